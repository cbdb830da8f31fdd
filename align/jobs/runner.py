"""run_job: process records in batches into append-only shards, resuming by id.

Sampling, annotation and the reference log-prob pass are all "map an expensive function
over a dataset of prompts". This runner gives them the same guarantees: kill it at any
point, start it again with the same arguments, and the output ends up exactly as an
uninterrupted run's — each id once, none missing.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from align import stopping
from align.errors import ConfigError, InputError, RecordError
from align.io.markers import mark_shard_done
from align.io.shards import (
    ShardWriter,
    check_fingerprint,
    check_shard_count,
    encode_record,
    iter_lines,
    shard_name,
)
from align.jobs.sharding import check_shard, shard_of
from align.ranks import is_writer, launch_group

ProcessBatch = Callable[[list[dict]], list[dict]]
# output directory (real path) -> a check that raises when the directory is no longer this run's
_GUARDS: dict[str, Callable[[], None]] = {}


def guard_writes(output_dir: str | Path, check: Callable[[], None] | None) -> None:
    """Run ``check`` before every append to (and the done marker of) a shard under ``output_dir``:
    a run whose directory another run took over stops instead of writing there (None: stop checking)."""
    key = os.path.realpath(output_dir)
    if check is None:
        _GUARDS.pop(key, None)
    else:
        _GUARDS[key] = check


def _check_guard(output_dir: Path) -> None:
    check = _GUARDS.get(os.path.realpath(output_dir))
    if check is not None:
        check()


@dataclass(frozen=True)
class JobResult:
    """What one run of one shard did."""

    output_dir: Path
    path: Path
    shard_index: int
    num_shards: int
    num_records: int  # records of this shard
    num_already_done: int  # found in the shard file at start (skipped)
    num_processed: int  # written by this run

    @property
    def complete(self) -> bool:
        return self.num_already_done + self.num_processed == self.num_records


class _Source:
    """Uniform row access to a list of dicts or a `datasets.Dataset`, ids checked once."""

    def __init__(self, records: Sequence[Mapping[str, Any]] | Any, id_field: str):
        self.records, self.id_field = records, id_field
        if hasattr(records, "column_names") and hasattr(records, "select"):
            if id_field not in records.column_names:
                raise InputError(f"dataset has no id column {id_field!r} (columns: {records.column_names})")
            ids = list(records[id_field])
        else:
            ids = [r.get(id_field) if isinstance(r, Mapping) else None for r in records]
        self.ids = _check_ids(ids, id_field)

    def __getitem__(self, index: int) -> dict:
        return dict(self.records[index])


def _check_ids(ids: list[Any], id_field: str) -> list[str]:
    """Every record needs a distinct non-empty string id: jobs resume by it."""
    seen: dict[str, int] = {}
    dupes: dict[str, list[int]] = {}
    for index, rid in enumerate(ids):
        if not isinstance(rid, str) or not rid:
            raise RecordError(f"<row {index}>", id_field, f"expected a non-empty string id, got {rid!r}")
        if rid in seen:
            dupes.setdefault(rid, [seen[rid]]).append(index)
        seen.setdefault(rid, index)
    if dupes:
        shown = ", ".join(f"{rid!r} (rows {rows})" for rid, rows in list(dupes.items())[:10])
        more = f" and {len(dupes) - 10} more" if len(dupes) > 10 else ""
        raise RecordError(next(iter(dupes)), id_field, f"duplicate ids in the input: {shown}{more}")
    return ids


def _check_outputs(batch_ids: list[str], outputs: Any, id_field: str) -> dict[str, dict]:
    """process_batch must return one dict per input, with the same ids."""
    if not isinstance(outputs, list) or len(outputs) != len(batch_ids):
        got = len(outputs) if isinstance(outputs, list) else type(outputs).__name__
        raise ValueError(f"process_batch returned {got} outputs for a batch of {len(batch_ids)} (ids {batch_ids[:5]}...)")
    by_id: dict[str, dict] = {}
    for i, out in enumerate(outputs):
        if not isinstance(out, Mapping):
            raise TypeError(f"process_batch output {i} (input id {batch_ids[i]!r}) is {type(out).__name__}, not a dict")
        by_id[out.get(id_field)] = dict(out)
    if set(by_id) != set(batch_ids):
        missing = sorted(set(batch_ids) - set(by_id))
        extra = sorted(set(by_id) - set(batch_ids), key=repr)
        raise ValueError(f"process_batch output ids do not match its input: missing {missing}, unexpected {extra}")
    return by_id


def done_ids(path: Path, id_field: str = "id") -> set[str]:
    """Ids already written to a shard file (a torn trailing line does not count)."""
    if not path.exists():
        return set()
    return {record.get(id_field) for _, record in iter_lines(path)}


def plan_batches(count: int, batch_size: int, max_batch_tokens: int | None = None,
                 sizes: Sequence[int] | None = None) -> list[tuple[int, int]]:
    """Consecutive batches (start, end) over ``count`` records: at most ``batch_size`` each and, with
    ``max_batch_tokens``, at most that many tokens counted as rows × the batch's longest record (the
    padded footprint, which bounds every layout's); a record longer than the budget is a batch alone."""
    if max_batch_tokens is None:
        return [(start, min(start + batch_size, count)) for start in range(0, count, batch_size)]
    if sizes is None or len(sizes) != count:
        got = None if sizes is None else len(sizes)
        raise ValueError(f"max_batch_tokens needs one size per record ({count}), got {got}")
    batches, start, longest = [], 0, 0
    for i, size in enumerate(sizes):
        rows = i - start
        if rows and (rows == batch_size or (rows + 1) * max(longest, size) > max_batch_tokens):
            batches.append((start, i))
            start, longest = i, 0
        longest = max(longest, size)
    if start < count:
        batches.append((start, count))
    return batches


def run_job(
    records: Sequence[Mapping[str, Any]] | Any,
    process_batch: ProcessBatch,
    output_dir: str | Path,
    *,
    shard_index: int = 0,
    num_shards: int = 1,
    batch_size: int = 16,
    id_field: str = "id",
    sort_key: Callable[[dict], Any] | None = None,
    desc: str | None = None,
    fingerprint: Mapping[str, Any] | None = None,
    max_batch_tokens: int | None = None,
    size_key: Callable[[dict], int] | None = None,
) -> JobResult:
    """Run shard `shard_index` of `num_shards` over `records`, skipping ids already done.

    Records go to shards by a hash of their id (see `align.jobs.sharding`). Pending records
    are ordered by `sort_key` (e.g. prompt length, to cut padding), then handed to
    `process_batch` `batch_size` at a time (with `max_batch_tokens`: also no more than that
    many tokens, counted as rows × the batch's longest `size_key`; see `plan_batches`); its
    outputs are appended to the shard file as each batch finishes. `fingerprint` (the job's
    settings: model, sampling parameters...) is stored in `output_dir/_job.json` and a
    resume with different settings is refused. When every record of the shard is written, a
    `.done.json` marker is written.
    """
    check_shard(shard_index, num_shards)
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    if max_batch_tokens is not None and (max_batch_tokens < 1 or size_key is None):
        raise ConfigError(f"max_batch_tokens={max_batch_tokens}: must be >= 1, with a size_key to count a record's "
                          "tokens")
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    if fingerprint is not None:
        check_fingerprint(output_dir, fingerprint)
    source = _Source(records, id_field)
    check_shard_count(output_dir, num_shards)
    path = output_dir / shard_name(shard_index, num_shards)
    mine = [i for i, rid in enumerate(source.ids) if shard_of(rid, num_shards) == shard_index]

    with ShardWriter(path) as writer:
        done = done_ids(path, id_field)
        pending = [i for i in mine if source.ids[i] not in done]
        already = len(mine) - len(pending)
        if sort_key is not None:
            keys = {i: sort_key(source[i]) for i in pending}
            pending.sort(key=keys.__getitem__)
        label = desc or f"shard {shard_index}/{num_shards}"
        processed = 0
        with tqdm(total=len(mine), initial=already, desc=label, unit="rec", dynamic_ncols=True,
                  disable=not is_writer()) as bar:  # one bar per launch, not N on one log
            sizes = [size_key(source[i]) for i in pending] if max_batch_tokens is not None else None
            for start, end in plan_batches(len(pending), batch_size, max_batch_tokens, sizes):
                chunk = pending[start:end]
                batch = [source[i] for i in chunk]
                batch_ids = [source.ids[i] for i in chunk]
                by_id = _check_outputs(batch_ids, process_batch(batch), id_field)
                lines = [encode_record(by_id[rid], rid) for rid in batch_ids]
                _check_guard(output_dir)
                for line in lines:
                    writer.write(line)
                writer.sync()
                processed += len(chunk)
                bar.update(len(chunk))
                if (reason := stopping.requested()) and launch_group() is None and end < len(pending):
                    # ranks of one launch may forward in step (a partitioned model): they are not stopped one by one
                    raise stopping.Stopped(f"{label}: stopped after {already + processed} of {len(mine)} rows "
                                           f"({reason}); the rows written are kept: run it again to resume")
        _check_guard(output_dir)
        mark_shard_done(
            output_dir, shard_index, num_shards,
            {"shard_index": shard_index, "num_shards": num_shards, "num_records": len(mine),
             "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
             "run_id": uuid.uuid4().hex},  # the stage's output id is drawn from these: a re-made shard is new
        )
    return JobResult(output_dir, path, shard_index, num_shards, len(mine), already, processed)
