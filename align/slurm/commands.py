"""The SLURM client commands ``align submit`` uses: ``sbatch`` and ``squeue``.

Each failure is a ``ServiceError`` naming the command and what SLURM answered, so the
CLI prints it as one line.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
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


def slurm_seconds(text: str | int | None) -> int | None:
    """A SLURM time (``--time`` or a partition's ``MaxTime``) in seconds; None for none or ``UNLIMITED``.

    The forms SLURM takes: ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``.
    """
    if text is None:
        return None
    text = str(text).strip()
    if text.upper() in ("UNLIMITED", "INFINITE", "NONE", ""):
        return None
    days, _, rest = text.rpartition("-") if "-" in text else ("0", "", text)
    parts = [int(p) for p in rest.split(":")]
    if "-" in text:
        hours, minutes, seconds = (parts + [0, 0])[:3]
    elif len(parts) == 1:
        hours, minutes, seconds = 0, parts[0], 0
    elif len(parts) == 2:
        hours, minutes, seconds = 0, parts[0], parts[1]
    else:
        hours, minutes, seconds = parts
    return ((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds


def slurm_time(seconds: int) -> str:
    """Seconds as a SLURM time, ``D-HH:MM:SS``."""
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"


def partition_max_time(partition: str | None) -> tuple[str, int | None]:
    """(the partition a job goes to: the one named, else the cluster's default, its MaxTime in seconds or None)."""
    out = _run(["scontrol", "--oneliner", "show", "partition", *([partition] if partition else [])])
    records = [dict(word.split("=", 1) for word in line.split() if "=" in word) for line in out.splitlines()]
    records = [r for r in records if r.get("PartitionName")]
    if partition is None:
        records = [r for r in records if r.get("Default") == "YES"] or records[:1]
    if not records:
        raise ServiceError(f"scontrol show partition {partition or ''} named no partition")
    return records[0]["PartitionName"], slurm_seconds(records[0].get("MaxTime"))


@dataclass(frozen=True)
class JobState:
    """One job (or array task) as SLURM reports it now."""

    job_id: str  # 123, or 123_4 for an array task
    state: str  # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, ...
    reason: str = ""  # why it is pending (Dependency, Priority, PartitionTimeLimit...)
    exit_code: str = ""  # "2:0": the step's code and the signal
    restarts: int = 0  # requeues so far
    log: str = ""

    def describe(self) -> str:
        text = f"job {self.job_id}: {self.state}"
        if self.state == "PENDING" and self.reason and self.reason != "None":
            text += f" ({self.reason})"
        code, _, signal = self.exit_code.partition(":")
        if self.state not in ("PENDING", "RUNNING", "COMPLETED", "COMPLETING") and (code, signal) != ("0", "0") \
                and code:
            text += f", exit code {code}" + (f" (signal {signal})" if signal not in ("0", "") else "")
        if self.restarts:
            text += f", attempt {self.restarts + 1} (requeued {self.restarts} time{'s' if self.restarts > 1 else ''})"
        if self.log and self.state not in ("PENDING",):
            text += f", log {self.log}"
        return text


def job_states(job_id: str) -> list[JobState]:
    """What SLURM knows of a job now: one entry per task of an array; from ``scontrol`` while the controller keeps
    the job, else from ``sacct`` where accounting is kept; [] when neither knows it."""
    if shutil.which("scontrol") is None:
        return []
    done = subprocess.run(["scontrol", "--oneliner", "show", "job", job_id], capture_output=True, text=True,
                          timeout=60, check=False)
    states = []
    for line in done.stdout.splitlines() if done.returncode == 0 else []:
        fields = dict(word.split("=", 1) for word in line.split() if "=" in word)
        task = fields.get("ArrayTaskId")
        name = f"{fields.get('ArrayJobId', job_id)}_{task}" if task else fields.get("JobId", job_id)
        states.append(JobState(name, fields.get("JobState", "?"), fields.get("Reason", ""),
                               fields.get("ExitCode", ""), int(fields.get("Restarts", "0") or 0),
                               fields.get("StdOut", "")))
    return states or _sacct_states(job_id)


def _sacct_states(job_id: str) -> list[JobState]:
    if shutil.which("sacct") is None:
        return []
    done = subprocess.run(["sacct", "--noheader", "--parsable2", "--jobs", job_id, "--format=JobID,State,ExitCode"],
                          capture_output=True, text=True, timeout=60, check=False)
    states = []
    for line in done.stdout.splitlines() if done.returncode == 0 else []:
        parts = line.split("|")
        if len(parts) == 3 and "." not in parts[0]:  # the job, not its steps (123.batch)
            states.append(JobState(parts[0], parts[1].split()[0], exit_code=parts[2]))
    return states
