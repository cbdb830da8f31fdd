"""Submitting to the local cluster and reading what it did (scontrol keeps finished jobs an hour)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SLURM_SCRIPTS = REPO / "recipes" / "slurm"
# The shipped scripts ask for GPUs and 16-64 CPUs per task; this cluster has 0 GPUs and a few CPUs.
NO_GPU = ["--gpus-per-task=0", "--cpus-per-task=1"]


def run(command: list[str], env: dict[str, str], cwd: Path | None = None, timeout: float = 120,
        check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in command], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, command))} exited {done.returncode}:\n{done.stdout[-4000:]}\n"
                             f"{done.stderr[-4000:]}")
    return done


def sbatch(args: list[str], env: dict[str, str], cwd: Path = REPO) -> str:
    """Submit; the job id."""
    return run(["sbatch", "--parsable", *args], env, cwd=cwd).stdout.strip().split(";")[0]


def active(job_ids: list[str], env: dict[str, str]) -> list[str]:
    """The squeue lines (job, state, reason) of those jobs that are still queued or running."""
    out = run(["squeue", "--noheader", "--array", "--format=%F %i %T %r"], env).stdout
    return [line for line in out.splitlines() if line.split()[0] in job_ids]


def wait_for(job_ids: list[str], env: dict[str, str], timeout_s: float = 240, logs: Path | None = None) -> None:
    """Until none of the jobs is queued or running (bounded)."""
    deadline = time.monotonic() + timeout_s
    while active(job_ids, env):
        if time.monotonic() > deadline:
            tails = log_tails(logs) if logs else ""
            raise AssertionError(f"jobs {job_ids} still queued after {timeout_s} s: {active(job_ids, env)}{tails}")
        time.sleep(0.5)


def wait_for_file(path: Path, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear in {timeout_s} s")
        time.sleep(0.2)


def job_records(job_id: str, env: dict[str, str]) -> list[dict[str, str]]:
    """``scontrol show job`` of a job (one record per array task): its KEY=VALUE fields."""
    out = run(["scontrol", "--oneliner", "show", "job", job_id], env).stdout
    records = []
    for line in out.splitlines():
        fields = {}
        for word in line.split():
            key, sep, value = word.partition("=")
            if sep:
                fields[key] = value
        if fields:
            records.append(fields)
    return records


def states(job_id: str, env: dict[str, str]) -> dict[str, str]:
    """Task (or "job") -> state, e.g. {"0": "COMPLETED", "2": "CANCELLED"}."""
    return {r.get("ArrayTaskId", "job"): r["JobState"] for r in job_records(job_id, env)}


def log_tails(logs: Path, chars: int = 3000) -> str:
    return "".join(f"\n--- {p.name}:\n{p.read_text(errors='replace')[-chars:]}" for p in sorted(logs.glob("*.out")))


def assert_states(job_id: str, expected: dict[str, str], env: dict[str, str], logs: Path) -> None:
    """The job's (or its tasks') final states, with the job logs when they differ."""
    got = states(job_id, env)
    assert got == expected, f"job {job_id}: {got}, expected {expected}{log_tails(logs)}"
