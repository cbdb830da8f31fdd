"""Statistics for evaluation reports: bootstrap confidence intervals and win rates.

Every number an evaluation reports comes with a 95% interval, because a gain the size of
its standard error is not a gain. Units are prompts: per-prompt values (the mean reward of
a prompt's samples, a prompt's win fraction against the baseline) are resampled with
replacement, so samples of one prompt move together (a cluster bootstrap). When two
policies answered the same prompts, their difference is bootstrapped per prompt (a paired
bootstrap), which removes the prompt-difficulty variance both share.

The percentile bootstrap is used throughout: B resamples (default 2,000) of the unit
indices, the statistic on each, the 2.5th and 97.5th percentiles. Seeded, so a report is
reproducible.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

DEFAULT_RESAMPLES = 2000
DEFAULT_CONFIDENCE = 0.95


@dataclass(frozen=True)
class Interval:
    """A point estimate with its bootstrap confidence interval over ``n`` units."""

    estimate: float
    low: float
    high: float
    n: int
    confidence: float = DEFAULT_CONFIDENCE

    def excludes(self, value: float) -> bool:
        """Whether ``value`` lies outside the interval (the change is then significant)."""
        return value < self.low or value > self.high

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def format(self, scale: float = 1.0, digits: int = 3) -> str:
        """``0.512 [0.480, 0.544]`` (values multiplied by ``scale``, e.g. 100 for points)."""
        f = lambda v: f"{v * scale:.{digits}f}"
        return f"{f(self.estimate)} [{f(self.low)}, {f(self.high)}]"


def _as_array(values: Sequence[float] | np.ndarray, name: str) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"{name}: expected one value per unit (1-D), got shape {array.shape}")
    if array.size and not np.all(np.isfinite(array)):
        bad = int(np.flatnonzero(~np.isfinite(array))[0])
        raise ValueError(f"{name}: value {bad} is not finite ({array[bad]})")
    return array


def resample_indices(n: int, *, resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> np.ndarray:
    """(resamples, n) unit indices drawn with replacement, seeded."""
    if n < 1:
        raise ValueError("the bootstrap needs at least one unit")
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def percentile_interval(estimate: float, replicates: np.ndarray, n: int,
                        confidence: float = DEFAULT_CONFIDENCE) -> Interval:
    """The percentile interval of bootstrap replicates around ``estimate``."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    tail = (1 - confidence) / 2
    low, high = np.quantile(replicates, [tail, 1 - tail])
    return Interval(float(estimate), float(low), float(high), n, confidence)


def bootstrap_mean(
    values: Sequence[float] | np.ndarray,
    *,
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = 0,
    weights: Sequence[float] | np.ndarray | None = None,
) -> Interval:
    """Mean of per-unit values with its bootstrap CI.

    With ``weights`` (e.g. samples per prompt) the statistic is Σ w·v / Σ w on each
    resample: a pooled mean whose units are still the prompts.
    """
    x = _as_array(values, "values")
    if x.size == 0:
        raise ValueError("values: nothing to average")
    idx = resample_indices(x.size, resamples=resamples, seed=seed)
    if weights is None:
        return percentile_interval(float(x.mean()), x[idx].mean(axis=1), x.size, confidence)
    w = _as_array(weights, "weights")
    if w.shape != x.shape or np.any(w < 0) or w.sum() <= 0:
        raise ValueError("weights: one non-negative weight per value, not all zero")
    replicates = (x[idx] * w[idx]).sum(axis=1) / np.maximum(w[idx].sum(axis=1), 1e-300)
    return percentile_interval(float((x * w).sum() / w.sum()), replicates, x.size, confidence)


def bootstrap_statistic(
    columns: Mapping[str, Sequence[float] | np.ndarray],
    statistic: Callable[[Mapping[str, np.ndarray]], float],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = 0,
) -> Interval:
    """Any statistic of per-unit columns (resampled together, row by row) with its CI.

    For statistics that are not plain means: a rank correlation over ladders, a ratio of
    sums. ``statistic`` receives the columns (same length each) and returns a float.
    """
    data = {name: np.asarray(col) for name, col in columns.items()}
    lengths = {len(col) for col in data.values()}
    if len(lengths) != 1:
        raise ValueError(f"columns differ in length: { {k: len(v) for k, v in data.items()} }")
    n = lengths.pop()
    idx = resample_indices(n, resamples=resamples, seed=seed)
    replicates = np.array([statistic({k: v[row] for k, v in data.items()}) for row in idx], dtype=np.float64)
    replicates = replicates[np.isfinite(replicates)]
    estimate = float(statistic(data))
    if replicates.size == 0:
        return Interval(estimate, float("nan"), float("nan"), n, confidence)
    return percentile_interval(estimate, replicates, n, confidence)


def paired_difference(
    treatment: Sequence[float] | np.ndarray,
    baseline: Sequence[float] | np.ndarray,
    *,
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = 0,
) -> Interval:
    """mean(treatment − baseline) over the same units, with a paired bootstrap CI."""
    a, b = _as_array(treatment, "treatment"), _as_array(baseline, "baseline")
    if a.shape != b.shape:
        raise ValueError(f"paired values need the same units: {a.size} against {b.size}")
    return bootstrap_mean(a - b, resamples=resamples, confidence=confidence, seed=seed)


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


def verdict(name: str, interval: Interval, *, null: float, unit: str = "", scale: float = 1.0) -> str:
    """A plain sentence: the figure, its interval, and whether the interval excludes ``null``.

    ``null`` is "no change": 0 for a difference, 0.5 for a win rate. Values are multiplied
    by ``scale`` (100 for points); a difference (``null`` 0) is printed with its sign.
    """
    sign = "+" if null == 0 else ""
    f = lambda v: f"{v * scale:{sign}.3g}{unit}"
    pct = round(interval.confidence * 100)
    text = f"{name}: {f(interval.estimate)} ({pct}% CI {f(interval.low)} to {f(interval.high)})"
    if interval.low > null:
        return f"{text}; the interval lies above {null * scale:g}{unit}: a real improvement."
    if interval.high < null:
        return f"{text}; the interval lies below {null * scale:g}{unit}: a real decline."
    return f"{text}; the interval includes {null * scale:g}{unit}: no change shown."
