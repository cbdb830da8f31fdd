"""The validation score over a grid: one panel per sweep, the first grid key along x, one line
per combination of the other keys, 95% intervals as bars, the chosen point starred and the
start policy's score as a dashed line."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from align.sweep.grid import Point, format_value


def _x_positions(values: list[Any]) -> tuple[list[float], bool]:
    """Numeric values as they are (on a log axis when positive and spanning 4x or more), others as 0, 1, 2..."""
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    if numeric:
        log = min(values) > 0 and max(values) >= 4 * min(values)
        return [float(v) for v in values], log
    return [float(i) for i in range(len(values))], False


def _dodge(x: float, index: int, count: int, log: bool) -> float:
    """Series side by side around each x, so equal scores do not hide one another's bars."""
    shift = 0.04 * (index - (count - 1) / 2)
    return x * (1 + shift) if log else x + shift


def _start_line(result: Any) -> float | None:
    """Where the start policy stands on the chosen metric: its own reward, or 50% for a win rate against itself."""
    if result.metric.startswith("win_rate"):
        return 50.0
    interval = result.start.get(result.metric)
    return None if not interval else interval["estimate"] * 100


def plot_sweeps(results: Mapping[str, Any], path: Path, *, title: str) -> Path:
    """Draw each named `SweepResult` as one panel, side by side with a shared y axis, into one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5.2 * len(results), 3.8), squeeze=False, sharey=True)
    for ax, (name, result) in zip(axes.flat, results.items()):
        keys = list(result.grid)
        xkey, others = keys[0], keys[1:]
        xs, log = _x_positions(result.grid[xkey])
        position = dict(zip(map(format_value, result.grid[xkey]), xs))
        series: dict[str, list[Any]] = {}
        for p in result.points:
            series.setdefault(Point({k: p.settings[k] for k in others}).label or result.metric, []).append(p)
        for index, (label, points) in enumerate(series.items()):
            scored = [p for p in points if p.metrics.get(result.metric)]
            if not scored:
                continue
            x = [_dodge(position[format_value(p.settings[xkey])], index, len(series), log) for p in scored]
            y = [p.metrics[result.metric]["estimate"] * 100 for p in scored]
            low = [max(0.0, v - p.metrics[result.metric]["low"] * 100) for v, p in zip(y, scored)]
            high = [max(0.0, p.metrics[result.metric]["high"] * 100 - v) for v, p in zip(y, scored)]
            bars = ax.errorbar(x, y, yerr=[low, high], marker="o", markersize=4, capsize=3, label=label)
            chosen = [(xi, yi) for xi, yi, p in zip(x, y, scored)
                      if result.chosen is not None and p.name == result.chosen.name]
            if chosen:
                ax.plot(*zip(*chosen), marker="*", markersize=16, color=bars[0].get_color(), linestyle="none")
        line = _start_line(result)
        if line is not None:
            ax.axhline(line, color="gray", linestyle="--", linewidth=0.8, label="start policy")
        if log:
            ax.set_xscale("log")
        ax.set_xticks(xs, [format_value(v) for v in result.grid[xkey]])
        ax.minorticks_off()
        ax.set_xlabel(xkey)
        ax.set_ylabel(f"validation {result.metric} (x100)")
        ax.set_title((f"{name}: " if name else "") + (f"chosen {result.chosen.label}" if result.chosen else
                                                      "no point scored"), fontsize=9)
        if ax.get_legend_handles_labels()[0]:  # nothing scored and no start figure: no legend to draw
            ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


__all__ = ["plot_sweeps"]
