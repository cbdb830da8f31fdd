"""Tuning preference training: a grid of settings, each point trained from the same start and
chosen on validation prompts, as a careful comparison of methods does.

Every point of the grid (``{"beta": [1, 5, 20], "learning_rate": [3e-5, 1e-4]}``: six) is
trained from the same start policy on the same pair rows and reference log-probs, with
every other setting shared. Each is then evaluated with `align.evaluate` beside the start
policy on validation prompts (which must be disjoint from the prompts any result is
reported on), and the point with the best ``metric`` (``reward_sampled`` by default) is
chosen. Report the chosen point on held-out prompts, never its validation score: that
one was the maximum of several noisy estimates.

Each point's training and its validation are output directories with manifests, so a
killed sweep rerun with the same settings retrains nothing that finished, and a grid that
grows trains only its new points (points are named by their values).

- `grid`: the points of a grid (``expand_grid``, ``Point``), values checked against the
  settings of preference training.
- `settings`: ``SweepSettings`` (grid, metric, validation settings), the metrics.
- `inputs`: what a sweep is bound to (the start policy's and the provider's fingerprints),
  validation prompts also trained on, the output directory it may use.
- `points`: one point's training and validation, each skipped when done.
- `run`: ``run_sweep``, the whole loop.
- `report`: ``SweepResult``, the choice, ``sweep.json`` and ``sweep.md``; `plots`: the
  validation score over the grid (``sweep.png``, ``plot_sweeps``).

The CLI stage is ``align sweep`` (`align.stages.sweep`); the Python API is ``align.run_sweep``
(the package itself is ``align.sweep``).
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY: dict[str, tuple[str, str]] = {
    "run_sweep": ("align.sweep.run", "run_sweep"),
    "SweepSettings": ("align.sweep.settings", "SweepSettings"),
    "METRICS": ("align.sweep.settings", "METRICS"),
    "Point": ("align.sweep.grid", "Point"),
    "expand_grid": ("align.sweep.grid", "expand_grid"),
    "SweepResult": ("align.sweep.report", "SweepResult"),
    "PointResult": ("align.sweep.report", "PointResult"),
    "choose": ("align.sweep.report", "choose"),
    "plot_sweeps": ("align.sweep.plots", "plot_sweeps"),
}

__all__ = ["METRICS", "Point", "PointResult", "SweepResult", "SweepSettings", "choose", "expand_grid", "plot_sweeps",
           "run_sweep"]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'align.sweep' has no attribute {name!r}")
    module, attribute = _LAZY[name]
    return getattr(importlib.import_module(module), attribute)
