"""``python second_python.py -m align step RECIPE NAME ...``: a second interpreter for a recipe's steps.

A test's recipe names it (through a shell wrapper) as the Python of some steps
(``slurm.stages.STAGE.python``): each run appends ``NAME`` to ``$SECOND_PYTHON_LOG``, so the
test knows exactly which steps it ran. With ``$HOLD_STEP`` and ``$HOLD_TASK`` set, that
step's array task writes its first batch, touches ``$HOLD_MARKER`` and waits to be
cancelled: a test that cancels it then cancels it mid-shard.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from align.io.shards import ShardWriter


def hold_after_first_batch() -> None:
    written = ShardWriter.sync  # the runner syncs once per written batch

    def sync(self: ShardWriter) -> None:
        written(self)
        Path(os.environ["HOLD_MARKER"]).touch()
        while True:
            time.sleep(1)

    ShardWriter.sync = sync


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:3] != ["-m", "align", "step"] or len(args) < 5:
        sys.exit(f"usage: python {sys.argv[0]} -m align step RECIPE NAME ...")
    name = args[4]
    with open(os.environ["SECOND_PYTHON_LOG"], "a", encoding="utf-8") as log:
        log.write(f"{name} {os.environ.get('SLURM_ARRAY_TASK_ID', '-')}\n")
    if name == os.environ.get("HOLD_STEP") and os.environ.get("SLURM_ARRAY_TASK_ID") == os.environ.get("HOLD_TASK"):
        hold_after_first_batch()
    from align.cli import main

    sys.exit(main(args[2:]))
