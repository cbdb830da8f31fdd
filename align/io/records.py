"""Reading the datasets that stages exchange, and turning rows into a `datasets.Dataset`."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from align.io.files import iter_jsonl
from align.io.shards import is_job_shard


def read_records(source: str | Path, *, split: str = "train") -> list[dict[str, Any]]:
    """Load rows from a JSONL/JSON/Parquet file, a stage output dir, or a `datasets` spec.

    A directory is read as the union of its ``*.jsonl`` / ``*.parquet`` files (job shards
    or a stage's output), in sorted file order. Anything else is passed to
    ``datasets.load_dataset`` (a hub name or a local dataset script).

    A JSONL file whose last line has no newline and does not parse was cut short: an error
    naming ``file:line``. Job shards (``shard-*-of-*.jsonl``, written by `align.jobs`) are
    the exception: there such a line is a record a killed writer left half-written, and it
    is skipped (the job redoes it when it resumes).
    """
    path = Path(source)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in (".jsonl", ".parquet") and not p.name.startswith("_"))
        if not files:
            raise FileNotFoundError(f"{path}: no .jsonl or .parquet files in this directory")
        rows: list[dict[str, Any]] = []
        for file in files:
            rows.extend(read_records(file))
        return rows
    if path.suffix == ".jsonl":
        return [record for _, record in iter_jsonl(path, torn_tail=is_job_shard(path))]
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from exc
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a JSON list of records")
        for number, row in enumerate(data):
            if not isinstance(row, dict):
                raise ValueError(  # noqa: TRY004 (bad data, reported by the CLI like every other)
                    f"{path}: item {number}: expected a JSON object per record, got {type(row).__name__}")
        return data
    if path.suffix == ".parquet":
        import datasets

        return datasets.Dataset.from_parquet(str(path)).to_list()
    if path.exists():
        raise ValueError(f"{path}: unsupported file type {path.suffix!r} (use .jsonl, .json or .parquet)")
    import datasets

    return datasets.load_dataset(str(source), split=split).to_list()


def rows_to_dataset(rows: Iterable[Mapping[str, Any]]) -> Any:
    """A `datasets.Dataset` with one column per key found in ANY row (missing: None).

    ``datasets.Dataset.from_list`` takes its columns from the first row only, so a key the
    first row lacks (``tools``, ``answer``, ...) would be dropped from every row. Every
    place that turns records into a ``Dataset`` goes through here instead.
    """
    import datasets

    rows = [dict(row) for row in rows]
    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(row))
    return datasets.Dataset.from_dict({name: [row.get(name) for row in rows] for name in names})
