"""Quantile rewards: a reward's rank among one prompt's reference rewards (docs/method.md, Quantile rewards).

R_q(x, y) = (1/n)·#{j : R(x, y_j) ≤ R(x, y)} over the n reference rewards (Apertus report §3.4,
QRPO's empirical CDF). Ties count for the candidate, so a reference completion scored
against its own set gets at least 1/n, and every value is one of 0, 1/n, ..., 1: computed as
``count / n``, so k/n compares exactly equal to the same fraction computed elsewhere.
"""

from __future__ import annotations

import bisect
import math
import numbers
from collections.abc import Iterable, Sequence
from typing import overload

from align.errors import InputError

__all__ = ["quantile_rewards"]


def _as_reward(value: object, field: str) -> float:
    """A real, non-NaN reward as float, or an ``InputError`` (a ``ValueError``) naming ``field``."""
    if value is None or isinstance(value, (bool, str, bytes)):
        raise InputError(f"{field} must be a number, got {value!r}")
    try:
        reward = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError) as error:
        raise InputError(f"{field} must be a number, got {value!r}") from error
    if math.isnan(reward):
        raise InputError(f"{field} is NaN (NaN rewards are an error)")
    return reward


def _as_rewards(values: object, field: str) -> list[float]:
    """A sequence (list, tuple, array) of rewards as floats; errors name ``field[i]``."""
    if isinstance(values, (str, bytes, numbers.Number)) or not isinstance(values, Iterable):
        # InputError like every other bad-input error here, so callers catch one type
        raise InputError(f"{field} must be a sequence of numbers, got {type(values).__name__}")
    return [_as_reward(value, f"{field}[{i}]") for i, value in enumerate(values)]


def _sorted_refs(ref_rewards: Sequence[float], expected_n: int | None) -> list[float]:
    """Validated, sorted reference rewards; too few of them is an error naming the count."""
    refs = _as_rewards(ref_rewards, "ref_rewards")
    if not refs:
        raise InputError(
            "ref_rewards is empty: a quantile reward needs at least one reference reward"
        )
    if expected_n is not None and len(refs) < expected_n:
        raise InputError(f"got {len(refs)} reference rewards, expected at least n = {expected_n}")
    return sorted(refs)


@overload
def quantile_rewards(
    rewards: float, ref_rewards: Sequence[float], *, expected_n: int | None = None
) -> float: ...
@overload
def quantile_rewards(
    rewards: Sequence[float], ref_rewards: Sequence[float], *, expected_n: int | None = None
) -> list[float]: ...
def quantile_rewards(
    rewards: float | Sequence[float], ref_rewards: Sequence[float], *, expected_n: int | None = None
) -> float | list[float]:
    """R_q of one reward (→ float) or of several candidates (→ list) against one prompt's refs.

    ``expected_n``: the number of reference samples drawn (n = 10 in Apertus); fewer
    reference rewards than that is a ValueError naming the count.
    """
    refs = _sorted_refs(ref_rewards, expected_n)
    n = len(refs)
    if isinstance(rewards, numbers.Real) and not isinstance(rewards, bool):
        return bisect.bisect_right(refs, _as_reward(rewards, "rewards")) / n
    return [bisect.bisect_right(refs, value) / n for value in _as_rewards(rewards, "rewards")]
