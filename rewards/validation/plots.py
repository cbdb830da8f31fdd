"""Judge validation's plot: mean pointwise score against degradation step."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from align.errors import optional_import


def plot_scores(report: Mapping[str, Any], path: str | Path) -> None:
    """Mean pointwise score (with its CI) against degradation step, one line per language."""
    matplotlib = optional_import("matplotlib", needed_by="judge validation's plot",
                                 install="pip install 'matplotlib>=3.7'")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(report["languages"].items()) or [("all", report["all"])]
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, m in groups:
        points = [(step, iv) for step, iv in enumerate(m["pointwise_scores"]["mean_by_step"]) if iv]
        if not points:
            continue
        xs = [s for s, _ in points]
        ax.plot(xs, [iv["estimate"] for _, iv in points], marker="o", label=f"{name} (n={m['prompts']})")
        ax.fill_between(xs, [iv["low"] for _, iv in points], [iv["high"] for _, iv in points], alpha=0.15)
    steps = max((len(m["pointwise_scores"]["mean_by_step"]) for _, m in groups), default=1)
    ax.set_xticks(range(steps))
    ax.set_xlabel("degradation step (flaws added)")
    ax.set_ylabel("mean pointwise judge score")
    ax.set_title("Judge score against degradation step")
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:  # a temp file renamed over the plot: never half a PNG
        fig.savefig(tmp, dpi=100, format="png")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
        plt.close(fig)
