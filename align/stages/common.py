"""What stages share beyond ``align.manifests.StageRun``: secrets kept out of outputs, and the
marker of an output that has no manifest of its own (a sweep: each point has one)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from align.config import to_dict
from align.errors import ConfigError
from align.io import mark_stage_complete
from align.manifests import redact
from align.manifests.lifecycle import (
    check_input_exists,
    check_model_path,
    check_output_dir,
    check_stage_input,
)

__all__ = ["check_input_exists", "check_model_path", "check_output_dir", "check_stage_input", "is_main_process",
           "keep_hub_token_out_of_outputs", "launch_devices", "mark_unmanaged_complete", "split_args"]


def split_args(args: Sequence[str]) -> tuple[str | None, list[str]]:
    """Separate the optional recipe path (the first argument without '=') from ``key=value`` overrides."""
    recipe, overrides = None, []
    for arg in args:
        if "=" in arg:
            overrides.append(arg)
        elif recipe is None:
            recipe = arg
        else:
            raise ConfigError(f"unexpected argument {arg!r} (one recipe, then key=value overrides)")
    return recipe, overrides


def recipe_from_args(command: str, args: Sequence[str], devices: str = "defer") -> Any:
    """``align COMMAND RECIPE [key=value ...]`` for a command that reads a whole recipe (status, submit):
    a pipeline recipe, or a stage file whose opening comments name its stage (``align STAGE ...``)."""
    from align.config import read_yaml
    from align.plan.recipe_header import header_lines, stage_from_header
    from align.recipe.read import is_pipeline
    from align.stages import STAGES, load_recipe

    path, overrides = split_args(args)
    if path is None:
        raise ConfigError(f"give the recipe: align {command} RECIPE.yaml [key=value ...]")
    stage = None
    if not is_pipeline(read_yaml(path)):
        stage = stage_from_header(header_lines(path), STAGES)
        if stage is None:
            raise ConfigError(f"{path}: the keys of one stage, and its opening comments name no `align STAGE` "
                              "command: add one (e.g. `# align sample RECIPE`), or use a pipeline recipe")
    return load_recipe(path, overrides, stage=stage, devices=devices)


def stage_config(stage: str, args: Sequence[str]) -> Any:
    """``align STAGE [RECIPE] [key=value ...]``: the stage's config from a stage file, or from the one step of
    that stage in a pipeline recipe (the overrides are that step's keys)."""
    from align.config import merge, parse_overrides
    from align.stages import load_recipe

    path, overrides = split_args(args)
    recipe = load_recipe(path if path is not None else {}, () if path is not None else overrides, stage=stage)
    if recipe.kind == "stage":
        if path is None:
            return recipe.config(recipe.steps[0])
        recipe = load_recipe(path, overrides, stage=stage)
        return recipe.config(recipe.steps[0])
    steps = [s for s in recipe if s.stage == stage and not s.phase]
    if len(steps) != 1:
        names = [s.name for s in steps]
        raise ConfigError(f"{path} has {len(steps)} steps of stage {stage}{f' ({names})' if names else ''}: run one "
                          f"with `align step {path} NAME`" if steps else
                          f"{path} has no step of stage {stage} (steps: {[s.name for s in recipe]})")
    step = steps[0]
    step.keys = merge(step.keys, parse_overrides(overrides))
    return recipe.config(step)


def keep_hub_token_out_of_outputs(config: Any) -> None:
    """Move a ``hub_token`` setting into ``$HF_TOKEN`` for this process.

    The Trainer pickles its arguments into every checkpoint and the saved model
    (``training_args.bin``); a token left there would sit in plain text under output_dir.
    The hub client reads ``$HF_TOKEN``, so ``push_to_hub`` still works.
    """
    token = getattr(config, "hub_token", None)
    if token:
        os.environ["HF_TOKEN"] = token
        config.hub_token = None


def launch_devices(config: Any) -> None:
    """Under a distributed launch, set up the launch's devices and process group now, as the trainer would
    (``TrainingArguments.device``): rank 0 then decides for every rank (``align.manifests.StageRun``)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        _ = config.device


def is_main_process() -> bool:
    """Rank 0 of a distributed launch (or a plain process): the one that writes markers."""
    return int(os.environ.get("RANK", "0")) == 0


def mark_unmanaged_complete(stage: str, config: Any, output_dir: str | Path, summary: dict[str, Any]) -> dict[str, Any]:
    """Mark an output complete that has no manifest of its own (its parts have theirs)."""
    if not is_main_process():
        return summary
    mark_stage_complete(output_dir, stage=stage, config=redact(to_dict(config)), summary=redact(summary))
    print(f"[align {stage}] wrote {output_dir}")
    print(f"[align {stage}] " + json.dumps(redact(summary), default=str))
    return summary
