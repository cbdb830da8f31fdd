"""An evaluation's outputs: ``eval.jsonl``, ``report.json``, ``report.md`` and three plots.

``report.md`` is meant to be pasted into a model card: one table of the policies (mean
reward greedy and sampled, length, KL), one of the comparisons with the baseline (win rates
and reward differences, with 95% intervals), a sentence per comparison saying whether its
interval excludes no change, and the same tables per language and category.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from align.errors import optional_import
from align.io import write_json, write_jsonl

PLOTS = ("rewards.png", "win_rates.png", "reward_vs_length.png")


def _ci(value: Mapping[str, Any] | None, scale: float = 1.0, digits: int = 3) -> str:
    if not value:
        return "–"
    f = lambda v: f"{v * scale:.{digits}f}"
    return f"{f(value['estimate'])} [{f(value['low'])}, {f(value['high'])}]"


def _win_cell(win: Mapping[str, Any] | None) -> str:
    if not win:
        return "–"
    return f"{_ci(win['rate'])} ({win['wins']}/{win['ties']}/{win['losses']})"


def _tables(section: Mapping[str, Any], baseline: str) -> list[str]:
    lines = ["| policy | reward, greedy | reward, sampled | length (tokens) | KL(π‖π_ref) | scored / skipped |",
             "|---|---|---|---|---|---|"]
    for name, p in section["policies"].items():
        label = f"{name} (baseline)" if name == baseline else name
        lines.append(f"| {label} | {_ci(p['reward_greedy'])} | {_ci(p['reward_sampled'])} | "
                     f"{_ci(p['length'], digits=1)} | {_ci(p.get('kl'))} | {p['scored']} / {p['skipped']} |")
    if section["comparisons"]:
        lines += ["", f"Against {baseline} (win rate [95% CI] (wins/ties/losses); ties count half):", "",
                  ("| policy | win rate by reward, sampled | by reward, greedy | by judge, sampled | by judge, greedy "
                  "| judge orders agree | reward difference, sampled | reward difference, greedy |"),
                  "|---|---|---|---|---|---|---|---|"]
        for name, c in section["comparisons"].items():
            agree = c.get("judge_orders_agree_sampled")
            lines.append(
                f"| {name} | {_win_cell(c['win_rate_reward_sampled'])} | {_win_cell(c['win_rate_reward_greedy'])} | "
                f"{_win_cell(c.get('win_rate_judge_sampled'))} | {_win_cell(c.get('win_rate_judge_greedy'))} | "
                f"{'–' if agree is None else f'{agree:.2f}'} | {_ci(c['reward_difference_sampled'])} | "
                f"{_ci(c['reward_difference_greedy'])} |")
        lines += ["", ("Win rate by reward within length buckets (the policy's sample shorter than, as long as, "
                  "or longer than the baseline's):"), "", "| policy | shorter | same | longer |", "|---|---|---|---|"]
        for name, c in section["comparisons"].items():
            buckets = c["win_rate_reward_by_length"]
            lines.append(f"| {name} | " + " | ".join(_win_cell(buckets[b]) for b in ("shorter", "same", "longer"))
                         + " |")
    return lines


def _generation_sentence(report: Mapping[str, Any]) -> str:
    """How the completions came about: the sampling settings for the policies sampled here,
    and, apart, the policies whose completions were given (the settings do not describe them)."""
    s = report["settings"]
    supplied = report.get("supplied") or []
    generated = report.get("generated", [n for n in report["overall"]["policies"] if n not in supplied])
    said = []
    if generated:
        said.append(f"{'Sampled here' if supplied else 'Sampled'}"
                    f"{' (' + ', '.join(f'`{n}`' for n in generated) + ')' if supplied else ''}: "
                    f"greedy {'yes' if s['greedy'] else 'no'}; {s['n']} samples per prompt at temperature "
                    f"{s['temperature']} (top_p {s['top_p']}, at most {s['max_tokens']} tokens).")
    if supplied:
        said.append(f"Given as completions ({', '.join(f'`{n}`' for n in supplied)}): their first {s['n']} per "
                    "prompt are the samples, with no greedy answer; how they were sampled is not known here.")
    return " ".join(said)


def markdown(report: Mapping[str, Any]) -> str:
    """The report as Markdown tables and sentences."""
    baseline = report["baseline"]
    s = report["settings"]
    lines = [
        "# Evaluation report", "",
        (f"{report['prompts']} prompts; reward: `{report['provider']}`; baseline: `{baseline}`. "
         f"{_generation_sentence(report)} Intervals are {int(s['confidence'] * 100)}% "
         f"bootstrap intervals over prompts ({s['resamples']} resamples; paired where two policies answered "
         "the same prompts)."), "",
        "## Overall", "",
    ]
    lines += _tables(report["overall"], baseline)
    verdicts = [v for c in report["overall"]["comparisons"].values() for v in c["verdicts"]]
    if verdicts:
        lines += ["", "### What the intervals say", ""] + [f"- {v}" for v in verdicts]
    if report.get("kl_notes"):
        lines += ["", "KL not estimated for: " + "; ".join(f"{k}: {v}" for k, v in report["kl_notes"].items()) + "."]
    for column, groups in report.get("breakdowns", {}).items():
        for value, section in groups.items():
            lines += ["", f"## {column}: {value}", ""] + _tables(section, baseline)
    return "\n".join(lines) + "\n"


def write_outputs(out: Path, rows: Sequence[Mapping[str, Any]], report: dict[str, Any], *, plots: bool = True) -> None:
    """eval.jsonl, report.json, report.md and (optionally) the plots, each written atomically."""
    write_jsonl(out / "eval.jsonl", rows)
    if plots:
        report["plots"] = [p.name for p in write_plots(out, rows, report)]
    write_json(out / "report.json", report)
    (out / ".report.md.tmp").write_text(markdown(report))
    (out / ".report.md.tmp").replace(out / "report.md")


def _pyplot():
    matplotlib = optional_import("matplotlib", needed_by="the evaluation plots (plots=false leaves them out)",
                                 install="pip install 'matplotlib>=3.7'")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_plots(out: Path, rows: Sequence[Mapping[str, Any]], report: Mapping[str, Any]) -> list[Path]:
    """Reward distribution per policy, win/tie/loss bars with CIs per language, reward vs length."""
    return [plot_rewards(out / PLOTS[0], rows, report), plot_win_rates(out / PLOTS[1], report),
            plot_reward_vs_length(out / PLOTS[2], rows, report)]


def _sample_means(rows: Sequence[Mapping[str, Any]], name: str) -> list[float]:
    means = []
    for row in rows:
        values = [s["score"] for s in row["policies"][name]["samples"] if s["score"] is not None]
        if not values and row["policies"][name].get("greedy", {}).get("score") is not None:
            values = [row["policies"][name]["greedy"]["score"]]
        if values:
            means.append(sum(values) / len(values))
    return means


def plot_rewards(path: Path, rows: Sequence[Mapping[str, Any]], report: Mapping[str, Any]) -> Path:
    """How each policy's per-prompt mean reward is spread: one panel per policy on a shared axis (not
    histograms stacked into one blur), its mean marked and written."""
    plt = _pyplot()
    names = list(report["overall"]["policies"])
    series = {n: _sample_means(rows, n) for n in names}
    values = [v for s in series.values() for v in s]
    fig, axes = plt.subplots(max(len(names), 1), 1, figsize=(6.5, 1.2 + 1.1 * max(len(names), 1)),
                             sharex=True, squeeze=False)
    low, high = (min(values), max(values)) if values else (0.0, 1.0)
    high = high if high > low else low + 1
    for ax, (name, s) in zip(axes.flat, series.items()):
        if s:
            ax.hist(s, bins=20, range=(low, high), color="tab:blue")
            mean = sum(s) / len(s)
            ax.axvline(mean, color="black", linewidth=1.2)
            ax.text(1.01, 0.5, f"{name}\nmean {mean:.3f}", transform=ax.transAxes, va="center", fontsize=8)
        ax.set_ylabel("prompts", fontsize=8)
        ax.tick_params(labelsize=7)
    axes.flat[-1].set_xlabel("mean reward of a prompt's samples")
    fig.suptitle("How the reward per prompt is spread, by policy (line: the mean)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def win_label(name: str, baseline: str, source: str, section: str) -> str:
    """A bar's label in words: who against whom, judged by what, on which prompts."""
    judged = "judge" if source == "judge" else "reward"
    prompts = "all prompts" if section == "all" else f"language {section}"
    return f"{name} vs {baseline}\nby {judged}, {prompts}"


def plot_win_rates(path: Path, report: Mapping[str, Any]) -> Path:
    """Stacked win/tie/loss bars per comparison (and per language), the win rate's CI as an error bar."""
    plt = _pyplot()
    fig = win_rates_figure(report)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def win_rates_figure(report: Mapping[str, Any]) -> Any:
    """The figure `plot_win_rates` saves (kept open for the caller)."""
    plt = _pyplot()
    sections = [("all", report["overall"])]
    sections += [(f"{value}", s) for value, s in report.get("breakdowns", {}).get("language", {}).items()]
    bars = []  # (label, wins, ties, losses, rate interval)
    for label, section in sections:
        for name, c in section["comparisons"].items():
            for source in ("judge", "reward"):
                win = c.get(f"win_rate_{source}_sampled") or c.get(f"win_rate_{source}_greedy")
                if win:
                    bars.append((win_label(name, report["baseline"], source, label), win))
                    break
    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(bars) + 2), 4))
    for i, (label, win) in enumerate(bars):
        total = max(win["wins"] + win["ties"] + win["losses"], 1)
        w, t = win["wins"] / total, win["ties"] / total
        ax.bar(i, w, color="tab:green", label="win" if i == 0 else None)
        ax.bar(i, t, bottom=w, color="tab:gray", label="tie" if i == 0 else None)
        ax.bar(i, 1 - w - t, bottom=w + t, color="tab:red", alpha=0.7, label="loss" if i == 0 else None)
        rate = win["rate"]
        ax.errorbar(i, rate["estimate"], yerr=[[max(0.0, rate["estimate"] - rate["low"])],
                                               [max(0.0, rate["high"] - rate["estimate"])]],
                    fmt="o", color="black", capsize=4, label="win rate, 95% CI" if i == 0 else None)
    ax.axhline(0.5, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(bars)), [b[0] for b in bars], fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("share of comparisons")
    ax.set_title(f"Against {report['baseline']}: wins, ties, losses")
    if bars:  # beside the axes, never over a bar
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    return fig


FEW_LENGTHS = 12  # at most this many distinct lengths: bars per length, not a scatter


def plot_reward_vs_length(path: Path, rows: Sequence[Mapping[str, Any]], report: Mapping[str, Any]) -> Path:
    """Mean reward per completion length, per policy. Many distinct lengths: each sample faint
    with the mean per length as a line; a handful (short answers): bars per length, with
    how many samples each holds, since a scatter would be a single spike."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    series = {}
    for name in report["overall"]["policies"]:
        points = [(s["num_tokens"], s["score"]) for row in rows for s in row["policies"][name]["samples"]
                  if s["score"] is not None]
        if points:
            series[name] = points
    lengths = sorted({x for points in series.values() for x, _ in points})
    if 0 < len(lengths) <= FEW_LENGTHS:
        width = 0.8 / len(series)
        for k, (name, points) in enumerate(series.items()):
            by_length = _by_length(points)
            xs = [i + (k - (len(series) - 1) / 2) * width for i, x in enumerate(lengths) if x in by_length]
            means = [sum(by_length[x]) / len(by_length[x]) for x in lengths if x in by_length]
            bars = ax.bar(xs, means, width=width, label=name)
            ax.bar_label(bars, labels=[f"n={len(by_length[x])}" for x in lengths if x in by_length], fontsize=6)
        ax.set_xticks(range(len(lengths)), [str(x) for x in lengths])
        ax.set_title("Mean reward by completion length (bars: samples of that length)")
    else:
        edges = _length_bins(lengths)
        for name, points in series.items():
            centres, means, halves = _binned_means(points, edges)
            ax.errorbar(centres, means, yerr=halves, marker="o", markersize=3, capsize=2, label=name)
        ax.set_title("Does reward follow length? Mean reward per length bin (bars: 95% interval)", fontsize=9)
    ax.set_xlabel("completion length (tokens)")
    ax.set_ylabel("reward")
    if series:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _length_bins(lengths: Sequence[int], count: int = 10) -> list[float]:
    """Edges of up to ``count`` bins holding about as many distinct lengths each (shared by every policy)."""
    step = max(1, len(lengths) // count)
    edges = [float(lengths[i]) for i in range(0, len(lengths), step)]
    return edges + [float(lengths[-1]) + 1.0]


def _binned_means(points: Sequence[tuple[int, float]], edges: Sequence[float]
                  ) -> tuple[list[float], list[float], list[float]]:
    """Per bin with samples: the mean length, the mean reward and half a normal 95% interval of that mean."""
    centres, means, halves = [], [], []
    for low, high in zip(edges, edges[1:]):
        inside = [(x, y) for x, y in points if low <= x < high]
        if not inside:
            continue
        ys = [y for _, y in inside]
        mean = sum(ys) / len(ys)
        spread = (sum((y - mean) ** 2 for y in ys) / (len(ys) - 1)) ** 0.5 if len(ys) > 1 else 0.0
        centres.append(sum(x for x, _ in inside) / len(inside))
        means.append(mean)
        halves.append(1.96 * spread / len(ys) ** 0.5)
    return centres, means, halves


def _by_length(points: Sequence[tuple[int, float]]) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for x, y in points:
        out.setdefault(x, []).append(y)
    return out
