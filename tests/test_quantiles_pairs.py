"""Quantile rewards and pair selection (docs/method.md, Quantile rewards and Pair selection)."""

from __future__ import annotations

import random

import pytest

from align.data.pairs import Pair, Skip, make_pairs, select_pair
from align.data.quantiles import quantile_rewards
from align.data.records import PAIR_FIELDS, RecordError

# --- quantile rewards -------------------------------------------------------------------


def test_quantile_by_hand():
    """refs [1, 2, 2, 3]: #{ref ≤ 2} = 3 → 3/4; below all → 0; at the top → 1."""
    refs = [2.0, 1.0, 3.0, 2.0]
    assert quantile_rewards(2.0, refs) == 0.75
    assert quantile_rewards([0.5, 2.5, 3.0, 7], refs) == [0.0, 0.75, 1.0, 1.0]
    assert quantile_rewards((1.0,), refs) == [0.25]


def test_ties_count_for_the_candidate():
    assert quantile_rewards(0.5, [0.5] * 4) == 1.0
    assert quantile_rewards([0.0, 1.0], [0.0, 1.0, 1.0, 1.0, 0.0]) == [0.4, 1.0]


def test_reference_against_its_own_set_matches_the_formula():
    rng = random.Random(0)
    for _ in range(50):
        n = rng.randint(1, 12)
        refs = [float(rng.randint(0, 3)) for _ in range(n)]  # many ties
        got = quantile_rewards(refs, refs)
        want = [sum(r_j <= r for r_j in refs) / n for r in refs]
        assert got == want
        assert all(q >= 1 / n for q in got)
        assert all(q in {k / n for k in range(n + 1)} for q in got)
        assert max(got) == 1.0


@pytest.mark.parametrize(
    "rewards, refs, match",
    [
        (0.3, [0.1, float("nan"), 0.2], r"ref_rewards\[1\] is NaN"),
        ([0.3, float("nan")], [0.1, 0.2], r"rewards\[1\] is NaN"),
        (float("nan"), [0.1], r"rewards is NaN"),
        (0.3, [0.1, None], r"ref_rewards\[1\] must be a number"),
        (0.3, [], "ref_rewards is empty"),
        ("0.3", [0.1], "rewards must be a sequence"),
    ],
)
def test_bad_quantile_input_names_the_field(rewards, refs, match):
    with pytest.raises(ValueError, match=match):
        quantile_rewards(rewards, refs)


def test_expected_n_names_the_count():
    with pytest.raises(ValueError, match="got 9 reference rewards, expected at least n = 10"):
        quantile_rewards(0.5, [0.1] * 9, expected_n=10)
    assert quantile_rewards(0.5, [0.1] * 10, expected_n=10) == 1.0


# --- select_pair --------------------------------------------------------------------------


def outcomes(rewards, quantiles, num_ref_rewards, seeds=range(200), **kwargs):
    return [select_pair(rewards, quantiles, num_ref_rewards=num_ref_rewards, seed=s, **kwargs) for s in seeds]


def test_buckets_high_and_low():
    """refs 0..9 → R_q = (k+1)/10; offline 100 (R_q 1) and −1 (R_q 0).

    high (R_q = 1): ref 9 and offline 100; low (R_q ≤ 0.2): refs 0, 1 and offline −1.
    """
    rewards = [float(k) for k in range(10)] + [100.0, -1.0]
    quantiles = quantile_rewards(rewards, rewards[:10])
    results = outcomes(rewards, quantiles, num_ref_rewards=10)
    assert all(isinstance(r, Pair) and r.fallback is None for r in results)
    assert {r.chosen for r in results} == {9, 10}
    assert {r.rejected for r in results} == {0, 1, 11}


def test_binary_rewards_nine_of_ten_correct_rejects_the_wrong_one():
    """docs/method.md, Pair selection: an interpolated 20th percentile of [0, 1×9] is 1, which would admit a
    correct answer as rejected; on R_q the wrong answer has 1/10 and is the only low one."""
    rewards = [1.0] * 9 + [0.0]
    rewards = rewards[4:] + rewards[:4]  # wrong answer at index 5
    quantiles = quantile_rewards(rewards, rewards)
    assert quantiles[5] == 0.1
    for result in outcomes(rewards, quantiles, num_ref_rewards=10):
        assert result.rejected == 5 and rewards[result.chosen] == 1.0 and result.fallback is None


def test_binary_rewards_seven_of_ten_falls_back_to_middle_and_says_so():
    rewards = [1.0] * 7 + [0.0] * 3  # wrong answers have R_q = 0.3 > 0.2
    quantiles = quantile_rewards(rewards, rewards)
    for result in outcomes(rewards, quantiles, num_ref_rewards=10, seeds=range(30)):
        assert result.rejected in (7, 8, 9) and result.chosen < 7
        assert result.fallback == "rejected:middle"


def test_rejected_falls_back_to_high_when_every_candidate_ties_the_best_reference():
    """All references 0.5 (R_q 1) and one offline 0.9 (R_q 1): the only preference is 0.9 > 0.5."""
    rewards = [0.5] * 10 + [0.9]
    quantiles = quantile_rewards(rewards, rewards[:10])
    for result in outcomes(rewards, quantiles, num_ref_rewards=10, seeds=range(30)):
        assert result.chosen == 10 and result.rejected < 10
        assert result.fallback == "rejected:high"


def test_chosen_fallback_and_both_fallbacks_are_recorded():
    one = select_pair([0.5, 0.1, 0.3], [0.6, 0.1, 0.4], num_ref_rewards=10, seed=0)
    assert one.chosen in (0, 2) and one.rejected == 1 and one.fallback == "chosen:middle"
    both = select_pair([0.5, 0.6], [0.5, 0.6], num_ref_rewards=10, seed=0)
    assert both == Pair(chosen=1, rejected=0, fallback="chosen:middle;rejected:middle")


def test_low_cut_is_at_least_one_over_n():
    """n = 2: R_q ∈ {0, 0.5, 1}; the worse reference (0.5) is low since max(0.2, 1/2) = 0.5."""
    rewards = [1.0, 2.0]
    result = select_pair(rewards, quantile_rewards(rewards, rewards), num_ref_rewards=2, seed=0)
    assert result == Pair(chosen=1, rejected=0, fallback=None)


def test_unscored_completions_are_not_candidates():
    rewards = [None, 0.2, None, 0.9]
    quantiles = [None, 0.5, None, 1.0]
    for result in outcomes(rewards, quantiles, num_ref_rewards=2, seeds=range(20)):
        assert (result.chosen, result.rejected) == (3, 1)


@pytest.mark.parametrize(
    "rewards, quantiles, reason",
    [
        ([0.3, None], [1.0, None], "fewer than 2 scored completions (1)"),
        ([0.4, 0.4, 0.4], [1.0, 1.0, 1.0], "all 3 scored completions have the same reward"),
    ],
)
def test_prompts_without_a_preference_are_skipped_with_a_reason(rewards, quantiles, reason):
    result = select_pair(rewards, quantiles, num_ref_rewards=3, seed=0)
    assert isinstance(result, Skip) and reason in result.reason


def test_selection_is_seeded_and_deterministic():
    rewards = [float(k) for k in range(10)] + [100.0, -1.0]
    quantiles = quantile_rewards(rewards, rewards[:10])
    first = outcomes(rewards, quantiles, num_ref_rewards=10, seeds=range(20))
    assert first == outcomes(rewards, quantiles, num_ref_rewards=10, seeds=range(20))
    assert select_pair(rewards, quantiles, num_ref_rewards=10, rng=random.Random(7)) == first[7]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (
            {"rewards": [0.1, 0.2], "quantiles": [0.5], "num_ref_rewards": 2, "seed": 0},
            "quantiles has 1 entries",
        ),
        (
            {"rewards": [0.1, 0.2], "quantiles": [0.5, None], "num_ref_rewards": 2, "seed": 0},
            r"rewards\[1\] and quantiles\[1\]",
        ),
        (
            {"rewards": [0.1, float("nan")], "quantiles": [0.5, 1.0], "num_ref_rewards": 2, "seed": 0},
            r"rewards\[1\] is NaN",
        ),
        (
            {"rewards": [0.1, 0.2], "quantiles": [0.5, 1.5], "num_ref_rewards": 2, "seed": 0},
            r"quantiles\[1\]",
        ),
        (
            {"rewards": [0.1, 0.2], "quantiles": [0.5, 1.0], "num_ref_rewards": 2},
            "exactly one of rng and seed",
        ),
        ({"rewards": [0.1, 0.2], "quantiles": [0.5, 1.0], "num_ref_rewards": 0, "seed": 0}, "num_ref_rewards"),
    ],
)
def test_bad_selection_input_names_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        select_pair(**kwargs)


# --- make_pairs ---------------------------------------------------------------------------


def record(rid, ref_rewards, offline=(), skips=None):
    """A prompt record in the library schema: references ``ref{j}``, offline ``off{k}``."""
    completions, rewards = [], []
    for j, reward in enumerate(ref_rewards):
        completions.append(
            {
                "text": f"{rid}-ref{j}",
                "num_tokens": 5,
                "finish_reason": "stop",
                "is_reference": True,
                "source": "policy",
            }
        )
        rewards.append(reward)
    for k, reward in enumerate(offline):
        completions.append(
            {
                "text": f"{rid}-off{k}",
                "num_tokens": 7,
                "finish_reason": "stop",
                "is_reference": False,
                "source": "other-model",
            }
        )
        rewards.append(reward)
    reward_skips = [None if r is not None else "judge output unparsable" for r in rewards]
    return {
        "id": rid,
        "messages": [{"role": "user", "content": f"question {rid}"}],
        "completions": completions,
        "rewards": rewards,
        "reward_skips": reward_skips,
    }


def test_make_pairs_rows_have_the_trainer_columns_and_consistent_values():
    records = [
        record("a", [0.1 * k for k in range(10)], offline=[2.0, -1.0]),
        record("b", [1.0] * 9 + [0.0]),
    ]
    pairs, skips = make_pairs(records, seed=0)
    assert skips == []
    by_id = {row["id"]: row for row in pairs}
    for row in pairs:
        assert tuple(row) == PAIR_FIELDS
        assert row["chosen_reward"] > row["rejected_reward"]
        assert row["num_ref_rewards"] == 10 and row["chosen_quantile"] == 1.0
    a = by_id["a"]
    assert a["chosen"] in ("a-ref9", "a-off0") and a["rejected"] in ("a-ref0", "a-ref1", "a-off1")
    want_q = {"a-ref0": 0.1, "a-ref1": 0.2, "a-off1": 0.0}[a["rejected"]]
    assert a["rejected_quantile"] == want_q
    assert by_id["b"]["rejected"] == "b-ref9" and by_id["b"]["rejected_quantile"] == 0.1
    assert by_id["b"]["messages"] == [{"role": "user", "content": "question b"}]


def test_unscored_reference_skips_the_prompt_unless_allowed():
    refs = [0.1 * k for k in range(9)] + [None]
    pairs, skips = make_pairs([record("p", refs, offline=[5.0])], seed=0)
    assert pairs == [] and skips == [
        {"id": "p", "reason": "only 9 of 10 reference rewards scored (min_ref_rewards=10)"}
    ]
    pairs, skips = make_pairs([record("p", refs, offline=[5.0])], seed=0, min_ref_rewards=9)
    assert skips == [] and pairs[0]["num_ref_rewards"] == 9
    assert pairs[0]["chosen"] in ("p-ref8", "p-off0")  # R_q against the 9 scored references


def test_no_preference_is_a_recorded_skip():
    pairs, skips = make_pairs(
        [record("same", [0.5] * 4), record("ok", [0.5, 0.5, 0.5, 0.0])], seed=1
    )
    assert [row["id"] for row in pairs] == ["ok"]
    assert skips[0]["id"] == "same" and "same reward" in skips[0]["reason"]


def test_make_pairs_is_deterministic_and_independent_of_order():
    records = [
        record(f"r{i}", [float(k % 4) for k in range(10)], offline=[9.0, -3.0]) for i in range(12)
    ]
    forward, _ = make_pairs(records, seed=3)
    backward, _ = make_pairs(list(reversed(records)), seed=3)
    assert sorted(forward, key=lambda r: r["id"]) == sorted(backward, key=lambda r: r["id"])
    assert make_pairs(records, seed=3) == (forward, [])
    other, _ = make_pairs(records, seed=4)
    assert [(r["chosen"], r["rejected"]) for r in other] != [
        (r["chosen"], r["rejected"]) for r in forward
    ]


@pytest.mark.parametrize(
    "mutate, kwargs, field",
    [
        (lambda r: [c.update(is_reference=False) for c in r["completions"]], {}, "completions"),
        (lambda r: None, {"num_ref_rewards": 2}, "completions"),  # bad-1 has 3
        (lambda r: r["rewards"].__setitem__(1, float("nan")), {}, r"rewards\[1\]"),
        (lambda r: r["rewards"].pop(), {}, "rewards"),
    ],
)
def test_bad_records_name_the_record_and_field(mutate, kwargs, field):
    bad = record("bad-1", [0.1, 0.2, 0.3])
    mutate(bad)
    with pytest.raises(RecordError, match=rf"'bad-1'.*{field}"):
        make_pairs([record("fine", [0.1, 0.9]), bad], seed=0, **kwargs)


def test_duplicate_ids_are_an_error():
    with pytest.raises(RecordError, match="duplicate id"):
        make_pairs([record("x", [0.1, 0.9]), record("x", [0.2, 0.8])], seed=0)


# --- truncated completions, dropped references, several pairs per prompt ---------------


def truncate(rec, *indices):
    """Mark completions as cut at the token budget."""
    for i in indices:
        rec["completions"][i]["finish_reason"] = "length"
    return rec


def test_pair_rows_carry_the_finish_reasons_of_chosen_and_rejected():
    pairs, _ = make_pairs([record("a", [0.1 * k for k in range(10)])], seed=0, truncated="train_without_end")
    assert pairs[0]["chosen_finish_reason"] == pairs[0]["rejected_finish_reason"] == "stop"
    rec = truncate(record("t", [0.0, 1.0]), 0, 1)
    pairs, _ = make_pairs([rec], seed=0, truncated="train_without_end")
    assert pairs[0]["chosen_finish_reason"] == pairs[0]["rejected_finish_reason"] == "length"


def test_truncated_completions_are_never_chosen_or_rejected_by_default():
    for seed in range(20):
        # the best and the worst completions are truncated: the pair comes from the rest
        rec = truncate(record("a", [0.1 * k for k in range(10)], offline=[5.0, -5.0]), 10, 11, 9, 0)
        pairs, skips = make_pairs([rec], seed=seed)
        assert skips == []
        row = pairs[0]
        assert row["chosen"] not in ("a-off0", "a-ref9") and row["rejected"] not in ("a-off1", "a-ref0")
        assert row["chosen_finish_reason"] == row["rejected_finish_reason"] == "stop"


def test_truncated_completions_still_count_as_references_for_quantiles():
    rec = truncate(record("a", [0.0] * 8 + [1.0, 2.0]), 9)  # the best reference is truncated
    pairs, _ = make_pairs([rec], seed=0)
    assert pairs[0]["num_ref_rewards"] == 10
    assert pairs[0]["chosen"] == "a-ref8" and pairs[0]["chosen_quantile"] == 0.9  # 9 of 10, the cut one counted
    assert pairs[0]["pair_fallback"].startswith("chosen:middle")


def test_a_prompt_left_without_untruncated_candidates_is_a_recorded_skip():
    rec = truncate(record("a", [0.0, 1.0, 2.0]), 1, 2)
    pairs, skips = make_pairs([rec], seed=0)
    assert pairs == [] and skips[0]["id"] == "a"
    assert "truncated" in skips[0]["reason"] and "1" in skips[0]["reason"]
    pairs, skips = make_pairs([truncate(record("a", [0.0, 1.0, 2.0]), 1, 2)], seed=0, truncated="train_without_end")
    assert skips == [] and pairs[0]["chosen_finish_reason"] == "length"


def test_untruncated_records_pair_exactly_as_before_the_truncated_setting():
    records = [record(f"r{i}", [float(k % 4) for k in range(10)], offline=[9.0, -3.0]) for i in range(8)]
    assert make_pairs(records, seed=2) == make_pairs(records, seed=2, truncated="train_without_end")


def test_bad_truncated_and_num_pairs_settings_are_errors():
    with pytest.raises(ValueError, match="truncated"):
        make_pairs([record("a", [0.0, 1.0])], seed=0, truncated="keep")
    with pytest.raises(ValueError, match="num_pairs_per_prompt"):
        make_pairs([record("a", [0.0, 1.0])], seed=0, num_pairs_per_prompt=0)


def test_references_dropped_by_overlong_drop_are_expected_missing():
    rec = record("a", [0.1 * k for k in range(8)])
    rec["num_ref_dropped"] = 2  # 10 drawn, 2 dropped as overlong
    pairs, skips = make_pairs([rec], seed=0, num_ref_rewards=10)
    assert skips == [] and pairs[0]["num_ref_rewards"] == 8 and pairs[0]["num_ref_dropped"] == 2
    rec["num_ref_dropped"] = 1
    with pytest.raises(RecordError, match=r"'a'.*completions.*num_ref_rewards=10 minus num_ref_dropped=1"):
        make_pairs([rec], seed=0, num_ref_rewards=10)
    rec["num_ref_dropped"] = -1
    with pytest.raises(RecordError, match=r"'a'.*num_ref_dropped"):
        make_pairs([rec], seed=0, num_ref_rewards=10)


def test_several_pairs_per_prompt_never_reuse_a_completion():
    rewards = [float(k) for k in range(10)]
    rec = record("a", rewards, offline=[20.0, 30.0, -1.0, -2.0])
    pairs, skips = make_pairs([rec], seed=0, num_pairs_per_prompt=3)
    assert skips == [] and [p["id"] for p in pairs] == ["a", "a#2", "a#3"]
    texts = [p["chosen"] for p in pairs] + [p["rejected"] for p in pairs]
    assert len(set(texts)) == len(texts)
    for p in pairs:
        assert p["chosen_reward"] > p["rejected_reward"]
    # the first pair is the single pair num_pairs_per_prompt=1 gives
    single, _ = make_pairs([record("a", rewards, offline=[20.0, 30.0, -1.0, -2.0])], seed=0)
    assert pairs[0] == single[0]


def test_several_pairs_stop_when_the_buckets_run_out():
    pairs, skips = make_pairs([record("a", [0.0, 0.0, 1.0, 1.0])], seed=0, num_pairs_per_prompt=5)
    assert skips == [] and len(pairs) == 2
    assert {p["chosen"] for p in pairs} == {"a-ref2", "a-ref3"} and {p["rejected"] for p in pairs} == {"a-ref0", "a-ref1"}


def test_several_pairs_draw_rejected_uniformly_from_the_low_bucket_and_are_seeded():
    # 20 references: the low bucket (R_q <= 0.2) holds the four with reward 0..3
    rewards = [float(k) for k in range(20)]
    counts: dict[str, int] = {}
    for seed in range(400):
        pairs, _ = make_pairs([record("a", rewards, offline=[50.0, 60.0])], seed=seed, num_pairs_per_prompt=2)
        assert len(pairs) == 2
        for p in pairs:
            assert p["rejected_quantile"] <= 0.2 and p["pair_fallback"] is None
            counts[p["rejected"]] = counts.get(p["rejected"], 0) + 1
    assert set(counts) == {"a-ref0", "a-ref1", "a-ref2", "a-ref3"}
    assert all(150 <= c <= 250 for c in counts.values()), counts  # 200 expected each
    again = make_pairs([record("a", rewards, offline=[50.0, 60.0])], seed=7, num_pairs_per_prompt=2)
    assert again == make_pairs([record("a", rewards, offline=[50.0, 60.0])], seed=7, num_pairs_per_prompt=2)


def test_pair_id_clash_between_prompts_is_an_error():
    with pytest.raises(RecordError, match="a#2"):
        make_pairs([record("a#2", [0.0, 1.0]), record("a", [0.0, 1.0, 2.0, 3.0])], seed=0, num_pairs_per_prompt=2)


def test_pair_rows_keep_the_tool_declarations_the_prompt_was_sampled_with():
    tool = {"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}
    with_tools = {**record("t", [0.0, 1.0]), "tools": [tool]}
    pairs, _ = make_pairs([record("plain", [0.0, 1.0]), with_tools], seed=0)
    by_id = {p["id"]: p for p in pairs}
    assert by_id["t"]["tools"] == [tool]
    assert "tools" not in by_id["plain"] and tuple(by_id["plain"]) == PAIR_FIELDS


def test_rejected_pick_highest_takes_the_low_buckets_highest_quantile_as_the_published_code_does():
    """Ten references with distinct rewards: the low bucket (R_q <= 0.2) holds the two lowest; `uniform` draws
    either over seeds, `highest` always the one of quantile 0.2; the chosen answer is drawn as before."""
    rewards = [0.9, 0.1, 0.5, 0.7, 0.05, 0.3, 0.6, 0.8, 0.4, 0.95]
    quantiles = quantile_rewards(rewards, rewards)
    assert sorted(quantiles[i] for i in (1, 4)) == [0.1, 0.2] and quantiles[1] == 0.2
    uniform = {select_pair(rewards, quantiles, num_ref_rewards=10, seed=s).rejected for s in range(40)}
    highest = {select_pair(rewards, quantiles, num_ref_rewards=10, seed=s, rejected_pick="highest").rejected
               for s in range(40)}
    assert uniform == {1, 4} and highest == {1}
    same_chosen = [select_pair(rewards, quantiles, num_ref_rewards=10, seed=s).chosen ==
                   select_pair(rewards, quantiles, num_ref_rewards=10, seed=s, rejected_pick="highest").chosen
                   for s in range(40)]
    assert all(same_chosen)
    with pytest.raises(ValueError, match=r"rejected_pick: 'best' is not one of \['uniform', 'highest'\]"):
        select_pair(rewards, quantiles, num_ref_rewards=10, seed=0, rejected_pick="best")
    rows = [{"id": "p", "messages": [{"role": "user", "content": "?"}], "rewards": rewards,
             "completions": [{"text": f"a{i}", "is_reference": True, "finish_reason": "stop"} for i in range(10)]}]
    (pair,), _ = make_pairs(rows, seed=3, num_ref_rewards=10, rejected_pick="highest")
    assert pair["rejected"] == "a1" and pair["rejected_quantile"] == 0.2
