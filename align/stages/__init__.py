"""The pipeline's stages as the CLI and the Python API run them.

Each stage module holds a ``Config`` dataclass (its recipe keys) and ``run(config)``,
reading and writing datasets on disk. Components (chat formats, losses, samplers, reward
providers) live elsewhere; a stage only wires them to a recipe.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

# name -> (module, one-line summary); modules are imported only when their stage runs.
STAGES: dict[str, tuple[str, str]] = {
    "sft": ("align.stages.sft", "supervised fine-tuning on chat data with assistant-only masks"),
    "sample": ("align.stages.sample", "sample n reference completions per prompt from the policy"),
    "annotate": ("align.stages.annotate", "score completions: reward model, judge, verifiable, classifier"),
    "pairs": ("align.stages.pairs", "quantile rewards against the references, then chosen/rejected pairs"),
    "logprobs": ("align.stages.logprobs", "one offline pass of reference log-probs for the pairs"),
    "train": ("align.stages.train", "QRPO or DPO preference training"),
    "sweep": ("align.stages.sweep", "tune training settings on a grid: every point from the same start, chosen on validation prompts"),
    "evaluate": ("align.stages.evaluate", "rewards, win rates against a baseline and KL, with confidence intervals"),
    "decontaminate": ("align.stages.decontaminate", "remove training prompts that overlap benchmarks"),
    "judge-validate": ("align.stages.judge_validate", "qualify a judge on degradation ladders (rank correlation, bias)"),
    "plan": ("align.stages.plan", "memory per GPU of each stage of a recipe, whether it fits, the smallest change that does"),
    "split": ("align.stages.split", "one part of a prompt file (the prompts of one round: round_prompts=split)"),
    "join": ("align.stages.join", "a policy's samples beside π_ref's reference samples (rounds, reference=initial)"),
    "pipeline": ("align.stages.pipeline", "every step of a recipe, skipping those whose output is current"),
    "step": ("align.stages.step", "one named step of a pipeline recipe (what a submitted job runs)"),
    "status": ("align.stages.status", "each step of a recipe: done, stale (why), partial or not started"),
    "submit": ("align.stages.submit", "a recipe's steps as SLURM jobs, each after the steps it reads"),
    "demo": ("align.stages.demo", "the whole method on a tiny model on CPU, in minutes"),
    "tiny-models": ("align.stages.tiny_models", "random-weight tiny models for the recipes in recipes/tiny/ (CPU)"),
}


def stage_module(name: str) -> ModuleType:
    """Import a stage's module by its CLI name."""
    if name not in STAGES:
        raise KeyError(f"unknown stage {name!r}; stages: {', '.join(STAGES)}")
    return importlib.import_module(STAGES[name][0])


def stage_config_class(name: str) -> type:
    """The ``Config`` dataclass of a stage (its recipe keys)."""
    return stage_module(name).Config


def load_recipe(source: str | Path | Mapping[str, Any], overrides: Sequence[str] | Mapping[str, Any] = (), *,
                stage: str | None = None, devices: str = "check") -> Any:
    """``align.recipe.read_recipe`` with the stages' configs: a recipe of any shape as its steps."""
    from align.recipe import read_recipe

    return read_recipe(source, overrides, config_class=stage_config_class, stage=stage, devices=devices)
