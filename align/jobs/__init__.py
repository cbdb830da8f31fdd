"""Resumable, sharded jobs: map an expensive function over records into JSONL shards.

    from align.jobs import run_job, read_output, shard_from_env
    shard, count = shard_from_env()          # SLURM array or torchrun/accelerate ranks
    run_job(records, process_batch, "out/", shard_index=shard, num_shards=count)
    rows = read_output("out/", expect_ids=[r["id"] for r in records])

Kill a job at any point and run the same command again: finished ids are skipped, a torn
last line is dropped and redone, so the output equals an uninterrupted run's.
"""

from align.jobs.reader import is_complete, output_files, read_output
from align.jobs.runner import JobResult, done_ids, run_job
from align.jobs.sharding import resolve_shard, shard_from_env, shard_of
from align.jobs.store import shard_name

__all__ = [
    "JobResult",
    "done_ids",
    "is_complete",
    "output_files",
    "read_output",
    "resolve_shard",
    "run_job",
    "shard_from_env",
    "shard_name",
    "shard_of",
]
