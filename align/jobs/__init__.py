"""Resumable, sharded jobs: map an expensive function over records into JSONL shards.

    from align.io import job_is_complete, read_output
    from align.jobs import run_job, shard_from_env
    shard, count = shard_from_env()          # SLURM array or torchrun/accelerate ranks
    run_job(records, process_batch, "out/", shard_index=shard, num_shards=count)
    rows = read_output("out/", expect_ids=[r["id"] for r in records])

Kill a job at any point and run the same command again: finished ids are skipped, a torn
last line is dropped and redone, so the output equals an uninterrupted run's. The shard
files, their markers and reading them back are `align.io`'s (``shards``, ``markers``).
"""

from align.jobs.runner import JobResult, done_ids, run_job
from align.jobs.sharding import resolve_shard, shard_from_env, shard_of

__all__ = [
    "JobResult",
    "done_ids",
    "resolve_shard",
    "run_job",
    "shard_from_env",
    "shard_of",
]
