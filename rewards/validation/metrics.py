"""The judge's answers on each ladder, the metrics over ladders, and the verdict.

Per prompt (the unit of every bootstrap interval, `align.bootstrap`): rank correlations
with the ladder order (pointwise scores, and pairwise: an item's mean P(win)), accuracy on
adjacent steps, position bias, order agreement, one-order comparisons and the distribution
of pointwise scores; `qualification` turns them into a verdict against `min_kendall_tau`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from align.bootstrap import bootstrap_mean
from rewards.degrade import Ladder
from rewards.validation.ranks import kendall_tau, spearman_rho


def decision(p_better: float | None) -> float | None:
    """1 / ½ / 0 for "the less flawed item won / tied / lost" from its P(win) (None: unknown)."""
    if p_better is None:
        return None
    return 1.0 if p_better > 0.5 else 0.5 if p_better == 0.5 else 0.0


def decided(comparison: Any) -> bool:
    """Whether a comparison says something: read in one or both orders, or settled without
    asking (an empty completion). Undecided: no label in either order, or a one-order
    comparison the judge was set to skip."""
    return comparison.orders_used > 0 or "empty" in (comparison.note or "")


# --------------------------------------------------------------------------- per-ladder results


@dataclass
class LadderResult:
    """The judge's answers on one ladder."""

    ladder: Ladder
    pointwise: list[float | None]
    comparisons: dict[tuple[int, int], Any] = field(default_factory=dict)  # (i, j), i < j -> Comparison

    def pairwise_scores(self) -> list[float | None]:
        """Mean P(win) of each item over its decided comparisons with the rest of its ladder."""
        wins: list[list[float]] = [[] for _ in self.ladder.texts]
        for (i, j), c in self.comparisons.items():
            if not decided(c):
                continue
            wins[i].append(c.first_wins)
            wins[j].append(1.0 - c.first_wins)
        return [sum(w) / len(w) if w else None for w in wins]

    def correlations(self, scores: Sequence[float | None]) -> tuple[float, float] | None:
        """(τ_b, ρ) of scores against the ladder order over the scored items (None below 2)."""
        items = [(step, s) for step, s in enumerate(scores) if s is not None]
        if len(items) < 2:
            return None
        truth = [-step for step, _ in items]
        values = [s for _, s in items]
        return kendall_tau(values, truth), spearman_rho(values, truth)

    def adjacent_pointwise(self) -> list[float]:
        out = []
        for j in range(len(self.pointwise) - 1):
            a, b = self.pointwise[j], self.pointwise[j + 1]
            if a is not None and b is not None:
                out.append(1.0 if a > b else 0.5 if a == b else 0.0)
        return out

    def adjacent_pairwise(self) -> list[float]:
        out = []
        for j in range(len(self.ladder.texts) - 1):
            c = self.comparisons.get((j, j + 1))
            if c is not None and decided(c):
                out.append(decision(c.first_wins))
        return out

    def first_shown_wins(self) -> list[float]:
        """P(the response shown first wins), for every readable presentation."""
        out = []
        for c in self.comparisons.values():
            if c.p_first_as_a is not None:
                out.append(c.p_first_as_a)  # the first completion shown as A
            if c.p_first_as_b is not None:
                out.append(1.0 - c.p_first_as_b)  # the second completion shown as A
        return out

    def orders_agree(self) -> list[float]:
        return [float(c.orders_agree) for c in self.comparisons.values() if c.orders_agree is not None]

    def single_order(self) -> int:
        """Comparisons where exactly one of the two orders was readable."""
        return sum((c.p_first_as_a is None) != (c.p_first_as_b is None) for c in self.comparisons.values())


# --------------------------------------------------------------------------- metrics


def _interval(values: Sequence[float], *, weights: Sequence[float] | None = None, resamples: int, seed: int,
              confidence: float) -> dict[str, Any] | None:
    if not values:
        return None
    return bootstrap_mean(values, weights=weights, resamples=resamples, seed=seed, confidence=confidence).to_dict()


def _rate(per_ladder: Sequence[Sequence[float]], **kwargs: Any) -> dict[str, Any] | None:
    """Pooled rate over ladders (each weighted by its count), CI over prompts."""
    kept = [v for v in per_ladder if v]
    return _interval([sum(v) / len(v) for v in kept], weights=[len(v) for v in kept], **kwargs)


def ladder_metrics(results: Sequence[LadderResult], *, scale: tuple[int, int] | None = None, resamples: int = 2000,
                   seed: int = 0, confidence: float = 0.95) -> dict[str, Any]:
    """Every metric of the module docstring over `results`, with 95% bootstrap CIs over prompts."""
    stats = {"resamples": resamples, "seed": seed, "confidence": confidence}
    out: dict[str, Any] = {"prompts": len(results), "kendall_tau": {}, "spearman_rho": {}, "adjacent_accuracy": {}}
    for mode in ("pointwise", "pairwise"):
        if mode == "pairwise" and not any(r.comparisons for r in results):
            continue
        pairs = [r.correlations(r.pointwise if mode == "pointwise" else r.pairwise_scores()) for r in results]
        pairs = [p for p in pairs if p is not None]
        out["kendall_tau"][mode] = _interval([p[0] for p in pairs], **stats)
        out["spearman_rho"][mode] = _interval([p[1] for p in pairs], **stats)
        adjacent = [r.adjacent_pointwise() if mode == "pointwise" else r.adjacent_pairwise() for r in results]
        out["adjacent_accuracy"][mode] = _rate(adjacent, **stats)
    if any(r.comparisons for r in results):
        out["position_bias"] = _rate([r.first_shown_wins() for r in results], **stats)
        out["order_agreement"] = _rate([r.orders_agree() for r in results], **stats)
        out["comparisons"] = sum(len(r.comparisons) for r in results)
        out["single_order_comparisons"] = sum(r.single_order() for r in results)
        out["single_order_scored"] = sum(c.orders_used == 1 for r in results for c in r.comparisons.values())
    scores = [s for r in results for s in r.pointwise if s is not None]
    steps = max((r.ladder.steps for r in results), default=0)
    by_step = []
    for step in range(steps + 1):
        values = [r.pointwise[step] for r in results if step < len(r.pointwise) and r.pointwise[step] is not None]
        by_step.append(_interval(values, **stats))
    histogram = Counter(str(round(s)) for s in scores)
    if scale is not None:
        histogram = Counter({str(k): histogram.get(str(k), 0) for k in range(scale[0], scale[1] + 1)})
    out["pointwise_scores"] = {
        "count": len(scores),
        "skipped": sum(s is None for r in results for s in r.pointwise),
        "mean": sum(scores) / len(scores) if scores else None,
        "std": _std(scores),
        "histogram": dict(histogram),
        "mean_by_step": by_step,
    }
    return out


def _std(values: Sequence[float]) -> float | None:
    if len(values) < 2:
        return None
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def qualification(metrics: Mapping[str, Any], *, min_kendall_tau: float, qualify_on: str = "pointwise",
                  require_significant: bool = True) -> dict[str, Any]:
    """Whether the judge qualifies on these metrics, and a sentence saying why."""
    tau = metrics["kendall_tau"].get(qualify_on)
    if tau is None:
        return {"qualified": False, "reason": f"no {qualify_on} Kendall τ (too few scored ladders)"}
    estimate, low, high = tau["estimate"], tau["low"], tau["high"]
    text = f"{qualify_on} Kendall τ {estimate:.3f} (95% CI {low:.3f} to {high:.3f})"
    if estimate < min_kendall_tau:
        return {"qualified": False, "reason": f"{text} is below the threshold {min_kendall_tau}"}
    if require_significant and not low > 0:
        return {"qualified": False, "reason": f"{text}: the interval includes 0, so the order is not shown"}
    return {"qualified": True, "reason": f"{text} reaches the threshold {min_kendall_tau}"}
