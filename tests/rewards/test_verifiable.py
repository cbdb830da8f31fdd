"""Answer normalisation and matching for the verifiable reward."""

from __future__ import annotations

import pytest
from reward_cases import prompt

from rewards.verifiable import VerifiableReward, answers_match, extract_answer, normalize_answer


@pytest.mark.parametrize(
    ("predicted", "reference"),
    [
        ("\\boxed{168}", "168"),
        ("168.0", "168"),
        ("  168. ", "168"),
        ("1,680", "1680"),
        ("$42$", "42"),
        ("Paris.", "paris"),
        ("0.75", "3/4"),
        ("\\boxed{\\frac{1}{2}}", "0.5"),
        ("\\dfrac{6}{4}", "3/2"),
        ("\\text{blue}", "Blue"),
        ("-3", "-3.00"),
        ("1e3", "1000"),
        ("New  York", "new york"),
    ],
)
def test_equal_after_normalisation(predicted, reference):
    assert answers_match(predicted, reference)


@pytest.mark.parametrize(("predicted", "reference"), [("169", "168"), ("1,68", "168"), ("Lyon", "Paris"), ("16.8", "168")])
def test_different_answers_do_not_match(predicted, reference):
    assert not answers_match(predicted, reference)


def test_normal_forms():
    assert normalize_answer(" \\boxed{1,234.50}. ") == "2469/2"
    assert normalize_answer("The END.") == "the end"


@pytest.mark.parametrize(
    ("completion", "extracted"),
    [
        ("We add them.\nSo the total is \\boxed{12}, done.", "12"),
        ("First \\boxed{3}, then corrected: \\boxed{4}", "4"),
        ("Some steps.\nThe answer is 42.", "42."),
        ("Work.\nFinal answer: x = 5", "x = 5"),
        ("17", "17"),
        ("A long explanation that mentions 17 somewhere but never states which value is the final answer.", None),
    ],
)
def test_extract_answer(completion, extracted):
    assert extract_answer(completion) == extracted


def test_rewards_of_matching_wrong_empty_and_answerless_completions():
    reward = VerifiableReward()
    conversation = prompt("What is 12 * 14?")
    scores = reward.score([conversation] * 4, ["\\boxed{168}", "It is 170.\nThe answer is 170", "", "I don't know how."],
                          references=["168.0", 168, 168, 168])
    assert [s.value for s in scores] == [1.0, 0.0, 0.0, 0.0]
    assert scores[0].details["extracted"] == "168"


def test_empty_completion_gets_the_lowest_score_with_the_reason():
    scores = VerifiableReward().score([prompt("What is 2 + 2?")] * 2, ["", " \n"], references=["4", "4"])
    for score in scores:
        assert score.value == 0.0 and score.reason is None
        assert score.details["empty_completion"] == "empty completion: given 0.0, no answer"


def test_a_list_of_accepted_answers():
    scores = VerifiableReward().score([prompt("Name a colour of the Swiss flag.")] * 2, ["White", "Blue"],
                                      references=[["red", "white"]] * 2)
    assert [s.value for s in scores] == [1.0, 0.0]


def test_references_are_required():
    with pytest.raises(ValueError, match="needs the reference answers"):
        VerifiableReward("solution").score([prompt("Q?")], ["1"])


@pytest.mark.parametrize("completion,reference,numeric,exact", [
    ("0123", "00123", 1.0, 0.0),        # leading zeros: the same number, not the same answer
    ("123", "00123", 1.0, 0.0),
    (" 00123\n", "00123", 1.0, 1.0),    # surrounding white space never counts
    ("3/4", "0.75", 1.0, 0.0),
    ("The answer is 12345", "12345", 1.0, 1.0),  # extraction is the same in both modes
    ("12354", "12345", 0.0, 0.0),
    ("Paris", "paris", 1.0, 0.0),       # numeric mode compares canonical text (lower case); exact, the characters
    ("x = A", "x = a", 1.0, 0.0),
])
def test_match_modes(completion, reference, numeric, exact):
    from rewards.verifiable import VerifiableReward

    conversation = [{"role": "user", "content": "Sort the digits."}]
    for mode, expected in (("numeric", numeric), ("exact", exact)):
        (score,) = VerifiableReward(match=mode).score([conversation], [completion], references=[reference])
        assert score.value == expected, (mode, completion, reference)


def test_match_mode_is_checked_and_part_of_the_fingerprint():
    from rewards.verifiable import VerifiableReward

    with pytest.raises(ValueError, match="match: 'fuzzy' is not one of"):
        VerifiableReward(match="fuzzy")
    assert "match" not in VerifiableReward().fingerprint()  # numeric: the fingerprint jobs already carry
    assert VerifiableReward(match="exact").fingerprint()["match"] == "exact"
