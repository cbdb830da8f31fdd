"""One named step of a pipeline recipe: what each job ``align submit`` writes runs.

``align step RECIPE NAME [key=value ...]`` builds that step's config as ``align pipeline``
would (defaults, ``@NAME`` wiring, its round's paths) and runs its stage; the overrides are
the step's own keys (``num_shards=16``). Only this step's config is built, so a job on an
inference node never builds a training step's config.

Example: ``align step recipes/apertus-8b/pipeline.yaml annotate_judge``, or
``align step recipes/tiny/rounds.yaml round-2.train``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from align.config import merge, parse_overrides
from align.drivers.args import load_recipe
from align.errors import ConfigError
from align.stage_table import spec

USAGE = "align step RECIPE.yaml NAME [key=value ...]   (the key=value overrides are the step's own keys: " \
        "`align STAGE --help` lists them)"
KEYS_TITLE = "Arguments"


@dataclass
class Config:
    recipe: str = field(default="", metadata={"help": "the pipeline recipe (the first argument)"})
    name: str = field(default="", metadata={"help": "the step to run (the second argument), as `align status` "
                                            "names it"})


@dataclass
class StepRun:
    """A step's stage and its built config."""

    stage: str
    config: Any
    name: str = ""
    extra: dict = field(default_factory=dict)


def config_from_args(args: Sequence[str]) -> StepRun:
    words = [a for a in args if "=" not in a]
    overrides = [a for a in args if "=" in a]
    if len(words) != 2:
        raise ConfigError(f"usage: {USAGE}")
    recipe = load_recipe(words[0])
    step = recipe.step(words[1])
    step.keys = merge(step.keys, parse_overrides(overrides))
    return StepRun(step.stage, recipe.config(step), step.name)


def run(step: StepRun) -> dict:
    print(f"[align step] {step.name} ({step.stage})")
    return spec(step.stage).load().run(step.config)
