"""The bootstrap behind every interval a report prints, against plain loops written out here.

Each interval is checked against the same resamples worked by hand (a loop over the rows of
``resample_indices``, numpy's linear percentile written out), so a wrong weight, a dropped
setting (seed, confidence, resamples) or a moved boundary changes a number these tests read.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from align.bootstrap import (
    Interval,
    bootstrap_mean,
    bootstrap_statistic,
    check_resamples,
    paired_difference,
    percentile_interval,
    resample_indices,
)
from align.errors import ConfigError


def linear_percentile(values: list[float], q: float) -> float:
    """numpy's default percentile (linear between order statistics), by hand."""
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (pos - lo) * (ordered[hi] - ordered[lo])


def by_hand(replicates: list[float], confidence: float) -> tuple[float, float]:
    tail = (1 - confidence) / 2
    return linear_percentile(replicates, tail), linear_percentile(replicates, 1 - tail)


# --------------------------------------------------------------------------- the interval


def test_an_interval_excludes_only_values_strictly_outside_it():
    interval = Interval(0.5, 0.25, 0.75, 40)
    assert not interval.excludes(0.25) and not interval.excludes(0.75) and not interval.excludes(0.5)
    assert interval.excludes(0.2499) and interval.excludes(0.7501)


def test_an_interval_prints_and_serialises_its_numbers():
    interval = Interval(0.51234, 0.48, 0.544, 12, 0.9)
    assert interval.format() == "0.512 [0.480, 0.544]"
    assert interval.format(scale=100, digits=1) == "51.2 [48.0, 54.4]"
    assert interval.to_dict() == {"estimate": 0.51234, "low": 0.48, "high": 0.544, "n": 12, "confidence": 0.9}


def test_confidence_must_lie_strictly_between_zero_and_one():
    replicates = np.linspace(0.0, 1.0, 101)
    for bad in (0.0, 1.0, 1.5, -0.1):
        with pytest.raises(ConfigError, match="confidence must be in"):
            percentile_interval(0.5, replicates, 7, bad)
    interval = percentile_interval(0.5, replicates, 7, 0.8)
    assert (interval.low, interval.high, interval.n, interval.confidence) == \
        pytest.approx((0.1, 0.9, 7, 0.8))


def test_too_few_resamples_are_refused_naming_the_setting():
    with pytest.raises(ConfigError, match=r"^resamples=199: .* at least 200"):
        check_resamples(199)
    with pytest.raises(ConfigError, match=r"^eval.resamples=5: "):
        check_resamples(5, "eval.resamples")
    check_resamples(200)


# --------------------------------------------------------------------------- resamples


def test_resamples_are_seeded_unit_indices_drawn_with_replacement():
    drawn = resample_indices(5, resamples=200)
    assert drawn.shape == (200, 5) and drawn.min() == 0 and drawn.max() == 4
    np.testing.assert_array_equal(drawn, np.random.default_rng(0).integers(0, 5, size=(200, 5)))
    assert not np.array_equal(resample_indices(5, resamples=200, seed=1), drawn)
    assert resample_indices(1, resamples=200).tolist() == [[0]] * 200  # one unit: always itself
    with pytest.raises(ValueError, match="at least one unit"):
        resample_indices(0, resamples=200)


# --------------------------------------------------------------------------- means


VALUES = [0.1, 0.9, 0.4, 0.4, 0.0, 1.0, 0.7]


def test_the_mean_interval_is_the_percentiles_of_the_resampled_means():
    interval = bootstrap_mean(VALUES, resamples=300, seed=11, confidence=0.9)
    means = [sum(VALUES[j] for j in row) / len(row) for row in resample_indices(len(VALUES), resamples=300, seed=11)]
    assert (interval.low, interval.high) == pytest.approx(by_hand(means, 0.9))
    assert (interval.estimate, interval.n, interval.confidence) == pytest.approx((sum(VALUES) / 7, 7, 0.9))


def test_the_default_seed_is_zero_and_the_seed_matters():
    assert bootstrap_mean(VALUES, resamples=200) == bootstrap_mean(VALUES, resamples=200, seed=0)
    assert bootstrap_mean(VALUES, resamples=200, seed=1) != bootstrap_mean(VALUES, resamples=200, seed=0)


def test_a_single_value_is_its_own_interval_and_nothing_is_an_error():
    interval = bootstrap_mean([0.3], resamples=200)
    assert (interval.estimate, interval.low, interval.high, interval.n) == (0.3, 0.3, 0.3, 1)
    assert not interval.readable  # one unit: no interval to read
    with pytest.raises(ValueError, match="nothing to average"):
        bootstrap_mean([], resamples=200)


def test_the_weighted_mean_resamples_prompts_and_pools_their_samples():
    """A prompt's weight is its number of samples: each resample is Σ w·v / Σ w over the prompts drawn."""
    values, weights = [1.0, 0.0, 0.5, 0.25], [0.5, 0.25, 0.0, 0.125]  # under 1 each, one zero
    interval = bootstrap_mean(values, weights=weights, resamples=400, seed=4, confidence=0.8)
    pooled = []
    for row in resample_indices(4, resamples=400, seed=4):
        total = sum(weights[j] for j in row)
        pooled.append(sum(values[j] * weights[j] for j in row) / total if total else 0.0)
    assert (interval.low, interval.high) == pytest.approx(by_hand(pooled, 0.8))
    assert interval.estimate == pytest.approx((0.5 + 0.0 + 0.0 + 0.25 * 0.125) / 0.875)
    assert (interval.n, interval.confidence) == (4, 0.8)


@pytest.mark.parametrize("weights", [[1.0, -1.0, 1.0], [0.0, 0.0, 0.0], [1.0, 1.0]])
def test_weights_must_be_one_per_value_non_negative_and_not_all_zero(weights):
    with pytest.raises(ValueError, match="^weights: one non-negative weight per value, not all zero$"):
        bootstrap_mean([0.1, 0.2, 0.3], weights=weights, resamples=200)


def test_a_missing_or_infinite_value_is_refused_naming_the_argument_and_the_unit():
    with pytest.raises(ValueError, match=r"^values: value 0 is not finite \(nan\)$"):
        bootstrap_mean([None, 1.0], resamples=200)
    with pytest.raises(ValueError, match=r"^weights: value 1 is not finite \(inf\)$"):
        bootstrap_mean([0.0, 1.0], weights=[1.0, float("inf")], resamples=200)
    with pytest.raises(ValueError, match="^treatment: value 0 is not finite"):
        paired_difference([float("nan")], [0.0], resamples=200)
    with pytest.raises(ValueError, match="^baseline: value 1 is not finite"):
        paired_difference([0.0, 0.0], [0.0, float("-inf")], resamples=200)
    with pytest.raises(ValueError, match=r"^values: expected one value per unit \(1-D\)"):
        bootstrap_mean([[0.0, 1.0]], resamples=200)


def test_a_paired_difference_is_the_mean_interval_of_the_differences_with_every_setting():
    treated, base = [0.5, 0.2, 0.9, 0.4, 0.6], [0.1, 0.3, 0.5, 0.4, 0.2]
    paired = paired_difference(treated, base, resamples=250, seed=9, confidence=0.7)
    assert paired == bootstrap_mean([t - b for t, b in zip(treated, base)], resamples=250, seed=9, confidence=0.7)
    assert paired != paired_difference(treated, base, resamples=250, seed=8, confidence=0.7)
    default = paired_difference(treated, base, resamples=250)
    assert default == paired_difference(treated, base, resamples=250, seed=0)
    assert default != paired_difference(treated, base, resamples=250, seed=1)


# --------------------------------------------------------------------------- any statistic


def ratio(columns) -> float:
    return float(np.sum(columns["y"]) / np.sum(columns["x"]))


def test_a_statistic_is_resampled_row_by_row_with_every_setting():
    x, y = [1.0, 2.0, 3.0, 4.0, 5.0], [2.0, 1.0, 7.0, 4.0, 3.0]
    interval = bootstrap_statistic({"x": x, "y": y}, ratio, resamples=300, seed=5, confidence=0.9)
    ratios = [sum(y[j] for j in row) / sum(x[j] for j in row) for row in resample_indices(5, resamples=300, seed=5)]
    assert (interval.low, interval.high) == pytest.approx(by_hand(ratios, 0.9))
    assert (interval.estimate, interval.n, interval.confidence) == pytest.approx((17 / 15, 5, 0.9))
    columns = {"x": [1.5, 2.0, 3.25, 4.0, 5.5, 1.0, 2.75], "y": [2.0, 1.0, 7.0, 4.5, 3.0, 0.5, 6.25]}
    default = bootstrap_statistic(columns, ratio, resamples=300)
    assert default == bootstrap_statistic(columns, ratio, resamples=300, seed=0)
    assert default != bootstrap_statistic(columns, ratio, resamples=300, seed=1)


def test_resamples_where_the_statistic_is_undefined_are_left_out():
    """A rank correlation of a resample that drew one ladder step only is undefined (None or NaN)."""
    ids = list(range(10))
    first = resample_indices(10, resamples=200, seed=2)[0].tolist()

    def only_on(rows):
        return lambda c: 0.25 if c["id"].tolist() in rows else None

    one = bootstrap_statistic({"id": ids}, only_on([first, ids]), resamples=200, seed=2, confidence=0.9)
    assert (one.estimate, one.low, one.high) == (0.25, 0.25, 0.25)  # one defined resample
    none = bootstrap_statistic({"id": ids}, only_on([ids]), resamples=200, seed=2, confidence=0.9)
    assert none.estimate == 0.25 and math.isnan(none.low) and math.isnan(none.high)
    assert (none.n, none.confidence) == (10, 0.9) and not none.readable


def test_columns_of_different_lengths_are_refused():
    with pytest.raises(ValueError, match="columns differ in length"):
        bootstrap_statistic({"x": [1.0, 2.0], "y": [1.0]}, ratio, resamples=200)
