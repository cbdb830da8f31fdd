"""The demo's report: a JSON of every number and a summary table for the terminal."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from align.data.pairs import fallback_note
from align.demo.environment import run_environment
from align.demo.parts import count_reasons
from align.io import write_json


def _ci(interval: Mapping[str, Any] | None, scale: float = 100.0, signed: bool = False, digits: int = 1) -> str:
    """``42.1 [38.0, 46.3]`` in points (percent) from an interval dict, or ``-``."""
    if not interval:
        return "-"
    sign = "+" if signed else ""
    f = lambda v: f"{v * scale:{sign}.{digits}f}"
    return f"{f(interval['estimate'])} [{f(interval['low'])}, {f(interval['high'])}]"


# How each measure's figures are printed: its column names, scale and digits, and the unit line.
MEASURE_FORMATS = {
    "exact": {"what": "accuracy", "scale": 100.0, "digits": 1,
              "unit": "accuracy in % of held-out prompts (answers), [95% bootstrap interval over prompts]"},
    "graded": {"what": "graded reward", "scale": 1.0, "digits": 3,
               "unit": "mean graded reward of the held-out answers, [95% bootstrap interval over prompts]"},
}


def summary_table(accuracy: Mapping[str, Mapping[str, Any]], gains: Mapping[str, Mapping[str, Any]],
                  head_to_head: Mapping[str, Any] | None = None, chosen: Mapping[str, str] | None = None,
                  rounds: Mapping[str, list[Mapping[str, Any]]] | None = None, measure: str = "exact") -> str:
    """Held-out figures of one measure (``accuracy`` in points, or the graded reward) per policy and
    their change against SFT, with 95% intervals; then QRPO against DPO (``head_to_head``: the
    paired differences, sampled and greedy), each later round against the round before
    (``rounds``), and the settings each was chosen with."""
    form = MEASURE_FORMATS[measure]
    ci = lambda value, signed=False: _ci(value, form["scale"], signed, form["digits"])
    width = max([8] + [len(name) + 2 for name in accuracy])
    what = form["what"]
    with_kl = measure == "exact" and any(values.get("kl") for values in accuracy.values())
    header = f"{'policy':<{width}}{f'sampled {what} (T=1)':>30}{f'greedy {what}':>26}{'sampled gain vs SFT':>26}"
    header += f"{'KL to SFT (nats)':>24}" if with_kl else ""
    lines = [header, "-" * len(header)]
    for name, values in accuracy.items():
        gain = gains.get(name, {}).get("sampled")
        kl = (f"{_ci(values.get('kl'), 1.0, False, 2) if values.get('kl') else '(reference)':>24}"
              if with_kl else "")
        lines.append(f"{name.upper():<{width}}{ci(values['sampled']):>30}{ci(values['greedy']):>26}"
                     f"{ci(gain, signed=True) if gain else '(baseline)':>26}{kl}")
    differences = [("QRPO - DPO", head_to_head)] if head_to_head else []
    for method, later in (rounds or {}).items():
        differences += [(f"{method.upper()} round {r['round']} - {r['round'] - 1}", r) for r in later]
    for label, difference in differences:
        lines.append(f"{label:<{width + 4}}{ci(difference.get('sampled'), signed=True):>26}"
                     f"{ci(difference.get('greedy'), signed=True):>26}")
    lines.append(form["unit"] + ("; KL of each policy's sampled answers to SFT's, per prompt" if with_kl else ""))
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
    from align.demo.plots import plot_reward_vs_accuracy

    plot_reward_vs_accuracy(state.along, state.out / "reward_vs_accuracy.png",
                            title=f"align demo, seed {config.seed}, trained on the {config.reward} reward")
    return plot_panels(panels, state.out / "training.png", title=f"align demo, seed {config.seed}")


def build_report(state: Any, *, total_seconds: float) -> dict[str, Any]:
    """Every number of the run: accuracy and gains with intervals, pairs, steps, timings."""
    from collections import Counter

    from align.demo.measures import measure_summary, over_optimisation, reward_agreement

    config, pairs, sweeps = state.config, state.pairs, state.sweeps
    exact = measure_summary(state.measures["exact"])
    graded = {**measure_summary(state.measures["graded"]),
              "later_rounds": state.measures["graded"]["round_comparisons"]}
    mean = lambda xs: sum(xs) / len(xs) if xs else None
    return {
        "config": {k: getattr(config, k) for k in config.__dataclass_fields__},
        "reward": config.reward,
        "held_out_prompts": len(state.splits["held_out"]),
        "validation_prompts": len(state.splits["validation"]),
        # exact accuracy (the goal), whichever reward the run trained on
        "accuracy": exact["policies"],
        "gains": exact["gains"],
        "improved": exact["improved"],
        "qrpo_vs_dpo": exact["qrpo_vs_dpo"],
        "accuracy_other_choices": exact["chosen_minus_other_choice"],
        # the same completions under the graded reward (the proxy)
        "graded_reward": graded,
        "reward_agreement": reward_agreement(state.annotated, config),
        # what the graded reward's length bias pays for, per policy (an exploit shows as "longer" rising)
        "answer_digits": state.answer_digits,
        "tuning": {"metric": config.metric, "steps_per_point": config.steps, "batch_pairs": config.batch_pairs,
                   "points_per_method": {name: len(result.points) for name, result in sweeps.items()}},
        "grids": {name: result.grid for name, result in sweeps.items()},
        "search": state.search,
        "chosen": {name: result.chosen.settings for name, result in sweeps.items()},
        # what chose (align.demo.config.DemoConfig.sweep_select_on), and the other measure's choice beside it
        "select_on": {name: result.select_on for name, result in sweeps.items()},
        "other_choice": other_choice_settings(state),
        "chosen_at_grid_edge": {name: result.at_edge for name, result in sweeps.items()},
        "along_training": state.along,
        "over_optimisation": {name: over_optimisation(points) for name, points in state.along.items()},
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
        "plots": ["training.png", "validation_grid.png", "reward_vs_accuracy.png", "evaluate/rewards.png",
                  "evaluate/win_rates.png", "evaluate/reward_vs_length.png"],
    }


def other_choice_settings(state: Any) -> dict[str, dict[str, Any]]:
    """Per method, the point the other measure would have chosen on validation (its settings and
    which measure), or nothing when the run scored no second measure."""
    from align.demo.grids import other_choice

    out = {}
    for name, result in state.sweeps.items():
        point, by = other_choice(result)
        if point is not None:
            out[name] = {"by": by, "settings": point.settings, "same_as_chosen": point.name == result.chosen.name}
    return out


def later_rounds(state: Any) -> dict[str, list[dict[str, Any]]]:
    """Each method's rounds 2..K: pairs, settings, validation score, and on the held-out prompts the
    paired difference against the round before (``sampled``, ``greedy``)."""
    compared = state.measures["exact"]["round_comparisons"]
    return {method: [{**r.as_json(), **compared[method][i]} for i, r in enumerate(later)]
            for method, later in state.rounds.items()}


def edge_note(grid: Mapping[str, list], chosen: Mapping[str, Any]) -> str:
    """Where each chosen value sits in its grid: inside, or at which edge (the best may lie beyond)."""
    from align.sweep.grid import format_value

    notes = []
    for key, values in grid.items():
        value, ordered = chosen[key], sorted(values)
        if len(values) < 3:
            where = f"one of {len(values)} values, so no interior"
        elif value == ordered[0]:
            where = "at the grid's lower edge"
        elif value == ordered[-1]:
            where = "at the grid's upper edge"
        else:
            where = "inside the grid"
        notes.append(f"{key} {format_value(value)} {where}")
    return "; ".join(notes)


def print_summary(state: Any, report: dict[str, Any]) -> None:
    """The table, each policy's verdict, and where the files are."""
    from align.sweep.grid import Point

    out = state.out
    print()
    by = {"reward": f"the {report['reward']} reward", "exact": "exact accuracy"}
    chosen = {name: f"{result.chosen.label} (by {by[result.select_on]})" for name, result in state.sweeps.items()}
    print(f"Trained on the {report['reward']} reward. Exact accuracy (the goal):")
    print(summary_table(report["accuracy"], report["gains"], report["qrpo_vs_dpo"], chosen, report["later_rounds"]))
    graded = report["graded_reward"]
    print("\nThe same answers under the graded reward (the proxy):")
    print(summary_table(graded["policies"], graded["gains"], graded["qrpo_vs_dpo"], None, None, measure="graded"))
    for name, result in state.sweeps.items():
        search = report["search"][name]
        untrained = "; ".join(Point(p).label for p in search["untrained_neighbours"])
        print(f"{name.upper()} grid ({len(result.points)} points, {len(search['added'])} added by the search): "
              f"{edge_note(result.grid, result.chosen.settings)}"
              + (f"; neighbours not trained (search_points ran out): {untrained}" if untrained else ""))
    agreement = report["reward_agreement"]
    if agreement["pearson"] is not None:
        print(f"Graded against exact on the SFT samples: correlation {agreement['pearson']:.2f}, "
              f"{agreement['pair_order']:.1%} of right/wrong pairs of a prompt in the right order.")
    longer = ", ".join(f"{name.upper()} {d['longer']:.1%}" for name, d in report["answer_digits"].items())
    print(f"Held-out answers with more digits than the prompt (what the length bias pays for): {longer}")
    for name, over in report["over_optimisation"].items():
        if over:
            print(f"{name.upper()} (chosen) along training, greedy on validation: exact "
                  f"{over['change']['exact'] * 100:+.1f} points, graded {over['change']['graded']:+.3f}")
    for name, other in report["other_choice"].items():
        measure = f"the {report['reward']} reward" if other["by"] == "reward" else "exact accuracy"
        if other["same_as_chosen"]:
            print(f"{name.upper()}: {measure} on validation would have chosen the same point.")
            continue
        label = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in other["settings"].items())
        difference = report["accuracy_other_choices"].get(f"{name}_by_{other['by']}")
        print(f"{name.upper()}: {measure} on validation would have chosen {label}"
              + (f"; chosen minus that, held-out exact accuracy: {_ci(difference['sampled'], signed=True)}"
                 if difference else ""))
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
          f"{out / 'reward_vs_accuracy.png'}, {out / 'evaluate'}/*.png")
