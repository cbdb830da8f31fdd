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
and score_by_step.png (mean pointwise score against step, one line per language).

Rank correlations are computed here (no scipy): τ_b = (C − D) / √((n₀ − n₁)(n₀ − n₂)) and ρ
= Pearson correlation of average ranks. A judge giving one ladder the same score at every
step has no order information there: its τ and ρ count as 0.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from align.bootstrap import bootstrap_mean
from rewards.degrade import Degrader, Ladder, RuleDegrader, build_ladders

# --------------------------------------------------------------------------- rank statistics


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


# --------------------------------------------------------------------------- the whole run


def good_completion(record: Mapping[str, Any], field_name: str) -> str | None:
    """The record's good completion: `field_name` (a string, or {"text": ...}), else the first
    entry of `completions`, else `chosen`."""
    value = record.get(field_name)
    if value is None and record.get("completions"):
        value = record["completions"][0]
    if value is None:
        value = record.get("chosen")
    if isinstance(value, Mapping):
        value = value.get("text")
    if isinstance(value, list):  # chosen as messages: the last assistant turn
        value = value[-1].get("content") if value else None
    return value if isinstance(value, str) else None


def judge_ladders(judge: Any, ladders: Sequence[Ladder], *, pairwise: bool = True) -> list[LadderResult]:
    """Score every ladder item pointwise (one batch), and compare all pairs of each ladder."""
    conversations = [ladder.conversation for ladder in ladders for _ in ladder.texts]
    texts = [text for ladder in ladders for text in ladder.texts]
    flat = judge.score(conversations, texts) if texts else []
    results, start = [], 0
    for ladder in ladders:
        values = [s.value for s in flat[start : start + len(ladder.texts)]]
        results.append(LadderResult(ladder, values))
        start += len(ladder.texts)
    if pairwise:
        index = [(n, i, j) for n, ladder in enumerate(ladders) for i in range(len(ladder.texts))
                 for j in range(i + 1, len(ladder.texts))]
        asked = [(ladders[n].conversation, ladders[n].texts[i], ladders[n].texts[j]) for n, i, j in index]
        answers = judge.compare_pairs(asked) if asked else []
        for (n, i, j), comparison in zip(index, answers):
            results[n].comparisons[(i, j)] = comparison
    return results


def validate_judge(
    records: Sequence[Mapping[str, Any]],
    judge: Any,
    *,
    degrader: Degrader | None = None,
    ladders: Sequence[Ladder] | None = None,
    steps: int = 4,
    kinds: Sequence[str] | None = None,
    pairwise: bool = True,
    min_kendall_tau: float = 0.5,
    qualify_on: str = "pointwise",
    require_significant: bool = True,
    completion_field: str = "completion",
    language_field: str = "language",
    output_dir: str | Path | None = None,
    resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, Any]:
    """Measure a judge on degradation ladders; return (and with `output_dir`, write) the report.

    `records` carry `messages` (the prompt), a good completion (`completion_field`, see
    `good_completion`) and optionally `language_field`; `ladders` (from `build_ladders`)
    replace building them. `judge` is a `ConstitutionalJudge` (anything with `score` and,
    for pairwise, `compare_pairs`). `degrader` defaults to the rule-based one.
    """
    if qualify_on not in ("pointwise", "pairwise"):
        raise ValueError(f"qualify_on must be 'pointwise' or 'pairwise', got {qualify_on!r}")
    if qualify_on == "pairwise" and not pairwise:
        raise ValueError("qualify_on='pairwise' needs pairwise=True")
    degrader = degrader or RuleDegrader()
    skipped: list[dict[str, Any]] = []
    if ladders is None:
        items = []
        for n, record in enumerate(records):
            rid = str(record.get("id", n))
            text = good_completion(record, completion_field)
            if text is None:
                skipped.append({"id": rid, "reason": f"no good completion ({completion_field!r}, completions or chosen)"})
                continue
            items.append((rid, record["messages"], text, record.get(language_field)))
        ladders, more = build_ladders(items, degrader, steps=steps, kinds=kinds, seed=seed)
        skipped += more
    if not ladders:
        raise ValueError(f"no ladder could be built ({len(skipped)} prompts skipped: "
                         f"{Counter(s['reason'] for s in skipped).most_common(3)})")
    results = judge_ladders(judge, ladders, pairwise=pairwise)
    scale = tuple(judge.config.scale) if hasattr(judge, "config") else None
    stats = {"scale": scale, "resamples": resamples, "seed": seed, "confidence": confidence}
    groups: dict[str, list[LadderResult]] = {}
    for result in results:
        if result.ladder.language is not None:
            groups.setdefault(str(result.ladder.language), []).append(result)
    report: dict[str, Any] = {
        "method": "synthetic degradation ladders (Apertus report, Appendix E.4.5)",
        "judge": judge.fingerprint() if hasattr(judge, "fingerprint") else {"judge": type(judge).__name__},
        "degrader": degrader.describe(),
        "settings": {"steps": steps, "kinds": list(kinds) if kinds else None, "pairwise": pairwise,
                     "min_kendall_tau": min_kendall_tau, "qualify_on": qualify_on,
                     "require_significant": require_significant, "resamples": resamples,
                     "confidence": confidence, "seed": seed},
        "ladders": len(ladders),
        "skipped": skipped,
        "flaws_used": dict(Counter(kind for ladder in ladders for kind in ladder.flaws)),
        "all": ladder_metrics(results, **stats),
        "languages": {lang: ladder_metrics(group, **stats) for lang, group in sorted(groups.items())},
    }
    verdict_args = {"min_kendall_tau": min_kendall_tau, "qualify_on": qualify_on, "require_significant": require_significant}
    report["verdicts"] = {lang: qualification(m, **verdict_args) for lang, m in report["languages"].items()}
    report["verdicts"]["all"] = qualification(report["all"], **verdict_args)
    if output_dir is not None:
        write_report(report, results, output_dir)
    return report


# --------------------------------------------------------------------------- outputs


def write_report(report: Mapping[str, Any], results: Sequence[LadderResult], output_dir: str | Path) -> dict[str, Path]:
    """report.json, report.md, ladders.jsonl and score_by_step.png under `output_dir`."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "report.json", "md": out / "report.md", "ladders": out / "ladders.jsonl",
             "plot": out / "score_by_step.png"}
    paths["json"].write_text(json.dumps(report, indent=2, ensure_ascii=False, default=str) + "\n", encoding="utf-8")
    paths["md"].write_text(markdown(report), encoding="utf-8")
    with paths["ladders"].open("w", encoding="utf-8") as handle:
        for r in results:
            row = {**r.ladder.to_dict(), "pointwise": r.pointwise,
                   "pairwise": r.pairwise_scores() if r.comparisons else None,
                   "comparisons": [{"pair": [i, j], "first_wins": c.first_wins, "p_first_as_a": c.p_first_as_a,
                                    "p_first_as_b": c.p_first_as_b, "orders_used": c.orders_used, "note": c.note}
                                   for (i, j), c in sorted(r.comparisons.items())]}
            handle.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
    plot_scores(report, paths["plot"])
    return paths


def _fmt(interval: Mapping[str, Any] | None) -> str:
    if not interval:
        return "–"
    return f"{interval['estimate']:.3f} [{interval['low']:.3f}, {interval['high']:.3f}]"


def markdown(report: Mapping[str, Any]) -> str:
    """The report as a markdown page: verdicts, a metrics table per language, score distribution."""
    settings = report["settings"]
    lines = [
        "# Judge validation",
        "",
        (f"Method: {report['method']}. {report['ladders']} ladders of {settings['steps']} flaws "
         f"({report['degrader']['degrader']} degrader), {len(report['skipped'])} prompts skipped. "
         f"Intervals: {int(settings['confidence'] * 100)}% bootstrap over prompts."),
        "",
        "## Verdicts",
        "",
    ]
    for lang, v in report["verdicts"].items():
        lines.append(f"- **{lang}**: {'qualified' if v['qualified'] else 'not qualified'}: {v['reason']}.")
    sections = [("all", report["all"])] + list(report["languages"].items())
    header = ("| group | prompts | τ pointwise | τ pairwise | ρ pointwise | ρ pairwise | adjacent pointwise | "
              "adjacent pairwise | P(first shown wins) | orders agree | one order |")
    lines += ["", "## Metrics", "", header, "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, m in sections:
        lines.append(
            f"| {name} | {m['prompts']} | {_fmt(m['kendall_tau'].get('pointwise'))} | {_fmt(m['kendall_tau'].get('pairwise'))} | "
            f"{_fmt(m['spearman_rho'].get('pointwise'))} | {_fmt(m['spearman_rho'].get('pairwise'))} | "
            f"{_fmt(m['adjacent_accuracy'].get('pointwise'))} | {_fmt(m['adjacent_accuracy'].get('pairwise'))} | "
            f"{_fmt(m.get('position_bias'))} | {_fmt(m.get('order_agreement'))} | "
            f"{m.get('single_order_comparisons', '–')} of {m.get('comparisons', '–')} |"
        )
    bias = report["all"].get("position_bias")
    if bias:
        side = "above" if bias["low"] > 0.5 else "below" if bias["high"] < 0.5 else None
        said = (f"the interval lies {side} 0.5: the judge favours the {'first' if side == 'above' else 'second'} position."
                if side else "the interval includes 0.5: no position bias shown.")
        lines += ["", f"Position bias: P(first shown wins) {_fmt(bias)}; {said}"]
    lines += ["", "## Pointwise scores", "", "| group | step | mean score |", "|---|---|---|"]
    for name, m in sections:
        for step, interval in enumerate(m["pointwise_scores"]["mean_by_step"]):
            lines.append(f"| {name} | {step} | {_fmt(interval)} |")
    hist = report["all"]["pointwise_scores"]["histogram"]
    lines += ["", "Histogram of pointwise scores (rounded): " + ", ".join(f"{k}: {v}" for k, v in hist.items()),
              "", f"Flaws used: {', '.join(f'{k} {v}' for k, v in sorted(report['flaws_used'].items()))}.", ""]
    if report["degrader"].get("cannot"):
        lines += ["The degrader cannot imitate: " + "; ".join(f"{k} ({v})" for k, v in report["degrader"]["cannot"].items()), ""]
    return "\n".join(lines)


def plot_scores(report: Mapping[str, Any], path: str | Path) -> None:
    """Mean pointwise score (with its CI) against degradation step, one line per language."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(report["languages"].items()) or [("all", report["all"])]
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, m in groups:
        points = [(step, iv) for step, iv in enumerate(m["pointwise_scores"]["mean_by_step"]) if iv]
        if not points:
            continue
        xs = [s for s, _ in points]
        ax.plot(xs, [iv["estimate"] for _, iv in points], marker="o", label=f"{name} (n={m['prompts']})")
        ax.fill_between(xs, [iv["low"] for _, iv in points], [iv["high"] for _, iv in points], alpha=0.15)
    steps = max((len(m["pointwise_scores"]["mean_by_step"]) for _, m in groups), default=1)
    ax.set_xticks(range(steps))
    ax.set_xlabel("degradation step (flaws added)")
    ax.set_ylabel("mean pointwise judge score")
    ax.set_title("Judge score against degradation step")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
