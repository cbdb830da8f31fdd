"""Statistics for evaluation reports: bootstrap confidence intervals and win rates.

Every number an evaluation reports comes with a 95% interval, because a gain the size of
its standard error is not a gain. The bootstrap itself (cluster and paired, percentile
intervals, seeded) is `align.bootstrap`, shared with judge validation and re-exported
here; this module adds win rates (ties count half) and verdict sentences.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from align.bootstrap import (
    DEFAULT_CONFIDENCE,
    DEFAULT_RESAMPLES,
    MIN_UNITS,
    Interval,
    bootstrap_mean,
    bootstrap_statistic,
    paired_difference,
    percentile_interval,
    resample_indices,
)

__all__ = [
    "DEFAULT_CONFIDENCE",
    "DEFAULT_RESAMPLES",
    "Interval",
    "WinRate",
    "bootstrap_mean",
    "bootstrap_statistic",
    "outcome",
    "paired_difference",
    "percentile_interval",
    "preference_outcome",
    "resample_indices",
    "verdict",
    "win_rate",
]


# --------------------------------------------------------------------------- win rates


def outcome(score: float | None, baseline_score: float | None, *, tolerance: float = 0.0) -> float | None:
    """1 (win), 0.5 (tie) or 0 (loss) of a score against the baseline's; None if either is missing."""
    if score is None or baseline_score is None:
        return None
    if abs(score - baseline_score) <= tolerance:
        return 0.5
    return 1.0 if score > baseline_score else 0.0


def preference_outcome(p_first_wins: float | None, *, tie_margin: float = 0.0) -> float | None:
    """A judge's P(first better) as 1 / 0.5 / 0 (within ``tie_margin`` of 0.5 is a tie)."""
    if p_first_wins is None or not math.isfinite(p_first_wins):
        return None
    if abs(p_first_wins - 0.5) <= tie_margin:
        return 0.5
    return 1.0 if p_first_wins > 0.5 else 0.0


@dataclass(frozen=True)
class WinRate:
    """Head-to-head result of a policy against a baseline, over prompts.

    ``rate`` is (wins + ties/2) / comparisons, its CI bootstrapped over prompts (each
    prompt's comparisons move together). ``prompts`` counts prompts with at least one
    comparison; ``missing`` counts comparisons that could not be decided.
    """

    rate: Interval
    wins: int
    ties: int
    losses: int
    prompts: int
    missing: int = 0

    @property
    def comparisons(self) -> int:
        return self.wins + self.ties + self.losses

    def to_dict(self) -> dict[str, Any]:
        return {"rate": self.rate.to_dict(), "wins": self.wins, "ties": self.ties, "losses": self.losses,
                "comparisons": self.comparisons, "prompts": self.prompts, "missing": self.missing}


def pooled_win_rate(outcomes_per_prompt: Iterable[Sequence[float | None]]) -> float | None:
    """The win rate alone (ties half), without an interval: for progress logs during training.

    None when nothing was decided.
    """
    decided = [o for outcomes in outcomes_per_prompt for o in outcomes if o is not None]
    if any(o not in (0.0, 0.5, 1.0) for o in decided):
        raise ValueError(f"an outcome is 1, 0.5 or 0, got {sorted(set(decided) - {0.0, 0.5, 1.0})}")
    return sum(decided) / len(decided) if decided else None


def win_rate(
    outcomes_per_prompt: Sequence[Sequence[float | None]],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = 0,
) -> WinRate | None:
    """Win rate from per-prompt lists of outcomes (1 / 0.5 / 0, None = undecided).

    Ties count half. Prompts are the bootstrap units; a prompt's weight is its number of
    decided comparisons, so the estimate equals the pooled rate. None when nothing was
    decided.
    """
    values, weights = [], []
    wins = ties = losses = missing = 0
    for outcomes in outcomes_per_prompt:
        decided = [o for o in outcomes if o is not None]
        missing += len(outcomes) - len(decided)
        for o in decided:
            if o not in (0.0, 0.5, 1.0):
                raise ValueError(f"an outcome is 1, 0.5 or 0, got {o}")
        wins += sum(o == 1.0 for o in decided)
        ties += sum(o == 0.5 for o in decided)
        losses += sum(o == 0.0 for o in decided)
        if decided:
            values.append(sum(decided) / len(decided))
            weights.append(len(decided))
    if not values:
        return None
    rate = bootstrap_mean(values, weights=weights, resamples=resamples, confidence=confidence, seed=seed)
    return WinRate(rate, wins, ties, losses, len(values), missing)


def verdict(name: str, interval: Interval, *, null: float, unit: str = "", scale: float = 1.0,
            between: bool = False) -> str:
    """A plain sentence: the figure, its interval, and whether the interval excludes ``null``.

    ``null`` is "no change": 0 for a difference, 0.5 for a win rate. Values are multiplied
    by ``scale`` (100 for points); a difference (``null`` 0) is printed with its sign.
    ``between``: a comparison of two methods (neither is the baseline): "higher" or "lower",
    not an improvement or a decline. An interval from fewer than 2 prompts, or one that does
    not hold its own estimate, shows nothing.
    """
    sign = "+" if null == 0 else ""
    f = lambda v: f"{v * scale:{sign}.3g}{unit}"
    pct = round(interval.confidence * 100)
    text = f"{name}: {f(interval.estimate)} ({pct}% CI {f(interval.low)} to {f(interval.high)})"
    if interval.n < MIN_UNITS:
        return f"{name}: {f(interval.estimate)} from {interval.n} prompt: too few for an interval, nothing shown."
    if not interval.readable:
        return f"{text}; the interval does not hold its own estimate (too few prompts or resamples): nothing shown."
    higher, lower = ("a real improvement", "a real decline") if not between else \
        ("a real difference, higher", "a real difference, lower")
    if interval.low > null:
        return f"{text}; the interval lies above {null * scale:g}{unit}: {higher}."
    if interval.high < null:
        return f"{text}; the interval lies below {null * scale:g}{unit}: {lower}."
    return f"{text}; the interval includes {null * scale:g}{unit}: no change shown."
