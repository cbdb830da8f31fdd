"""A sweep's result: every point's validation figures, the chosen point, ``sweep.json`` and ``sweep.md``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from align.io import atomic_write, write_json
from align.sweep.grid import Point, at_edge, format_value
from align.sweep.settings import METRICS, REWARD, guard_failure, score_of


@dataclass
class PointResult:
    """One point: its settings, where its outputs are, its training summary and validation figures."""

    name: str
    settings: dict[str, Any]
    score: float | None  # the choosing metric's estimate on the validation prompts (under ``select_on``)
    metrics: dict[str, Any]  # every validation figure under the validation reward (intervals)
    start: dict[str, Any]  # the start policy's figures in the same evaluation
    steps: int | None
    train_loss: float | None
    model_dir: str
    validation_dir: str
    trained_now: bool = False  # False: found finished and skipped
    seconds: float | None = None
    measures: dict[str, Any] = field(default_factory=dict)  # measure -> {"metrics", "start"} of the same answers
    reward_score: float | None = None  # the metric under the validation reward (what the reward would choose by)
    excluded: str | None = None  # the guard it is past: never chosen
    target_tracking: dict[str, Any] | None = None  # QRPO: its training's log-ratios against their targets

    @classmethod
    def of(cls, point: Point, trained: Mapping[str, Any], validated: Mapping[str, Any], out: Path, settings: Any,
           *, trained_now: bool, seconds: float | None) -> PointResult:
        """``settings``: the sweep's (``metric``, ``select_on`` and the guards)."""
        metrics, start = dict(validated.get("metrics") or {}), dict(validated.get("start") or {})
        measures = dict(validated.get("measures") or {})
        chosen_by = metrics if settings.select_on == REWARD else measures[settings.select_on]["metrics"]
        return cls(name=point.name, settings=dict(point.settings), score=score_of(chosen_by, settings.metric),
                   metrics=metrics, start=start, steps=trained.get("steps"), train_loss=trained.get("train_loss"),
                   model_dir=str(out / "points" / point.name), validation_dir=str(out / "validation" / point.name),
                   trained_now=trained_now, seconds=seconds, measures=measures,
                   reward_score=score_of(metrics, settings.metric), excluded=guard_failure(metrics, start, settings),
                   target_tracking=trained.get("target_tracking"))

    def figures(self, select_on: str) -> dict[str, Any]:
        """Its validation figures under ``select_on`` (the reward's, or a measure's)."""
        return self.metrics if select_on == REWARD else self.measures.get(select_on, {}).get("metrics", {})

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
    select_on: str = REWARD
    reward_choice: PointResult | None = None  # with select_on a measure: the point the reward's metric would choose

    def __post_init__(self) -> None:
        if self.chosen is not None and not self.at_edge:
            self.at_edge = at_edge(self.grid, self.chosen.settings)
        if self.select_on != REWARD and self.reward_choice is None:
            self.reward_choice = choose(self.points, by_reward=True)

    @property
    def start(self) -> dict[str, Any]:
        """The start policy's validation figures (each point's evaluation has the same ones)."""
        return next((p.start for p in self.points if p.start), {})

    def as_json(self) -> dict[str, Any]:
        reward = self.reward_choice
        return {
            "metric": self.metric,
            "metric_means": METRICS[self.metric],
            "select_on": self.select_on,
            "reward_would_choose": None if reward is None else {"name": reward.name, "settings": reward.settings,
                                                                "score": reward.reward_score},
            "grid": self.grid,
            "chosen": None if self.chosen is None else {"name": self.chosen.name, "settings": self.chosen.settings,
                                                        "score": self.chosen.score, "model_dir": self.chosen.model_dir},
            "chosen_at_grid_edge": self.at_edge,
            "validation_prompts": self.validation_prompts,
            "validation_prompts_also_trained_on": self.validation_overlap,
            "start": self.start,
            "points": [asdict(p) for p in self.points],
        }


def choose(points: Sequence[PointResult], *, by_reward: bool = False) -> PointResult | None:
    """The point with the highest score among those past no guard; a tie goes to the point that comes
    first in the grid. ``by_reward``: by the validation reward's metric instead (what the reward alone
    would choose, guards still applied)."""
    best, best_score = None, None
    for point in points:
        score = point.reward_score if by_reward else point.score
        if point.excluded is None and score is not None and (best_score is None or score > best_score):
            best, best_score = point, score
    return best


def _figure(interval: Mapping[str, Any] | None, *, signed: bool = False) -> str:
    if not interval:
        return "-"
    sign = "+" if signed else ""
    f = lambda v: f"{v * 100:{sign}.1f}"
    return f"{f(interval['estimate'])} [{f(interval['low'])}, {f(interval['high'])}]"


def markdown(result: SweepResult) -> str:
    """``sweep.md``: one row per point, the chosen one marked, the start policy's row first."""
    keys, on = list(result.grid), result.select_on
    by = result.metric if on == REWARD else f"{on}: {result.metric}"
    head = ["point", *keys, f"{by} (chosen by)", "reward, samples", "reward, greedy",
            "gain vs start, samples", "KL", "steps", "train loss", "not chosen because"]
    title = f"# Sweep: {len(result.points)} points, chosen by {by} on {result.validation_prompts} validation prompts"
    means = f"{result.metric}: {METRICS[result.metric]}" + ("" if on == REWARD else f", under the measure {on!r} "
                                                          "(the same answers scored again)") + \
        ". The reward columns are the validation reward's. Figures in points (x100) with 95% bootstrap intervals " \
        "over prompts; KL in nats."
    lines = [title, "", means, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    start = result.start
    start_on = start if on == REWARD else next((p.measures[on]["start"] for p in result.points if on in p.measures),
                                               {})
    lines.append("| " + " | ".join(["start", *("" for _ in keys), _figure(start_on.get(result.metric)) if
                                     result.metric in start_on else "", _figure(start.get("reward_sampled")),
                                     _figure(start.get("reward_greedy")), "", "", "", "", ""]) + " |")
    for p in result.points:
        mark = " (chosen)" if result.chosen is not None and p.name == result.chosen.name else ""
        if result.reward_choice is not None and p.name == result.reward_choice.name:
            mark += " (the reward's choice)"
        loss = "-" if p.train_loss is None else f"{p.train_loss:.4g}"
        kl = p.metrics.get("kl")
        cells = [f"`{p.name}`{mark}", *(format_value(p.settings[k]) for k in keys),
                 _figure(p.figures(on).get(result.metric)),
                 *(_figure(p.metrics.get(name)) for name in ("reward_sampled", "reward_greedy")),
                 _figure(p.metrics.get("gain_sampled"), signed=True), "-" if not kl else f"{kl['estimate']:.3g}",
                 str(p.steps), loss, p.excluded or ""]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    if result.chosen is None:
        lines.append("No point could be scored." if not any(p.excluded for p in result.points) else
                     "No point could be chosen: every scored point is past a guard.")
    else:
        lines.append(f"Chosen: {result.chosen.label} ({result.chosen.model_dir}).")
        reward = result.reward_choice
        if reward is not None and reward.name != result.chosen.name:
            lines.append(f"The validation reward alone would have chosen {reward.label}: by {on} it scores "
                         f"{_figure(reward.figures(on).get(result.metric))} against the chosen point's "
                         f"{_figure(result.chosen.figures(on).get(result.metric))}.")
        elif reward is not None:
            lines.append("The validation reward alone would have chosen the same point.")
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
        print(f"[align sweep] {p.label}: {result.metric} {_figure(p.figures(result.select_on).get(result.metric))}"
              + (f" (not chosen: {p.excluded})" if p.excluded else "")
              + (" <- chosen" if result.chosen is not None and p.name == result.chosen.name else ""))
    print(f"[align sweep] wrote {out / 'sweep.json'}, {out / 'sweep.md'}, {out / 'sweep.png'}")


__all__ = ["PointResult", "SweepResult", "choose", "markdown", "write_report"]
