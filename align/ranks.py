"""Who does what under a distributed launch: one definition each of who writes, how rank 0's decision
reaches the other ranks, and how a launch's process group starts.

A plain process and a SLURM array task are rank 0 of a launch of their own. Under
``accelerate launch`` or torchrun, ``RANK`` names the process; rank 0 alone writes markers and
manifests, fingerprints inputs and decides, and the other ranks receive what it decided (as
TRL shares its reference cache key).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def is_writer() -> bool:
    """Rank 0 of a distributed launch (or a plain process, or a SLURM array task): the one that writes."""
    return int(os.environ.get("RANK", "0")) == 0


def in_launch() -> bool:
    """This process is one of several ranks of a distributed launch."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def launch_group() -> Any:
    """torch.distributed when this process is a rank of a launch whose process group is up, else None."""
    if not in_launch():
        return None
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    return dist if dist.is_available() and dist.is_initialized() else None


def share(value: T) -> T:
    """Rank 0's ``value`` on every rank of the launch (unchanged outside one)."""
    dist = launch_group()
    if dist is None:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def on_rank_zero(compute: Callable[[], T]) -> T:
    """``compute()`` on rank 0 of a launch, its value shared with every rank (a fingerprint the launch needs
    once, not once per rank); outside a launch, ``compute()``."""
    dist = launch_group()
    if dist is None:
        return compute()
    value = compute() if dist.get_rank() == 0 else None
    return share(value)  # type: ignore[return-value]


def any_rank(flag: bool) -> bool:
    """True on every rank when ``flag`` is true on any rank of the launch (outside a launch: ``flag``). A
    collective: every rank calls it at the same point (a trainer's step end)."""
    dist = launch_group()
    if dist is None:
        return flag
    import torch

    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    value = torch.tensor([int(flag)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def start_process_group(config: Any = None, *, one_rank: bool = False) -> None:
    """Under a distributed launch, bring its process group up now, so rank 0 can decide for every rank.

    A trainer's config (``TrainingArguments``) sets up the launch as the trainer will use it
    (DeepSpeed included) when its ``device`` is first read; anything else gets a plain group
    (nccl on GPUs, gloo on CPU). Outside a launch nothing happens, unless ``one_rank``: a
    launch of one process still gets its group (a model partitioned over one rank needs one).
    """
    if not (in_launch() or one_rank):
        return
    if config is not None and hasattr(type(config), "device") and hasattr(config, "local_rank"):
        _ = config.device
        return
    import torch
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
