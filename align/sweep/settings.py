"""What a sweep varies, how each point is scored on validation prompts, and which score chooses."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from align.errors import ConfigError
from align.eval.evaluate import EvalSettings
from align.sweep.grid import Point, expand_grid

# ``select_on`` naming the provider the validation answers were scored with (not another measure).
REWARD = "reward"

# The metrics a sweep can choose by, each read from a point's validation report (higher is better).
METRICS: dict[str, str] = {
    "reward_sampled": "mean reward of the n samples per validation prompt (accuracy, with a verifiable reward)",
    "reward_greedy": "mean reward of the greedy completion per validation prompt",
    "win_rate_sampled": "win rate by reward of the point's samples against the start policy's (ties count half)",
    "win_rate_greedy": "win rate by reward of the point's greedy completion against the start policy's",
}


def validation_defaults() -> EvalSettings:
    """Validation scoring by default: a greedy answer and 4 samples per prompt; no KL, no plots
    (each point's evaluation is a step of the sweep, its report the table of all points)."""
    return EvalSettings(n=4, kl=False, plots=False)


@dataclass
class SweepSettings:
    """A grid over preference-training settings, each point scored on validation prompts.

    grid: setting -> values (any key of `align train`: ``beta``, ``learning_rate``,
        ``max_steps``, ``loss_type``, ...); every combination is one point, trained from the
        same start policy on the same pairs.
    metric: the validation figure that chooses the point (higher is better): reward_sampled,
        reward_greedy, win_rate_sampled or win_rate_greedy (the win rates against the start
        policy, by reward). Ties go to the point that comes first in the grid.
    validation: how each point (and the start policy beside it) is evaluated on the
        validation prompts: `align.eval.evaluate.EvalSettings` (greedy, n, temperature,
        max_tokens, seed, kl, ...), by default a greedy answer and 4 samples, no KL.
    select_on: whose ``metric`` chooses: ``reward`` (the provider the validation answers are
        scored with, usually the reward trained on) or the name of a measure given to
        ``run_sweep(measures=...)`` that scores the same answers again (the goal: an answer
        check, a stronger judge). The report then also names the point the reward would have
        chosen, so a reward the policies learned to game shows as a gap between the two.
    max_kl / max_length_ratio: guards a point must pass to be chosen: its KL to the start
        policy on the validation samples (needs ``validation.kl``), its mean sampled answer
        length over the start policy's. A point past one is listed with the reason, never chosen.
    """

    grid: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "setting -> list of values, e.g. grid.beta=[1,5,20] grid.learning_rate=[3e-5,1e-4]; every "
                "combination is one point"})
    metric: str = field(default="reward_sampled", metadata={
        "help": "what chooses the point on the validation prompts: " + " | ".join(METRICS)})
    validation: EvalSettings = field(default_factory=validation_defaults, metadata={
        "help": "how each point is evaluated on the validation prompts (align.evaluate's settings)"})
    select_on: str = field(default=REWARD, metadata={
        "help": "whose metric chooses: 'reward' (the validation reward) or a measure that scores the same answers "
                "again (align sweep: 'goal', the goal section)"})
    max_kl: float | None = field(default=None, metadata={
        "help": "a point whose KL to the start policy on the validation samples is above this is not chosen "
                "(needs validation.kl=true)", "above": 0})
    max_length_ratio: float | None = field(default=None, metadata={
        "help": "a point whose mean sampled answer length is above this times the start policy's is not chosen",
        "above": 0})

    def __post_init__(self) -> None:
        parent = getattr(super(), "__post_init__", None)
        if parent is not None:  # a stage's Config composes this with the trainer's settings
            parent()
        if self.metric not in METRICS:
            raise ConfigError(f"metric: {self.metric!r} is not one of {list(METRICS)}")
        if self.metric.endswith("_sampled") and self.validation.n < 1:
            raise ConfigError(f"metric: {self.metric} needs samples: set validation.n to 1 or more")
        if self.metric.endswith("_greedy") and not self.validation.greedy:
            raise ConfigError(f"metric: {self.metric} needs the greedy answer: set validation.greedy=true")
        if not self.select_on:
            raise ConfigError(f"select_on: name the measure that chooses ({REWARD!r}: the validation reward)")
        if self.max_kl is not None and not self.validation.kl:
            raise ConfigError("max_kl: the guard needs the points' KL: set validation.kl=true")
        if self.validation.num_shards != 1 or self.validation.shard_index != 0:
            raise ConfigError("validation.num_shards, validation.shard_index: a sweep evaluates each point in one "
                              "process, after training it (leave them at 1 and 0)")
        self.points()  # every value checked now, not after the first point has trained

    def points(self) -> list[Point]:
        """Every point of the grid, in order."""
        return expand_grid(self.grid)


def point_metrics(report: Mapping[str, Any], name: str) -> dict[str, Any]:
    """A point's validation figures, each an interval dict (or None), from its evaluation report."""
    overall = report["overall"]
    policy, comparison = overall["policies"][name], overall["comparisons"][name]
    win = lambda kind: (comparison.get(f"win_rate_reward_{kind}") or {}).get("rate")
    return {
        "reward_sampled": policy.get("reward_sampled"),
        "reward_greedy": policy.get("reward_greedy"),
        "win_rate_sampled": win("sampled"),
        "win_rate_greedy": win("greedy"),
        "gain_sampled": comparison.get("reward_difference_sampled"),
        "gain_greedy": comparison.get("reward_difference_greedy"),
        "kl": policy.get("kl"),
        "length": policy.get("length"),
    }


def start_metrics(report: Mapping[str, Any], baseline: str) -> dict[str, Any]:
    """The start policy's own validation figures (the same in every point's evaluation)."""
    policy = report["overall"]["policies"][baseline]
    return {"reward_sampled": policy.get("reward_sampled"), "reward_greedy": policy.get("reward_greedy"),
            "length": policy.get("length")}


def score_of(metrics: Mapping[str, Any], metric: str) -> float | None:
    """The estimate of the chosen metric, or None when it could not be computed (nothing scored)."""
    interval = metrics.get(metric)
    return None if not interval else float(interval["estimate"])


def guard_failure(metrics: Mapping[str, Any], start: Mapping[str, Any], settings: Any) -> str | None:
    """Why a point may not be chosen (a guard of ``settings`` it is past), or None."""
    kl = metrics.get("kl")
    if settings.max_kl is not None and not kl:
        return "KL not measured (max_kl needs it)"
    if settings.max_kl is not None and kl["estimate"] > settings.max_kl:
        return f"KL {kl['estimate']:.3g} > max_kl {settings.max_kl:g}"
    length, start_length = metrics.get("length"), start.get("length")
    if settings.max_length_ratio is not None and length and start_length and start_length["estimate"] > 0:
        ratio = length["estimate"] / start_length["estimate"]
        if ratio > settings.max_length_ratio:
            return f"answers {ratio:.3g}x the start policy's length > max_length_ratio {settings.max_length_ratio:g}"
    return None


__all__ = ["METRICS", "REWARD", "SweepSettings", "guard_failure", "point_metrics", "score_of", "start_metrics",
           "validation_defaults"]
