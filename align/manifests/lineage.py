"""What a finished stage output was made from, followed back through the completion markers.

Each finished output records its manifest: the settings, and for each input either the
content fingerprint of a file or model, or the manifest fingerprint and output id of the
earlier stage output it read. Following those back gives the whole chain that made a
policy (base model, SFT data, prompts, reward provider, pairs, method), which is what a
model card states (``align card``). Nothing is hashed again: an earlier output is matched by
the output id it recorded, so an output replaced since is named as such, not described.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from align.errors import InputError
from align.io import stage_completion_info


@dataclass
class Made:
    """One finished stage output of the chain: where it is, its manifest and summary, what it read."""

    path: Path
    stage: str
    output_id: str
    fingerprint: str
    settings: dict[str, Any]
    summary: dict[str, Any]
    inputs: dict[str, dict[str, Any]]  # input key -> the manifest's entry for it
    library: str = ""
    earlier: dict[str, Made | str] = field(default_factory=dict)  # input key -> its output, or why it is not here

    def setting(self, key: str, default: Any = None) -> Any:
        return self.settings.get(key, default)


def read_made(path: Path) -> Made:
    """A finished output's record; an unfinished or unmarked directory is an InputError naming it."""
    info = stage_completion_info(path)
    if info is None:
        raise InputError(f"{path}: not a finished stage output (no completion marker)")
    manifest = info.get("manifest")
    if not isinstance(manifest, dict) or not info.get("output_id"):
        raise InputError(f"{path}: its completion marker holds no manifest (written by an earlier version of "
                         "align): what it was made from is not recorded")
    missing = [key for key in ("stage", "fingerprint", "settings", "inputs", "library") if key not in manifest]
    if missing:
        raise InputError(f"{path}: the manifest in its completion marker lacks {missing}: not one align wrote")
    return Made(path=path, stage=str(manifest["stage"]), output_id=str(info["output_id"]),
                fingerprint=str(manifest["fingerprint"]), settings=dict(manifest["settings"]),
                summary=dict(info.get("summary") or {}), inputs=dict(manifest["inputs"]),
                library=str(manifest["library"]))


def locate(recorded: str, reader: Path) -> Path | None:
    """Where an input path recorded by a run is now: as written (from here), else under an ancestor of the
    output that read it (a recipe's relative paths are relative to where it ran, usually above its outputs)."""
    candidate = Path(recorded).expanduser()
    if candidate.is_absolute() or candidate.exists():
        return candidate if candidate.exists() else None
    for ancestor in reader.resolve().parents:
        if (ancestor / candidate).exists():
            return ancestor / candidate
    return None


def _stage_dir(found: Path, entry: dict[str, Any]) -> Path:
    """A stage input may name one data file of the output (``@pairs/pairs.jsonl``, recorded with ``file``):
    its directory."""
    return found.parent if entry.get("file") else found


def trace(path: Path) -> Made:
    """The output at ``path`` with every earlier stage output it read, recursively (each read once)."""
    seen: dict[Path, Made] = {}

    def visit(where: Path) -> Made:
        key = where.resolve()
        if key not in seen:
            made = seen[key] = read_made(where)
            for name, entry in made.inputs.items():
                if entry.get("kind") == "stage":
                    made.earlier[name] = _earlier(entry, where, visit)
        return seen[key]

    return visit(Path(path))


def _earlier(entry: dict[str, Any], reader: Path, visit) -> Made | str:
    """The earlier output an input entry names, or why it cannot be described (gone, replaced)."""
    found = locate(str(entry["path"]), reader)
    if found is None:
        return f"{entry['path']}: not found from here"
    try:
        made = visit(_stage_dir(found, entry))
    except InputError as exc:
        return str(exc)
    if made.output_id != entry.get("output_id"):
        return f"{entry.get('path')}: replaced since it was read (another output id)"
    return made


def walk(made: Made) -> Iterator[Made]:
    """Every output of the chain once, earliest first."""
    done: set[str] = set()

    def visit(node: Made) -> Iterator[Made]:
        for earlier in node.earlier.values():
            if isinstance(earlier, Made) and earlier.output_id not in done:
                yield from visit(earlier)
        if node.output_id not in done:
            done.add(node.output_id)
            yield node

    return visit(made)


def sources(made: Made) -> Iterator[tuple[Made, str, dict[str, Any]]]:
    """Every input no stage made (a data file, a model, a charter), with the output that read it and its key."""
    for node in walk(made):
        for name, entry in node.inputs.items():
            if entry.get("kind") != "stage":
                yield node, name, entry
