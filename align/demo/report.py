"""The demo's report: a JSON of every number and a summary table for the terminal."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from align.data.pairs import fallback_note
from align.demo.environment import run_environment
from align.io import write_json


def _ci(interval: Mapping[str, Any] | None, scale: float = 100.0, signed: bool = False) -> str:
    """``42.1 [38.0, 46.3]`` in points (percent) from an interval dict, or ``-``."""
    if not interval:
        return "-"
    sign = "+" if signed else ""
    f = lambda v: f"{v * scale:{sign}.1f}"
    return f"{f(interval['estimate'])} [{f(interval['low'])}, {f(interval['high'])}]"


def summary_table(accuracy: Mapping[str, Mapping[str, Any]], gains: Mapping[str, Mapping[str, Any]],
                  head_to_head: Mapping[str, Any] | None = None, chosen: Mapping[str, str] | None = None,
                  rounds: Mapping[str, list[Mapping[str, Any]]] | None = None) -> str:
    """Held-out accuracy per policy and its change against SFT, in points, with 95% intervals;
    then QRPO against DPO (``head_to_head``: the paired differences, sampled and greedy), each
    later round against the round before (``rounds``), and the settings each was chosen with."""
    width = max([8] + [len(name) + 2 for name in accuracy])
    header = f"{'policy':<{width}}{'sampled accuracy (T=1)':>26}{'greedy accuracy':>24}{'sampled gain vs SFT':>26}"
    lines = [header, "-" * len(header)]
    for name, values in accuracy.items():
        gain = gains.get(name, {}).get("sampled")
        lines.append(f"{name.upper():<{width}}{_ci(values['sampled']):>26}{_ci(values['greedy']):>24}"
                     f"{_ci(gain, signed=True) if gain else '(baseline)':>26}")
    differences = [("QRPO - DPO", head_to_head)] if head_to_head else []
    for method, later in (rounds or {}).items():
        differences += [(f"{method.upper()} round {r['round']} - {r['round'] - 1}", r) for r in later]
    for label, difference in differences:
        lines.append(f"{label:<{width + 4}}{_ci(difference.get('sampled'), signed=True):>22}"
                     f"{_ci(difference.get('greedy'), signed=True):>24}")
    lines.append("accuracy in % of held-out prompts (answers), [95% bootstrap interval over prompts]")
    for name, label in (chosen or {}).items():
        lines.append(f"{name.upper()}: {label}, chosen on the validation prompts")
    return "\n".join(lines)


def write_report(out: Path, report: dict[str, Any]) -> Path:
    return write_json(out / "report.json", report)


def _series(logs: list[dict], key: str) -> list[tuple[int, float]]:
    """(step, value) of one logged quantity."""
    return [(log["step"], float(log[key])) for log in logs if isinstance(log.get(key), (int, float))]


def chosen_log_history(result: Any) -> list[dict]:
    """The training logs of a sweep's chosen point (kept in its completion marker)."""
    from align.io import stage_completion_info

    info = stage_completion_info(result.chosen.model_dir) or {}
    return (info.get("summary") or {}).get("log_history") or []


def plot_training(state: Any) -> Path:
    """``training.png``: SFT loss and stopping, the chosen points' losses and targets;
    ``validation_grid.png``: each method's validation score over its grid."""
    from align.demo.plots import Panel, plot_panels
    from align.sweep.plots import plot_sweeps

    config, sweeps = state.config, state.sweeps
    plot_sweeps({"QRPO": sweeps["qrpo"], "DPO": sweeps["dpo"]}, state.out / "validation_grid.png",
                title=f"align demo, seed {config.seed}: validation {config.metric} over each grid "
                      f"({config.steps} steps a point)")
    qrpo_logs, dpo_logs = chosen_log_history(sweeps["qrpo"]), chosen_log_history(sweeps["dpo"])
    panels = [
        Panel("SFT: training loss", "loss", {"SFT": _series(state.sft.state.log_history, "loss")}),
        Panel("SFT: greedy accuracy on validation prompts", "accuracy", {"SFT": state.sft_history},
              hline=config.sft_stop_accuracy, hline_label="stop at", smooth=False),
        Panel("QRPO and DPO (chosen points): training loss", "loss",
              {"QRPO": _series(qrpo_logs, "loss"), "DPO": _series(dpo_logs, "loss")}),
        Panel("QRPO (chosen): beta x log-ratio against its target", "value", {
            "target, chosen": _series(qrpo_logs, "qrpo/target/chosen"),
            "beta x log-ratio, chosen": _series(qrpo_logs, "qrpo/beta_logratio/chosen"),
            "target, rejected": _series(qrpo_logs, "qrpo/target/rejected"),
            "beta x log-ratio, rejected": _series(qrpo_logs, "qrpo/beta_logratio/rejected")}),
        Panel("DPO (chosen): reward margin, chosen minus rejected", "margin",
              {"DPO": _series(dpo_logs, "rewards/margins")}),
    ]
    return plot_panels(panels, state.out / "training.png", title=f"align demo, seed {config.seed}")


def count_reasons(items: Any) -> dict[str, int]:
    """How many skips of each reason (the text before its first colon)."""
    counts: dict[str, int] = {}
    for item in items:
        key = str(item).split(":")[0]
        counts[key] = counts.get(key, 0) + 1
    return counts


def build_report(state: Any, *, total_seconds: float) -> dict[str, Any]:
    """Every number of the run: accuracy and gains with intervals, pairs, steps, timings."""
    from collections import Counter

    config, pairs, overall, sweeps = state.config, state.pairs, state.evaluation["overall"], state.sweeps
    accuracy = {name: {"sampled": p["reward_sampled"], "greedy": p["reward_greedy"], "kl": p.get("kl")}
                for name, p in overall["policies"].items()}
    gains = {name: {"sampled": c["reward_difference_sampled"], "greedy": c["reward_difference_greedy"],
                    "win_rate_sampled": c["win_rate_reward_sampled"], "verdicts": c["verdicts"]}
             for name, c in overall["comparisons"].items()}
    mean = lambda xs: sum(xs) / len(xs) if xs else None
    return {
        "config": {k: getattr(config, k) for k in config.__dataclass_fields__},
        "held_out_prompts": len(state.splits["held_out"]),
        "validation_prompts": len(state.splits["validation"]),
        "accuracy": accuracy,
        "gains": gains,
        "improved": {name: g["sampled"]["low"] > 0 for name, g in gains.items()},
        "qrpo_vs_dpo": {"sampled": state.head_to_head["reward_difference_sampled"],
                        "greedy": state.head_to_head["reward_difference_greedy"],
                        "win_rate_sampled": state.head_to_head["win_rate_reward_sampled"],
                        "verdicts": state.head_to_head["verdicts"]},
        "tuning": {"metric": config.metric, "steps_per_point": config.steps, "batch_pairs": config.batch_pairs,
                   "points_per_method": {name: len(result.points) for name, result in sweeps.items()}},
        "grids": {name: result.grid for name, result in sweeps.items()},
        "chosen": {name: result.chosen.settings for name, result in sweeps.items()},
        "sweeps": {name: result.as_json() for name, result in sweeps.items()},
        "sft_steps": state.sft.state.global_step,
        "sft_validation": state.sft_history,
        "prompts": len(state.splits["prompts"]),
        "pairs": len(pairs),
        "pair_fallbacks": sum(1 for p in pairs if p.get("pair_fallback")),
        "pair_fallback_kinds": dict(Counter(p["pair_fallback"] for p in pairs if p.get("pair_fallback"))),
        "mean_chosen_quantile": mean([p["chosen_quantile"] for p in pairs]),
        "mean_rejected_quantile": mean([p["rejected_quantile"] for p in pairs]),
        "skipped_prompts": len(state.skips),
        "skip_reasons": count_reasons(s["reason"] for s in state.skips),
        "steps": {name: result.chosen.steps for name, result in sweeps.items()},
        "rounds": config.rounds,
        "later_rounds": later_rounds(state),
        "judge": state.judge_summary,
        "seconds": state.seconds,
        "total_seconds": total_seconds,
        # what a rerun must match to give the same digits (align.demo.environment)
        "environment": run_environment(),
        "evaluation": "evaluate/report.md",
        "plots": ["training.png", "validation_grid.png", "evaluate/rewards.png", "evaluate/win_rates.png",
                  "evaluate/reward_vs_length.png"],
    }


def later_rounds(state: Any) -> dict[str, list[dict[str, Any]]]:
    """Each method's rounds 2..K: pairs, settings, validation score, and on the held-out prompts the
    paired difference against the round before (``sampled``, ``greedy``)."""
    compared = state.round_comparisons
    return {method: [{**r.as_json(), **compared[method][i]} for i, r in enumerate(later)]
            for method, later in state.rounds.items()}


def print_summary(state: Any, report: dict[str, Any]) -> None:
    """The table, each policy's verdict, and where the files are."""
    out = state.out
    print()
    chosen = {name: result.chosen.label for name, result in state.sweeps.items()}
    print(summary_table(report["accuracy"], report["gains"], report["qrpo_vs_dpo"], chosen, report["later_rounds"]))
    for name, gain in report["gains"].items():
        print(f"{name.upper()}: {gain['verdicts'][0]}")
    print(f"QRPO against DPO: {report['qrpo_vs_dpo']['verdicts'][0]}")
    for later in report["later_rounds"].values():
        for r in later:
            print(f"Round {r['round']} against round {r['round'] - 1}: {r['verdicts'][0]}")
    print(f"({report['pairs']} pairs from {report['prompts']} prompts; SFT stopped at step {report['sft_steps']}; "
          f"{report['total_seconds']} s in all.)")
    if report["pair_fallbacks"]:
        print(fallback_note(report["pair_fallbacks"], report["pairs"], report["pair_fallback_kinds"]))
    print(f"Report: {out / 'report.json'}, {out / 'evaluate' / 'report.md'}, {out / 'qrpo' / 'sweep.md'}, "
          f"{out / 'dpo' / 'sweep.md'}; plots: {out / 'training.png'}, {out / 'validation_grid.png'}, "
          f"{out / 'evaluate'}/*.png")
