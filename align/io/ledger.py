"""What a stage wrote in its output directory, recorded as it writes: the list ``overwrite=true`` removes.

A stage output directory may hold files its owner put there (notes, a README, another
tool's outputs). Removing "everything that was not there before" would delete those; a
name pattern would delete a user's file that happens to match. So each entry a stage
creates at the top of its directory (a file, a shard, a checkpoint directory) is appended
to ``_written.jsonl`` before it is created, and an overwrite removes exactly those.

``open_ledger(output_dir)`` makes a directory's ledger active in this process: from then
on, the library's writers (``atomic_write``, the job shards) note every top-level entry
they create under it (``note``). Writers elsewhere (a trainer's checkpoints) call ``note``
themselves, and the stage notes what is left when it finishes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

LEDGER_FILE = "_written.jsonl"
# the library's own bookkeeping files: never listed (an overwrite handles them by name)
_BOOKKEEPING = frozenset({LEDGER_FILE, "_COMPLETE.json", "_manifest.json", "_manifest_rows.json"})
_ACTIVE: dict[str, set[str]] = {}  # real path of an active output directory -> the names noted


def _real(path: str | Path) -> str:
    return os.path.realpath(os.path.expanduser(str(path)))


def open_ledger(output_dir: str | Path) -> None:
    """Note the entries this process creates in ``output_dir`` from now on."""
    _ACTIVE[_real(output_dir)] = set(written(output_dir))


def close_ledger(output_dir: str | Path) -> None:
    _ACTIVE.pop(_real(output_dir), None)


def note(path: str | Path) -> None:
    """Record ``path``'s top-level entry in the ledger of the active output directory holding it (if any)."""
    if not _ACTIVE:
        return
    real = _real(path)
    for root, names in _ACTIVE.items():
        if real.startswith(root + os.sep):
            name = real[len(root) + 1:].split(os.sep, 1)[0]
            if name and name not in names and name not in _BOOKKEEPING:
                names.add(name)
                _append(Path(root), [name])
            return


def note_names(output_dir: str | Path, names: Iterable[str]) -> None:
    """Record entries of ``output_dir`` by name (what a stage finds it made when it finishes)."""
    known = _ACTIVE.get(_real(output_dir))
    new = [n for n in names if n not in _BOOKKEEPING and (known is None or n not in known)]
    if known is not None:
        known.update(new)
    if new:
        _append(Path(output_dir), new)


def _append(output_dir: Path, names: list[str]) -> None:
    """One line per name, each a single O_APPEND write: array tasks append to one ledger safely."""
    output_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(output_dir / LEDGER_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        for name in names:
            os.write(fd, (json.dumps(name, ensure_ascii=False) + "\n").encode())
    finally:
        os.close(fd)


def written(output_dir: str | Path) -> list[str]:
    """The names the ledger holds (each once, in the order first noted); a torn last line is left out."""
    path = Path(output_dir) / LEDGER_FILE
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    names: dict[str, None] = {}
    for line in text.splitlines():
        try:
            name = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(name, str) and name and "/" not in name and name not in (".", ".."):
            names[name] = None
    return list(names)
