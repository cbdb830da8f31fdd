"""Rank statistics of judge validation, computed here (no scipy).

τ_b = (C − D) / √((n₀ − n₁)(n₀ − n₂)), ties corrected; ρ = Pearson correlation of average
ranks. A side with one value throughout has no order information: τ and ρ are 0 there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def average_ranks(values: Sequence[float]) -> list[float]:
    """Ranks 1..n, ties sharing the mean of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for position in range(start, end + 1):
            ranks[order[position]] = (start + end) / 2 + 1
        start = end + 1
    return ranks


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's τ_b (tie-corrected); 0 when either side is constant, NaN for fewer than 2 items."""
    if len(x) != len(y):
        raise ValueError(f"kendall_tau: {len(x)} against {len(y)} values")
    n = len(x)
    if n < 2:
        return float("nan")
    concordant = discordant = ties_x = ties_y = 0
    for i in range(n):
        for j in range(i + 1, n):
            dx, dy = x[i] - x[j], y[i] - y[j]
            if dx == 0:
                ties_x += 1
            if dy == 0:
                ties_y += 1
            if dx * dy > 0:
                concordant += 1
            elif dx * dy < 0:
                discordant += 1
    pairs = n * (n - 1) // 2
    denominator = math.sqrt((pairs - ties_x) * (pairs - ties_y))
    return (concordant - discordant) / denominator if denominator else 0.0


def spearman_rho(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's ρ (Pearson on average ranks); 0 when either side is constant, NaN below 2 items."""
    if len(x) != len(y):
        raise ValueError(f"spearman_rho: {len(x)} against {len(y)} values")
    if len(x) < 2:
        return float("nan")
    rx, ry = average_ranks(x), average_ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    return sxy / math.sqrt(sxx * syy) if sxx and syy else 0.0
