"""Tuning until the chosen point is inside: the demo's search rule, the same for QRPO and DPO.

A grid whose best point sits at its largest (or smallest) value says only that the best
setting may lie beyond it. So each method starts from a grid of the same size, and then,
while the chosen point lacks a trained neighbour on either side along a key (a key of three
or more values), that neighbour is trained: the next value of the grid, or past an edge one
more value at the same ratio as the grid's last step there (learning rates 1e-4, 3e-4 →
9e-4; β 16, 64 → 256), the other settings kept. Points past an edge come first. Each method
may add at most ``search_points`` points; when they run out, the report names any edge the
chosen point still sits at. The finished points are never trained again (``align.sweep``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any


def step_beyond(values: Sequence[float], upper: bool) -> float:
    """The next value past one end of a sorted grid, at the ratio of that end's last step (3 significant digits)."""
    a, b = (values[-2], values[-1]) if upper else (values[1], values[0])
    return float(f"{b * (b / a):.3g}")


def searched_keys(grid: Mapping[str, Sequence[Any]]) -> list[str]:
    """The keys the search moves along: three or more positive numbers (two values have no inside)."""
    return [key for key, values in grid.items() if len(values) >= 3 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in values)]


def _key(settings: Mapping[str, Any]) -> tuple:
    return tuple(sorted(settings.items()))


def missing_neighbours(grid: Mapping[str, Sequence[Any]], chosen: Mapping[str, Any],
                       tried: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The chosen point's neighbours along each searched key that have not been trained, past-edge ones first."""
    done = {_key(s) for s in tried}
    beyond, inside = [], []
    for key in searched_keys(grid):
        ordered = sorted(grid[key])
        i = ordered.index(chosen[key])
        for side, edge in ((-1, i == 0), (1, i == len(ordered) - 1)):
            value = step_beyond(ordered, upper=side > 0) if edge else ordered[i + side]
            neighbour = {**chosen, key: value}
            if _key(neighbour) not in done:
                (beyond if edge else inside).append(neighbour)
    return beyond + inside


def search(run: Callable[[dict[str, list[Any]]], Any], grid: dict[str, list[Any]], search_points: int,
           announce: Callable[[str], Any] = print) -> tuple[Any, list[dict[str, Any]]]:
    """``run(grid)`` (a sweep, returning its ``SweepResult``) on the starting grid, then on one point at a time
    while the best point lacks a trained neighbour, at most ``search_points`` of them; the result over every
    point trained (its grid: each key's values tried) and the points added, in order."""
    from align.sweep.grid import Point
    from align.sweep.report import SweepResult, choose, write_report

    first = run(grid)
    points = list(first.points)
    values = {key: sorted(vals) if key in searched_keys(grid) else list(vals) for key, vals in grid.items()}
    added: list[dict[str, Any]] = []
    while len(added) < search_points:
        best = choose(points)
        if best is None:
            break
        wanted = missing_neighbours(values, best.settings, [p.settings for p in points])
        if not wanted:
            break
        point = wanted[0]
        announce(f"[align demo] chosen {best.label} lacks a trained neighbour: training {Point(point).label}")
        points += run({key: [value] for key, value in point.items()}).points
        added.append(point)
        for key, value in point.items():
            if value not in values[key]:
                values[key] = sorted([*values[key], value])
    if not added:
        return first, added
    result = SweepResult(grid=values, metric=first.metric, points=points, chosen=choose(points),
                         select_on=first.select_on,
                         validation_prompts=first.validation_prompts, validation_overlap=first.validation_overlap,
                         output_dir=first.output_dir)
    write_report(Path(first.output_dir), result)  # the whole search, over the last one-point sweep's files
    return result, added


def goal_choice(result: Any) -> Any:
    """The point exact accuracy on validation would choose (first in grid order on a tie), or None
    when the sweep did not score the exact measure."""
    from align.sweep.settings import score_of

    best, best_score = None, None
    for point in result.points:
        score = score_of(point.measures.get("exact", {}).get("metrics", {}), result.metric)
        if point.excluded is None and score is not None and (best_score is None or score > best_score):
            best, best_score = point, score
    return best


def other_choice(result: Any) -> tuple[Any, str]:
    """The point the measure that did not choose would have chosen, and that measure (``reward``
    when the sweep chose on the goal, ``goal`` when it chose on the reward); the point is None
    when the sweep scored no second measure."""
    if result.select_on != "reward":
        return result.reward_choice, "reward"
    return goal_choice(result), "goal"


__all__ = ["goal_choice", "other_choice", "missing_neighbours", "search", "searched_keys", "step_beyond"]
