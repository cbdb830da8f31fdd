"""What the sweep's picture shows, read back from the figure: the points, their intervals, the
chosen star, the start policy's line, the axes and the titles."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from align.sweep.plots import plot_sweeps  # noqa: E402
from align.sweep.report import PointResult, SweepResult  # noqa: E402


def interval(estimate, low=None, high=None):
    return {"estimate": estimate, "low": estimate - 0.05 if low is None else low,
            "high": estimate + 0.05 if high is None else high}


def point(settings, score, metric="reward_sampled", **metric_override):
    name = "_".join(f"{k}-{v}" for k, v in settings.items())
    metrics = {} if score is None else {metric: metric_override.get("interval") or interval(score)}
    return PointResult(name, settings, score, metrics, {"reward_sampled": interval(0.3)}, 1, None, name, name)


def lines_of(ax):
    """(label, x, y, marker, linestyle) of each line; an errorbar series by its container's label."""
    labels = {id(c.lines[0]): c.get_label() for c in ax.containers}
    return [(labels.get(id(line), line.get_label()), list(line.get_xdata()), list(line.get_ydata()),
             line.get_marker(), line.get_linestyle()) for line in ax.get_lines()]


def test_a_grid_over_beta_and_learning_rate(drawn, tmp_path):
    points = [point({"beta": b, "learning_rate": lr}, s) for (b, lr), s in
              zip([(1, 1e-4), (4, 1e-4), (16, 1e-4), (1, 3e-4), (4, 3e-4), (16, 3e-4)],
                  [0.25, 0.5, 0.75, 0.3, None, 0.9])]
    result = SweepResult(grid={"beta": [1, 4, 16], "learning_rate": [1e-4, 3e-4]}, metric="reward_sampled",
                         points=points, chosen=points[5], validation_prompts=10)
    out = plot_sweeps({"QRPO": result}, tmp_path / "s.png", title="validation over the grid")
    assert out == tmp_path / "s.png" and out.stat().st_size > 1000
    (fig,) = drawn
    (ax,) = fig.axes
    assert fig._suptitle.get_text() == "validation over the grid"
    assert ax.get_title() == "QRPO: chosen beta=16, learning_rate=0.0003"
    assert ax.get_xlabel() == "beta" and ax.get_ylabel() == "validation reward_sampled (x100)"
    assert ax.get_xscale() == "log"  # positive and spanning 4x or more
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "4", "16"]
    assert list(ax.get_xticks()) == [1.0, 4.0, 16.0]
    found = lines_of(ax)
    # one series per learning rate, dodged apart (x times 1 -/+ 0.02 on a log axis), y in points
    first = next(f for f in found if f[0] == "learning_rate=0.0001")
    assert first[1] == pytest.approx([0.98, 3.92, 15.68]) and first[2] == pytest.approx([25.0, 50.0, 75.0])
    second = next(f for f in found if f[0] == "learning_rate=0.0003")
    assert second[1] == pytest.approx([1.02, 16.32]) and second[2] == pytest.approx([30.0, 90.0])  # beta-4 unscored
    star = [f for f in found if f[3] == "*"]
    assert len(star) == 1 and star[0][1] == pytest.approx([16.32]) and star[0][2] == pytest.approx([90.0])
    assert star[0][4] == "None"
    start = [f for f in found if f[0] == "start policy"]
    assert len(start) == 1 and start[0][2] == pytest.approx([30.0, 30.0]) and start[0][4] == "--"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["start policy", "learning_rate=0.0001",
                                                                   "learning_rate=0.0003"]
    # the interval bars: 5 points below and above each estimate
    bars = [c for c in ax.collections if c.get_segments()]
    segments = sorted((s[0][0], s[0][1], s[1][1]) for c in bars for s in c.get_segments())
    assert segments[0] == pytest.approx((0.98, 20.0, 30.0))
    assert len(segments) == 5


def test_win_rates_start_at_fifty_and_other_values_sit_side_by_side(drawn, tmp_path):
    points = [point({"loss_type": t}, s, metric="win_rate_greedy") for t, s in (("qrpo", 0.6), ("dpo", 0.4))]
    result = SweepResult(grid={"loss_type": ["qrpo", "dpo"]}, metric="win_rate_greedy", points=points,
                         chosen=None, validation_prompts=10)
    plot_sweeps({"": result, "other": result}, tmp_path / "w.png", title="t")
    (fig,) = drawn
    left, right = fig.axes
    assert left.get_title() == "no point scored" and right.get_title() == "other: no point scored"
    assert left.get_xscale() == "linear" and [t.get_text() for t in left.get_xticklabels()] == ["qrpo", "dpo"]
    found = lines_of(left)
    series = next(f for f in found if f[0] == "win_rate_greedy")  # no other key: the series is the metric
    assert series[1] == pytest.approx([0.0, 1.0]) and series[2] == pytest.approx([60.0, 40.0])
    assert next(f for f in found if f[0] == "start policy")[2] == pytest.approx([50.0, 50.0])
    assert not [f for f in found if f[3] == "*"]
    assert fig.get_size_inches() == pytest.approx([10.4, 3.8])


def test_small_spans_stay_linear_and_intervals_never_reach_below_zero_length(drawn, tmp_path):
    odd = {"estimate": 0.5, "low": 0.55, "high": 0.45}  # an interval that misses its estimate
    points = [point({"beta": 1}, 0.5, interval=odd), point({"beta": 2}, 0.2), point({"beta": 3.5}, 0.1)]
    result = SweepResult(grid={"beta": [1, 2, 3.5]}, metric="reward_sampled", points=points, chosen=points[0],
                         validation_prompts=10)
    plot_sweeps({"x": result}, tmp_path / "o.png", title="t")
    (ax,) = drawn[0].axes
    assert ax.get_xscale() == "linear"  # 3.5 < 4 x 1
    assert lines_of(ax)[0][1] == pytest.approx([1.0, 2.0, 3.5])  # one series: not dodged
    segments = [s for c in ax.collections for s in c.get_segments()]
    first = next(s for s in segments if s[0][0] == pytest.approx(1.0))
    assert first[0][1] == pytest.approx(50.0) and first[1][1] == pytest.approx(50.0)  # clamped, not inverted
    empty = SweepResult(grid={"beta": [1, 2, 3]}, metric="reward_greedy", points=[point({"beta": 1}, None)],
                        chosen=None, validation_prompts=3)
    plot_sweeps({"": empty}, tmp_path / "e.png", title="t")
    (ax,) = drawn[1].axes
    assert [line.get_label() for line in ax.get_lines()] == []  # no score, no start figure for the metric
    assert ax.get_legend() is None
