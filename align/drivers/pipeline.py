"""Every step of a recipe, in order, each skipped when its output is already complete and current.

A recipe is a step graph (``steps:``, named steps of any stage type, each reading earlier
steps' outputs by ``@NAME``) or one section per stage (``sft``, ``sample``, ``annotate``,
``pairs``, ``logprobs``, ``train``, ``evaluate``; ``decontaminate`` optional), with
``defaults`` merged under every step that has the key, at every depth (docs/pipeline.md).
Each step marks its output complete only when it has finished, and the long stages resume
inside themselves (job shards, trainer checkpoints), so a killed pipeline rerun with the same
command picks up where it stopped and redoes nothing that finished.

Each output records what it was made from (its manifest) and what it holds. A step whose
output was made from other settings or inputs, or was edited since, stops the pipeline and
names each difference; with ``overwrite=true`` every such step is redone instead (each
removes only what it wrote), and since a redone step's output is new, every later step that
reads it is redone too, while steps whose outputs are current are skipped. ``align status
RECIPE`` shows where each step stands without running anything; ``align submit RECIPE``
runs the steps as SLURM jobs.

Example: ``align pipeline recipes/tiny/pipeline.yaml``; one step of a recipe:
``align step recipes/apertus-8b/pipeline.yaml annotate_judge`` (or ``align train
recipes/tiny/pipeline.yaml`` where the recipe has one step of that stage).

Rounds (docs/rounds.md): with ``rounds: K`` the steps that depend on the policy run K
times, round k from the policy round k−1 trained, under ``output_dir/round-k/``.
Example: ``align pipeline recipes/tiny/rounds.yaml``; from Python,
``align.pipeline("recipes/tiny/rounds.yaml", rounds=3, reference="initial")``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from align import stopping
from align.config import merge, read_yaml, to_dict
from align.drivers.args import load_recipe, missing_recipe, split_args
from align.io import stage_completion_info
from align.recipe import PipelineSettings, Recipe
from align.stage_table import spec


@dataclasses.dataclass
class Config(PipelineSettings):
    """A pipeline recipe's keys (docs/pipeline.md)."""


def config_from_args(args: Sequence[str]) -> Recipe:
    """``align pipeline RECIPE [key=value ...]``: the recipe read into its steps, every config built now."""
    path, overrides = split_args(args)
    if path is None:
        raise missing_recipe("pipeline")
    recipe = load_recipe(path, overrides)
    recipe.build_all()  # a mistake in the last step stops the run before the first
    return recipe


def _output_id(output_dir: str | Path | None) -> str | None:
    """The id of a complete stage output (a new one each time it is made), else None."""
    if output_dir is None or not Path(output_dir).is_dir():
        return None
    return (stage_completion_info(output_dir) or {}).get("output_id")


def run(recipe: Recipe | PipelineSettings | Mapping[str, Any]) -> dict[str, Any]:
    """Run the steps in order; a step whose output is complete and current skips itself.

    Returns, per step name (``sample``; ``round-2.sample`` with rounds): the ``stage``, its
    ``round``, ``output_dir``, the ``outcome`` (``made`` now; ``skipped``, complete and
    current; ``unfinished``, job shards left to other processes; ``keyed``, an output under
    its cache key) and the ``summary`` the stage returned.
    """
    if not isinstance(recipe, Recipe):
        recipe = load_recipe(to_dict(recipe) if dataclasses.is_dataclass(recipe) else dict(recipe))
        recipe.build_all()
    report: dict[str, Any] = {}
    for step in recipe:
        if (reason := stopping.requested()) is not None:  # asked to stop (a signal): between steps is a safe point
            raise stopping.Stopped(f"stopped before step {step.name} ({reason}): run the pipeline again to go on "
                                   "from there")
        if step.round is None:
            print(f"[align pipeline] step {step.name} ({step.stage})")
        else:
            print(f"[align pipeline] round {step.round} step {step.name}: {step.what}")
        config = recipe.config(step)
        if recipe.settings.overwrite:
            config.overwrite = True
        output_dir = getattr(config, "output_dir", None)
        before = _output_id(output_dir)
        summary = spec(step.stage).load().run(config)
        after = _output_id(output_dir)
        if output_dir is None:
            outcome = "keyed"
        elif after is None:
            outcome = "unfinished"
        else:
            outcome = "skipped" if after == before else "made"
        report[step.name] = {"stage": step.stage, "round": step.round, "output_dir": output_dir,
                             "outcome": outcome, "summary": summary}
    return report


def pipeline(recipe: str | Path | Mapping[str, Any] | None = None, *overrides: str, **keys: Any) -> dict[str, Any]:
    """``align pipeline RECIPE key=value ...`` from Python; returns ``run``'s report.

    ``recipe``: a YAML file or the recipe as a mapping. ``keys``: top-level keys over it
    (``rounds=3``, ``reference="initial"``; a mapping such as ``train={"beta": 3.0}`` is merged
    into its section or step). ``overrides``: ``key=value`` strings as on the command line
    (``"train.beta=3"``), applied last.
    """
    data = read_yaml(recipe) if isinstance(recipe, (str, Path)) else dict(recipe or {})
    built = load_recipe(merge(data, keys), overrides)
    built.source = str(recipe) if isinstance(recipe, (str, Path)) else None
    built.build_all()
    return run(built)
