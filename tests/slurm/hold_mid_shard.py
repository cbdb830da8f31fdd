"""``python hold_mid_shard.py -m align STAGE ...``: ``align STAGE ...``, with one array task held mid-shard.

The array task whose SLURM_ARRAY_TASK_ID is $HOLD_TASK writes its first batch, touches
$HOLD_MARKER and then waits until it is cancelled: a test that cancels it once the marker
is there cancels it mid-shard, every time (part of its shard written, the rest not).
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
    if args[:2] != ["-m", "align"]:
        sys.exit(f"usage: python {sys.argv[0]} -m align STAGE ...")
    if os.environ.get("SLURM_ARRAY_TASK_ID") == os.environ.get("HOLD_TASK"):
        hold_after_first_batch()
    from align.cli import main

    sys.exit(main(args[2:]))
