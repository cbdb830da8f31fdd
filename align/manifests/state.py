"""A stage output directory's manifest files on disk: whether it is complete, partial or
empty, the lock its writers share, and removing what the stage wrote."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from align.io import STAGE_COMPLETE_MARKER, stage_completion_info
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
    except (OSError, json.JSONDecodeError):
        return None


def recorded_manifest(output_dir: str | Path) -> tuple[str, dict[str, Any] | None]:
    """(state, manifest): ``complete``, ``partial`` (started, not finished) or ``empty``."""
    output_dir = Path(output_dir)
    info = stage_completion_info(output_dir) if output_dir.is_dir() else None
    if info is not None:
        return "complete", info.get("manifest")
    started = read_json(output_dir / MANIFEST_FILE)
    if started is not None:
        own = {MANIFEST_FILE, ROWS_FILE, LOCK_FILE, WRITER_LOCK, LEDGER_FILE, *(started.get("preexisting") or [])}
        if all(p.name in own for p in output_dir.iterdir()):
            return "empty", None  # started, but failed before writing anything: nothing to keep
        return "partial", started
    if output_dir.is_dir() and stage_artifacts(output_dir):
        return "partial", None
    return "empty", None


def stage_artifacts(output_dir: Path) -> list[Path]:
    """What a stage of an earlier version (no manifest) leaves: markers, shards, checkpoints, data files."""
    names = re.compile(r"^(_COMPLETE\.json|_job\.json|shard-\d{5}-of-\d{5}\..*|checkpoint-\d+|pairs\.jsonl|"
                       r"skipped\.jsonl|kept\.jsonl|removed\.jsonl)$")
    return [p for p in output_dir.iterdir() if names.match(p.name)]


@contextlib.contextmanager
def locked(output_dir: Path) -> Iterator[None]:
    """One process at a time decides and cleans (SLURM array tasks, ranks of one launch)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(output_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
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
