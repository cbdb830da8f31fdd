"""A memory plan for every stage of a recipe, per GPU, before GPUs are booked.

``align plan RECIPE [key=value ...]`` reads a stage recipe (or a pipeline recipe, every
section) and the model's ``config.json`` alone (no weights load), and prints for each job
the stage runs the bytes per GPU by part: weights, gradients, fp32 master weights,
optimizer states (AdEMAMix keeps three: m1, m2, ν), activations with or without
activation checkpointing, the LM head's peak, the log-prob pass replicated and under
ZeRO-3, vLLM's weights per tensor-parallel GPU and the KV cache that
gpu_memory_utilization leaves. Then whether it fits the hardware and, if not, the
smallest change that does (a smaller micro-batch, activation checkpointing, ZeRO-3, more
nodes, CPU offload where align allows it). Nothing runs, and nothing is written under the
recipe's output_dir. docs/memory-plan.md writes down every formula and what it was checked
against.

The hardware comes from these keys, else from the recipe's ``# hardware:`` comment line,
else one node of 8 GPUs of 80 GiB; how training is launched from ``zero_stage`` /
``accelerate_config``, else from the ``accelerate launch --config_file`` command in the
recipe's header, else the trainer's ``deepspeed`` key (none: DDP). A model path that is
the output_dir of another step of the same pipeline recipe, or of a recipe the header's
``# lineage: sft.yaml`` line names (``runs/apertus-8b/sft``), is traced back to the model it
was trained from (no other file beside the recipe is read); hub names need a local copy, the
Hugging Face cache, or the numbers align ships (align/plan/known_configs/), else
``model_config=PATH``.

Examples::

    align plan recipes/apertus-70b/qrpo.yaml gpus_per_node=8 nodes=8 gpu_memory_gib=80
    align plan recipes/apertus-70b/qrpo.yaml nodes=1 --json
    align plan recipes/apertus-8b/sft.yaml set.per_device_train_batch_size=4 output=plan.json
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from align.config import ConfigError, load_config, read_yaml
from align.drivers.args import load_recipe
from align.io import write_json
from align.plan.recipe_header import header_lines, stage_from_header
from align.plan.recipe_plan import PLANNED_STAGES, PlanSettings, plan_jobs
from align.plan.report import render, to_json
from align.recipe.read import is_pipeline

Config = PlanSettings


def config_from_args(args: Sequence[str]) -> Config:
    """``align plan RECIPE [key=value ...] [--json]``: the recipe is this stage's input, not its
    settings, so it is passed as ``recipe`` rather than loaded into ``Config``."""
    rest = [a for a in args if a != "--json"]
    unknown = [a for a in rest if a.startswith("--")]
    if unknown:
        raise ConfigError(f"unknown option {unknown[0]!r} (align plan RECIPE [key=value ...] [--json])")
    recipes = [a for a in rest if "=" not in a]
    if len(recipes) > 1:
        raise ConfigError(f"unexpected argument {recipes[1]!r} (one recipe, then key=value overrides)")
    recipe, overrides = (recipes[0] if recipes else None), [a for a in rest if "=" in a]
    extra = ([f"recipe={recipe}"] if recipe is not None else []) + (["json=true"] if "--json" in args else [])
    return load_config(Config, None, [*overrides, *extra])


def _steps(config: Config, header: list[tuple[int, str]]) -> tuple[Any, list[Any]]:
    """(the recipe, the steps to plan), read as a login node reads it: no device is checked."""
    data = read_yaml(config.recipe)
    stage = None
    if not is_pipeline(data):
        stage = config.stage or stage_from_header(header, PLANNED_STAGES)
        if stage is None:
            raise ConfigError(f"stage: {config.recipe} does not say which stage it is for (no `align STAGE` command "
                              f"in its opening comments); give stage=NAME, one of {list(PLANNED_STAGES)}")
        if stage not in PLANNED_STAGES:
            raise ConfigError(f"stage: align plan plans {list(PLANNED_STAGES)}, not {stage!r}")
    recipe = load_recipe(config.recipe, dict(config.set), stage=stage, devices="defer")
    steps = list(recipe)  # phases too: every job align submit writes is planned
    if recipe.kind == "pipeline" and config.stage:
        picked = [step for step in steps if step.stage == config.stage]
        if not picked:
            raise ConfigError(f"stage: the pipeline recipe has no {config.stage!r} step (it has "
                              f"{sorted({s.stage for s in steps})})")
        steps = picked
    return recipe, steps


def plan_recipe(config: Config) -> tuple[list[Any], dict[str, Any]]:
    """Every job's plan (the jobs ``align submit`` writes), and the plan's header (recipe, hardware, launch)."""
    recipe, steps = _steps(config, header_lines(Path(config.recipe)))
    return plan_jobs(config, recipe, steps)


def run(config: Config) -> dict[str, Any]:
    """Print the plan (a table, or JSON with ``json``); write it to ``output`` when set."""
    with contextlib.redirect_stdout(sys.stderr):  # what libraries print while planning stays out of the JSON
        plans, info = plan_recipe(config)
    report = to_json(plans, info)
    hw = info["hardware"]
    if config.json:
        print(json.dumps(report, indent=1))
    else:
        nodes = hw["nodes"]
        print(render(plans, f"align plan {config.recipe}: {nodes} node{'s' if nodes != 1 else ''} × "
                            f"{hw['gpus_per_node']} GPUs of {hw['gpu_memory_gib']:g} GiB "
                            f"({info['hardware_source']}), {config.headroom_gib:g} GiB headroom per GPU"))
    if config.output:
        write_json(config.output, report)
    return report
