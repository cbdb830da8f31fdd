"""The figures of an evaluation report, computed from its per-prompt rows.

Per policy: mean reward (greedy, sampled), completion length and KL(π‖π_ref), each with a
bootstrap CI over prompts. Per policy against the baseline: win rates by reward and by the
judge's head-to-head comparisons (ties count half), how often the judge's two orders
agreed, paired reward differences, and win rates within length buckets (the policy's
completion shorter than, as long as, or longer than the baseline's), which shows a judge or
reward model that prefers longer answers. The same, per ``language`` and ``category``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from align.eval import stats

BREAKDOWN_COLUMNS = ("language", "category")
# Completion length relative to the baseline's, for win rates within length buckets.
LENGTH_BUCKETS = ("shorter", "same", "longer")

def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _length_bucket(mine: int, theirs: int) -> str:
    return LENGTH_BUCKETS[(mine > theirs) - (mine < theirs) + 1]


def _reward_outcomes(a: Mapping[str, Any], b: Mapping[str, Any], kind: str) -> list[tuple[float | None, str]]:
    """(outcome, length bucket) of a policy's completions against the baseline's, pairwise by position."""
    if kind == "greedy":
        pairs = [(a["greedy"], b["greedy"])] if a.get("greedy") and b.get("greedy") else []
    else:
        pairs = list(zip(a["samples"], b["samples"]))
    return [(stats.outcome(x["score"], y["score"]), _length_bucket(x["num_tokens"], y["num_tokens"]))
            for x, y in pairs]


def _judge_outcomes(a: Mapping[str, Any], b: Mapping[str, Any], kind: str, margin: float) -> list[tuple]:
    judged = a.get("judge_vs_baseline") or {}
    if kind == "greedy":
        entries = [(judged.get("greedy"), a.get("greedy"), b.get("greedy"))] if judged.get("greedy") else []
    else:
        entries = list(zip(judged.get("samples", []), a["samples"], b["samples"]))
    return [(stats.preference_outcome(e["p_win"], tie_margin=margin), e["orders_agree"],
             _length_bucket(x["num_tokens"], y["num_tokens"])) for e, x, y in entries]


def _win(outcomes_per_prompt: list[list[float | None]], settings: Any) -> dict[str, Any] | None:
    result = stats.win_rate(outcomes_per_prompt, resamples=settings.resamples, confidence=settings.confidence,
                            seed=settings.seed)
    return None if result is None else result.to_dict()


def _interval(values: list[float], settings: Any) -> dict[str, Any] | None:
    if not values:
        return None
    return stats.bootstrap_mean(values, resamples=settings.resamples, confidence=settings.confidence,
                                seed=settings.seed).to_dict()


def policy_summary(rows: list[dict], name: str, settings: Any) -> dict[str, Any]:
    """Mean reward (greedy, sampled), length, skips and KL of one policy, with CIs over prompts."""
    greedy, sampled, lengths, kls = [], [], [], []
    skipped = total = 0
    for row in rows:
        entry = row["policies"][name]
        if entry.get("greedy"):
            total += 1
            if entry["greedy"]["score"] is None:
                skipped += 1
            else:
                greedy.append(entry["greedy"]["score"])
        values = [s["score"] for s in entry["samples"] if s["score"] is not None]
        total += len(entry["samples"])
        skipped += len(entry["samples"]) - len(values)
        if values:
            sampled.append(sum(values) / len(values))
        if entry["samples"]:
            lengths.append(_mean([s["num_tokens"] for s in entry["samples"]]))
        elif entry.get("greedy"):
            lengths.append(entry["greedy"]["num_tokens"])
        if entry.get("kl_logratios"):
            kls.append(sum(entry["kl_logratios"]) / len(entry["kl_logratios"]))
    out = {
        "prompts": len(rows),
        "reward_greedy": _interval(greedy, settings),
        "reward_sampled": _interval(sampled, settings),
        "length": _interval(lengths, settings),
        "scored": total - skipped,
        "skipped": skipped,
    }
    if kls:
        out["kl"] = _interval(kls, settings)
    return out


def comparison_summary(rows: list[dict], name: str, baseline: str, settings: Any, *,
                       between: bool = False) -> dict[str, Any]:
    """Win rates (reward and judge), paired reward differences and length buckets against the baseline.
    ``between``: two methods side by side (neither is the other's start), so the verdicts say
    "higher" or "lower", never "improvement" or "decline"."""
    out: dict[str, Any] = {"policy": name, "baseline": baseline}
    for kind in ("greedy", "sampled"):
        reward_outcomes = [_reward_outcomes(r["policies"][name], r["policies"][baseline], kind) for r in rows]
        out[f"win_rate_reward_{kind}"] = _win([[o for o, _ in per] for per in reward_outcomes], settings)
        deltas = _paired_deltas(rows, name, baseline, kind)
        out[f"reward_difference_{kind}"] = None if not deltas else stats.paired_difference(
            [a for a, _ in deltas], [b for _, b in deltas], resamples=settings.resamples,
            confidence=settings.confidence, seed=settings.seed).to_dict()
        if kind == "sampled":
            out["win_rate_reward_by_length"] = {
                bucket: _win([[o for o, b in per if b == bucket] for per in reward_outcomes], settings)
                for bucket in LENGTH_BUCKETS}
        judged = [_judge_outcomes(r["policies"][name], r["policies"][baseline], kind, settings.tie_margin)
                  for r in rows]
        if any(judged):
            out[f"win_rate_judge_{kind}"] = _win([[o for o, _, _ in per] for per in judged], settings)
            agreements = [a for per in judged for _, a, _ in per if a is not None]
            out[f"judge_orders_agree_{kind}"] = _mean([float(a) for a in agreements])
            if kind == "sampled":
                out["win_rate_judge_by_length"] = {
                    bucket: _win([[o for o, _, b in per if b == bucket] for per in judged], settings)
                    for bucket in LENGTH_BUCKETS}
    out["verdicts"] = _verdicts(out, name, baseline, between=between)
    return out


def _paired_deltas(rows: list[dict], name: str, baseline: str, kind: str) -> list[tuple[float, float]]:
    """Per prompt (policy value, baseline value) where both were scored: greedy score or sample mean."""
    pairs = []
    for row in rows:
        a, b = row["policies"][name], row["policies"][baseline]
        if kind == "greedy":
            if a.get("greedy") and b.get("greedy") and None not in (a["greedy"]["score"], b["greedy"]["score"]):
                pairs.append((a["greedy"]["score"], b["greedy"]["score"]))
            continue
        mine = [s["score"] for s in a["samples"] if s["score"] is not None]
        theirs = [s["score"] for s in b["samples"] if s["score"] is not None]
        if mine and theirs:
            pairs.append((sum(mine) / len(mine), sum(theirs) / len(theirs)))
    return pairs


def _verdicts(comparison: Mapping[str, Any], name: str, baseline: str, *, between: bool = False) -> list[str]:
    sentences = []
    for kind in ("sampled", "greedy"):
        delta = comparison.get(f"reward_difference_{kind}")
        if delta:
            sentences.append(stats.verdict(f"{name} − {baseline}, mean {kind} reward",
                                           stats.Interval(**delta), null=0.0, between=between))
        for source in ("reward", "judge"):
            win = comparison.get(f"win_rate_{source}_{kind}")
            if win:
                sentences.append(stats.verdict(f"{name} vs {baseline}, win rate by {source} ({kind})",
                                               stats.Interval(**win["rate"]), null=0.5, between=between))
    return sentences


def _groups(rows: list[dict], column: str) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = {}
    for row in rows:
        if column in row:
            groups.setdefault(str(row[column]), []).append(row)
    return groups


def build_report(rows: list[dict], names: Sequence[str], baseline: str, settings: Any, *,
                 provider_name: str, kl_notes: Mapping[str, str] | None = None,
                 supplied: Sequence[str] = ()) -> dict[str, Any]:
    """Every figure of the evaluation, overall and per ``language`` / ``category``.
    ``supplied``: the policies whose completions were given, not generated here (the
    generation settings do not describe them)."""

    def section(subset: list[dict]) -> dict[str, Any]:
        return {
            "policies": {n: policy_summary(subset, n, settings) for n in names},
            "comparisons": {n: comparison_summary(subset, n, baseline, settings) for n in names if n != baseline},
        }

    report: dict[str, Any] = {
        "provider": provider_name,
        "baseline": baseline,
        "prompts": len(rows),
        "settings": {k: getattr(settings, k) for k in settings.__dataclass_fields__},
        "generated": [n for n in names if n not in supplied],
        "supplied": [n for n in names if n in supplied],
        "overall": section(rows),
        "kl_notes": dict(kl_notes or {}),
        "breakdowns": {},
    }
    for column in BREAKDOWN_COLUMNS:
        groups = _groups(rows, column)
        if groups:
            report["breakdowns"][column] = {value: section(subset) for value, subset in sorted(groups.items())}
    _check_finite(report)
    return report


def _check_finite(value: Any, where: str = "report") -> None:
    """A NaN in a report is a bug upstream: fail here rather than write it."""
    if isinstance(value, float) and not math.isfinite(value):
        raise RuntimeError(f"{where} is {value}")
    if isinstance(value, Mapping):
        for key, item in value.items():
            _check_finite(item, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_finite(item, f"{where}[{i}]")


