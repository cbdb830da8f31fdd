"""The verifiable reward on adversarial completions: model output is untrusted input.

Every completion below must score (correctly) without hanging or raising: huge
exponents, 100,000-digit numbers, deeply nested braces, long runs of markup. Timings are
not asserted; an alarm stops a case that hangs, so a hang fails the test instead of the
run. Reference answers that could never be compared (empty, too long) are errors.
"""

from __future__ import annotations

import signal

import pytest

from rewards.verifiable import (
    MAX_ANSWER_CHARS,
    VerifiableReward,
    answers_match,
    as_number,
    reference_problem,
)

CONV = [{"role": "user", "content": "What is the answer?"}]
DIGITS = "9" * 100_000


@pytest.fixture(autouse=True)
def hang_guard():
    """Fail a case that runs for 30 s (the unbounded parser took minutes), never time it."""
    def hung(signum, frame):
        raise TimeoutError("the verifiable reward hung on this completion")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(30)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def score(completion: str, reference) -> float:
    return VerifiableReward().score([CONV], [completion], references=[reference])[0].value


@pytest.mark.parametrize("completion,reference,expected", [
    # huge exponents: compared exactly, never expanded
    ("1e5000", "1", 0.0),
    ("1e10000000", "1", 0.0),
    ("\\boxed{1e10000000}", "1e10000000", 1.0),
    ("\\boxed{10e9999999}", "1e10000000", 1.0),
    ("\\boxed{1.000e10000000}", "1E+10000000", 1.0),
    ("\\boxed{1e10000000}", "1e10000001", 0.0),
    ("\\boxed{-1e10000000}", "1e10000000", 0.0),
    ("\\boxed{1e-10000000}", "0", 0.0),
    ("\\boxed{1e-10000000}", "10e-10000001", 1.0),
    ("The answer is 1e99999999999999999999999", "1", 0.0),
    ("\\boxed{1e" + "9" * 100_000 + "}", "1", 0.0),
    # enormous digit strings
    (DIGITS, "9", 0.0),
    ("\\boxed{" + DIGITS + "}", "9", 0.0),
    ("Answer: " + DIGITS, "1", 0.0),
    ("\\boxed{" + DIGITS + "/3}", "1", 0.0),
    ("\\boxed{1/" + DIGITS + "}", "1", 0.0),
    ("\\boxed{" + "1," * 50_000 + "000}", "1", 0.0),
    ("\\boxed{0." + "0" * 100_000 + "1}", "0", 0.0),
    # deep nesting and long markup runs
    ("\\boxed{" + "{" * 100_000 + "}", "1", 0.0),
    ("\\boxed{" * 50_000 + "7" + "}" * 50_000, "7", 1.0),
    ("\\boxed{" + "{" * 50_000 + "7" + "}" * 50_001, "7", 0.0),
    ("\\boxed{" + "\\text{" * 50_000 + "}", "1", 0.0),
    ("\\boxed{" + "\\frac{" * 50_000 + "}", "1", 0.0),
    ("$" * 100_000, "1", 0.0),
    ("answer is " * 20_000, "1", 0.0),
    ("[" * 100_000 + "1" + "]" * 100_000, "1", 0.0),
    # ordinary numbers keep their exact comparison
    ("\\boxed{168.0}", "168", 1.0),
    ("\\boxed{1,680}", "1680", 1.0),
    ("\\boxed{0.75}", "3/4", 1.0),
    ("\\boxed{\\frac{3}{4}}", "0.75", 1.0),
    ("\\boxed{2.50e2}", "250", 1.0),
    ("\\boxed{1e3}", "1000", 1.0),
    ("\\boxed{-0.0}", "0", 1.0),
    ("\\boxed{.5}", "1/2", 1.0),
    ("\\boxed{1e-3}", "1/1000", 1.0),
    ("\\boxed{" + "1" + "0" * 900 + "}", "1e900", 1.0),
    ("\\boxed{100e2498}", "1" + "0" * 2500, 1.0),
    ("\\boxed{100e2498}", "1e2501", 0.0),
    ("\\boxed{169}", "168", 0.0),
])
def test_adversarial_completions_score_correctly(completion, reference, expected):
    assert score(completion, reference) == expected


def test_an_overlong_answer_is_not_compared_and_says_so():
    result = VerifiableReward().score([CONV], ["\\boxed{" + "1" * (MAX_ANSWER_CHARS + 1) + "}"], references=["1"])[0]
    assert result.value == 0.0 and "not compared" in result.details["answer_too_long"]


def test_numbers_compare_by_exact_value_at_every_size():
    assert as_number("1e10000000") == "1e10000000"
    assert as_number("12.500e-10000000") == "125e-10000001"
    assert as_number("1e" + "9" * 19) is None  # an absurd exponent is not a number
    assert answers_match("0.1e3", "100") and answers_match("1" + "0" * 3000, "1e3000")
    assert not answers_match("1" + "0" * 3000, "1e2999")


@pytest.mark.parametrize("answer,needle", [
    ("", "empty reference answer"),
    ("   ", "empty reference answer"),
    ("$ $", "empty reference answer"),
    ("\\boxed{}", "empty reference answer"),
    (["4", ""], "empty reference answer"),
    ("1" * (MAX_ANSWER_CHARS + 1), "characters"),
    (None, "missing"),
    ({"value": 4}, "expected a string"),
])
def test_references_that_cannot_be_compared_are_named(answer, needle):
    assert needle in reference_problem(answer)


def test_an_empty_reference_never_matches_an_empty_box():
    from align.data.records import RecordError
    from rewards.annotate import validate_for_annotation

    record = {"id": "r1", "messages": CONV, "answer": "", "completions": [{"text": "\\boxed{}"}]}
    with pytest.raises(RecordError, match=r"record 'r1': field 'answer': empty reference answer"):
        validate_for_annotation(record, 0, "answer")
