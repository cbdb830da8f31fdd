"""The reward-provider interface: score (conversation, completion) pairs, with reasons.

Every provider (reward model, constitutional judge, verifiable answers) returns one
`Score` per completion. A completion that cannot be scored gets `value=None` and a
`reason`, so the annotation stage records a skip instead of dropping the row or inventing
a number; a NaN or infinite value is turned into such a skip here, in one place.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Message = Mapping[str, Any]
Conversation = Sequence[Message]


@dataclass(frozen=True)
class Score:
    """One completion's reward, or why there is none.

    value:   the reward, a finite float, or None when the completion could not be scored
    reason:  why value is None (always set then; None otherwise)
    details: flat, JSON-friendly extras (truncated flag, judge probability mass, ranks...)
    """

    value: float | None
    reason: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.value is None and not self.reason:
            raise ValueError("a Score without a value needs a reason")
        if self.value is not None and self.reason:
            raise ValueError(f"a Score with a value ({self.value}) must not carry a skip reason")

    @classmethod
    def skip(cls, reason: str, **details: Any) -> Score:
        return cls(None, reason, details)

    @property
    def ok(self) -> bool:
        return self.value is not None


def checked(value: float | None, reason: str | None = None, **details: Any) -> Score:
    """Build a Score, turning a NaN/inf value into a recorded skip (never a reward)."""
    if value is None:
        return Score.skip(reason or "no score", **details)
    value = float(value)
    if not math.isfinite(value):
        return Score.skip(f"non-finite score ({value})", **details)
    return Score(value, None, details)


def is_empty(text: str) -> bool:
    """An empty or whitespace-only completion: nothing for a reward model to judge."""
    return not text.strip()


class RewardProvider(ABC):
    """Scores completions of prompts.

    Subclasses implement `score` (flat lists, one Score per pair). Providers that need
    to see all completions of a prompt together (the judge's pairwise ranking) override
    `score_groups`. Providers that need a per-record reference (verifiable answers) set
    `reference_field`; the annotation stage then reads that field of each record and
    passes it as `references`.
    """

    name: str = "reward"
    reference_field: str | None = None

    @abstractmethod
    def score(
        self,
        conversations: Sequence[Conversation],
        completions: Sequence[str],
        *,
        references: Sequence[Any] | None = None,
    ) -> list[Score]:
        """One Score per (conversation, completion) pair, in input order."""

    def score_groups(
        self,
        conversations: Sequence[Conversation],
        completion_groups: Sequence[Sequence[str]],
        *,
        references: Sequence[Any] | None = None,
    ) -> list[list[Score]]:
        """Scores for each prompt's completions; default: flatten, `score`, regroup."""
        flat_conv, flat_comp, flat_ref = [], [], []
        for i, (conversation, group) in enumerate(zip(conversations, completion_groups, strict=True)):
            for completion in group:
                flat_conv.append(conversation)
                flat_comp.append(completion)
                flat_ref.append(references[i] if references is not None else None)
        flat = self.score(flat_conv, flat_comp, references=flat_ref if references is not None else None)
        if len(flat) != len(flat_comp):
            raise RuntimeError(f"{type(self).__name__}.score returned {len(flat)} scores for {len(flat_comp)} inputs")
        grouped, start = [], 0
        for group in completion_groups:
            grouped.append(list(flat[start : start + len(group)]))
            start += len(group)
        return grouped

    def fingerprint(self) -> dict[str, Any]:
        """Settings that change the scores; a resumed annotation job must match them."""
        return {"provider": self.name}
