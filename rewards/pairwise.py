"""Pairwise ranking of a prompt's top completions: both orders, odd–even transposition sort.

A comparison asks the judge "A or B?" twice, with the two completions in both positions,
and averages P(first is better) over the two orders; this cancels the judge's position
bias (docs/method.md, "Constitutional judge, pairwise"). P(first is better) in one order is P("A") / (P("A") + P("B")) at the
first answer position (a label outside the backend's top-k counts as probability 0).

The sort is odd–even transposition: in each phase the disjoint neighbour pairs (0,1),
(2,3), ... or (1,2), (3,4), ... are compared and swapped when the second is better.
`k` phases sort any `k` items under a consistent comparison, and the worst case needs
all `k` (5 phases for 5 items; checked exhaustively in the tests), so the default limit
is `k` phases, not the "4 passes for 5" of an earlier specification. The sort stops early once two
consecutive phases swap nothing (every neighbour pair is then in order). Comparisons are
remembered, so a pair is never asked twice; all pending comparisons of a phase, over
every prompt in the batch, go to the judge in one call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from align.errors import ConfigError


@dataclass(frozen=True)
class Comparison:
    """How completion `first` fared against `second`.

    first_wins:   P(first is better), averaged over the readable orders; 0.5 when unknown
    p_first_as_a: P(first better) when shown as A (None: neither label was readable)
    p_first_as_b: P(first better) when shown as B
    orders_agree: whether both orders preferred the same completion (None: not both read)
    note:         why the judge was not asked or could not answer ("empty completion", ...)
    orders_used:  how many orders `first_wins` rests on: 2, 1 (only one order readable,
                  recorded instead of silently used) or 0 (not asked, or undecided)
    """

    first_wins: float
    p_first_as_a: float | None = None
    p_first_as_b: float | None = None
    orders_agree: bool | None = None
    note: str | None = None
    orders_used: int = 0

    def flipped(self) -> Comparison:
        """The same comparison seen from the other completion's side."""
        flip = lambda p: None if p is None else 1.0 - p
        return Comparison(1.0 - self.first_wins, flip(self.p_first_as_b), flip(self.p_first_as_a), self.orders_agree,
                          self.note, self.orders_used)


def combine_orders(p_first_as_a: float | None, p_first_as_b: float | None, *, single_order: str = "score") -> Comparison:
    """Average the two presentation orders into one comparison.

    When only one order is readable the result says so (`orders_used=1` and a note):
    `single_order="score"` uses that order alone, `"skip"` leaves the pair undecided
    (first_wins 0.5, so the sort keeps the pointwise order).
    """
    if single_order not in ("score", "skip"):
        raise ConfigError(f"single_order must be 'score' or 'skip', got {single_order!r}")
    readable = [p for p in (p_first_as_a, p_first_as_b) if p is not None]
    if not readable:
        return Comparison(0.5, None, None, None, "judge gave neither label in either order")
    if len(readable) == 1:
        which = "A" if p_first_as_a is not None else "B"
        if single_order == "skip":
            return Comparison(0.5, p_first_as_a, p_first_as_b, None,
                              f"only one order readable (first shown as {which}); skipped", 0)
        return Comparison(readable[0], p_first_as_a, p_first_as_b, None,
                          f"only one order readable (first shown as {which})", 1)
    agree = (p_first_as_a > 0.5) == (p_first_as_b > 0.5) if 0.5 not in readable else None
    return Comparison(sum(readable) / 2, p_first_as_a, p_first_as_b, agree, None, 2)


def preference_from_logprobs(a: float | None, b: float | None) -> float | None:
    """P(A) / (P(A) + P(B)) from the two labels' logprobs (missing = outside the top-k)."""
    import math

    if a is None and b is None:
        return None
    pa = math.exp(a) if a is not None else 0.0
    pb = math.exp(b) if b is not None else 0.0
    if pa + pb == 0.0:
        return None
    return pa / (pa + pb)


Pair = tuple[int, int, int]  # (group, first completion, second completion)
CompareBatch = Callable[[list[Pair]], list[Comparison]]


@dataclass
class GroupRanking:
    """One prompt's pairwise result: the order (best first) and what each comparison said."""

    order: list[int]
    comparisons: dict[tuple[int, int], Comparison]
    phases: int = 0


def odd_even_rank(
    candidates: Sequence[Sequence[int]], compare: CompareBatch, *, max_phases: int | None = None
) -> list[GroupRanking]:
    """Sort each group's candidates (given best-first by pointwise score) by pairwise result.

    `compare` receives the pending (group, first, second) pairs of one phase and returns
    one Comparison each (P(first better)). A pair is swapped when the second completion
    wins with probability > 0.5; ties keep the pointwise order.
    """
    rankings = [GroupRanking(list(c), {}) for c in candidates]
    limits = [max_phases if max_phases is not None else len(c) for c in candidates]
    quiet = [0] * len(rankings)  # consecutive phases without a swap
    phase = 0
    while True:
        active = [g for g, r in enumerate(rankings) if len(r.order) > 1 and quiet[g] < 2 and r.phases < limits[g]]
        if not active:
            return rankings
        pairs = _phase_pairs(rankings, active, phase)
        pending = [p for p in pairs if (p[1], p[2]) not in rankings[p[0]].comparisons]
        if pending:
            answers = compare(pending)
            if len(answers) != len(pending):
                raise RuntimeError(f"compare returned {len(answers)} results for {len(pending)} pairs")
            for (g, a, b), comparison in zip(pending, answers):
                rankings[g].comparisons[(a, b)] = comparison
                rankings[g].comparisons[(b, a)] = comparison.flipped()
        swapped = set()
        for g, a, b in pairs:
            order = rankings[g].order
            if rankings[g].comparisons[(b, a)].first_wins > 0.5:
                i = order.index(a)
                order[i], order[i + 1] = b, a
                swapped.add(g)
        for g in active:
            rankings[g].phases += 1
            quiet[g] = 0 if g in swapped else quiet[g] + 1
        phase += 1


def _phase_pairs(rankings: list[GroupRanking], active: list[int], phase: int) -> list[Pair]:
    pairs = []
    for g in active:
        order = rankings[g].order
        pairs += [(g, order[q], order[q + 1]) for q in range(phase % 2, len(order) - 1, 2)]
    return pairs
