"""Seeded kill points for the kill-and-resume tests, printed so that a failure can be replayed.

Each test draws its kill points from ``kill_rng(default_seed, what)``: the seed is the test's
own default, or ``ALIGN_KILL_SEED`` when set. The seed and every kill point are printed (pytest
shows them with a failure) and go into the assertion messages; rerun the failing test with
``ALIGN_KILL_SEED=<seed>`` to aim its kills at the same points.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

KILL_SEED_ENV = "ALIGN_KILL_SEED"


def kill_rng(default_seed: int, what: str) -> tuple[random.Random, int]:
    """A ``random.Random`` for ``what``'s kill points, and its seed (printed)."""
    seed = int(os.environ.get(KILL_SEED_ENV, default_seed))
    print(f"[kill points] {what}: seed {seed} (replay: {KILL_SEED_ENV}={seed})", flush=True)
    return random.Random(seed), seed


def complete_lines(path: Path) -> bytes:
    """The rows of a JSONL file that end in a newline (a killed writer may leave a partial last one)."""
    data = path.read_bytes() if path.exists() else b""
    return data[: data.rfind(b"\n") + 1]


def kill_once_written(command: list, shard: Path, after: int, log: Path, *, env: dict, deadline_s: float,
                      cwd: Path | None = None) -> int:
    """Start ``command``, SIGKILL its process group once ``shard`` holds ``after`` complete rows (or
    it ends, or ``deadline_s`` passes), and return its exit status (``-SIGKILL`` when killed)."""
    with log.open("w") as stream:
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=stream, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        try:
            deadline = time.monotonic() + deadline_s
            while process.poll() is None and time.monotonic() < deadline:
                if complete_lines(shard).count(b"\n") >= after:
                    break
                time.sleep(0.005)
            os.killpg(process.pid, signal.SIGKILL)
        finally:
            process.wait(timeout=60)
    return process.returncode
