"""Where each step of a recipe stands, without running or loading anything.

For each step, in order, one line: ``done`` (complete, made from the recipe's current
settings and inputs, and unchanged since), ``stale`` (complete, but made from something
else, or edited since: each difference is named), ``partial`` (started: k of n job shards
done, or the trainer's last checkpoint), or ``not started``. A change in an early step makes
every later step that reads its output stale too: each step is compared with what the steps
before it would produce now. No model loads, and no device is checked (a login node without
a GPU reads a recipe whose training steps use bf16); input files and weights are hashed.
To run what is missing on a cluster, run ``align submit RECIPE`` again: it submits exactly
the steps and shards that are not done.

With rounds (docs/rounds.md) each step of each round gets its line (``round-2.sample``),
then one line per round: done, in progress (and the step it resumes at), stale, or not
started.

Example: ``align status recipes/tiny/pipeline.yaml`` (overrides as for ``align pipeline``:
``align status recipes/tiny/pipeline.yaml train.beta=3``), ``align status
recipes/apertus-8b/pipeline.yaml``, or a stage file: ``align status recipes/apertus-8b/qrpo.yaml``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from align.drivers.args import recipe_from_args
from align.io import stage_completion_info
from align.manifests.status import Outputs, round_state, step_state
from align.recipe import PipelineSettings, Recipe
from align.recipe.graph import path_key
from align.slurm.commands import JobState, job_states


@dataclass
class Config(PipelineSettings):
    """The recipe whose steps to report (``align pipeline``'s keys)."""


def config_from_args(args: Sequence[str]) -> Recipe:
    """``align status RECIPE [key=value ...]``: the recipe read as a login node reads it (no device checks)."""
    return recipe_from_args("status", args)


def split_counts(recipe: Recipe, report: dict[str, Any]) -> list[str]:
    """One line per split of rows by ``where:`` whose branches are all done: the rows each branch took and
    the rows no branch took, out of the rows they read (from the branches' own summaries)."""
    groups: dict[str, list[Any]] = {}  # the real path the branches read -> [(step, config)]
    if recipe.settings.stop_after is not None:  # branches after the stop are not in this reading of the recipe
        return []
    for step in recipe:
        config = recipe.config(step)
        if step.stage == "annotate" and config.where and isinstance(config.input, str):
            groups.setdefault(path_key(config.input), []).append((step, config))
    lines = []
    for branches in groups.values():
        if any(report[step.name]["state"] != "done" for step, _ in branches):
            continue
        # done: each branch's marker holds its summary, with the rows it took and those it left (where: is set)
        summaries = [(step.name, stage_completion_info(config.output_dir)["summary"]) for step, config in branches]
        if any("not_selected" not in summary for _, summary in summaries):  # made by a version that did not count
            continue
        total = summaries[0][1]["records"] + summaries[0][1]["not_selected"]
        taken = {name: summary["records"] for name, summary in summaries}
        rest = total - sum(taken.values())
        lines.append(f"split of {branches[0][1].input}: " + ", ".join(f"{n} {c}" for n, c in taken.items())
                     + f", in no branch {rest} (of {total} rows)")
    return lines


def submitted_jobs(recipe: Recipe) -> dict[str, dict[str, Any]]:
    """The jobs the last ``align submit`` of this recipe recorded (``slurm.log_dir/jobs.json``), by step."""
    path = Path(recipe.settings.slurm.log_dir) / "jobs.json"
    try:
        jobs = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {name: entry for name, entry in jobs.items() if isinstance(entry, dict) and entry.get("job_id")}


def job_lines(states: list[JobState]) -> list[str]:
    """A job's lines: its tasks that completed counted in one line (an array of 16 says so once), then each
    task that did not, as SLURM reports it."""
    done = [state for state in states if state.state == "COMPLETED"]
    lines = [state.describe() for state in states if state.state != "COMPLETED"]
    if len(done) > 1:
        return [f"{len(done)} tasks COMPLETED", *lines]
    return lines + [state.describe() for state in done]


def run(recipe: Recipe) -> dict[str, Any]:
    """Print one line per step (and a line per reason); return {step: {state, reasons, ...}}."""
    outputs: Outputs = {}
    report: dict[str, Any] = {}
    steps = list(recipe)
    jobs = submitted_jobs(recipe)
    width = max(14, *(len(step.name) for step in steps))
    for step in steps:
        config = recipe.config(step)
        found = step_state(step.stage, config, outputs)
        where = config.output_dir if config.output_dir is not None else config.cache_dir  # cache_dir: logprobs
        print(f"{step.name:<{width}} {found.state:<30} {where}".rstrip())
        for reason in found.reasons:
            print(f"{'':<{width}}   {reason}")
        report[step.name] = {"state": found.state, "reasons": found.reasons, "output_dir": str(where),
                             "stage": step.stage, "round": step.round}
        if found.state != "done" and step.name in jobs:
            report[step.name]["jobs"] = job_lines(job_states(str(jobs[step.name]["job_id"])))
            for line in report[step.name]["jobs"]:
                print(f"{'':<{width}}   {line}")
    for line in split_counts(recipe, report):
        print(line)
    for k in sorted({step.round for step in steps if step.round is not None}):
        state, reasons = round_state([(s.name, report[s.name]["state"]) for s in steps if s.round == k])
        print((f"{f'round-{k}':<{width}} {state:<30} " + "; ".join(reasons)).rstrip())
        report[f"round-{k}"] = {"state": state, "reasons": reasons}
    if any(r["state"].startswith("partial") or r["state"] == "not started" for r in report.values()):
        print(f"To run what is not done: align pipeline {recipe.source or 'RECIPE'} (here), or align submit "
              f"{recipe.source or 'RECIPE'} (on the cluster: only the missing steps and shards)")
    return report
