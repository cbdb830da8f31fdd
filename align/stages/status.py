"""Where each stage of a pipeline recipe stands, without running or loading anything.

For each stage section, in pipeline order, one line: ``done`` (complete and made from the
recipe's current settings and inputs), ``stale`` (complete, but made from something else:
each difference is named), ``partial`` (started: k of n job shards done, with the
shard options that rerun the missing ones, or the trainer's last checkpoint), or ``not
started``. A change in an early stage makes every later stage that reads its output stale
too: each stage is compared with what the stages before it would produce now, not with
what is on disk. No model loads; input files and weights are hashed (see
docs/environment.md, "Fingerprints", for what that costs).

With rounds (``align pipeline``'s ``rounds: K``, docs/rounds.md) each stage of each round
gets its line, named ``round-k.STAGE`` (``round-2.sample``), then one line per round: done,
in progress (and the step it resumes at), stale (which steps), or not started.

Example: ``align status recipes/tiny/pipeline.yaml`` (the same keys as ``align pipeline``,
overrides included: ``align status recipes/tiny/pipeline.yaml train.beta=3``), or
``align status recipes/tiny/rounds.yaml``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from align.io import stage_completion_info
from align.manifests import build_manifest, dir_key, explain, recorded_manifest
from align.slurm.scripts import array_spec
from align.stages.pipeline import Config as PipelineConfig

_SHARD = re.compile(r"^shard-(\d{5})-of-(\d{5})\.jsonl$")
_DONE = re.compile(r"^shard-(\d{5})-of-(\d{5})\.done\.json$")


@dataclass
class Config(PipelineConfig):
    """The pipeline recipe whose stages to report (``align pipeline``'s keys)."""


def missing_shards(output_dir: Path) -> tuple[int, list[int]] | None:
    """(shard count, shards not done) of a started job output; None if it holds no shards."""
    names = [p.name for p in output_dir.iterdir()] if output_dir.is_dir() else []
    counts = {int(m.group(2)) for n in names if (m := _SHARD.match(n) or _DONE.match(n))}
    if not counts:
        return None
    total = max(counts)
    done = {int(m.group(1)) for n in names if (m := _DONE.match(n)) and int(m.group(2)) == total}
    return total, [i for i in range(total) if i not in done]


def _progress(output_dir: Path, config: Any, name: str = "") -> str:
    """How far a started stage got: job shards done, or the trainer's checkpoints."""
    names = [p.name for p in output_dir.iterdir()]
    shards = missing_shards(output_dir)
    if shards:
        total, missing = shards
        # a SLURM array of the missing shards; NUM_SHARDS, since a resubmitted array alone cannot tell the count
        array = (f"; as a SLURM array: NUM_SHARDS={total} STAGE={name} sbatch --array={array_spec(missing)} "
                 "recipes/slurm/annotate_array.sbatch RECIPE") if name in ("sample", "annotate", "evaluate") else ""
        return (f"{total - len(missing)} of {total} shards done; shards {array_spec(missing)} are missing: rerun each "
                f"with shard_index=K num_shards={total} (a job per shard){array}"
                ) if missing else f"all {total} shards done, not yet marked complete"
    checkpoints = sorted(int(n.split("-")[1]) for n in names if re.fullmatch(r"checkpoint-\d+", n))
    if checkpoints:
        return f"last checkpoint: checkpoint-{checkpoints[-1]} (the stage resumes from it)"
    return "started, nothing finished yet"


def stage_status(name: str, config: Any,
                 overrides: dict[str, tuple[str, str, str | None]]) -> tuple[str, list[str]]:
    """(state, reasons) of one stage; records the fingerprint it will have in ``overrides``."""
    output_dir = getattr(config, "output_dir", None)
    if output_dir is None:
        return "keyed", ["output under cache_dir, named by its cache key (checked when the stage runs)"]
    output_dir = Path(output_dir)
    manifest = build_manifest(name, config, overrides=overrides)
    state, recorded = recorded_manifest(output_dir)
    current = state == "complete" and recorded is not None and recorded.get("fingerprint") == manifest.fingerprint
    # a current output keeps its id; any other will be made anew (a new id: what reads it is stale)
    output_id = (stage_completion_info(output_dir) or {}).get("output_id") if current else None
    overrides[dir_key(output_dir)] = (name, manifest.fingerprint, output_id)
    if state == "empty":
        return "not started", []
    same = recorded is not None and recorded.get("fingerprint") == manifest.fingerprint
    if recorded is None:
        reasons = ["written without a manifest (by an earlier version of align): what it was made from is unknown"]
    else:
        reasons = [] if same else explain(name, output_dir, recorded, manifest)
    if state == "complete":
        return ("done", []) if same else ("stale", reasons)
    progress = _progress(output_dir, config, name)
    if same:
        return "partial", [progress]
    return "partial, from other settings", [progress, *reasons]


def round_state(states: list[tuple[str, str]]) -> tuple[str, list[str]]:
    """(state, reasons) of a round from its steps' (key, state): done, not started, stale, or in
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


def run(config: Config) -> dict[str, Any]:
    """Print one line per stage (and a line per reason); return {step: {state, reasons, ...}}.

    With rounds a step is ``round-k.STAGE``, and each round gets a line too (``round-k``:
    done, in progress and where it resumes, stale, not started).
    """
    overrides: dict[str, tuple[str, str, str | None]] = {}
    report: dict[str, Any] = {}
    steps = config.steps()
    width = max(14, *(len(step.key) for step in steps))
    for step in steps:
        state, reasons = stage_status(step.stage, step.config, overrides)
        where = getattr(step.config, "output_dir", None) or getattr(step.config, "cache_dir", "")
        print(f"{step.key:<{width}} {state:<30} {where}")
        for reason in reasons:
            print(f"{'':<{width}}   {reason}")
        report[step.key] = {"state": state, "reasons": reasons, "output_dir": str(where), "stage": step.stage,
                            "round": step.round}
    for k in sorted({step.round for step in steps if step.round is not None}):
        state, reasons = round_state([(s.key, report[s.key]["state"]) for s in steps if s.round == k])
        print(f"{f'round-{k}':<{width}} {state:<30} " + "; ".join(reasons))
        report[f"round-{k}"] = {"state": state, "reasons": reasons}
    return report
