"""Verifiable reward: 1.0 when the completion's final answer matches the reference, else 0.0.

The cheap provider that lets the whole pipeline run without a GPU (docs/method.md, Verifiable reward), and the
right one for math and short-answer prompts. The answer is taken from the completion as
the last `\\boxed{...}` if there is one, else a final "answer: ..." / "answer is ..."
line, else the whole completion when it is short (a bare answer). Both sides are then
normalised (see `normalize_answer`) and compared; numbers compare by exact value, so
"168" equals "168.0", "1,680" equals "1680" and "3/4" equals "0.75". A completion that
states no answer scores 0.0, and so does an empty completion (its details say why): the
lowest score, so a prompt is not lost because one of its references came back empty. A reference may be a
list of acceptable answers; an empty one (or one that normalises to nothing) is an error,
since it would match an empty `\\boxed{}`.

Completions are model output, so untrusted: every step is bounded. An extracted answer
longer than `MAX_ANSWER_CHARS` scores 0.0 without being compared; numbers are compared
exactly as (digits, exponent) without ever expanding `1e10000000` into an integer, and an
exponent of more than `MAX_EXPONENT_DIGITS` digits is not read as a number at all.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from align.errors import ConfigError, InputError
from rewards.base import Conversation, RewardProvider, Score, is_empty

_ANSWER_LINE = re.compile(r"(?:final answer|answer)\s*(?:is|:)\s*(?P<answer>.+)$", re.IGNORECASE)
_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_NUMBER = re.compile(r"^(?P<sign>[+-]?)(?:(?P<int>\d+)(?:\.(?P<frac>\d*))?|\.(?P<frac2>\d+))(?:[eE](?P<exp>[+-]?\d+))?$")
_FRACTION = re.compile(r"^([+-]?\d+)\s*/\s*(\d+)$")

# Bounds on what a completion can make the reward do (model output is untrusted input).
MATCH_MODES = ("numeric", "exact")
MAX_ANSWER_CHARS = 1000      # longer extracted answers score 0.0 without being compared
MAX_EXPONENT_DIGITS = 18     # "1e<19+ digits>" is not read as a number
MAX_EXACT_DIGITS = 2000      # up to this many digits (and exponent) a number is a Fraction


@dataclass
class VerifiableConfig:
    """Settings of the answer-matching reward.

    answer_field:     record field holding the reference answer (default "answer"); a
                      record without it is an error naming the record.
    max_bare_answer:  a completion without `\\boxed{}` or an "answer:" line is compared as
                      a whole only when at most this many characters (default 64), so a
                      long explanation that merely contains the number does not match.
    match:            how the extracted answer is compared with the reference:
                      "numeric" (default) after normalisation (case, `$`, `\\text{}`,
                      thousands separators; numbers by exact value, so "0123" matches
                      "123" and "0.75" matches "3/4"); "exact": the same characters, only
                      surrounding white space ignored ("0123" does not match "123").
    """

    answer_field: str = "answer"
    max_bare_answer: int = 64
    match: str = "numeric"

    def __post_init__(self) -> None:
        if not self.answer_field:
            raise ConfigError("answer_field must be a non-empty field name")
        if self.match not in MATCH_MODES:
            raise ConfigError(f"match: {self.match!r} is not one of {list(MATCH_MODES)}")


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (braces balanced), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


def extract_answer(completion: str, max_bare: int = 64) -> str | None:
    """The final answer a completion gives, or None when it states none."""
    boxed = last_boxed(completion)
    if boxed is not None:
        return boxed
    lines = [ln.strip() for ln in completion.strip().splitlines() if ln.strip()]
    if lines and (m := _ANSWER_LINE.search(lines[-1])):
        return m["answer"]
    stripped = completion.strip()
    return stripped if len(stripped) <= max_bare else None


def normalize_answer(answer: str) -> str:
    """Canonical text: no \\boxed, `$`, \\text{}, surrounding spaces/quotes, trailing period;
    lower case; `\\frac{a}{b}` as a/b; thousands separators removed from numbers; numbers
    in exact canonical form ("168.0" → "168", "0.75" → "3/4")."""
    text = last_boxed(answer) if last_boxed(answer) is not None else answer
    text = text.strip().strip("$").strip()
    text = re.sub(r"\\text\{([^}]*)\}", r"\1", text)
    text = re.sub(r"\\d?frac\{([^{}]*)\}\{([^{}]*)\}", r"\1/\2", text)
    text = text.rstrip(".").strip().strip("\"'").strip()
    text = re.sub(r"\s+", " ", text).lower()
    number = as_number(text)
    return _format_number(number) if number is not None else text


def as_number(text: str) -> Fraction | str | None:
    """An exact number for "1,680", "168.0", "-3", "1e3", "3/4"; None otherwise.

    A number of at most `MAX_EXACT_DIGITS` digits and exponent is a `Fraction`; a bigger
    one ("1e5000", 100,000 digits) is its canonical text ``[-]DIGITSeEXP`` (digits without
    leading or trailing zeros), which is just as exact and is built without expanding it.
    """
    text = text.replace(" ", "")
    if _THOUSANDS.match(text):
        text = text.replace(",", "")
    if m := _FRACTION.match(text):
        numerator, denominator = m[1].lstrip("+-").lstrip("0"), m[2].lstrip("0")
        if not denominator:
            return None
        if max(len(numerator), len(denominator)) > MAX_EXACT_DIGITS:
            return None  # compared as text
        return Fraction(int(m[1]), int(m[2]))
    m = _NUMBER.match(text)
    if m is None:
        return None
    exp_text = (m["exp"] or "0").lstrip("+-").lstrip("0")
    if len(exp_text) > MAX_EXPONENT_DIGITS:
        return None  # an absurd exponent: not read as a number
    fraction = m["frac"] or m["frac2"] or ""
    digits = ((m["int"] or "") + fraction).lstrip("0")
    exponent = (-1 if (m["exp"] or "").startswith("-") else 1) * int(exp_text or "0") - len(fraction)
    if not digits:
        return Fraction(0)
    stripped = digits.rstrip("0")
    exponent += len(digits) - len(stripped)
    sign = "-" if m["sign"] == "-" else ""
    if len(stripped) + abs(exponent) > MAX_EXACT_DIGITS:
        return f"{sign}{stripped}e{exponent}"
    value = Fraction(int(stripped) * 10 ** max(exponent, 0), 10 ** max(-exponent, 0))
    return -value if sign else value


def _format_number(value: Fraction | str) -> str:
    if isinstance(value, str):
        return value
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def _same_text(predicted: str, reference: str) -> bool:
    """The ``exact`` match: the same characters, surrounding white space ignored."""
    return predicted.strip() == reference.strip()


def answers_match(predicted: str, reference: str) -> bool:
    """Equal after normalisation (numbers by exact value)."""
    return normalize_answer(predicted) == normalize_answer(reference)


def reference_problem(answer: Any) -> str | None:
    """Why a record's reference answer cannot be compared with (the error's text), or None.

    Missing, of the wrong type, empty or normalising to nothing (it would match an empty
    ``\\boxed{}``), or longer than `MAX_ANSWER_CHARS` (no completion could match it).
    """
    if answer is None:
        return "missing reference answer (needed by the verifiable reward)"
    accepted = answer if isinstance(answer, list) else [answer]
    if not accepted or any(isinstance(a, bool) or not isinstance(a, (str, int, float)) for a in accepted):
        return f"expected a string, a number or a list of them, got {answer!r:.80}"
    for item in accepted:
        text = str(item)
        if len(text) > MAX_ANSWER_CHARS:
            return (f"a reference answer of {len(text)} characters (over {MAX_ANSWER_CHARS}); answers that long "
                    "are not compared, so no completion could match it")
        if not normalize_answer(text):
            return f"empty reference answer {item!r}: it would match an empty \\boxed{{}}, not an answer"
    return None


class VerifiableReward(RewardProvider):
    """1.0 / 0.0 by answer match against the record's reference answer (``match``: numeric or exact)."""

    name = "verifiable"

    def __init__(self, answer_field: str = "answer", *, match: str = "numeric", max_bare_answer: int = 64):
        self.config = VerifiableConfig(answer_field, max_bare_answer, match)
        self.reference_field = self.config.answer_field

    def score(
        self,
        conversations: Sequence[Conversation],
        completions: Sequence[str],
        *,
        references: Sequence[Any] | None = None,
    ) -> list[Score]:
        if references is None:
            raise InputError(f"VerifiableReward needs the reference answers (record field {self.reference_field!r})")
        if not len(conversations) == len(completions) == len(references):
            raise InputError(f"{len(conversations)} conversations, {len(completions)} completions, {len(references)} references")
        return [self._one(completion, reference) for completion, reference in zip(completions, references)]

    def _one(self, completion: str, reference: Any) -> Score:
        if is_empty(completion):
            return Score(0.0, None, {"extracted": None, "empty_completion": "empty completion: given 0.0, no answer"})
        answer = extract_answer(completion, self.config.max_bare_answer)
        if answer is None:
            return Score(0.0, None, {"extracted": None})
        if len(answer) > MAX_ANSWER_CHARS:
            return Score(0.0, None, {"extracted": answer[:200],
                                     "answer_too_long": f"{len(answer)} characters (over {MAX_ANSWER_CHARS}): not compared"})
        accepted = reference if isinstance(reference, (list, tuple)) else [reference]
        same = answers_match if self.config.match == "numeric" else _same_text
        matched = any(same(answer, str(r)) for r in accepted)
        return Score(1.0 if matched else 0.0, None, {"extracted": answer[:200]})

    def fingerprint(self) -> dict[str, Any]:
        fingerprint = {"provider": self.name, "answer_field": self.reference_field,
                       "max_bare_answer": self.config.max_bare_answer, "empty_completion": 0.0,
                       "max_answer_chars": MAX_ANSWER_CHARS}
        if self.config.match != "numeric":  # a numeric job's fingerprint stays what it was
            fingerprint["match"] = self.config.match
        return fingerprint
