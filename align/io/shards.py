"""Job shards: append-only JSONL files that survive being killed at any instant, and
reading a job's output back (merged shards, ``datasets`` loading).

Layout of an output directory (N = num_shards)::

    shard-00000-of-0000N.jsonl       one JSON object per line, appended as work finishes
    shard-00000-of-0000N.done.json   written (atomically) when shard 0 has every record
                                     (``align.io.markers``: the job's completion markers)
    shard-00000-of-0000N.lock        flock'ed by the process writing shard 0
    _job.json                        the job's fingerprint (settings), when one was given

A record is one line, written with a single ``write`` and followed by ``fsync`` at the
end of each batch. A kill can at worst leave a trailing line without its newline: the
writer truncates it when it reopens the shard, and readers ignore it, so nobody ever sees
a half record and the record is simply redone.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Self

from align.errors import InputError, RecordError
from align.io.files import iter_jsonl
from align.io.ledger import note

SHARD_RE = re.compile(r"^shard-(\d{5})-of-(\d{5})\.jsonl$")
JOB_FILE = "_job.json"


def shard_name(shard_index: int, num_shards: int) -> str:
    """File name of one shard's JSONL output."""
    return f"shard-{shard_index:05d}-of-{num_shards:05d}.jsonl"


def shard_files(output_dir: str | Path) -> list[Path]:
    """The shard JSONL files in a directory, sorted; all must agree on N."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    files = sorted(p for p in output_dir.iterdir() if SHARD_RE.match(p.name))
    counts = {SHARD_RE.match(p.name).group(2) for p in files}
    if len(counts) > 1:
        raise InputError(
            f"{output_dir} mixes shard files of different shard counts ({sorted(counts)}); "
            "a job must be resumed with the num_shards it started with"
        )
    return files


def check_shard_count(output_dir: Path, num_shards: int) -> None:
    """Refuse to add shard files of another shard count to a directory (ids would repeat)."""
    files = shard_files(output_dir)
    if files and int(SHARD_RE.match(files[0].name).group(2)) != num_shards:
        raise InputError(
            f"{output_dir} holds shards of a run with different shard counts "
            f"({files[0].name}, now num_shards={num_shards}); a job must be resumed with the "
            "num_shards it started with, or written to a new output_dir"
        )


def _to_json(value: Any) -> Any:
    """json.dumps fallback: numpy/torch scalars and arrays become plain Python values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def encode_record(record: Mapping[str, Any], record_id: str) -> bytes:
    """One JSON line; NaN/inf are refused (they are not JSON and datasets cannot read them):
    an error naming the record and the field that holds one. A value of a type JSON has no
    form for is align's own bug (a TypeError)."""
    try:
        line = json.dumps(record, ensure_ascii=False, allow_nan=False, default=_to_json)
    except ValueError as err:
        field = next((str(k) for k, v in record.items() if not _is_finite_json(v)), "<output>")
        raise RecordError(record_id, field, f"the output cannot be written as JSON: {err}") from err
    except TypeError as err:
        raise TypeError(f"record {record_id!r}: output cannot be written as JSON: {err}") from err
    return (line + "\n").encode("utf-8")


def _is_finite_json(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False, default=_to_json)
    except (TypeError, ValueError):
        return False
    return True


def iter_lines(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, record) for each complete line of a shard; a trailing partial line is skipped."""
    return iter_jsonl(path, torn_tail=True)


def is_job_shard(path: Path) -> bool:
    """A shard that `align.jobs` appends to (``shard-00000-of-00004.jsonl``)."""
    return SHARD_RE.match(path.name) is not None


def _open_no_symlink(path: Path, flags: int) -> int:
    """Open (creating) a file the job owns, never through a symlink: a shard or lock that
    is a link could append to, or truncate, a file outside the output directory."""
    try:
        return os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as error:
        if error.errno == errno.ELOOP or path.is_symlink():
            raise InputError(f"{path} is a symlink; a job writes only files of its own in its output "
                             "directory: remove the link") from None
        raise


class ShardWriter:
    """Exclusive appender to one shard file: repairs a torn tail, writes whole lines.

    The shard and its lock are opened with ``O_NOFOLLOW``: a symlink in their place is an
    error naming it, never followed out of the output directory.
    """

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        note(path)
        note(path.with_suffix(".lock"))
        self._fd = -1
        self._lock = _open_no_symlink(path.with_suffix(".lock"), os.O_RDWR)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock)
            raise InputError(f"{path} is being written by another process (the same shard run twice at "
                             "once?)") from None
        try:
            self._fd = _open_no_symlink(path, os.O_RDWR | os.O_APPEND)
        except BaseException:
            os.close(self._lock)
            raise
        self._truncate_partial_tail()

    def _truncate_partial_tail(self) -> None:
        size = os.fstat(self._fd).st_size
        if size == 0:
            return
        data = os.pread(self._fd, size, 0)
        keep = data.rfind(b"\n") + 1
        if keep != size:
            os.ftruncate(self._fd, keep)
            os.fsync(self._fd)

    def write(self, line: bytes) -> None:
        """Append one encoded line (a single write, retried only on a short write). A write the disk
        refuses (full) names the shard; the line it cut short is dropped when the shard is opened again."""
        view = memoryview(line)
        with self._naming():
            while view:
                view = view[os.write(self._fd, view):]

    def sync(self) -> None:
        with self._naming():
            os.fsync(self._fd)

    @contextlib.contextmanager
    def _naming(self) -> Iterator[None]:
        """An ``OSError`` of a write names no file: here it names the shard."""
        try:
            yield
        except OSError as exc:
            if exc.filename is None:
                exc.filename = str(self.path)
            raise

    def close(self) -> None:
        try:
            if self._fd >= 0:
                with self._naming():
                    os.fsync(self._fd)
        finally:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            os.close(self._lock)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _same_paths(settings: dict[str, Any]) -> dict[str, Any]:
    """A job's settings with each value that names a local path spelled one way (its real path): a killed
    job resumes whether its model was given as ``runs/sft`` or ``./runs/sft/``."""
    out = {}
    for key, value in settings.items():
        if isinstance(value, str) and value and len(value) < 4096 and "\n" not in value and os.path.exists(value):
            value = os.path.realpath(value)
        out[key] = value
    return out


def check_fingerprint(output_dir: Path, fingerprint: Mapping[str, Any]) -> None:
    """Record the job's settings on first run; refuse to resume with different ones."""
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / JOB_FILE
    wanted = _same_paths(json.loads(json.dumps(fingerprint, sort_keys=True, default=_to_json)))
    note(path)
    tmp = output_dir / f".{JOB_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(wanted, indent=2, sort_keys=True))
    try:
        os.link(tmp, path)  # atomic create-if-absent, safe with shards starting together
        return
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: not a job fingerprint (not valid JSON: {exc}); use a new output_dir") from None
    found = _same_paths(found) if isinstance(found, dict) else found
    if found != wanted:
        diff = sorted(k for k in set(found) | set(wanted) if found.get(k) != wanted.get(k))
        raise InputError(
            f"{output_dir} holds output of a job with other settings (differs in {diff}: "
            f"{ {k: found.get(k) for k in diff} } there, { {k: wanted.get(k) for k in diff} } now); "
            "use a new output_dir or the same settings"
        )


# --------------------------------------------------------------------------- reading a job's output


def output_files(output_dir: str | Path) -> list[str]:
    """The shard files, for `datasets.load_dataset("json", data_files=output_files(d))`.

    Load only a complete output (`align.io.job_is_complete`): a shard being written may end in a torn
    line that `read_output` skips but the `datasets` JSON reader would reject.
    """
    return [str(p) for p in shard_files(output_dir)]


def read_output(
    output_dir: str | Path, *, expect_ids: Iterable[str] | None = None, id_field: str = "id"
) -> list[dict]:
    """All records of all shards; in `expect_ids` order (and checked against it) if given.

    Raises on an id written twice (corruption, or two jobs sharing a directory) and, with
    `expect_ids`, on ids missing from the output or present but not expected.
    """
    merged: dict[str, dict] = {}
    where: dict[str, str] = {}
    for path in shard_files(output_dir):
        for number, record in iter_lines(path):
            rid = record.get(id_field)
            if rid in merged:
                raise InputError(f"id {rid!r} is written twice: {where[rid]} and {path.name}:{number}")
            merged[rid], where[rid] = record, f"{path.name}:{number}"
    if expect_ids is None:
        return list(merged.values())
    expected = list(expect_ids)
    missing = [rid for rid in expected if rid not in merged]
    extra = sorted(set(merged) - set(expected))
    if missing or extra:
        raise InputError(
            f"output in {output_dir} does not match the expected ids: "
            f"{len(missing)} missing {missing[:10]}, {len(extra)} unexpected {extra[:10]}"
        )
    return [merged[rid] for rid in expected]


def ids_of(records_or_ids: Sequence[Any] | Any, id_field: str) -> list[str]:
    if hasattr(records_or_ids, "column_names"):
        return list(records_or_ids[id_field])
    return [r[id_field] if isinstance(r, Mapping) else r for r in records_or_ids]
