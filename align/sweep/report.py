"""A sweep's result: every point's validation figures, the chosen point, ``sweep.json`` and ``sweep.md``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from align.io import atomic_write, write_json
from align.sweep.grid import Point, at_edge, format_value
from align.sweep.settings import METRICS, score_of


@dataclass
class PointResult:
    """One point: its settings, where its outputs are, its training summary and validation figures."""

    name: str
    settings: dict[str, Any]
    score: float | None  # the chosen metric's estimate on the validation prompts
    metrics: dict[str, Any]  # every validation figure (intervals)
    start: dict[str, Any]  # the start policy's figures in the same evaluation
    steps: int | None
    train_loss: float | None
    model_dir: str
    validation_dir: str
    trained_now: bool = False  # False: found finished and skipped
    seconds: float | None = None

    @classmethod
    def of(cls, point: Point, trained: Mapping[str, Any], validated: Mapping[str, Any], out: Path, metric: str,
           *, trained_now: bool, seconds: float | None) -> PointResult:
        metrics = dict(validated.get("metrics") or {})
        return cls(name=point.name, settings=dict(point.settings), score=score_of(metrics, metric), metrics=metrics,
                   start=dict(validated.get("start") or {}), steps=trained.get("steps"),
                   train_loss=trained.get("train_loss"), model_dir=str(out / "points" / point.name),
                   validation_dir=str(out / "validation" / point.name), trained_now=trained_now, seconds=seconds)

    @property
    def label(self) -> str:
        return Point(self.settings).label


@dataclass
class SweepResult:
    """Every point's figures and the choice, as ``sweep.json`` holds them."""

    grid: dict[str, list[Any]]
    metric: str
    points: list[PointResult]
    chosen: PointResult | None
    validation_prompts: int
    validation_overlap: int = 0
    output_dir: str = ""
    at_edge: dict[str, bool] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.chosen is not None and not self.at_edge:
            self.at_edge = at_edge(self.grid, self.chosen.settings)

    @property
    def start(self) -> dict[str, Any]:
        """The start policy's validation figures (each point's evaluation has the same ones)."""
        return next((p.start for p in self.points if p.start), {})

    def as_json(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "metric_means": METRICS[self.metric],
            "grid": self.grid,
            "chosen": None if self.chosen is None else {"name": self.chosen.name, "settings": self.chosen.settings,
                                                        "score": self.chosen.score, "model_dir": self.chosen.model_dir},
            "chosen_at_grid_edge": self.at_edge,
            "validation_prompts": self.validation_prompts,
            "validation_prompts_also_trained_on": self.validation_overlap,
            "start": self.start,
            "points": [asdict(p) for p in self.points],
        }


def choose(points: Sequence[PointResult]) -> PointResult | None:
    """The point with the highest score; a tie goes to the point that comes first in the grid."""
    best = None
    for point in points:
        if point.score is not None and (best is None or point.score > best.score):
            best = point
    return best


def _figure(interval: Mapping[str, Any] | None, *, signed: bool = False) -> str:
    if not interval:
        return "-"
    sign = "+" if signed else ""
    f = lambda v: f"{v * 100:{sign}.1f}"
    return f"{f(interval['estimate'])} [{f(interval['low'])}, {f(interval['high'])}]"


def markdown(result: SweepResult) -> str:
    """``sweep.md``: one row per point, the chosen one marked, the start policy's row first."""
    keys = list(result.grid)
    head = ["point", *keys, f"{result.metric} (chosen by)", "reward, samples", "reward, greedy",
            "gain vs start, samples", "steps", "train loss"]
    title = f"# Sweep: {len(result.points)} points, chosen by {result.metric} on {result.validation_prompts} " \
        "validation prompts"
    means = f"{result.metric}: {METRICS[result.metric]}. Figures in points (x100) with 95% bootstrap intervals " \
        "over prompts."
    lines = [title, "", means, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    start = result.start
    lines.append("| " + " | ".join(["start", *("" for _ in keys), _figure(start.get(result.metric)) if
                                     result.metric in start else "", _figure(start.get("reward_sampled")),
                                     _figure(start.get("reward_greedy")), "", "", ""]) + " |")
    for p in result.points:
        mark = " (chosen)" if result.chosen is not None and p.name == result.chosen.name else ""
        loss = "-" if p.train_loss is None else f"{p.train_loss:.4g}"
        cells = [f"`{p.name}`{mark}", *(format_value(p.settings[k]) for k in keys),
                 *(_figure(p.metrics.get(name)) for name in (result.metric, "reward_sampled", "reward_greedy")),
                 _figure(p.metrics.get("gain_sampled"), signed=True), str(p.steps), loss]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    if result.chosen is None:
        lines.append("No point could be scored.")
    else:
        lines.append(f"Chosen: {result.chosen.label} ({result.chosen.model_dir}).")
        edges = [k for k, edge in result.at_edge.items() if edge]
        if edges:
            lines.append(f"The chosen {', '.join(edges)} is at the edge of the grid: the best value may lie beyond it.")
    if result.validation_overlap:
        lines.append(f"Warning: {result.validation_overlap} validation prompts are also prompts of the training pairs.")
    return "\n".join(lines) + "\n"


def write_report(out: Path, result: SweepResult) -> None:
    """``sweep.json``, ``sweep.md`` and ``sweep.png`` under the sweep's directory, and a line per point."""
    from align.sweep.plots import plot_sweeps

    write_json(out / "sweep.json", result.as_json())
    text = markdown(result)
    atomic_write(out / "sweep.md", lambda handle: handle.write(text))
    plot_sweeps({"": result}, out / "sweep.png", title=f"validation {result.metric} over the grid")
    for p in result.points:
        print(f"[align sweep] {p.label}: {result.metric} {_figure(p.metrics.get(result.metric))}"
              + (" <- chosen" if result.chosen is not None and p.name == result.chosen.name else ""))
    print(f"[align sweep] wrote {out / 'sweep.json'}, {out / 'sweep.md'}, {out / 'sweep.png'}")


__all__ = ["PointResult", "SweepResult", "choose", "markdown", "write_report"]
