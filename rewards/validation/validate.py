"""Judge validation, the whole run: ladders from good completions, the judge's answers on
them, the metrics per language and the verdicts; the report written with `output_dir`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from align.errors import ConfigError, InputError
from rewards.degrade import Degrader, Ladder, RuleDegrader, build_ladders
from rewards.validation.metrics import LadderResult, ladder_metrics, qualification
from rewards.validation.report import write_report


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
        raise ConfigError(f"qualify_on must be 'pointwise' or 'pairwise', got {qualify_on!r}")
    if qualify_on == "pairwise" and not pairwise:
        raise ConfigError("qualify_on='pairwise' needs pairwise=True")
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
        raise InputError(f"no ladder could be built ({len(skipped)} prompts skipped: "
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
