"""The smallest change that makes a job fit, found by trying them.

Each kind of job has its settings that trade memory (``Knob``: a name, the current value
and the values to try). Every combination is planned (arithmetic only) and the fitting one
that changes least wins: fewest settings changed, then fewest nodes, then no CPU offload,
then the lowest ZeRO stage, then the largest batch; so a recipe is told "nodes=8" only when
no change on its own hardware fits.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from align.plan.memory import Estimate


@dataclass(frozen=True)
class Knob:
    """A setting the advice may change: ``key`` as the plan or the recipe spells it,
    ``values`` to try besides ``current`` (in order of preference), and ``cost``: how a
    value ranks (lower is cheaper) once the number of changed settings ties."""

    key: str
    current: Any
    values: tuple[Any, ...]
    cost: Callable[[Any], float]
    recipe_key: bool = False  # a key of the planned recipe (set.KEY=...), else a plan / launch key


@dataclass(frozen=True)
class Change:
    """A fitting combination: the settings changed, and its plan."""

    settings: dict[str, Any]
    recipe_keys: tuple[str, ...]
    estimate: Estimate

    def label(self) -> str:
        return " ".join(f"{'set.' if k in self.recipe_keys else ''}{k}={_text(v)}" for k, v in self.settings.items())


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def smallest_change(knobs: Sequence[Knob], plan: Callable[[dict[str, Any]], Estimate],
                    fits: Callable[[Estimate], bool], max_changes: int = 3) -> Change | None:
    """The fitting combination of knob values that changes least (None: nothing tried fits)."""
    choices = [(knob, (knob.current, *[v for v in knob.values if v != knob.current])) for knob in knobs]
    best: tuple[tuple, Change] | None = None
    for combo in itertools.product(*(values for _, values in choices)):
        changed = {knob.key: value for (knob, _), value in zip(choices, combo) if value != knob.current}
        if not changed or len(changed) > max_changes:
            continue
        rank = (len(changed), *(knob.cost(value) for (knob, _), value in zip(choices, combo)))
        if best is not None and rank >= best[0]:
            continue
        estimate = plan(changed)
        if fits(estimate):
            recipe_keys = tuple(k.key for k in knobs if k.recipe_key and k.key in changed)
            best = (rank, Change(changed, recipe_keys, estimate))
    return None if best is None else best[1]


def halvings(value: int) -> tuple[int, ...]:
    """``value``/2, /4, ... down to 1."""
    out = []
    while value > 1:
        value //= 2
        out.append(value)
    return tuple(out)


def doublings(value: int, limit: int) -> tuple[int, ...]:
    """``value``·2, ·4, ... up to ``limit``."""
    out = []
    while value * 2 <= limit:
        value *= 2
        out.append(value)
    return tuple(out)
