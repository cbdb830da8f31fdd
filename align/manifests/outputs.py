"""What a finished stage output holds, recorded when it finishes and checked whenever it is trusted.

``_COMPLETE.json`` lists every file the stage wrote with its size and modification time,
and, for data and settings files, the XXH3 digest of its bytes. A later run, ``align
status`` and every stage that reads the output check it: a data file is hashed again and
compared (the rows a later stage would read are exactly those that were made); a weight
file (``.safetensors``, ``.bin``...) is compared by size and modification time, since
hashing 140 GB of weights at every ``align status`` would cost minutes. A file edited,
truncated or replaced after the stage finished makes the output "changed since it was
made", naming the file, and it is never skipped over or read as current.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from align.io.fingerprint import WEIGHT_SUFFIXES, file_digest
from align.io.records import is_marker


def _files(output_dir: Path, names: Iterable[str]) -> list[Path]:
    out: list[Path] = []
    for name in sorted(set(names)):
        path = output_dir / name
        if path.is_symlink() or not path.exists():
            continue
        if path.is_dir():
            out += sorted(p for p in path.rglob("*") if p.is_file() and not p.is_symlink())
        elif path.is_file():
            out.append(path)
    return out


def record_outputs(output_dir: str | Path, names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """relative path -> {size, mtime_ns, digest (not for weight files)} of every file under ``names``."""
    output_dir = Path(output_dir)
    recorded: dict[str, dict[str, Any]] = {}
    for path in _files(output_dir, (n for n in names if not is_marker(n))):
        stat = path.stat()
        entry: dict[str, Any] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
        if path.suffix not in WEIGHT_SUFFIXES:
            entry["digest"] = file_digest(path)
        recorded[str(path.relative_to(output_dir))] = entry
    return recorded


def changed_outputs(output_dir: str | Path, recorded: Mapping[str, Mapping[str, Any]] | None) -> list[str]:
    """The recorded files that are missing, or whose content is not what was recorded (``[]``: as made).

    An output recorded before files were listed (``recorded`` None) is not checked.
    """
    if not recorded:
        return []
    output_dir = Path(output_dir)
    changed = []
    for name, entry in sorted(recorded.items()):
        path = output_dir / name
        try:
            stat = os.stat(path)
        except OSError:
            changed.append(f"{name} (missing)")
            continue
        if stat.st_size != entry.get("size"):
            changed.append(f"{name} ({entry.get('size')} bytes when made, {stat.st_size} now)")
        elif "digest" in entry:
            if file_digest(path) != entry["digest"]:
                changed.append(f"{name} (other bytes)")
        elif stat.st_mtime_ns != entry.get("mtime_ns"):
            changed.append(f"{name} (rewritten since)")
    return changed
