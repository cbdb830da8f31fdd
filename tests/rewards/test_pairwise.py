"""Odd–even transposition ranking and the two-order comparison arithmetic."""

from __future__ import annotations

import itertools

import pytest

from rewards.pairwise import Comparison, combine_orders, odd_even_rank, preference_from_logprobs


def by_quality(quality):
    """A consistent judge: the completion with the higher quality wins; records calls."""
    calls = []

    def compare(pairs):
        calls.append(list(pairs))
        return [Comparison(1.0 if quality[g][a] > quality[g][b] else 0.0) for g, a, b in pairs]

    return compare, calls


def test_five_phases_sort_every_order_of_five_and_four_do_not():
    four_phases_fail = 0
    for perm in itertools.permutations(range(5)):
        quality = [list(perm)]
        compare, _ = by_quality(quality)
        ranking = odd_even_rank([list(range(5))], compare)[0]
        assert [perm[i] for i in ranking.order] == [4, 3, 2, 1, 0]
        assert ranking.phases <= 5
        limited = odd_even_rank([list(range(5))], by_quality(quality)[0], max_phases=4)[0]
        four_phases_fail += [perm[i] for i in limited.order] != [4, 3, 2, 1, 0]
    assert four_phases_fail > 0  # why the default limit is k phases, not the "4 passes" of an earlier specification


def test_no_pair_is_asked_twice_and_phases_are_batched_across_groups():
    quality = [[0, 1, 2, 3, 4], [4, 3, 2, 1, 0], [2, 0, 1]]
    compare, calls = by_quality(quality)
    rankings = odd_even_rank([[0, 1, 2, 3, 4], [0, 1, 2, 3, 4], [0, 1, 2]], compare)
    asked = [(g, frozenset((a, b))) for call in calls for g, a, b in call]
    assert len(asked) == len(set(asked))
    assert {g for g, _, _ in calls[0]} == {0, 1, 2}  # one judge call per phase, all groups
    assert rankings[0].order == [4, 3, 2, 1, 0]
    assert rankings[1].order == [0, 1, 2, 3, 4]
    assert rankings[2].order == [0, 2, 1]


def test_sorted_input_stops_after_two_quiet_phases():
    compare, calls = by_quality([[5, 4, 3, 2, 1]])
    ranking = odd_even_rank([[0, 1, 2, 3, 4]], compare)[0]
    assert ranking.order == [0, 1, 2, 3, 4] and ranking.phases == 2
    assert sum(len(c) for c in calls) == 4  # each neighbour pair once


def test_ties_keep_the_pointwise_order():
    ranking = odd_even_rank([[3, 1, 2]], lambda pairs: [Comparison(0.5) for _ in pairs])[0]
    assert ranking.order == [3, 1, 2]


def test_single_candidates_need_no_comparison():
    def never(pairs):
        raise AssertionError("no comparison expected")

    assert [r.order for r in odd_even_rank([[2], []], never)] == [[2], []]


def test_combining_the_two_orders():
    agree = combine_orders(0.8, 0.6)
    assert agree.first_wins == pytest.approx(0.7) and agree.orders_agree is True
    disagree = combine_orders(0.9, 0.3)  # position bias: "A" preferred in both orders
    assert disagree.first_wins == pytest.approx(0.6) and disagree.orders_agree is False
    one = combine_orders(None, 0.2)
    assert one.first_wins == pytest.approx(0.2) and one.orders_agree is None
    none = combine_orders(None, None)
    assert none.first_wins == 0.5 and none.note
    flipped = agree.flipped()
    assert flipped.first_wins == pytest.approx(0.3)
    assert (flipped.p_first_as_a, flipped.p_first_as_b) == pytest.approx((0.4, 0.2))


def test_preference_from_label_logprobs():
    import math

    assert preference_from_logprobs(math.log(0.6), math.log(0.2)) == pytest.approx(0.75)
    assert preference_from_logprobs(math.log(0.6), None) == 1.0  # "B" outside the top-k
    assert preference_from_logprobs(None, None) is None
