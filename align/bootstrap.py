"""Bootstrap confidence intervals: the statistics every report of the project shares.

Units are prompts: per-prompt values (the mean reward of a prompt's samples, a prompt's win
fraction against the baseline, a judge's rank correlation on one degradation ladder) are
resampled with replacement, so samples of one prompt move together (a cluster bootstrap).
When two policies answered the same prompts, their difference is bootstrapped per prompt
(a paired bootstrap), which removes the prompt-difficulty variance both share.

The percentile bootstrap is used throughout: B resamples (default 2,000) of the unit
indices, the statistic on each, the 2.5th and 97.5th percentiles. Seeded, so a report is
reproducible.

Bottom layer (docs/architecture.md): evaluation (`align.eval.stats`) and judge
validation (`rewards.validation`) both use it and import nothing from each other.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from align.errors import ConfigError

DEFAULT_RESAMPLES = 2000
DEFAULT_CONFIDENCE = 0.95
# Fewer resamples give percentile intervals too coarse to read (with 1, the interval is one
# replicate, which need not even hold the estimate); fewer than 2 units have no spread to resample.
MIN_RESAMPLES = 200
MIN_UNITS = 2


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

    @property
    def readable(self) -> bool:
        """An interval that can be read: from at least ``MIN_UNITS`` units, and holding its own estimate."""
        return self.n >= MIN_UNITS and self.low <= self.estimate <= self.high

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


def check_resamples(resamples: int, key: str = "resamples") -> None:
    """At least ``MIN_RESAMPLES`` resamples (a setting's error names the setting)."""
    if resamples < MIN_RESAMPLES:
        raise ConfigError(f"{key}={resamples}: the bootstrap needs at least {MIN_RESAMPLES} resamples for a "
                          f"percentile interval (default {DEFAULT_RESAMPLES})")


def resample_indices(n: int, *, resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> np.ndarray:
    """(resamples, n) unit indices drawn with replacement, seeded."""
    check_resamples(resamples)
    if n < 1:
        raise ValueError("the bootstrap needs at least one unit")
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def percentile_interval(estimate: float, replicates: np.ndarray, n: int,
                        confidence: float = DEFAULT_CONFIDENCE) -> Interval:
    """The percentile interval of bootstrap replicates around ``estimate``."""
    if not 0 < confidence < 1:
        raise ConfigError(f"confidence must be in (0, 1), got {confidence}")
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
