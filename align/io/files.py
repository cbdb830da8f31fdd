"""JSON and JSONL files: the one line reader, and writers that replace a file atomically.

Every writer goes through ``atomic_write`` (a temp file in the same directory, fsync'ed,
then renamed over the target), so a reader sees the old file or the new one, never half.
The file gets the mode any other output gets (0666 less the umask: 0644 under umask 022),
not the private 0600 of a temp file.
"""

from __future__ import annotations

import json
import os
import re
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from align.errors import AlignError, ConfigError, InputError
from align.io.ledger import note


def _file_line(path: Path, line: int) -> str:
    return f"{path}:{line}"


MAX_DEPTH = 64  # JSON nesting a row may have: conversations and tool calls need a handful of levels
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}")


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


_SETTING_VARIABLE = re.compile(r"\$(\w+|\{\w+\})")


def expand_variables(text: str, *, named: str, what: str) -> str:
    """``$VAR`` / ``${VAR}`` in a setting (a path, a URL) replaced by the environment's value; an unset one is
    a ``ConfigError`` naming the setting (``named``: how the message shows it; ``what``: "path", "URL")."""
    unset = [n for n in (m.strip("{}") for m in _SETTING_VARIABLE.findall(text)) if n not in os.environ]
    if unset:
        raise ConfigError(f"{named}: ${unset[0]} is not set in this environment (a {what} with $VAR takes the "
                          f"variable's value; set it, or write the {what} out)")
    return _SETTING_VARIABLE.sub(lambda m: os.environ[m.group(1).strip("{}")], text)


def _depth(value: Any) -> int:
    """How deep a parsed JSON value nests (iteratively: a deep value must not exhaust the stack here)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, level = todo.pop()
        if isinstance(item, dict):
            items = item.values()
        elif isinstance(item, list):
            items = item
        else:
            continue
        deepest = max(deepest, level)
        if deepest > MAX_DEPTH:
            return deepest
        todo.extend((child, level + 1) for child in items)
    return deepest


def _lone_surrogate(value: Any) -> str | None:
    """The first string holding half of a UTF-16 surrogate pair (not text: it cannot be encoded), else None."""
    todo = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, str):
            if any("\ud800" <= ch <= "\udfff" for ch in item):
                return item
        elif isinstance(item, dict):
            todo.extend(item.keys())
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)
    return None


def parse_json(text: str, where: str) -> Any:
    """One JSON document as the library's readers accept it: no key twice in an object, at most
    ``MAX_DEPTH`` levels, no lone surrogate (``\\ud800`` alone is not text); anything else is an
    ``InputError`` naming ``where`` (``file:line``)."""
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicates)
    except _DuplicateKey as exc:
        raise InputError(f"{where}: the key {str(exc)!r} is given twice in one object (JSON would keep the last "
                         "silently); give each key once") from None
    except RecursionError:
        raise InputError(f"{where}: nested deeper than {MAX_DEPTH} levels (a row holds messages, tools and "
                         "tool calls a few levels deep)") from None
    if _depth(value) > MAX_DEPTH:
        raise InputError(f"{where}: nested deeper than {MAX_DEPTH} levels (a row holds messages, tools and tool "
                         "calls a few levels deep)")
    if _SURROGATE_ESCAPE.search(text) and (bad := _lone_surrogate(value)) is not None:
        raise InputError(f"{where}: holds a lone UTF-16 surrogate escape (in {bad[:40]!r}): half of a character, "
                         "which cannot be encoded; fix the text that produced it")
    return value


def iter_jsonl(path: str | Path, *, torn_tail: bool = False,
               where: Callable[[Path, int], str] = _file_line) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) for each non-blank line of a JSONL file, one JSON object a line.

    A final line without its newline is, with ``torn_tail`` (a job shard, see
    ``align.io.shards``), a record a killed writer left half-written: skipped, the job redoes
    it. Otherwise it is read when it parses, and a truncated file (a ``ValueError``) when
    it does not. Any other bad line is an ``InputError`` (a ``ValueError``) naming
    ``file:line`` (``where`` writes that location).
    """
    path = Path(path)
    with path.open(encoding="utf-8") as handle:
        for number, line in _utf8_lines(path, handle, where):
            if not line.strip():
                continue
            if not line.endswith("\n"):
                if torn_tail:
                    break  # a trailing half-written line from a killed writer is not a record
                try:
                    record = parse_json(line, where(path, number))
                except json.JSONDecodeError as exc:
                    raise InputError(f"{where(path, number)}: truncated last line (not valid JSON, no newline: "
                                     f"{exc.msg}); the file was cut short") from exc
            else:
                try:
                    record = parse_json(line, where(path, number))
                except json.JSONDecodeError as exc:
                    raise InputError(f"{where(path, number)}: not valid JSON ({exc.msg})") from exc
            if not isinstance(record, dict):
                raise InputError(
                    f"{where(path, number)}: expected a JSON object per line, got {type(record).__name__}")
            yield number, record


def _utf8_lines(path: Path, handle: IO[str], where: Callable[[Path, int], str]) -> Iterator[tuple[int, str]]:
    """(line number, line) of a text file; bytes that are not UTF-8 are an error naming the line."""
    try:
        yield from enumerate(handle, 1)
    except UnicodeDecodeError as exc:
        number, offset, byte = _first_bad_byte(path)  # the text reader decodes ahead: find the byte itself
        raise InputError(f"{where(path, number)}: not UTF-8 text: byte {offset} is {byte!r} ({exc.reason}); JSONL "
                         "is read as UTF-8: save it as UTF-8 (a Latin-1 file: iconv -f latin1 -t utf-8)") from None


def _first_bad_byte(path: Path) -> tuple[int, int, bytes]:
    """(line number, byte offset in the file, the byte) of the first byte that is not UTF-8."""
    offset = 0
    with path.open("rb") as raw:
        for number, line in enumerate(raw, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as exc:
                return number, offset + exc.start, line[exc.start:exc.start + 1]
            offset += len(line)
    return 1, 0, b""


def read_text(path: str | Path, *, error: type[AlignError] = InputError, what: str = "") -> str:
    """A text file a user wrote (a recipe, a ``from:`` file, a charter, a prompt file), read as
    UTF-8 whatever the locale. Bytes that are not UTF-8 are one ``error`` naming the file, the
    byte offset and line; so is a path that is not a regular file (a FIFO would block the read
    forever). ``what`` says what the file is for (``charter``), before its path."""
    path = Path(path)
    label = f"{what} {path}" if what else str(path)
    try:
        regular = stat.S_ISREG(os.stat(path).st_mode)
        data = path.read_bytes() if regular else b""
    except FileNotFoundError:
        raise error(f"{label}: file not found") from None
    except OSError as exc:
        raise error(f"{label}: cannot be read ({exc.strerror or exc})") from None
    if not regular:
        raise error(f"{label}: not a regular file (a FIFO, a device or a directory); name a text file")
    return decode_utf8(data, label, error=error)


def decode_utf8(data: bytes, label: str, *, error: type[AlignError] = InputError) -> str:
    """``data`` as UTF-8 text; otherwise one ``error`` naming ``label``, the byte offset and line."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise error(f"{label}: not UTF-8 text: byte {exc.start} (line {line}) is {data[exc.start:exc.start + 1]!r} "
                    f"({exc.reason}); align reads text files as UTF-8: save it as UTF-8 (a Latin-1 file: "
                    f"iconv -f latin1 -t utf-8)") from None


def _umask() -> int:
    """The process umask: from /proc where the kernel says it, else read by setting it and
    setting it straight back (a moment in which another thread could create a file)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path: str | Path, write: Callable[[IO[str]], None]) -> Path:
    """Create or replace ``path`` with what ``write(handle)`` writes: temp file, fsync, rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    note(path)  # the stage's ledger, when its output directory holds it (align.io.ledger)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 would make this one output private
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename is None:
            exc.filename = str(path)  # a write or fsync names no file: name the one it was for (a full disk)
        raise
    return path


def write_jsonl(path: str | Path, records: Iterable[Mapping[str, Any]], *,
                default: Callable[[Any], Any] | None = None) -> Path:
    """Write records atomically, one JSON object a line (``default``: as in ``json.dumps``)."""

    def write(handle: IO[str]) -> None:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False, default=default) + "\n")

    return atomic_write(path, write)


def write_json(path: str | Path, data: Any) -> Path:
    """Write one JSON document atomically (indented, non-ASCII kept, a final newline)."""

    def write(handle: IO[str]) -> None:
        json.dump(data, handle, indent=2, ensure_ascii=False, default=str)
        handle.write("\n")

    return atomic_write(path, write)
