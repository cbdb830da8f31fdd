"""The demo's graded reward: a stand-in for a reward model, with partial credit and known flaws.

The exact-match reward says right or wrong. The rewards a team aligns a model with (a reward
model's score, a judge's weighted rating) are graded and imperfect, which is the case QRPO's
quantile rewards were designed for. This one scores a sorting answer from the prompt and the
completion alone, as a reward model does (no reference answer), and its imperfections are
written down and set by two numbers:

    base   = purity × (½ · content + ½ · order)
    reward = base + length_bias × extra digits + noise × z

- ``content``: the share of the prompt's digits the answer contains (a multiset recall: extra
  digits cost nothing);
- ``order``: adjacent digit pairs in non-decreasing order, over the ``len - 1`` a right answer
  has (capped at 1);
- ``purity``: the share of the answer's characters that are digits (other text dilutes it);
- **the length bias**: ``length_bias`` per digit beyond the prompt's count, so a sorted answer
  with an extra digit outscores the right one (``0123459`` over ``012345``), as reward models
  that prefer longer answers do. A policy can exploit it; exact accuracy then shows it;
- **the noise**: ``z`` is a standard normal drawn from a hash of the prompt and the answer, so
  the same answer to the same prompt always gets the same score (a fixed model's
  idiosyncratic error, not a fresh draw at each call).

A right answer scores 1 + noise; one adjacent swap 0.875, one digit wrong but sorted 0.9, one
digit missing 0.775, an unsorted copy of the prompt about 0.75. ``docs/results.md`` gives its
measured correlation with exact accuracy; ``tests/demo/test_graded_reward.py`` holds it.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import random
from collections import Counter
from collections.abc import Sequence
from typing import Any

from align.errors import ConfigError, InputError
from rewards.base import Conversation, RewardProvider, Score

DIGITS = "0123456789"
# Model output is untrusted: a longer answer is not read, it scores 0 (before noise and bias).
MAX_ANSWER_CHARS = 1000
# The largest noise or length bias: times the most extra digits (fewer than MAX_ANSWER_CHARS) or
# the largest normal draw (|z| < 9: Box-Muller on 53-bit uniforms), each term stays below 1e304,
# so every reward is a finite number (1e306 per extra digit would make an answer's reward inf).
MAX_WEIGHT = 1e300


def problem_of(conversation: Conversation) -> str:
    """The digits to sort: the last user message, which must be digits only."""
    users = [m for m in conversation if m.get("role") == "user"]
    if not users:
        raise InputError("graded reward: the conversation has no user message (the digits to sort)")
    problem = str(users[-1].get("content") or "").strip()
    if len(problem) < 2 or any(c not in DIGITS for c in problem):
        raise InputError(f"graded reward: the user message {problem[:40]!r} is not a string of at least 2 digits")
    return problem


def base_score(problem: str, answer: str) -> dict[str, float]:
    """``content``, ``order``, ``purity`` and their combination ``base`` (0 to 1) for one answer."""
    answer = answer.strip()
    digits = [c for c in answer if c in DIGITS]
    if not digits or len(answer) > MAX_ANSWER_CHARS:
        return {"content": 0.0, "order": 0.0, "purity": 0.0, "base": 0.0}
    content = sum((Counter(digits) & Counter(problem)).values()) / len(problem)
    ordered = sum(a <= b for a, b in itertools.pairwise(digits))
    order = min(1.0, ordered / (len(problem) - 1))
    purity = len(digits) / len(answer)
    return {"content": content, "order": order, "purity": purity, "base": purity * (0.5 * content + 0.5 * order)}


def noise_draw(problem: str, answer: str) -> float:
    """A standard normal fixed by the prompt and the answer (the same pair, the same draw)."""
    digest = hashlib.blake2b(f"{problem}\x00{answer.strip()}".encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "big")).gauss(0.0, 1.0)


class GradedSortingReward(RewardProvider):
    """Partial credit for sorting answers, with a length bias and a fixed per-answer noise (see the module)."""

    name = "demo-graded-sorting"
    reference_field = None  # scored from the prompt and the completion, as a reward model is

    def __init__(self, *, noise: float = 0.1, length_bias: float = 0.05):
        for key, value in (("reward_noise", noise), ("reward_length_bias", length_bias)):
            if not (math.isfinite(value) and 0 <= value <= MAX_WEIGHT):
                raise ConfigError(f"{key}: must be from 0 to {MAX_WEIGHT} (so that every reward stays finite), "
                                  f"got {value}")
        self.noise, self.length_bias = float(noise), float(length_bias)

    def score(self, conversations: Sequence[Conversation], completions: Sequence[str], *,
              references: Sequence[Any] | None = None) -> list[Score]:
        if len(conversations) != len(completions):
            raise InputError(f"{len(conversations)} conversations, {len(completions)} completions")
        return [self.one(problem_of(c), text) for c, text in zip(conversations, completions)]

    def one(self, problem: str, answer: str) -> Score:
        """The score of one answer to one problem, with its parts in the details."""
        parts = base_score(problem, answer)
        digits = sum(c in DIGITS for c in answer.strip()) if parts["purity"] else 0
        extra = max(0, digits - len(problem))
        z = noise_draw(problem, answer)
        value = parts["base"] + self.length_bias * extra + self.noise * z
        if not math.isfinite(value):  # MAX_WEIGHT keeps it finite: a bug if this is ever reached
            raise RuntimeError(f"graded reward: {value} for an answer with {extra} extra digits")
        return Score(value, None, {**{k: round(v, 6) for k, v in parts.items()}, "extra_digits": extra,
                                   "noise": round(self.noise * z, 6)})

    def fingerprint(self) -> dict[str, Any]:
        return {"provider": self.name, "noise": self.noise, "length_bias": self.length_bias,
                "max_answer_chars": MAX_ANSWER_CHARS}


__all__ = ["MAX_WEIGHT", "GradedSortingReward", "base_score", "noise_draw", "problem_of"]
