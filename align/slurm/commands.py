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
    if text is None or str(text).strip().upper() in ("UNLIMITED", "INFINITE", ""):
        return None
    days, dash, rest = str(text).strip().rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if dash:  # D-H[:M[:S]]
        hours, minutes, seconds = [*parts, 0, 0][:3]
    elif len(parts) == 3:  # H:M:S
        hours, minutes, seconds = parts
    else:  # M or M:S
        hours, minutes, seconds = 0, parts[0], parts[1] if len(parts) == 2 else 0
    return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds


def slurm_time(seconds: int) -> str:
    """Seconds as a SLURM time, ``D-HH:MM:SS``."""
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"


def key_values(line: str) -> dict[str, str]:
    """One ``scontrol --oneliner`` record: its ``KEY=VALUE`` words (a value may hold ``=``)."""
    return dict(word.split("=", 1) for word in line.split() if "=" in word)


def partition_max_time(partition: str | None) -> tuple[str, int | None]:
    """(the partition a job goes to: the one named, else the cluster's default, its MaxTime in seconds or None)."""
    out = _run(["scontrol", "--oneliner", "show", "partition", *([partition] if partition else [])])
    records = [r for r in map(key_values, out.splitlines()) if "PartitionName" in r]
    if partition is None:
        records = [r for r in records if r.get("Default") == "YES"]
    if not records:
        raise ServiceError(f"scontrol show partition {partition or '(the default)'} named no partition")
    return records[0]["PartitionName"], slurm_seconds(records[0]["MaxTime"])


# states in which a job's exit code is not its last word
UNFINISHED = ("PENDING", "RUNNING", "COMPLETED", "COMPLETING")


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
        if self.state == "PENDING" and self.reason not in ("", "None"):
            text += f" ({self.reason})"
        if self.state not in UNFINISHED and self.exit_code not in ("", "0:0"):
            code, _, signal = self.exit_code.partition(":")
            text += f", exit code {code}" + (f" (signal {signal})" if signal != "0" else "")
        if self.restarts:
            text += f", attempt {self.restarts + 1} (requeued {self.restarts} time{'s' if self.restarts > 1 else ''})"
        if self.log and self.state != "PENDING":
            text += f", log {self.log}"
        return text


def _answer(command: list[str], timeout: float = 60) -> str:
    """What a query command printed; nothing where it failed (the job is not known to it) or hung (a controller
    that does not answer does not hold ``align status`` up)."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return ""
    return done.stdout if done.returncode == 0 else ""


def job_states(job_id: str) -> list[JobState]:
    """What SLURM knows of a job now: one entry per task of an array; from ``scontrol`` while the controller keeps
    the job, else from ``sacct`` where accounting is kept; [] when neither knows it (or there is no SLURM here)."""
    if shutil.which("scontrol") is None:
        return []
    states = []
    for fields in map(key_values, _answer(["scontrol", "--oneliner", "show", "job", job_id]).splitlines()):
        name = f"{fields['ArrayJobId']}_{fields['ArrayTaskId']}" if "ArrayTaskId" in fields else job_id
        states.append(JobState(name, fields["JobState"], fields["Reason"], fields["ExitCode"], int(fields["Restarts"]),
                               fields["StdOut"]))
    return states or _sacct_states(job_id)


def _sacct_states(job_id: str) -> list[JobState]:
    if shutil.which("sacct") is None:
        return []
    states = []
    for line in _answer(["sacct", "--noheader", "--parsable2", "--jobs", job_id,
                         "--format=JobID,State,ExitCode"]).splitlines():
        job, state, exit_code = line.split("|")
        if "." not in job:  # the job, not its steps (123.batch)
            states.append(JobState(job, state.split()[0], exit_code=exit_code))
    return states
