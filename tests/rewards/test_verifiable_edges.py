"""The verifiable reward at its edges: canonical forms by value, the bounds on model output, what a
score records, and the fingerprint a finished annotation is kept by.

Each expected form is worked out by hand ("1.2e-3" is 12·10⁻⁴ = 3/2500); the bounds are tested
on both sides of the line (64 characters of bare answer, 1,000 of extracted answer, 2,000
digits of exact number, 18 digits of exponent).
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from rewards.verifiable import (
    MAX_ANSWER_CHARS,
    VerifiableReward,
    as_number,
    extract_answer,
    normalize_answer,
    reference_problem,
)


@pytest.mark.parametrize("answer,canonical", [
    ("1e3", "1000"), ("2.50", "5/2"), ("-0.5", "-1/2"), ("0012", "12"), ("1.2e-3", "3/2500"), ("-0", "0"),
    ("0.000", "0"), ("+5", "5"), ("5", "5"), ("1,234.5", "2469/2"), ("4/2", "2"), ("-3/4", "-3/4"),
    ("- 5", "-5"), ("1e+0003", "1000"),
    # Roman numerals and quoted words keep their letters: only `$`, quotes and a final period go
    ("XL", "xl"), ("MIX.", "mix"), ('"LX"', "lx"), ("'Paris'", "paris"), ("$X$", "x"),
])
def test_canonical_forms_by_hand(answer, canonical):
    assert normalize_answer(answer) == canonical


def test_exact_numbers_up_to_two_thousand_digits_then_exact_text():
    assert as_number("1e1999") == Fraction(10**1999)  # 1 digit + exponent 1999: 2,000
    assert as_number("1e2000") == "1e2000" and as_number("-1e2500") == "-1e2500"
    assert as_number("-25e2400") == "-25e2400" and as_number("2500e2398") == "25e2400"
    assert as_number("1e+" + "0" * 20 + "3") == 1000  # leading zeros of an exponent are no digits
    assert as_number("1e" + "1" * 18) == "1e" + "1" * 18  # 18 exponent digits: still a number
    assert as_number("1e" + "1" * 19) is None  # 19: not read as one


def test_fractions_count_digits_without_signs_or_leading_zeros():
    zeros = "0" * 2001
    assert as_number(f"+{zeros}1/2") == Fraction(1, 2)
    assert as_number(f"1/{zeros}2") == Fraction(1, 2)
    assert as_number("9" * 2000 + "/7") == Fraction(int("9" * 2000), 7)  # 2,000 digits: a number
    assert as_number("9" * 2001 + "/7") is None  # compared as text
    assert as_number("1/0") is None and as_number("1/000") is None  # no number divides by zero


def test_a_bare_answer_is_at_most_its_setting_long():
    assert extract_answer("x" * 64) == "x" * 64 and extract_answer("x" * 65) is None
    assert extract_answer("  42  ", max_bare=2) == "42"
    short = VerifiableReward(max_bare_answer=10)
    assert short.score([[]], ["the answer here is long: 42"], references=["42"])[0].details == {"extracted": None}
    assert VerifiableReward().score([[]], ["x" * 64], references=["x" * 64])[0].value == 1.0


def test_what_each_score_records():
    reward = VerifiableReward()
    long_box = "\\boxed{" + "7" * 300 + "}"
    at_limit = "\\boxed{" + "7" * MAX_ANSWER_CHARS + "}"
    over = "\\boxed{" + "7" * (MAX_ANSWER_CHARS + 1) + "}"
    scores = reward.score([[]] * 5, ["", "I cannot say, sorry." * 10, long_box, at_limit, over],
                          references=["7", "7", "7" * 300, "7" * MAX_ANSWER_CHARS, "7"])
    assert [s.value for s in scores] == [0.0, 0.0, 1.0, 1.0, 0.0]
    assert scores[0].details == {"extracted": None, "empty_completion": "empty completion: given 0.0, no answer"}
    assert scores[1].details == {"extracted": None}
    assert scores[2].details == {"extracted": "7" * 200} and scores[3].details == {"extracted": "7" * 200}
    assert scores[4].details == {"extracted": "7" * 200,
                                 "answer_too_long": f"{MAX_ANSWER_CHARS + 1} characters (over 1000): not compared"}


def test_references_at_and_over_the_length_bound():
    assert reference_problem("7" * MAX_ANSWER_CHARS) is None
    assert reference_problem("7" * (MAX_ANSWER_CHARS + 1)) == (
        "a reference answer of 1001 characters (over 1000); answers that long are not compared, so no completion "
        "could match it")
    assert reference_problem(None) == "missing reference answer (needed by the verifiable reward)"


def test_the_fingerprint_a_finished_annotation_is_kept_by():
    """An upgrade that keeps these settings keeps earlier annotations current (numeric: no match key)."""
    assert VerifiableReward().fingerprint() == {"provider": "verifiable", "answer_field": "answer",
                                                "max_bare_answer": 64, "empty_completion": 0.0,
                                                "max_answer_chars": 1000}
    assert VerifiableReward("solution", match="exact", max_bare_answer=8).fingerprint() == {
        "provider": "verifiable", "answer_field": "solution", "max_bare_answer": 8, "empty_completion": 0.0,
        "max_answer_chars": 1000, "match": "exact"}
    assert VerifiableReward().reference_field == "answer"
