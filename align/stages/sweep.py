"""Tune preference training: a grid of settings, each point trained from the same start on the
same pairs, evaluated on validation prompts, the best by ``metric`` chosen.

Takes every key of ``align train`` (the settings all points share: the start policy in
``model_name_or_path``, the pairs with reference log-probs in ``input``), plus ``grid``
(setting -> values), ``metric``, the ``validation_prompts`` to choose on (disjoint from the
held-out prompts you report on) and how they are evaluated (``validation.*``, the
``sampler`` and the ``reward`` provider, as in ``align evaluate``).

Writes under ``output_dir``: ``points/<name>/`` (each trained policy), ``validation/<name>/``
(its evaluation beside the start policy), ``sweep.json`` (every point's figures and the
choice), ``sweep.md`` (the table) and ``sweep.png`` (the score over the grid). Then evaluate
the chosen point (``sweep.json``: ``chosen.model_dir``) on held-out prompts with ``align
evaluate``. Rerun the same command after a kill: finished points are not trained again;
a grid that grows trains only its new points.

Example (after ``align pipeline recipes/tiny/pipeline.yaml``)::

    align sweep recipes/tiny/sweep.yaml grid.beta=[1,5,20] grid.learning_rate=[3e-5,1e-4]

One process trains and evaluates the points in turn. To spread a large grid over a SLURM
array, give each task part of the grid (``grid.beta=[5]``) and the same ``output_dir``; a
last run with the whole grid finds every point done and writes the report.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from align.errors import ConfigError
from align.manifests.lifecycle import (
    check_input_exists,
    check_model_path,
    check_output_dir,
    mark_complete_unmanaged,
    read_input,
)
from align.sampling.config import SamplerConfig
from align.sweep.settings import SweepSettings
from align.trainers.common import keep_hub_token_out_of_outputs
from align.trainers.preference_config import PreferenceConfig
from rewards.config import RewardProviderConfig, build_reward_provider

# what `align sweep --help` lists first: the keys no default can stand for
REQUIRED_KEYS = {
    "grid": "the settings to vary and their values, e.g. grid.beta=[1,5,20]",
    "input": "pair rows with reference log-probs (as for align train)",
    "model_name_or_path": "the policy every point starts from (the SFT output)",
    "validation_prompts": "the prompts each point is evaluated on (none of them held out)",
}

# Rendering settings the validation sampler must share with training.
SHARED_WITH_SAMPLER = ("chat_format", "chat_date", "enable_thinking")


def _validation_reward() -> RewardProviderConfig:
    """Answer checking by default, as in ``align evaluate``; the judge scores pointwise."""
    return RewardProviderConfig(provider="verifiable", top_k_pairwise=0)


@dataclass
class Config(SweepSettings, PreferenceConfig):
    """`align.trainers.preference_config.PreferenceConfig` (what every point shares) and
    `align.sweep.settings.SweepSettings` (grid, metric, validation), plus the data.

    input (str): pair rows with reference log-probs (the ``align logprobs`` output).
    validation_prompts (str): prompt records (id, messages, answer) the points are chosen on:
        never the held-out prompts results are reported on.
    """

    input: str = field(default="", metadata={"help": "pair rows with ref log-probs (file or stage dir)"})
    validation_prompts: str = field(default="", metadata={
        "help": "the prompt records points are chosen on, disjoint from the held-out prompts results are reported on"})
    sampler: SamplerConfig = field(
        default_factory=lambda: SamplerConfig(backend="transformers"),
        metadata={"help": "how validation completions are generated (sampler.model is set per policy)"})
    reward: RewardProviderConfig = field(default_factory=_validation_reward, metadata={
        "help": "the reward provider scoring validation completions: reward_model | judge | verifiable"})
    goal: RewardProviderConfig | None = field(default=None, metadata={
        "help": "a second measure scoring the same validation completions (the goal beside the reward trained on, "
                "e.g. goal.provider=verifiable); select_on=goal chooses by it"})
    overwrite: bool = field(default=False, metadata={
        "help": "redo a point whose output was made from other settings or inputs (removes only what that point "
                "wrote); finished points made from the same ones are kept"})

    def __post_init__(self) -> None:
        super().__post_init__()
        for key in SHARED_WITH_SAMPLER:
            if getattr(self.sampler, key) != getattr(self, key):
                raise ConfigError(f"sampler.{key}: {getattr(self.sampler, key)!r} differs from {key}: "
                                  f"{getattr(self, key)!r}; validation prompts must render as in training")
        if self.reward.provider == "classifier":
            raise ConfigError("reward.provider: the sweep scores with reward_model, judge or verifiable")
        if self.goal is not None and self.goal.provider == "classifier":
            raise ConfigError("goal.provider: the sweep scores with reward_model, judge or verifiable")
        if self.select_on not in ("reward", "goal"):
            raise ConfigError(f"select_on: {self.select_on!r}: choose 'reward' or 'goal'")
        if self.select_on == "goal" and self.goal is None:
            raise ConfigError("select_on: goal needs a goal section (e.g. goal.provider=verifiable)")

    def training(self) -> PreferenceConfig:
        """The preference-training settings alone (what every point starts from)."""
        return PreferenceConfig(**{f.name: getattr(self, f.name) for f in fields(PreferenceConfig) if f.init})


def run(config: Config) -> dict[str, Any]:
    """Train, validate and choose; return the summary (``sweep.json`` has every figure)."""
    from align.sampling.config import build_sampler
    from align.sweep.run import run_sweep

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError("align sweep runs in one process (it trains and evaluates the points in turn); give "
                          "each point its own `align train` launch for multi-process training")
    for key in ("input", "validation_prompts"):
        check_input_exists(getattr(config, key), "sweep", key)
    check_model_path(config.model_name_or_path, "sweep", "model_name_or_path")
    check_output_dir(config.output_dir, "sweep")
    keep_hub_token_out_of_outputs(config)
    rows = read_input(config.input, "sweep", "input")
    validation = read_input(config.validation_prompts, "sweep", "validation_prompts")
    provider, identity = _provider(config.reward)
    measures, fingerprints = {}, {}
    if config.goal is not None:
        measures["goal"], goal_identity = _provider(config.goal)
        if goal_identity is not None:
            fingerprints["goal"] = goal_identity

    def sampler(name: str, model: Any) -> Any:
        return build_sampler(replace(config.sampler, model=str(model)))

    result = run_sweep(config.training(), rows, validation, provider, config, sampler=sampler,
                       provider_fingerprint=identity, overwrite=config.overwrite, measures=measures,
                       measure_fingerprints=fingerprints)
    chosen = result.chosen
    summary = {"points": len(result.points), "metric": result.metric, "select_on": result.select_on,
               "chosen": None if chosen is None else {"settings": chosen.settings, "score": chosen.score,
                                                      "model_dir": chosen.model_dir},
               "report": str(Path(config.output_dir) / "sweep.md")}
    by = result.metric if result.select_on == "reward" else f"the goal's {result.metric}"
    print(f"[align sweep] chosen: {'none' if chosen is None else chosen.label} (by {by} on "
          f"{result.validation_prompts} validation prompts); evaluate it on held-out prompts")
    return mark_complete_unmanaged("sweep", config, config.output_dir, summary)


def _provider(reward: RewardProviderConfig) -> tuple[Any, str | None]:
    """The provider (an answer check loads nothing and is built now; a model is built when the validation
    answers are scored and released before the next point trains) and, for the latter, its identity."""
    if reward.provider == "verifiable":
        return build_reward_provider(reward), None
    return (lambda: build_reward_provider(reward)), _identity(reward)


def _identity(reward: RewardProviderConfig) -> str:
    """A provider built later is identified by its settings (its model's files, the judge's charter text)."""
    from align.manifests import build_manifest

    return build_manifest("sweep-reward", reward).fingerprint


__all__ = ["Config", "run"]
