"""Judge validation's report: the markdown page, and the files `validate_judge` writes
(through `align.io`'s atomic writers)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from align.io import atomic_write, write_json, write_jsonl
from rewards.validation.metrics import LadderResult
from rewards.validation.plots import plot_scores


def write_report(report: Mapping[str, Any], results: Sequence[LadderResult], output_dir: str | Path) -> dict[str, Path]:
    """report.json, report.md, ladders.jsonl and score_by_step.png under `output_dir`, each
    written atomically (a killed run leaves the previous file or none, never half of one)."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "report.json", "md": out / "report.md", "ladders": out / "ladders.jsonl",
             "plot": out / "score_by_step.png"}
    write_json(paths["json"], report)
    atomic_write(paths["md"], lambda handle: handle.write(markdown(report)))
    write_jsonl(paths["ladders"], (ladder_row(r) for r in results), default=str)
    plot_scores(report, paths["plot"])
    return paths


def ladder_row(result: LadderResult) -> dict[str, Any]:
    """One line of ladders.jsonl: the ladder, its scores and every comparison."""
    return {**result.ladder.to_dict(), "pointwise": result.pointwise,
            "pairwise": result.pairwise_scores() if result.comparisons else None,
            "comparisons": [{"pair": [i, j], "first_wins": c.first_wins, "p_first_as_a": c.p_first_as_a,
                             "p_first_as_b": c.p_first_as_b, "orders_used": c.orders_used, "note": c.note}
                            for (i, j), c in sorted(result.comparisons.items())]}


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
