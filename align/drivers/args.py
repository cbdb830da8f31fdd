"""Command-line arguments into a recipe: the one place the drivers and the CLI read recipes from."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from align.config import merge, parse_overrides, read_yaml
from align.errors import ConfigError
from align.recipe import Recipe, read_recipe
from align.recipe.read import is_pipeline
from align.stage_table import STAGES, command_module


def stage_config_class(name: str) -> type:
    """The ``Config`` dataclass of a stage, or of a command that takes key=value (its keys)."""
    return command_module(name).Config


def load_recipe(source: str | Path | Mapping[str, Any], overrides: Sequence[str] | Mapping[str, Any] = (), *,
                stage: str | None = None, devices: str = "check") -> Recipe:
    """``align.recipe.read_recipe`` with the stages' configs: a recipe of any shape as its steps, the graph
    checked whole."""
    return read_recipe(source, overrides, config_class=stage_config_class, stage=stage, devices=devices)


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


def missing_recipe(command: str) -> ConfigError:
    return ConfigError(f"give the recipe: align {command} RECIPE.yaml [key=value ...]")


def recipe_from_args(command: str, args: Sequence[str], devices: str = "defer") -> Recipe:
    """``align COMMAND RECIPE [key=value ...]`` for a command that reads a whole recipe (status, submit):
    a pipeline recipe, or a stage file whose opening comments name its stage (``align STAGE ...``)."""
    from align.plan.recipe_header import header_lines, stage_from_header

    path, overrides = split_args(args)
    if path is None:
        raise missing_recipe(command)
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
