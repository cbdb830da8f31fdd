"""Where a recipe's steps stand, read from their outputs without running or loading anything.

Each step is compared with what the steps before it would produce now, not with what is on
disk: a change in an early step makes every later step that reads its output stale too.
``align status`` prints these; ``align submit`` submits from them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from align.io import stage_completion_info
from align.manifests.differences import explain
from align.manifests.inputs import dir_key
from align.manifests.manifest import build_manifest
from align.manifests.outputs import changed_outputs
from align.manifests.state import MANIFEST_FILE, recorded_manifest, unreadable_manifest

_SHARD = re.compile(r"^shard-(\d{5})-of-(\d{5})\.jsonl$")
_DONE = re.compile(r"^shard-(\d{5})-of-(\d{5})\.done\.json$")
# Overrides: output directory (dir_key) -> (stage, the manifest fingerprint it will have, its output id or None)
Outputs = dict[str, tuple[str, str, str | None]]


@dataclass
class StepState:
    """One step's state: ``done``, ``stale``, ``partial``, ``partial, from other settings``,
    ``not started`` or ``keyed``, why, and (partial job outputs) the shards still missing."""

    state: str
    reasons: list[str] = field(default_factory=list)
    shards: tuple[int, list[int]] | None = None  # (shard count, missing shards)

    @property
    def needs_redo(self) -> bool:
        """Made from something else, or changed since: ``overwrite=true`` redoes it."""
        return self.state in ("stale", "partial, from other settings")


def missing_shards(output_dir: Path) -> tuple[int, list[int]] | None:
    """(shard count, shards not done) of a started job output; None if it holds no shards."""
    names = [p.name for p in output_dir.iterdir()] if output_dir.is_dir() else []
    counts = {int(m.group(2)) for n in names if (m := _SHARD.match(n) or _DONE.match(n))}
    if not counts:
        return None
    total = max(counts)
    done = {int(m.group(1)) for n in names if (m := _DONE.match(n)) and int(m.group(2)) == total}
    return total, [i for i in range(total) if i not in done]


def shard_list(indices: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2,5``."""
    parts, start = [], None
    for i, value in enumerate(indices):
        if start is None:
            start = value
        if i + 1 == len(indices) or indices[i + 1] != value + 1:
            parts.append(str(start) if start == value else f"{start}-{value}")
            start = None
    return ",".join(parts)


def progress(output_dir: Path) -> tuple[str, tuple[int, list[int]] | None]:
    """How far a started step got (job shards done, or a trainer's last checkpoint), and its missing shards."""
    shards = missing_shards(output_dir)
    if shards:
        total, missing = shards
        if not missing:
            return f"all {total} shards done, not yet marked complete (the next run of the step marks it)", shards
        return (f"{total - len(missing)} of {total} shards done; shards {shard_list(missing)} are missing", shards)
    checkpoints = sorted(int(p.name.split("-")[1]) for p in output_dir.iterdir()
                         if re.fullmatch(r"checkpoint-\d+", p.name))
    if checkpoints:
        return f"last checkpoint: checkpoint-{checkpoints[-1]} (the step resumes from it)", None
    return "started, nothing finished yet", None


def step_state(stage: str, config: Any, outputs: Outputs) -> StepState:
    """A step's state; records in ``outputs`` the fingerprint its output will have (for the steps after it)."""
    output_dir = config.output_dir  # every stage's config has one; None: a logprobs pass keyed under cache_dir
    if output_dir is None:
        return StepState("keyed", ["output under cache_dir, named by its cache key (checked when the step runs)"])
    output_dir = Path(output_dir)
    manifest = build_manifest(stage, config, overrides=outputs)
    state, recorded = recorded_manifest(output_dir)
    same = recorded is not None and recorded.get("fingerprint") == manifest.fingerprint
    info = stage_completion_info(output_dir) if state == "complete" else None
    changed = changed_outputs(output_dir, (info or {}).get("files")) if same and info else []
    current = state == "complete" and same and not changed
    # a current output keeps its id; any other will be made anew (a new id: what reads it is stale)
    outputs[dir_key(output_dir)] = (stage, manifest.fingerprint, (info or {}).get("output_id") if current else None)
    if state == "empty":
        return StepState("not started")
    problem = unreadable_manifest(output_dir) if recorded is None else None
    if problem is not None:
        return StepState("stale", [(f"its manifest ({MANIFEST_FILE}) is {problem}: what the partial output was "
                                    "made from is unknown; rerun the step with overwrite=true to redo it")])
    if recorded is None:
        return StepState("stale", ["written without a manifest (by an earlier version of align): what it was made "
                                   "from is unknown; remove it to redo it"])
    if state == "complete":
        if current:
            return StepState("done")
        if changed:
            return StepState("stale", [f"changed since it was made: {'; '.join(changed[:5])}"])
        return StepState("stale", explain(stage, output_dir, recorded, manifest))
    how_far, shards = progress(output_dir)
    if same:
        return StepState("partial", [how_far], shards)
    return StepState("partial, from other settings", [how_far, *explain(stage, output_dir, recorded, manifest)],
                     shards)


def round_state(states: list[tuple[str, str]]) -> tuple[str, list[str]]:
    """(state, reasons) of a round from its steps' (name, state): done, not started, stale, or in
    progress (and the step it resumes at)."""
    if all(state == "done" for _, state in states):
        return "done", []
    if all(state == "not started" for _, state in states):
        return "not started", []
    stale = [key for key, state in states if state == "stale" or state.endswith("from other settings")]
    if stale:
        return "stale", [f"made from other settings or inputs: {', '.join(stale)}"]
    first = next(key for key, state in states if state != "done")
    return "in progress", [f"resumes at {first}"]
