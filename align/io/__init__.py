"""The one I/O package: readers, atomic writers and completion markers.

- ``files``: the JSONL line reader (``iter_jsonl``) and atomic writers (``atomic_write``,
  ``write_jsonl``, ``write_json``).
- ``records``: the datasets stages exchange (``read_records``: a file, a stage output
  directory or a ``datasets`` source; ``rows_to_dataset``: a ``datasets.Dataset`` with the
  columns of every row).
- ``shards``: a job's append-only shard files (``ShardWriter``, ``shard_name``) and
  reading its output back (``read_output``, ``output_files``).
- ``markers``: completion markers, stage (``stage_is_complete``, ``mark_stage_complete``,
  ``stage_completion_info``, ``_COMPLETE.json``) and job (``job_is_complete``: every
  shard's ``.done.json`` marker, exactly the expected ids).
- ``http``: ``request_json``, a retrying JSON request to an OpenAI-compatible server.

``align.jobs`` (run_job, sharding) writes and resumes through this package.
"""

from align.io.files import atomic_write, iter_jsonl, write_json, write_jsonl
from align.io.http import request_json
from align.io.markers import (
    STAGE_COMPLETE_MARKER,
    job_is_complete,
    mark_stage_complete,
    stage_completion_info,
    stage_is_complete,
)
from align.io.records import read_records, rows_to_dataset
from align.io.shards import output_files, read_output, shard_name

__all__ = [
    "STAGE_COMPLETE_MARKER",
    "atomic_write",
    "iter_jsonl",
    "job_is_complete",
    "mark_stage_complete",
    "output_files",
    "read_output",
    "read_records",
    "request_json",
    "rows_to_dataset",
    "shard_name",
    "stage_completion_info",
    "stage_is_complete",
    "write_json",
    "write_jsonl",
]
