"""Stopping a long stage cleanly when the cluster asks: save, exit, and resume where it stopped.

SLURM warns a job before its time limit with the signal ``--signal=B:USR1@MARGIN`` asks for,
and sends SIGTERM when it preempts or requeues a job. The batch script ``align submit``
writes turns either into a *stop file* (``$ALIGN_STOP_FILE``, on the shared filesystem, so
every rank on every node sees it) and waits; a process started outside such a script
catches SIGUSR1 and SIGTERM itself (``install``). A stage asks ``requested()`` where it can
stop without losing work: a job between two appended batches, a trainer at the end of a
step (every rank agreeing, after saving a checkpoint). It then raises ``Stopped``; the CLI
exits with ``STOPPED_EXIT`` (75) and leaves ``STOP_FILE.stopped`` (a launcher between the
script and the ranks reports its own exit code), and the script requeues the job, which resumes
from what was saved (job shards skip the rows written; a trainer resumes from its last checkpoint).
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

from align.errors import AlignError

STOP_FILE_ENV = "ALIGN_STOP_FILE"
STOPPED_EXIT = 75  # EX_TEMPFAIL: the work is not done, and a rerun resumes it
_SIGNALS = ("SIGUSR1", "SIGTERM")
_received: list[str] = []


class Stopped(AlignError):
    """A stage stopped before its end because the cluster asked, having saved what it did: rerun it to resume."""


def install() -> None:
    """Catch SIGUSR1 and SIGTERM in this process: the next safe point stops instead of the process dying mid-write
    (main thread only; elsewhere signals cannot be caught, and the stop file still works)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for name in _SIGNALS:
        signal.signal(getattr(signal, name), _note)


def _note(number: int, frame: object) -> None:
    """The first signal asks for a stop at the next safe point; a second one ends the process as it would have."""
    name = signal.Signals(number).name
    if name in _received:
        signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
        return
    _received.append(name)
    print(f"[align] {name} received: saving at the next safe point, then stopping (send it again to stop now)",
          flush=True)


def requested() -> str | None:
    """Why this process should stop at its next safe point (a signal received, or the stop file its batch script
    wrote), or None."""
    if _received:
        return f"{_received[0]} received"
    path = os.environ.get(STOP_FILE_ENV)
    if path and Path(path).exists():
        return f"the job's stop file {path} was written (the cluster signalled the job)"
    return None


def record_stop(message: str) -> None:
    """Leave word beside the stop file that the step saved and stopped (``STOP_FILE.stopped``): the batch script
    reads it whatever exit code a launcher in between reports, and requeues the job."""
    path = os.environ.get(STOP_FILE_ENV)
    if path:
        Path(f"{path}.stopped").write_text(message + "\n")


def reset() -> None:
    """Forget a signal received (a notebook that handled a stop and goes on)."""
    _received.clear()
