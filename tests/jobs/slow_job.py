"""An annotation-like job for the kill/resume tests: deterministic, a little slow.

    python slow_job.py OUTPUT_DIR NUM_RECORDS [SHARD_INDEX NUM_SHARDS]

Each output depends only on its record (a per-id seeded draw), as a real reward or
sampling stage seeded per id does, so an interrupted-and-resumed run must reproduce an
uninterrupted one exactly.
"""

from __future__ import annotations

import random
import sys
import time

from align.jobs import run_job


def make_records(n: int) -> list[dict]:
    return [{"id": f"prompt-{i:04d}", "text": "word " * (i % 7 + 1)} for i in range(n)]


def annotate(batch: list[dict]) -> list[dict]:
    time.sleep(0.02)
    out = []
    for record in batch:
        rng = random.Random(record["id"])
        out.append({**record, "reward": rng.random(), "tokens": [rng.randrange(100) for _ in range(3)]})
    return out


def main(argv: list[str]) -> None:
    output_dir, n = argv[0], int(argv[1])
    shard, count = (int(argv[2]), int(argv[3])) if len(argv) > 2 else (0, 1)
    run_job(
        make_records(n), annotate, output_dir, shard_index=shard, num_shards=count,
        batch_size=3, sort_key=lambda r: len(r["text"]), desc="slow job",
    )


if __name__ == "__main__":
    main(sys.argv[1:])
