"""The edges of quantile rewards and pair selection that tests/test_quantiles_pairs.py leaves open.

A mutation check (mutmut) on align/data/pairs.py and align/data/quantiles.py showed rules no test held:
which settings are refused and which boundary values are accepted, what an upstream skip row and an
unencodable completion leave in the skip rows, how non-float rewards are read, how the overlong-drop
count is checked, and what the fallback note prints. Each test states one such rule as a user sees it.
"""

from __future__ import annotations

import pytest
from test_quantiles_pairs import record

from align.data.pairs import Pair, fallback_note, make_pairs, select_pair
from align.data.quantiles import quantile_rewards
from align.errors import ConfigError, InputError, RecordError
from align.stage_table import SKIP_FIELD

TEN = [float(k) for k in range(10)]  # ten references, R_q = (k + 1) / 10


def refused(match, **kwargs):
    """make_pairs refuses the setting before reading any record."""
    with pytest.raises(ConfigError, match=match):
        make_pairs([], seed=0, **kwargs)


# --- quantile rewards: what is a number -------------------------------------------------


@pytest.mark.parametrize("bad", [True, "0.3", b"1"])
def test_a_bool_or_text_reference_reward_is_refused_naming_its_index(bad):
    with pytest.raises(InputError, match=r"ref_rewards\[1\] must be a number"):
        quantile_rewards(0.5, [0.1, bad])


# --- select_pair: settings and the low cut -----------------------------------------------


@pytest.mark.parametrize("n", [True, 2.5, 0])
def test_select_pair_refuses_a_num_ref_rewards_that_is_not_a_positive_int(n):
    with pytest.raises(ConfigError, match="num_ref_rewards must be a positive int"):
        select_pair([0.0, 1.0], [0.5, 1.0], num_ref_rewards=n, seed=0)


def test_one_reference_is_enough_to_select_a_pair():
    assert select_pair([0.0, 1.0], [0.0, 1.0], num_ref_rewards=1, seed=0) == Pair(1, 0, None)


@pytest.mark.parametrize("threshold", [1.0, 1.5, -0.1])
def test_low_threshold_outside_zero_to_one_is_refused(threshold):
    with pytest.raises(ConfigError, match=r"low_threshold must be in \[0, 1\)"):
        select_pair(TEN, quantile_rewards(TEN, TEN), num_ref_rewards=10, seed=0, low_threshold=threshold)


def test_low_threshold_zero_leaves_only_the_one_over_n_floor():
    """low_threshold 0 is allowed; the low bucket is then R_q <= 1/n: only the worst of ten references."""
    quantiles = quantile_rewards(TEN, TEN)
    rejected = {select_pair(TEN, quantiles, num_ref_rewards=10, seed=s, low_threshold=0.0).rejected
                for s in range(40)}
    assert rejected == {0}


def test_make_pairs_uses_its_low_threshold():
    """low_threshold 0.5 widens the low bucket to R_q <= 0.5: `highest` picks the reference at 0.5."""
    (pair,), _ = make_pairs([record("a", TEN)], seed=0, low_threshold=0.5, rejected_pick="highest")
    assert pair["rejected"] == "a-ref4" and pair["rejected_quantile"] == 0.5


# --- make_pairs: settings refused before any record is read ----------------------------


@pytest.mark.parametrize("value", [True, 2.5, 0])
def test_num_pairs_per_prompt_must_be_a_positive_int(value):
    refused("num_pairs_per_prompt must be a positive int", num_pairs_per_prompt=value)


@pytest.mark.parametrize("value", [True, 2.5, 0, -1])
def test_num_ref_rewards_must_be_an_int_of_at_least_one(value):
    refused(rf"num_ref_rewards={value!r}: the number of reference completions", num_ref_rewards=value)


@pytest.mark.parametrize("value", [True, 2.5, 0])
def test_min_ref_rewards_must_be_a_positive_int(value):
    refused("min_ref_rewards must be a positive int or None", min_ref_rewards=value)


def test_an_unknown_chat_format_is_refused_before_any_record():
    refused("unknown chat format 'nope'", chat_format="nope")


def test_the_tokenizer_chat_format_is_accepted_and_checks_no_text():
    """"tokenizer": the special tokens are the tokenizer's, checked later; nothing is left out here."""
    rec = record("a", [0.0, 1.0])
    rec["completions"][1]["text"] = "x <|system_end|> y"
    pairs, skips = make_pairs([rec], seed=0, chat_format="tokenizer")
    assert skips == [] and pairs[0]["chosen"] == "x <|system_end|> y"


# --- one reference, one scored reference --------------------------------------------------


def test_num_ref_rewards_one_with_one_reference_gives_a_pair():
    (pair,), skips = make_pairs([record("a", [0.5], offline=[1.0])], seed=0, num_ref_rewards=1)
    assert skips == [] and (pair["chosen"], pair["rejected"]) == ("a-off0", "a-ref0")
    assert pair["num_ref_rewards"] == 1 and pair["pair_fallback"] == "rejected:high"


def test_min_ref_rewards_one_pairs_a_prompt_with_one_scored_reference():
    (pair,), skips = make_pairs([record("a", [0.5, None, None], offline=[1.0])], seed=0, min_ref_rewards=1)
    assert skips == [] and (pair["chosen"], pair["rejected"]) == ("a-off0", "a-ref0")
    assert pair["num_ref_rewards"] == 1


# --- rewards that are not Python floats ---------------------------------------------------


def test_int_rewards_are_read_as_floats_beside_an_unscored_completion():
    (pair,), skips = make_pairs([record("a", [0, 1, 2], offline=[None])], seed=0)
    assert skips == []
    assert (pair["chosen"], pair["rejected"]) == ("a-ref2", "a-ref0")
    assert pair["chosen_reward"] == 2.0 and pair["rejected_reward"] == 0.0 and pair["pair_fallback"] is None


def test_int_rewards_that_are_one_float_are_a_tie():
    """Selection compares the rewards as the floats the quantiles see: 2**53 and 2**53 + 1 are one float."""
    pairs, skips = make_pairs([record("a", [2**53, 2**53 + 1])], seed=0)
    assert pairs == [] and skips == [
        {"id": "a", "reason": "all 2 scored completions have the same reward: no preference"}]


# --- skip rows -------------------------------------------------------------------------------


def test_upstream_skip_rows_pass_with_their_reason_and_the_rest_is_paired():
    upstream = {"id": "u", SKIP_FIELD: "sampling failed"}
    pairs, skips = make_pairs([upstream, record("a", [0.0, 1.0])], seed=0)
    assert skips == [{"id": "u", "reason": "sampling failed", "upstream": True}]
    assert [p["id"] for p in pairs] == ["a"]


@pytest.mark.parametrize("bad_id", [None, "", 7])
def test_an_upstream_skip_row_without_an_id_is_refused_naming_the_row(bad_id):
    """The skip row is passed on and matched to its prompt by id downstream: without one it is refused here,
    not written as an id no stage after could match."""
    row = {SKIP_FIELD: "no prompt"} if bad_id is None else {"id": bad_id, SKIP_FIELD: "no prompt"}
    with pytest.raises(RecordError, match=r"<row 1>.*'id'.*a skip row needs the id.*no prompt"):
        make_pairs([record("a", [0.0, 1.0]), row], seed=0)


def test_a_duplicate_id_names_both_rows():
    with pytest.raises(RecordError, match=r"'x'.*'id'.*duplicate id \(rows 0 and 1\)"):
        make_pairs([{"id": "x", SKIP_FIELD: "sampling failed"}, record("x", [0.0, 1.0])], seed=0)
    with pytest.raises(RecordError, match=r"'y'.*'id'.*duplicate id \(rows 1 and 2\)"):
        make_pairs([record("a", [0.0, 1.0]), record("y", [0.0, 1.0]), record("y", [0.0, 1.0])], seed=0)


def test_a_bad_record_without_an_id_is_named_by_its_row():
    bad = record("gone", [0.0, 1.0])
    del bad["id"]
    with pytest.raises(RecordError, match=r"record '<row 1>': field 'id'"):
        make_pairs([record("a", [0.0, 1.0]), bad], seed=0)


def test_a_skip_row_without_left_out_completions_has_only_id_and_reason():
    _, skips = make_pairs([record("same", [0.5] * 3)], seed=0)
    assert skips == [{"id": "same", "reason": "all 3 scored completions have the same reward: no preference"}]


def test_a_skip_for_unencodable_text_keeps_the_selection_reason_and_lists_them():
    rec = record("a", [0.0, 1.0])
    rec["completions"][1]["text"] = "x <|system_end|> y"
    pairs, skips = make_pairs([rec], seed=0)
    assert pairs == [] and len(skips) == 1
    assert skips[0]["reason"] == "fewer than 2 scored completions (1) (1 completions excluded: special_token_text)"
    assert [row["completion"] for row in skips[0]["left_out"]] == [1]
    assert skips[0]["left_out"][0]["reason"].startswith("special_token_text: contains '<|system_end|>'")


# --- references dropped as overlong -------------------------------------------------------


@pytest.mark.parametrize("dropped", [-1, True, 1.5, "2"])
def test_num_ref_dropped_must_be_a_count(dropped):
    rec = {**record("a", TEN), "num_ref_dropped": dropped}
    with pytest.raises(RecordError, match=r"'a'.*'num_ref_dropped'.*expected a count >= 0"):
        make_pairs([rec], seed=0)


def test_missing_references_after_drops_state_the_expected_count():
    rec = {**record("a", [0.1 * k for k in range(8)]), "num_ref_dropped": 1}
    with pytest.raises(RecordError, match=r"'a'.*'completions'.*8 reference completions, expected num_ref_rewards=10 "
                                          r"minus num_ref_dropped=1 \(removed by sampling with overlong=drop\) = 9$"):
        make_pairs([rec], seed=0, num_ref_rewards=10)


def test_dropping_all_drawn_references_while_some_are_present_is_a_count_mismatch():
    """num_ref_dropped == num_ref_rewards is allowed as a count; one reference still present contradicts it."""
    rec = {**record("a", [0.5], offline=[1.0]), "num_ref_dropped": 2}
    with pytest.raises(RecordError, match=r"'a'.*'completions'.*1 reference completions.*= 0$"):
        make_pairs([rec], seed=0, num_ref_rewards=2)
    rec = {**record("a", [0.5], offline=[1.0]), "num_ref_dropped": 3}
    with pytest.raises(RecordError, match=r"'num_ref_dropped'.*is 3, more than the num_ref_rewards=2"):
        make_pairs([rec], seed=0, num_ref_rewards=2)


# --- the fallback note ----------------------------------------------------------------------


def test_the_fallback_note_lists_kinds_most_common_first_then_by_name():
    note = fallback_note(5, 9, {"b:x": 1, "c:x": 3, "a:x": 1})
    assert note == (
        "(5 of the 9 pairs are fallbacks (3 c:x, 1 a:x, 1 b:x): the preferred bucket was empty, so the next was "
        "used. Expected when references tie (a 0/1 reward, or one text sampled several times): a completion tied "
        "with others has a quantile above the low cut; every pair still prefers the higher reward "
        "(docs/method.md, Pair selection).)")
