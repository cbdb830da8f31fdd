"""The demo's report: a JSON of every number, PNG plots, and a summary table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from align.io import write_json


def plot_reward_distributions(before: list[float], after: list[float], path: Path, *, title: str) -> Path:
    """Histogram of per-prompt sampled accuracy before and after QRPO."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    bins = [i / 10 - 0.05 for i in range(12)]
    ax.hist(before, bins=bins, alpha=0.6, label=f"before QRPO (mean {sum(before) / max(len(before), 1):.3f})")
    ax.hist(after, bins=bins, alpha=0.6, label=f"after QRPO (mean {sum(after) / max(len(after), 1):.3f})")
    ax.set_xlabel("reward (fraction of samples correct per held-out prompt)")
    ax.set_ylabel("prompts")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_curves(curves: dict[str, list[tuple[int, float]]], path: Path, *, title: str) -> Path:
    """One panel per logged quantity (loss, calibrated targets, beta*logratio, ...)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n, points in curves.items() if points]
    cols = min(3, max(len(names), 1))
    rows = (len(names) + cols - 1) // cols or 1
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        steps, values = zip(*curves[name])
        ax.plot(steps, values)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("step")
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def summary_table(rows: list[tuple[str, Any, Any]]) -> str:
    """A plain-text table of (metric, before, after) with the change."""
    lines = [f"{'metric':<34}{'before':>10}{'after':>10}{'change':>10}"]
    for name, before, after in rows:
        change = after - before if isinstance(before, (int, float)) and isinstance(after, (int, float)) else ""
        fmt = lambda v: f"{v:.3f}" if isinstance(v, float) else str(v)  # noqa: E731
        lines.append(f"{name:<34}{fmt(before):>10}{fmt(after):>10}{(f'{change:+.3f}' if change != '' else ''):>10}")
    return "\n".join(lines)


def write_report(out: Path, report: dict[str, Any]) -> Path:
    return write_json(out / "report.json", report)
