"""The demo's search rule: train the chosen point's missing neighbours, past an edge first, for both methods alike."""

from __future__ import annotations

import itertools
import pytest

from align.demo.config import DemoConfig
from align.demo.grids import missing_neighbours, search, searched_keys, step_beyond
from align.errors import ConfigError

GRID = {"beta": [0.25, 1.0, 4.0], "learning_rate": [3e-5, 1e-4, 3e-4]}


def product(grid):
    return [dict(zip(grid, values)) for values in itertools.product(*grid.values())]


def test_the_next_value_keeps_the_last_steps_ratio():
    assert step_beyond([3e-5, 1e-4, 3e-4], upper=True) == 9e-4
    assert step_beyond([3e-5, 1e-4, 3e-4], upper=False) == 9e-6
    assert step_beyond([4.0, 16.0, 64.0], upper=True) == 256.0
    assert step_beyond([0.25, 1.0, 4.0], upper=False) == 0.0625


def test_only_keys_of_three_or_more_positive_numbers_are_searched():
    assert searched_keys({"beta": [1.0, 4.0], "loss_type": ["a", "b", "c"], "learning_rate": [1e-4, 3e-4, 1e-3],
                          "flag": [True, False, True], "shift": [-1.0, 0.0, 1.0]}) == ["learning_rate"]


def test_an_inside_point_of_a_full_grid_has_every_neighbour():
    assert missing_neighbours(GRID, {"beta": 1.0, "learning_rate": 1e-4}, product(GRID)) == []


def test_past_edge_neighbours_come_first_then_untrained_inside_ones():
    tried = product(GRID) + [{"beta": 4.0, "learning_rate": 9e-4}]
    grid = {"beta": GRID["beta"], "learning_rate": [3e-5, 1e-4, 3e-4, 9e-4]}
    # chosen at beta's upper edge and at the new learning rate: beta 16 past the edge, learning rate 2.7e-3 past
    # it, then beta 1 at 9e-4, which was never trained
    assert missing_neighbours(grid, {"beta": 4.0, "learning_rate": 9e-4}, tried) == [
        {"beta": 16.0, "learning_rate": 9e-4}, {"beta": 4.0, "learning_rate": 2.7e-3},
        {"beta": 1.0, "learning_rate": 9e-4}]
    assert missing_neighbours(GRID, {"beta": 0.25, "learning_rate": 1e-4}, product(GRID)) == [
        {"beta": 0.0625, "learning_rate": 1e-4}]


def point(settings, score):
    from align.sweep.grid import Point
    from align.sweep.report import PointResult

    name = Point(settings).name
    metrics = {} if score is None else {"reward_sampled": {"estimate": score, "low": score - 0.1, "high": score + 0.1,
                                                           "n": 3}}
    return PointResult(name=name, settings=dict(settings), score=score, metrics=metrics, start={}, steps=8,
                       train_loss=None, model_dir=f"points/{name}", validation_dir=f"validation/{name}")


def sweeps(score, tmp_path):
    """A sweep over a grid whose points score ``score(settings)``; every grid it ran, in order."""
    from align.sweep.report import SweepResult, choose

    ran = []

    def run(grid):
        ran.append(grid)
        points = [point(s, score(s)) for s in product(grid)]
        return SweepResult(grid=grid, metric="reward_sampled", points=points, chosen=choose(points),
                           validation_prompts=3, output_dir=str(tmp_path))

    return run, ran


def peak_at(beta, rate):
    return lambda s: -abs(s["beta"] - beta) - 1e4 * abs(s["learning_rate"] - rate)


def test_a_search_trains_past_the_edge_until_the_chosen_point_is_inside(tmp_path):
    run, ran = sweeps(peak_at(1.0, 9e-4), tmp_path)
    said = []
    result, added = search(run, dict(GRID), 2, announce=said.append)
    assert ran[1:] == [{"beta": [1.0], "learning_rate": [9e-4]}, {"beta": [1.0], "learning_rate": [2.7e-3]}]
    assert added == [{"beta": 1.0, "learning_rate": 9e-4}, {"beta": 1.0, "learning_rate": 2.7e-3}]
    assert result.chosen.settings == {"beta": 1.0, "learning_rate": 9e-4}  # now with a worse point on each side
    assert result.grid == {"beta": [0.25, 1.0, 4.0], "learning_rate": [3e-5, 1e-4, 3e-4, 9e-4, 2.7e-3]}
    assert result.at_edge == {"beta": False, "learning_rate": False} and len(result.points) == 11
    assert said[0] == ("[align demo] chosen beta=1, learning_rate=0.0003 lacks a trained neighbour: training "
                       "beta=1, learning_rate=0.0009")
    assert (tmp_path / "sweep.json").is_file() and "11 points" in (tmp_path / "sweep.md").read_text()


def test_the_search_stops_when_its_points_run_out_and_the_edge_is_named(tmp_path):
    run, ran = sweeps(peak_at(100.0, 3e-4), tmp_path)
    result, added = search(run, dict(GRID), 2, announce=lambda _: None)
    assert added == [{"beta": 16.0, "learning_rate": 3e-4}, {"beta": 64.0, "learning_rate": 3e-4}]
    assert result.chosen.settings == {"beta": 64.0, "learning_rate": 3e-4} and result.at_edge["beta"] is True
    assert missing_neighbours(result.grid, result.chosen.settings, [p.settings for p in result.points])[0] == {
        "beta": 256.0, "learning_rate": 3e-4}  # what the report lists as untrained
    run, ran = sweeps(peak_at(100.0, 3e-4), tmp_path)
    result, added = search(run, dict(GRID), 0, announce=lambda _: None)
    assert len(ran) == 1 and added == [] and result.at_edge == {"beta": True, "learning_rate": True}


def test_an_inside_choice_or_no_choice_adds_nothing(tmp_path):
    run, ran = sweeps(peak_at(1.0, 1e-4), tmp_path)
    result, added = search(run, dict(GRID), 2, announce=lambda _: None)
    assert len(ran) == 1 and added == [] and result.chosen.settings == {"beta": 1.0, "learning_rate": 1e-4}
    run, ran = sweeps(lambda s: None, tmp_path)
    result, added = search(run, dict(GRID), 2, announce=lambda _: None)
    assert len(ran) == 1 and added == [] and result.chosen is None


def test_both_methods_start_from_grids_of_the_same_size_with_the_same_rule():
    config = DemoConfig()
    qrpo, dpo = config.grid("qrpo"), config.grid("dpo")
    assert {k: len(v) for k, v in qrpo.items()} == {k: len(v) for k, v in dpo.items()} == {"beta": 3, "learning_rate": 3}
    assert qrpo["learning_rate"] == dpo["learning_rate"] and config.search_points == 2
    assert config.sweep_settings("dpo", {"beta": [1.0], "learning_rate": [1e-4]}).grid == {"beta": [1.0],
                                                                                         "learning_rate": [1e-4]}
    with pytest.raises(ConfigError, match="search_points"):
        DemoConfig(search_points=-1)
