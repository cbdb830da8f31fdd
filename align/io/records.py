"""Reading the datasets that stages exchange, and turning rows into a `datasets.Dataset`.

One rule for every input, file or directory (docs/bad-inputs.md):

- A data file is ``.jsonl``, ``.json`` or ``.parquet``, the suffix in any case (``.JSONL``).
- A directory is read as the union of its data files. Nothing in it is ignored silently:
  the library's own markers (``_COMPLETE.json``, ``_job.json``, ``_manifest.json``, a
  shard's ``.done.json`` and ``.lock``, an atomic writer's ``.*.tmp``) are skipped by name;
  any other name starting with ``_`` or ``.``, any other file, or a subdirectory, is an
  error naming it.
- An empty path is an error (never the current directory); a local-looking path that does
  not exist is "not found" at once; only a name that looks like a hub dataset (``org/name``)
  is passed to ``datasets.load_dataset``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from align.errors import InputError, MissingInputError, RecordError
from align.io.files import iter_jsonl, parse_json, read_text
from align.io.shards import is_job_shard

DATA_SUFFIXES = (".jsonl", ".json", ".parquet")
# Files the library itself writes next to data (completion markers, the job fingerprint,
# shard markers and locks, a killed atomic writer's temp file): skipped when a directory is
# read. A new marker name belongs here, or readers refuse the directories that hold it.
MARKER_NAMES = frozenset({"_COMPLETE.json", "_job.json", "_manifest.json", "_manifest_rows.json", "_written.jsonl",
                          ".align-stage.lock", ".align-writer.lock"})
_MARKER_RE = re.compile(r"^(?:shard-\d{5}-of-\d{5}\.(?:done\.json|lock)|\..+\.tmp)$")


def is_marker(name: str) -> bool:
    """A file name the library writes next to data and readers skip."""
    return name in MARKER_NAMES or _MARKER_RE.match(name) is not None


def data_suffix(path: str | Path) -> str:
    """The file's suffix in lower case (``.JSONL`` is read as ``.jsonl``)."""
    return Path(path).suffix.lower()


def looks_local(value: str | Path) -> bool:
    """A path on this machine rather than a hub name (``org/name``): it starts with ``.``,
    ``/`` or ``~``, has more than one ``/``, or ends in a data file suffix."""
    text = str(value)
    return (text.startswith((".", "/", "~")) or text.count("/") > 1
            or data_suffix(text) in DATA_SUFFIXES)


def data_files(directory: str | Path) -> list[Path]:
    """The data files of an input directory, sorted; anything else but a marker is an error."""
    directory = Path(directory)
    files: list[Path] = []
    for entry in sorted(directory.iterdir()):
        if is_marker(entry.name):
            continue
        if entry.name.startswith(("_", ".")):
            raise InputError(f"{entry}: named like one of the library's markers (a leading '_' or '.') but not one "
                             f"({', '.join(sorted(MARKER_NAMES))}, shard .done.json / .lock, .*.tmp); "
                             "rename it to read it, or move it out")
        if entry.is_dir():
            raise InputError(f"{entry}: a subdirectory inside an input directory (only data files are read: "
                             f"{', '.join(DATA_SUFFIXES)}); move it out, or name the directory to read")
        if data_suffix(entry) not in DATA_SUFFIXES:
            raise InputError(f"{entry}: not a data file ({', '.join(DATA_SUFFIXES)}, any case) and not one of "
                             "the library's markers; an input directory is read whole, so move it out")
        files.append(entry)
    if not files:
        raise MissingInputError(f"{directory}: no .jsonl, .json or .parquet files in this directory")
    return files


def read_records(source: str | Path, *, split: str = "train") -> list[dict[str, Any]]:
    """Load rows from a JSONL/JSON/Parquet file, a stage output dir, or a `datasets` spec.

    The one reader of the library's inputs. A directory is read as the union of its data
    files (job shards or a stage's output), in sorted file order, under the rule of the
    module docstring. A name that looks like a hub dataset (``org/name``) and is not a local
    path is passed to ``datasets.load_dataset``.

    A JSONL file whose last line has no newline and does not parse was cut short: an error
    naming ``file:line``. Job shards (``shard-*-of-*.jsonl``, written by `align.jobs`) are
    the exception: there such a line is a record a killed writer left half-written, and it
    is skipped (the job redoes it when it resumes).

    One duplicate-id rule everywhere: a string ``id`` on two rows is an error naming the id
    and both places (jobs resume by id, pairs and log-probs are joined by it). Rows without
    a string id (SFT conversations often have none) are not checked.
    """
    rows, where = _read_located(source, split)
    seen: dict[str, int] = {}
    for index, row in enumerate(rows):
        rid = row.get("id")
        if isinstance(rid, str) and rid:
            if rid in seen:
                raise RecordError(rid, "id", f"duplicate id ({where[seen[rid]]} and {where[index]})")
            seen[rid] = index
    return rows


def _read_located(source: str | Path, split: str) -> tuple[list[dict[str, Any]], list[str]]:
    """(rows, where each row is: ``file:line``, ``file[item]`` or ``source[row]``)."""
    if not str(source).strip():
        raise InputError("input path is empty (an empty path is never read as the current directory)")
    path = Path(source).expanduser()
    if path.is_dir():
        rows: list[dict[str, Any]] = []
        where: list[str] = []
        for file in data_files(path):
            more, places = _read_located(file, split)
            rows.extend(more)
            where.extend(places)
        return rows, where
    suffix = data_suffix(path)
    if not path.exists():
        if looks_local(source):
            raise MissingInputError(f"{path}: not found")
        rows = _hub_rows(str(source), split)
        return rows, [f"{source}[{i}]" for i in range(len(rows))]
    if suffix == ".jsonl":
        located = list(iter_jsonl(path, torn_tail=is_job_shard(path)))
        return [record for _, record in located], [f"{path.name}:{number}" for number, _ in located]
    if suffix == ".json":
        try:
            data = parse_json(read_text(path), str(path))
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from exc
        if not isinstance(data, list):
            raise InputError(f"{path}: expected a JSON list of records")
        for number, row in enumerate(data):
            if not isinstance(row, dict):
                raise InputError(
                    f"{path}: item {number}: expected a JSON object per record, got {type(row).__name__}")
        return data, [f"{path.name}[{i}]" for i in range(len(data))]
    if suffix == ".parquet":
        rows = _parquet_rows(path)
        return rows, [f"{path.name}[{i}]" for i in range(len(rows))]
    raise InputError(f"{path}: unsupported file type {path.suffix!r} (use .jsonl, .json or .parquet)")


def _parquet_rows(path: Path) -> list[dict[str, Any]]:
    """A Parquet file's rows; a file that is not Parquet is an error naming it."""
    import datasets
    import pyarrow

    try:
        return datasets.Dataset.from_parquet(str(path)).to_list()
    except pyarrow.ArrowException as exc:
        raise InputError(f"{path}: not a readable Parquet file ({exc})") from None


def _hub_rows(name: str, split: str) -> list[dict[str, Any]]:
    """A hub dataset's rows; a name the hub does not give (or cannot be reached for) is an
    error naming it, since it is just as likely a mistyped local path."""
    import datasets

    try:
        return datasets.load_dataset(name, split=split).to_list()
    except (FileNotFoundError, ConnectionError) as exc:
        raise MissingInputError(f"{name}: not a local path, and not a dataset the hub gives ({exc})") from None


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
