"""The evaluation statistics on fixed data, against values worked out by hand."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from align.eval import stats


def test_win_rate_counts_ties_half_and_pools_over_prompts():
    # prompt 0: win, tie; prompt 1: loss; prompt 2: win, win, undecided
    result = stats.win_rate([[1.0, 0.5], [0.0], [1.0, 1.0, None]], resamples=500)
    assert (result.wins, result.ties, result.losses, result.missing) == (3, 1, 1, 1)
    assert result.prompts == 3 and result.comparisons == 5
    assert result.rate.estimate == pytest.approx((3 + 0.5) / 5)


def test_win_rate_of_only_undecided_comparisons_is_none():
    assert stats.win_rate([[None], [None, None]]) is None


def test_win_rate_rejects_outcomes_that_are_not_win_tie_loss():
    with pytest.raises(ValueError, match="1, 0.5 or 0"):
        stats.win_rate([[0.7]])


def test_outcome_ties_within_tolerance_and_missing_scores():
    assert stats.outcome(2.0, 1.0) == 1.0
    assert stats.outcome(1.0, 2.0) == 0.0
    assert stats.outcome(1.0, 1.0) == 0.5
    assert stats.outcome(1.05, 1.0, tolerance=0.1) == 0.5
    assert stats.outcome(None, 1.0) is None


def test_preference_outcome_reads_a_judge_probability():
    assert stats.preference_outcome(0.8) == 1.0
    assert stats.preference_outcome(0.2) == 0.0
    assert stats.preference_outcome(0.5) == 0.5
    assert stats.preference_outcome(0.55, tie_margin=0.1) == 0.5
    assert stats.preference_outcome(None) is None


def test_bootstrap_of_two_units_has_the_enumerable_interval():
    # resampled means of [0, 1] are 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4: the 2.5th
    # and 97.5th percentiles are 0 and 1
    interval = stats.bootstrap_mean([0.0, 1.0], resamples=4000, seed=3)
    assert (interval.estimate, interval.low, interval.high) == (0.5, 0.0, 1.0)


def test_bootstrap_of_constant_values_is_a_point():
    interval = stats.bootstrap_mean([0.25] * 10)
    assert (interval.estimate, interval.low, interval.high) == (0.25, 0.25, 0.25)


def test_bootstrap_equals_a_plain_loop_over_the_same_resamples():
    values = [0.1, 0.9, 0.4, 0.4, 0.0, 1.0, 0.7]
    interval = stats.bootstrap_mean(values, resamples=300, seed=11)
    idx = stats.resample_indices(len(values), resamples=300, seed=11)
    means = sorted(sum(values[j] for j in row) / len(row) for row in idx)
    # numpy's default (linear) quantile, by hand
    def quantile(q):
        pos = q * (len(means) - 1)
        lo = math.floor(pos)
        return means[lo] + (pos - lo) * (means[min(lo + 1, len(means) - 1)] - means[lo])
    assert interval.low == pytest.approx(quantile(0.025))
    assert interval.high == pytest.approx(quantile(0.975))
    assert interval.estimate == pytest.approx(sum(values) / len(values))


def test_bootstrap_interval_matches_the_normal_approximation_on_a_large_sample():
    rng = random.Random(0)
    values = [rng.gauss(1.0, 2.0) for _ in range(2000)]
    interval = stats.bootstrap_mean(values, resamples=4000)
    half_width = 1.96 * np.std(values, ddof=1) / math.sqrt(len(values))
    assert (interval.high - interval.low) / 2 == pytest.approx(half_width, rel=0.1)


def test_weighted_bootstrap_estimate_is_the_pooled_mean():
    interval = stats.bootstrap_mean([1.0, 0.0], weights=[3, 1], resamples=200)
    assert interval.estimate == pytest.approx(0.75)


def test_paired_bootstrap_removes_shared_prompt_difficulty():
    # both policies see the same easy and hard prompts; treatment is always 0.1 better
    base = [0.0, 0.9, 0.2, 0.8, 0.5, 0.1, 0.95, 0.3]
    treated = [b + 0.1 for b in base]
    paired = stats.paired_difference(treated, base)
    assert (paired.low, paired.estimate, paired.high) == pytest.approx((0.1, 0.1, 0.1))
    assert paired.excludes(0.0)


def test_paired_difference_needs_the_same_units():
    with pytest.raises(ValueError, match="same units"):
        stats.paired_difference([1.0, 2.0], [1.0])


def test_non_finite_values_are_refused_naming_the_unit():
    with pytest.raises(ValueError, match="value 1 is not finite"):
        stats.bootstrap_mean([0.0, float("nan")])


def test_bootstrap_statistic_resamples_columns_together():
    xs = [1.0, 2.0, 3.0, 4.0]
    interval = stats.bootstrap_statistic({"x": xs, "y": [2 * x for x in xs]},
                                         lambda c: float(np.sum(c["y"]) / np.sum(c["x"])), resamples=200)
    assert (interval.low, interval.estimate, interval.high) == pytest.approx((2.0, 2.0, 2.0))


def test_verdict_says_whether_the_interval_excludes_no_change():
    up = stats.Interval(0.06, 0.03, 0.09, 500)
    flat = stats.Interval(0.01, -0.02, 0.04, 500)
    down = stats.Interval(0.3, 0.2, 0.4, 500)
    assert "a real improvement" in stats.verdict("gain", up, null=0.0)
    assert "+0.06" in stats.verdict("gain", up, null=0.0)
    assert "no change shown" in stats.verdict("gain", flat, null=0.0)
    assert "a real decline" in stats.verdict("win rate", down, null=0.5)


# --------------------------------------------------------------------------- the sentences a report prints

I = stats.Interval


@pytest.mark.parametrize("args,kwargs,sentence", [
    ((I(0.06, 0.03, 0.09, 500),), {"null": 0.0},
     "reward gain: +0.06 (95% CI +0.03 to +0.09); the interval lies above 0: a real improvement."),
    ((I(0.62, 0.55, 0.69, 300, 0.9),), {"null": 0.5, "scale": 100, "unit": " points"},
     "reward gain: 62 points (90% CI 55 points to 69 points); the interval lies above 50 points: a real improvement."),
    ((I(0.38, 0.31, 0.45, 300),), {"null": 0.5, "scale": 100, "unit": "%"},
     "reward gain: 38% (95% CI 31% to 45%); the interval lies below 50%: a real decline."),
    ((I(0.52, 0.45, 0.58, 300),), {"null": 0.5, "scale": 100, "unit": "%"},
     "reward gain: 52% (95% CI 45% to 58%); the interval includes 50%: no change shown."),
    ((I(-0.04, -0.07, -0.01, 40),), {"null": 0.0, "between": True},
     "reward gain: -0.04 (95% CI -0.07 to -0.01); the interval lies below 0: a real difference, lower."),
    ((I(0.04, 0.01, 0.07, 40),), {"null": 0.0, "between": True},
     "reward gain: +0.04 (95% CI +0.01 to +0.07); the interval lies above 0: a real difference, higher."),
    # an interval that touches "no change" includes it; two prompts are enough for an interval
    ((I(0.03, 0.0, 0.05, 2),), {"null": 0.0},
     "reward gain: +0.03 (95% CI +0 to +0.05); the interval includes 0: no change shown."),
    ((I(0.45, 0.4, 0.5, 2),), {"null": 0.5},
     "reward gain: 0.45 (95% CI 0.4 to 0.5); the interval includes 0.5: no change shown."),
    ((I(0.5, 0.5, 0.5, 1),), {"null": 0.0},
     "reward gain: +0.5 from 1 prompt: too few for an interval, nothing shown."),
    ((I(0.5, 0.6, 0.7, 30),), {"null": 0.0},
     "reward gain: +0.5 (95% CI +0.6 to +0.7); the interval does not hold its own estimate (too few prompts or "
     "resamples): nothing shown."),
])
def test_verdict_sentences_word_for_word(args, kwargs, sentence):
    assert stats.verdict("reward gain", *args, **kwargs) == sentence


def test_equal_scores_and_an_even_judge_are_ties_whatever_the_margin():
    assert stats.outcome(1.0, 1.0, tolerance=0.0) == 0.5 and stats.outcome(1.0 + 1e-12, 1.0) == 1.0
    assert stats.preference_outcome(0.5, tie_margin=0.0) == 0.5 and stats.preference_outcome(0.5 + 1e-12) == 1.0
    assert stats.preference_outcome(float("nan")) is None and stats.preference_outcome(float("inf")) is None


def test_a_win_rate_counts_undecided_comparisons_of_every_prompt_and_keeps_every_setting():
    outcomes = [[1.0, None], [0.0, None, None], [0.5, 1.0], [1.0]]
    result = stats.win_rate(outcomes, resamples=300, seed=5, confidence=0.8)
    assert result.missing == 3 and result.prompts == 4 and result.comparisons == 5
    assert result.rate == stats.bootstrap_mean([1.0, 0.0, 0.75, 1.0], weights=[1, 1, 2, 1], resamples=300, seed=5,
                                               confidence=0.8)
    assert result.to_dict() == {"rate": result.rate.to_dict(), "wins": 3, "ties": 1, "losses": 1, "comparisons": 5,
                                "prompts": 4, "missing": 3}
    many = [[1.0, 0.0, 0.5][: 1 + i % 3] + [(i * 7) % 3 / 2] for i in range(15)]
    default = stats.win_rate(many, resamples=300).rate
    assert default == stats.win_rate(many, resamples=300, seed=0).rate != stats.win_rate(many, resamples=300, seed=1).rate
    assert default != stats.win_rate(many).rate  # 2,000 resamples by default


def test_the_training_log_win_rate_is_the_pooled_rate_without_an_interval():
    outcomes = [[1.0, None], [0.0, 0.5], [1.0, 1.0, 0.0]]
    assert stats.pooled_win_rate(outcomes) == pytest.approx(3.5 / 6)
    assert stats.pooled_win_rate(outcomes) == pytest.approx(stats.win_rate(outcomes, resamples=200).rate.estimate)
    assert stats.pooled_win_rate([[None], []]) is None
    for bad in (0.7, 2.0):
        with pytest.raises(ValueError, match="1, 0.5 or 0"):
            stats.pooled_win_rate([[1.0, bad]])
