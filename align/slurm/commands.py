"""The SLURM client commands ``align submit`` uses: ``sbatch`` and ``squeue``.

Each failure is a ``ServiceError`` naming the command and what SLURM answered, so the
CLI prints it as one line.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path

from align.errors import ServiceError

# squeue states of a job that may still run (anything else is over)
ACTIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD",
                           "REQUEUE_FED", "RESIZING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT"})


def _run(command: Sequence[str], timeout: float = 120) -> str:
    if shutil.which(command[0]) is None:
        raise ServiceError(f"{command[0]} not found on PATH: align submit needs the SLURM client commands "
                           "(run it on a cluster's login node)")
    try:
        done = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise ServiceError(f"`{' '.join(command)}` did not answer in {timeout:g} s (is the SLURM controller "
                           "up? `sinfo` tells)") from None
    if done.returncode != 0:
        answer = (done.stderr or done.stdout).strip().replace("\n", " | ")
        raise ServiceError(f"`{' '.join(command)}` failed (exit {done.returncode}): {answer}")
    return done.stdout


def dependency_options(after: Iterable[str]) -> list[str]:
    """Start only after every job in ``after`` succeeded; cancelled if one of them fails."""
    after = list(after)
    if not after:
        return []
    return [f"--dependency=afterok:{':'.join(after)}", "--kill-on-invalid-dep=yes"]


def sbatch(script: Path, after: Iterable[str] = ()) -> str:
    """Submit a batch script; its job id."""
    out = _run(["sbatch", "--parsable", *dependency_options(after), str(script)])
    job_id = out.strip().split(";")[0]  # "ID" or "ID;CLUSTER"
    if not job_id.isdigit():
        raise ServiceError(f"sbatch answered {out.strip()!r}, not a job id")
    return job_id


def sbatch_test_only(script: Path, timeout: float = 60) -> str:
    """``sbatch --test-only``: SLURM checks the script and says when it would start; nothing runs."""
    if shutil.which("sbatch") is None:
        raise ServiceError("sbatch not found on PATH")
    try:
        done = subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise ServiceError(f"sbatch --test-only {script} did not answer in {timeout:g} s") from None
    answer = (done.stderr + done.stdout).strip()
    if done.returncode != 0:
        raise ServiceError(f"sbatch --test-only {script} refused it: {answer}")
    return answer


def active_jobs(job_ids: Iterable[str]) -> dict[str, str]:
    """The jobs among ``job_ids`` that are still queued or running, with their state (an
    array job is active while any of its tasks is)."""
    wanted = set(job_ids)
    if not wanted:
        return {}
    out = _run(["squeue", "--noheader", "--array", "--format=%F %T"])
    active: dict[str, str] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in wanted and parts[1] in ACTIVE_STATES:
            active.setdefault(parts[0], parts[1])
    return active
