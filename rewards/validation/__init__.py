"""Judge validation by synthetic degradation (Apertus report, Appendix E.4.5).

From prompts with good completions, `rewards.degrade` builds ladders whose step number is
the true rank (step j carries j flaws). The judge scores every ladder item pointwise, and
compares every pair of items of a ladder in both orders; then, per prompt (the unit of
every 95% bootstrap interval, `align.bootstrap`):

- Kendall τ_b and Spearman ρ between the judge's scores and the ladder order (higher
  score for fewer flaws = positive), pointwise (the probability-weighted score) and
  pairwise (an item's mean P(win) over its comparisons with the other items);
- accuracy on adjacent steps (j against j+1): 1 when the less flawed one scores higher,
  ½ on a tie, 0 otherwise (pairwise: P(win) above, at or below ½);
- position bias: P(the response shown first wins), over every readable presentation, with
  its interval against 0.5;
- order agreement: how often the two orders of a comparison prefer the same response;
- comparisons with only one readable order (`orders_used` 1), and how the judge's
  `single_order` setting treated them (scored, or skipped as undecided);
- the distribution of pointwise scores (per scale value, and the mean per step).

Everything is reported for all prompts and per `language` where records carry one, with a
qualification verdict per language: qualified when the chosen τ (pointwise by default)
reaches `min_kendall_tau` and, with `require_significant`, its interval lies above 0.
`validate_judge` writes report.json, report.md, ladders.jsonl (every text with its scores)
and score_by_step.png (mean pointwise score against step, one line per language), each
atomically (`align.io`).

Rank correlations are computed in `ranks` (no scipy): τ_b = (C − D) / √((n₀ − n₁)(n₀ − n₂)) and ρ
= Pearson correlation of average ranks. A judge giving one ladder the same score at every
step has no order information there: its τ and ρ count as 0.

Modules (as `align.eval` splits evaluation):

- `ranks`: Kendall τ_b, Spearman ρ, average ranks (pure statistics);
- `metrics`: one ladder's answers (`LadderResult`), the metrics over ladders with their
  intervals, and the qualification verdict;
- `validate`: the run: a record's good completion, judging the ladders, `validate_judge`;
- `report`: the markdown page and the files written; `plots`: score against step.
"""

from __future__ import annotations

from rewards.validation.metrics import (
    LadderResult,
    decided,
    decision,
    ladder_metrics,
    qualification,
)
from rewards.validation.plots import plot_scores
from rewards.validation.ranks import average_ranks, kendall_tau, spearman_rho
from rewards.validation.report import markdown, write_report
from rewards.validation.validate import good_completion, judge_ladders, validate_judge

__all__ = [
    "LadderResult",
    "average_ranks",
    "decided",
    "decision",
    "good_completion",
    "judge_ladders",
    "kendall_tau",
    "ladder_metrics",
    "markdown",
    "plot_scores",
    "qualification",
    "spearman_rho",
    "validate_judge",
    "write_report",
]
