"""Content fingerprints of the inputs a stage's settings name: another stage's output (by
its manifest fingerprint and output id), a model, a tokenizer, a data file or directory,
a hub name, the judge's charter; and per-row digests for naming which rows changed."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from align.io import stage_completion_info
from align.io.records import is_marker
from align.manifests.outputs import changed_outputs
from align.io.fingerprint import (
    WEIGHT_SUFFIXES,
    file_digest,
    files_fingerprint,
    json_digest,
    weight_files,
)


def _data_files(directory: Path) -> list[Path]:
    """Every file under a directory, except hidden files and lock files (they hold no content)."""
    return sorted(p for p in directory.rglob("*") if p.is_file() and not p.name.startswith(".")
                  and p.suffix != ".lock" and not any(part.startswith(".") for part in p.relative_to(directory).parts))


def _relative_fingerprint(directory: Path, files: Sequence[Path]) -> str:
    return json_digest([[str(p.relative_to(directory)), p.stat().st_size, file_digest(p)] for p in files])


def dir_key(path: str | Path) -> str:
    """One spelling per directory (relative, absolute, through a symlink): how outputs are matched."""
    return os.path.realpath(os.path.expanduser(str(path)))


def fingerprint_input(value: str, overrides: Mapping[str, tuple[str, str, str | None]] | None = None,
                      *, key: str = "") -> dict[str, Any]:
    """The content fingerprint of one input path: a stage output, a model, a data file or directory.

    Another stage's output is bound by its manifest fingerprint and its output id (a new id
    each time the output is made: a re-made earlier output, even from the same settings, is
    other bytes). ``overrides`` maps a stage output directory (``dir_key``) to (stage, the
    manifest fingerprint, the output id) it will have: ``align status`` passes what an
    earlier stage of the same pipeline would produce (id None: it is to be made).
    """
    path = Path(value).expanduser()
    entry: dict[str, Any] = {"path": str(value)}
    for stage_dir in (path, path.parent):  # the output itself, or a file in it (pairs.jsonl)
        if overrides and dir_key(stage_dir) in overrides:
            stage, fingerprint, output_id = overrides[dir_key(stage_dir)]
            entry.update(kind="stage", stage=stage, fingerprint=fingerprint, output_id=output_id)
            if stage_dir != path:
                entry["file"] = path.name
            return entry
    stage_dir = path if path.is_dir() else path.parent
    info = stage_completion_info(stage_dir) if stage_dir.is_dir() else None
    if info and info.get("manifest_fingerprint"):
        entry.update(kind="stage", stage=info.get("stage"), fingerprint=info["manifest_fingerprint"],
                     output_id=info.get("output_id"))
        changed = changed_outputs(stage_dir, info.get("files"))
        if changed:  # edited since it was made: not the output its id names
            entry["changed"] = changed
        if stage_dir != path:
            entry["file"] = path.name
        return entry
    if key.rsplit(".", 1)[-1] == "tokenizer" and path.is_dir():  # its own files, not a model's weights
        files = [p for p in sorted(path.iterdir()) if p.is_file() and p.suffix not in WEIGHT_SUFFIXES
                 and not p.name.startswith(".")]
        entry.update(kind="tokenizer", fingerprint=files_fingerprint(files))
        return entry
    if path.is_file():
        entry.update(kind="file", fingerprint=file_digest(path))
    elif path.is_dir():
        weights = weight_files(path)
        if weights:  # a checkpoint: its weights, config and tokenizer files (top level)
            files = [p for p in sorted(path.iterdir()) if p.is_file() and not p.name.startswith(".")
                     and p.suffix != ".lock" and not is_marker(p.name)]
            entry.update(kind="model", fingerprint=files_fingerprint(files),
                         files={p.name: file_digest(p)[:16] for p in files})
        else:
            entry.update(kind="directory", fingerprint=_relative_fingerprint(path, _data_files(path)))
    else:
        entry.update(kind="name", fingerprint=json_digest(str(value)))  # a hub name: compared by name
    return entry


def charter_input(value: str | None) -> dict[str, Any]:
    """The charter text the judge's prompts start with (layout-only edits to the file do not count)."""
    from rewards.charter import charter_fingerprint

    return {"path": str(value) if value else "default", "kind": "charter", "fingerprint": charter_fingerprint(value)}


def row_digests(rows: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """id (or ``<row i>``) -> a short digest of the row, for naming which rows changed."""
    out = {}
    for index, row in enumerate(rows):
        rid = row.get("id") if isinstance(row, Mapping) else None
        out[rid if isinstance(rid, str) and rid else f"<row {index}>"] = json_digest(row)[:16]
    return out
