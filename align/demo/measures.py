"""The demo's two measures, exact accuracy (the goal) and the graded reward (the proxy), side by side.

Whichever reward a run trains on, its policies are reported under both, paired over the
same held-out prompts and samples: a policy that raises the graded reward without raising
exact accuracy is gaming the reward, and this is where it shows. Along training, every grid
point's greedy answers to the validation prompts are scored under both a few times
(``along_training_checks``), which draws reward against accuracy (over-optimisation).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from align.demo.config import DATE, GENERATE_BATCH, DemoConfig

MEASURES = ("exact", "graded")
# what the callback logs each measure as (align.eval.callback, ``also``)
LOG_KEYS = {measure: f"gen_eval/also/{measure}" for measure in MEASURES}


def along_training_callback(config: DemoConfig, validation: Sequence[Mapping[str, Any]], tokenizer: Any) -> list:
    """The callback (none when ``along_training_checks`` is 0) that scores greedy answers to the first
    ``along_training_prompts`` validation prompts under both measures at the start and
    ``along_training_checks`` times during a point's training."""
    from align.eval.callback import GenerationEvalCallback

    if config.along_training_checks == 0:
        return []
    return [GenerationEvalCallback(
        validation[: config.along_training_prompts], config.reward_provider(), tokenizer, eval_steps=max(1, config.steps // config.along_training_checks),
        chat_format="apertus", chat_date=DATE, temperature=0.0, max_tokens=config.max_tokens,
        batch_size=GENERATE_BATCH, seed=config.seed + 1,
        also={measure: config.reward_provider(measure) for measure in MEASURES})]


def held_out_figures(state: Any, rows: list[dict], settings: Any) -> dict[str, Any]:
    """One measure's held-out figures from ``eval.jsonl`` rows scored by it: every policy, each against
    SFT, QRPO against DPO, and each later round against the one before (all paired)."""
    from align.demo.rounds import round_comparisons
    from align.eval.summary import build_report, comparison_summary

    names = list(rows[0]["policies"]) if rows else []
    overall = build_report(rows, names, "sft", settings, provider_name="")["overall"]
    # each method's chosen point against the point the other measure would have chosen (align.demo.run)
    others = {name: name.split("_by_")[0] for name in names if "_by_" in name}
    return {"overall": overall,
            "qrpo_vs_dpo": comparison_summary(rows, "qrpo", "dpo", settings, between=True),
            "round_comparisons": round_comparisons(state, rows, settings),
            "other_choices": {other: comparison_summary(rows, method, other, settings, between=True)
                              for other, method in others.items()}}


def measure_summary(figures: Mapping[str, Any]) -> dict[str, Any]:
    """The report's view of one measure: each policy's figures, gains over SFT, QRPO − DPO."""
    overall, head = figures["overall"], figures["qrpo_vs_dpo"]
    policies = {name: {"sampled": p["reward_sampled"], "greedy": p["reward_greedy"], "kl": p.get("kl")}
                for name, p in overall["policies"].items()}
    gains = {name: {"sampled": c["reward_difference_sampled"], "greedy": c["reward_difference_greedy"],
                    "win_rate_sampled": c["win_rate_reward_sampled"], "verdicts": c["verdicts"]}
             for name, c in overall["comparisons"].items()}
    other = {name: {"sampled": c["reward_difference_sampled"], "greedy": c["reward_difference_greedy"],
                    "verdicts": c["verdicts"]} for name, c in figures.get("other_choices", {}).items()}
    return {"policies": policies, "gains": gains, "chosen_minus_other_choice": other,
            "improved": {name: g["sampled"]["low"] > 0 for name, g in gains.items()},
            "qrpo_vs_dpo": {"sampled": head["reward_difference_sampled"], "greedy": head["reward_difference_greedy"],
                            "win_rate_sampled": head["win_rate_reward_sampled"], "verdicts": head["verdicts"]}}


def answer_lengths(rows: Sequence[Mapping[str, Any]], prompts: Sequence[Mapping[str, Any]]) -> dict[str, dict]:
    """Per policy, the share of its sampled held-out answers with more digits than the prompt
    (what the graded reward's length bias pays for: a policy exploiting it shows here) and
    with fewer."""
    from align.demo.reward import DIGITS, problem_of

    problems = {p["id"]: len(problem_of(p["messages"])) for p in prompts}
    counts: dict[str, list[int]] = {}
    for row in rows:
        for name, entry in row["policies"].items():
            seen = counts.setdefault(name, [0, 0, 0])
            for sample in entry["samples"]:
                digits = sum(c in DIGITS for c in sample["text"])
                seen[0] += 1
                seen[1] += digits > problems[row["id"]]
                seen[2] += digits < problems[row["id"]]
    return {name: {"answers": total, "longer": longer / total if total else None,
                   "shorter": shorter / total if total else None}
            for name, (total, longer, shorter) in counts.items()}


def reward_agreement(annotated: Sequence[Mapping[str, Any]], config: DemoConfig) -> dict[str, Any]:
    """How well the graded reward tracks exact accuracy on the SFT policy's reference samples.

    ``pearson``: the correlation of the two over every sample; ``pair_order``: of the
    (right, wrong) sample pairs of one prompt, the share the graded reward puts in the right
    order, which is what the pairs are made from (ties count half).
    """
    exact, graded = config.reward_provider("exact"), config.reward_provider("graded")
    xs: list[float] = []
    ys: list[float] = []
    ordered = pairs = 0.0
    for record in annotated:
        texts = [c["text"] for c in record["completions"]]
        right = [s.value for s in exact.score([record["messages"]] * len(texts), texts,
                                               references=[record["answer"]] * len(texts))]
        score = [s.value for s in graded.score([record["messages"]] * len(texts), texts)]
        xs += right
        ys += score
        good = [g for r, g in zip(right, score) if r == 1.0]
        bad = [g for r, g in zip(right, score) if r != 1.0]
        for g in good:
            for b in bad:
                ordered += 1.0 if g > b else 0.5 if g == b else 0.0
                pairs += 1
    varied = len(set(xs)) > 1 and len(set(ys)) > 1
    return {"samples": len(xs), "exact_mean": sum(xs) / len(xs) if xs else None,
            "pearson": statistics.correlation(xs, ys) if varied else None,
            "right_wrong_pairs": int(pairs), "pair_order": ordered / pairs if pairs else None}


def training_series(log_history: Sequence[Mapping[str, Any]]) -> list[dict[str, float]]:
    """``(step, exact, graded)`` of one point's checks along training, in step order."""
    return [{"step": log["step"], **{m: float(log[LOG_KEYS[m]]) for m in MEASURES}}
            for log in log_history if all(isinstance(log.get(LOG_KEYS[m]), (int, float)) for m in MEASURES)]


def along_training(result: Any) -> list[dict[str, Any]]:
    """Every point of a sweep with its checks along training (read from its completion marker)."""
    from align.io import stage_completion_info

    points = []
    for point in result.points:
        info = stage_completion_info(point.model_dir) or {}
        series = training_series((info.get("summary") or {}).get("log_history") or [])
        points.append({"name": point.name, "settings": point.settings,
                       "chosen": result.chosen is not None and point.name == result.chosen.name, "checks": series})
    return points


def over_optimisation(points: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The chosen point's checks: change in each measure from start to end, and where accuracy peaked."""
    chosen = next((p for p in points if p["chosen"] and p["checks"]), None)
    if chosen is None:
        return None
    checks = chosen["checks"]
    best = max(checks, key=lambda c: c["exact"])
    return {"start": checks[0], "end": checks[-1],
            "change": {m: checks[-1][m] - checks[0][m] for m in MEASURES},
            "best_exact_step": best["step"], "exact_below_its_best_at_end": checks[-1]["exact"] < best["exact"]}


__all__ = ["MEASURES", "along_training", "answer_lengths", "along_training_callback", "held_out_figures", "measure_summary",
           "over_optimisation", "reward_agreement", "training_series"]
