"""Free TCP ports for the launchers the tests start (``torch.distributed.run``, ``accelerate launch``,
servers): the default rendezvous port 29500 collides when two test runs share a machine."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nobody listens on at the moment of asking (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(nproc: int = 2) -> list[str]:
    """``python -m torch.distributed.run`` with ``nproc`` processes on a free rendezvous port."""
    import sys

    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
            "--master_port", str(free_port())]


def accelerate_launch(config_file: str) -> list[str]:
    """``python -m accelerate.commands.launch --config_file CONFIG`` on a free main-process port."""
    import sys

    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config_file),
            "--main_process_port", str(free_port())]
