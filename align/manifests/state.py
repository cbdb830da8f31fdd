"""A stage output directory's manifest files on disk: whether it is complete, partial or
empty, the lock its writers share, and removing what the stage wrote."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from align.errors import InputError, NotWritableError
from align.io import STAGE_COMPLETE_MARKER, stage_completion_info
from align.io.disk import not_writable_message
from align.io.ledger import LEDGER_FILE, written
from align.io.records import is_marker

MANIFEST_FILE = "_manifest.json"
ROWS_FILE = "_manifest_rows.json"
LOCK_FILE = ".align-stage.lock"
WRITER_LOCK = ".align-writer.lock"
# The library's own files in a stage output: never a user's, removed with the output they describe
OWN_MARKERS = (STAGE_COMPLETE_MARKER, ROWS_FILE, LEDGER_FILE, "_job.json")


def read_json(path: Path) -> Any:
    """The JSON in ``path``, or None where it is missing or half-written."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None


def started_manifest(output_dir: str | Path) -> dict[str, Any] | None:
    """The manifest a run recorded when it started (``_manifest.json``), or None where there is
    none or it cannot be read (``unreadable_manifest`` says why)."""
    found = read_json(Path(output_dir) / MANIFEST_FILE)
    return found if isinstance(found, dict) else None


def unreadable_manifest(output_dir: str | Path) -> str | None:
    """Why ``output_dir``'s ``_manifest.json`` cannot be read (cut short, not JSON, not a mapping),
    or None where it reads or is absent. A manifest that is there but unreadable is no sign of an
    earlier version: its writer was cut off (a full disk, a killed copy)."""
    path = Path(output_dir) / MANIFEST_FILE
    if not path.is_file():
        return None
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    except UnicodeDecodeError:
        return "unreadable (not UTF-8 text)"
    except json.JSONDecodeError as exc:
        return f"truncated or not valid JSON (line {exc.lineno}: {exc.msg})"
    return None if isinstance(found, dict) else f"not a manifest (a JSON {type(found).__name__})"


def recorded_manifest(output_dir: str | Path) -> tuple[str, dict[str, Any] | None]:
    """(state, manifest): ``complete``, ``partial`` (started, not finished) or ``empty``."""
    output_dir = Path(output_dir)
    info = stage_completion_info(output_dir) if output_dir.is_dir() else None
    if info is not None:
        return "complete", info.get("manifest")
    started = started_manifest(output_dir)
    if started is not None:
        own = {MANIFEST_FILE, ROWS_FILE, LOCK_FILE, WRITER_LOCK, LEDGER_FILE, *(started.get("preexisting") or [])}
        if all(p.name in own for p in output_dir.iterdir()):
            return "empty", None  # started, but failed before writing anything: nothing to keep
        return "partial", started
    if output_dir.is_dir() and (stage_artifacts(output_dir) or unreadable_manifest(output_dir)):
        return "partial", None  # a stage's work, of unknown settings
    return "empty", None


def stage_artifacts(output_dir: Path) -> list[Path]:
    """What a stage of an earlier version (no manifest) leaves: markers, shards, checkpoints, data files."""
    names = re.compile(r"^(_COMPLETE\.json|_job\.json|shard-\d{5}-of-\d{5}\..*|checkpoint-\d+|pairs\.jsonl|"
                       r"skipped\.jsonl|kept\.jsonl|removed\.jsonl)$")
    return [p for p in output_dir.iterdir() if names.match(p.name)]


def open_lock(path: Path, stage: str) -> int:
    """Open (creating) one of the library's lock files, never through a symbolic link.

    A lock that is a directory, a symbolic link, or a file that cannot be opened for writing
    (immutable, or on a read-only mount) is refused by name, saying what to remove or make
    writable: a lock is a file the library writes, and only that.
    """
    who = f"{stage}: "
    if path.is_symlink():
        raise InputError(f"{who}{path} is a symbolic link, not a lock file this library writes; remove the link "
                         "(nothing it points to is touched), then run again")
    if path.is_dir():
        raise InputError(f"{who}{path} is a directory, not a lock file this library writes; remove it (rmdir, "
                         "after moving out anything of yours), then run again")
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        if exc.errno == errno.EROFS:
            raise NotWritableError(not_writable_message(stage or "align", path, exc.errno)) from None
        if exc.errno not in (errno.EACCES, errno.EPERM, errno.ELOOP, errno.EISDIR):
            raise
        raise InputError(f"{who}{path} cannot be opened for writing ({exc.strerror}): remove it (an immutable file: "
                         "chattr -i it first), then run again") from None


@contextlib.contextmanager
def locked(output_dir: Path, stage: str) -> Iterator[None]:
    """One process at a time decides and cleans (SLURM array tasks, ranks of one launch)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    fd = open_lock(output_dir / LOCK_FILE, stage)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def remove_stage_output(output_dir: Path, started: Mapping[str, Any] | None,
                        info: Mapping[str, Any] | None = None) -> tuple[list[str], list[str]]:
    """Remove what the stage wrote: the entries its ledger holds and the files its completion marker
    lists (and the library's own markers); (removed, kept: entries the stage did not write)."""
    names = set(written(output_dir)) | {name.split("/", 1)[0] for name in ((info or {}).get("files") or {})}
    names |= set(OWN_MARKERS)
    keep = set((started or {}).get("preexisting") or []) | {LOCK_FILE, WRITER_LOCK, MANIFEST_FILE}
    victims = [p for p in output_dir.iterdir() if p.name in names and p.name not in keep]
    for path in victims:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    kept = sorted(p.name for p in output_dir.iterdir() if p.name not in names and p.name not in keep
                  and not p.name.startswith(".") and not is_marker(p.name))
    return sorted(p.name for p in victims), kept
