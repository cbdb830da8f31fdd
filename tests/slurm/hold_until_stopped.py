"""``python hold_until_stopped.py -m align step ...``: the step, with one array task held mid-shard until asked to stop.

On its first attempt, the array task whose SLURM_ARRAY_TASK_ID is $HOLD_TASK writes its first
batch, touches $HOLD_MARKER, and waits until the cluster asks it to stop (``scontrol requeue``
sends SIGTERM; the batch script writes the stop file): the job then stops as any step does at
its next safe point. A test that requeues it once the marker is there requeues it mid-shard,
every time; the next attempt runs unheld.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from align import stopping
from align.io.shards import ShardWriter


def hold_after_first_batch() -> None:
    written = ShardWriter.sync  # the runner syncs once per written batch

    def sync(self: ShardWriter) -> None:
        written(self)
        Path(os.environ["HOLD_MARKER"]).touch()
        while stopping.requested() is None:
            time.sleep(0.2)
        ShardWriter.sync = written

    ShardWriter.sync = sync


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:2] != ["-m", "align"]:
        sys.exit(f"usage: python {sys.argv[0]} -m align STAGE ...")
    first = os.environ.get("SLURM_RESTART_COUNT", "0") == "0"
    if first and os.environ.get("SLURM_ARRAY_TASK_ID") == os.environ.get("HOLD_TASK"):
        hold_after_first_batch()
    from align.cli import main

    sys.exit(main(args[2:]))
