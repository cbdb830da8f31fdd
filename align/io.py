"""Reading and writing the datasets that stages exchange, and stage completion markers.

A stage's output directory is complete when it holds ``_COMPLETE.json`` (written last,
atomically). ``align pipeline`` skips complete stages, so a killed pipeline resumes at
the first incomplete one.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

COMPLETE_MARKER = "_COMPLETE.json"


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
        return list(_read_jsonl(path, torn_tail=_is_job_shard(path)))
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


def _is_job_shard(path: Path) -> bool:
    """A shard that `align.jobs` appends to (``shard-00000-of-00004.jsonl``)."""
    from align.jobs.store import SHARD_RE

    return SHARD_RE.match(path.name) is not None


def _read_jsonl(path: Path, *, torn_tail: bool) -> Iterable[dict[str, Any]]:
    """One JSON object per line. A final line without its newline is, in a job shard
    (``torn_tail``), a record a killed writer left half-written (skipped: the job redoes it);
    in a stage's input file it is a truncated file, an error naming file:line."""
    with path.open() as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            if not line.endswith("\n"):
                if torn_tail:
                    break  # a trailing half-written line from a killed writer is not a record
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{number}: truncated last line (not valid JSON, no newline: "
                                     f"{exc.msg}); the file was cut short") from exc
            else:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{number}: not valid JSON ({exc.msg})") from exc
            if not isinstance(record, dict):
                raise ValueError(  # noqa: TRY004 (bad data, reported by the CLI like every other)
                    f"{path}:{number}: expected a JSON object per line, got {type(record).__name__}")
            yield record


def write_jsonl(path: str | Path, records: Iterable[Mapping[str, Any]]) -> Path:
    """Write records atomically (temp file + rename), so a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            for record in records:
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json(path: str | Path, data: Any) -> Path:
    """Write one JSON document atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle, indent=2, ensure_ascii=False, default=str)
        handle.write("\n")
    os.replace(tmp, path)
    return path


def mark_complete(output_dir: str | Path, **info: Any) -> Path:
    """Record that a stage finished writing ``output_dir`` (the last thing a stage does)."""
    return write_json(Path(output_dir) / COMPLETE_MARKER, {"finished_at": time.time(), **info})


def is_complete(output_dir: str | Path) -> bool:
    """Whether a stage already finished writing ``output_dir``."""
    return (Path(output_dir) / COMPLETE_MARKER).is_file()


def completion_info(output_dir: str | Path) -> dict[str, Any] | None:
    """The metadata a finished stage left, or None when it has not finished."""
    marker = Path(output_dir) / COMPLETE_MARKER
    return json.loads(marker.read_text()) if marker.is_file() else None


def request_json(url: str, body: Mapping[str, Any] | None = None, *, method: str = "POST", api_key: str | None = None,
                 timeout_s: float = 600.0, max_retries: int = 3) -> dict[str, Any]:
    """One JSON request to an OpenAI-compatible server, retrying connection errors and 5xx
    answers with a short backoff; anything else is a RuntimeError naming the URL."""
    import urllib.error
    import urllib.request

    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = json.dumps(body).encode() if body is not None else None
    for attempt in range(max_retries + 1):
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                raw = response.read().decode(errors="replace")
            try:
                return json.loads(raw)
            except json.JSONDecodeError:
                raise RuntimeError(f"{url}: answer is not JSON: {raw[:200]!r}") from None
        except urllib.error.HTTPError as error:
            detail = error.read().decode(errors="replace")[:300]
            if error.code < 500 or attempt == max_retries:
                raise RuntimeError(f"{url}: HTTP {error.code}: {detail}") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
            if attempt == max_retries:
                raise RuntimeError(f"{url}: request failed after {attempt + 1} tries: {error}") from None
        time.sleep(0.5 * 2**attempt)
    raise AssertionError("unreachable")
