"""The demo's training figure: a few panels that each answer a question, in words.

Each panel holds one or more series of (step, value) points. Noisy per-step values are
drawn faint, with an exponential moving average over them, so the trend reads at a glance
and the noise stays visible.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from align.errors import optional_import

Points = Sequence[tuple[float, float]]
MAX_PANELS = 6


@dataclass
class Panel:
    """One subplot: a title in words, a y label, named series, an optional reference line."""

    title: str
    ylabel: str
    series: dict[str, Points] = field(default_factory=dict)
    hline: float | None = None
    hline_label: str | None = None
    smooth: bool = True


def ema(values: Sequence[float], weight: float = 0.8) -> list[float]:
    """Exponential moving average, bias-corrected so the first points are not pulled to 0."""
    out, avg = [], 0.0
    for i, value in enumerate(values, start=1):
        avg = weight * avg + (1 - weight) * value
        out.append(avg / (1 - weight**i))
    return out


def _pyplot():
    """matplotlib's pyplot on the file-only backend (an install hint where matplotlib is missing)."""
    matplotlib = optional_import("matplotlib", needed_by="the demo's figure", install="pip install 'matplotlib>=3.7'")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path, title: str) -> Path:
    """Title, lay out, write and close one figure."""
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    _pyplot().close(fig)
    return path


def plot_panels(panels: Sequence[Panel], path: Path, *, title: str) -> Path:
    """Draw up to six panels (two rows of three) into one PNG."""
    plt = _pyplot()
    panels = [p for p in panels if any(p.series.values())]
    if len(panels) > MAX_PANELS:
        raise RuntimeError(f"{len(panels)} panels: a figure a person reads holds at most {MAX_PANELS}")
    cols = min(3, max(len(panels), 1))
    rows = (len(panels) + cols - 1) // cols or 1
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.4 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, panels):
        for label, points in panel.series.items():
            if not points:
                continue
            steps, values = zip(*points)
            if panel.smooth and len(points) > 3:
                raw = ax.plot(steps, values, alpha=0.25, linewidth=0.8)[0]
                ax.plot(steps, ema(values), color=raw.get_color(), label=label)
            else:
                ax.plot(steps, values, marker="o", markersize=3, label=label)
        if panel.hline is not None:
            ax.axhline(panel.hline, color="gray", linestyle="--", linewidth=0.8, label=panel.hline_label)
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(panel.ylabel)
        if len(panel.series) > 1 or panel.hline_label:
            ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    return _save(fig, path, title)


def plot_reward_vs_accuracy(along: dict[str, list[dict]], path: Path, *, title: str) -> Path:
    """One panel per method: each grid point's path through (graded reward, exact accuracy) along
    its training, the chosen point drawn bold; a path that moves right but not up is a policy
    that raises the proxy and not the goal (over-optimisation)."""
    fig, axes = _pyplot().subplots(1, max(len(along), 1), figsize=(5.2 * max(len(along), 1), 4.2), squeeze=False)
    for ax, (method, points) in zip(axes.flat, along.items()):
        for point in points:
            checks = point["checks"]
            if not checks:
                continue
            xs, ys = [c["graded"] for c in checks], [100 * c["exact"] for c in checks]
            if point["chosen"]:
                ax.plot(xs, ys, marker="o", markersize=4, linewidth=2, color="C3", zorder=3,
                        label=f"chosen: {point['name']}")
                for c, x, y, where in ((checks[0], xs[0], ys[0], "start"), (checks[-1], xs[-1], ys[-1], "end")):
                    ax.annotate(f"step {c['step']} ({where})", (x, y), textcoords="offset points", xytext=(6, 6),
                                fontsize=7, arrowprops={"arrowstyle": "-", "linewidth": 0.5})
            else:
                ax.plot(xs, ys, marker=".", markersize=3, linewidth=0.8, color="gray", alpha=0.5)
                ax.plot(xs[-1:], ys[-1:], marker=">", markersize=4, color="gray", alpha=0.6)
        ax.plot([], [], color="gray", alpha=0.5, label="other grid points (> : end)")
        ax.set_title(f"{method.upper()}: validation, greedy answers, along training", fontsize=10)
        ax.set_xlabel("mean graded reward (the proxy)")
        ax.set_ylabel("exact accuracy, % (the goal)")
        ax.legend(fontsize=8)
    return _save(fig, path, title)
