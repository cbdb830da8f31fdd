"""How long the demo's steps take, and so how long is left: one line before each step.

Each step's typical seconds were measured on 2 idle cores (``TYPICAL_SECONDS``, per preset,
from the report's ``seconds`` of a run). A run on another machine goes faster or slower by
about one factor: the ratio of the seconds the steps done so far took to what they
typically take. The estimate for what is left is that ratio times the typical seconds of
the steps to come; before the first step, the typical seconds as they are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

# Seconds per step on 2 idle cores (the report's "seconds"); a later round costs "round k".
TYPICAL_SECONDS: dict[str, dict[str, float]] = {
    "full": {"data and model": 2.0, "SFT": 45.0, "sample references": 25.0, "annotate (reward)": 3.0,
             "judge (tiny model, path check)": 4.0, "pairs": 1.0, "reference log-probs": 6.0,
             "QRPO sweep": 95.0, "DPO sweep": 85.0, "round k": 60.0, "evaluate (align.evaluate)": 40.0},
    "ci": {"data and model": 0.2, "SFT": 20.0, "sample references": 2.0, "annotate (reward)": 0.1,
           "judge (tiny model, path check)": 0.7, "pairs": 0.1, "reference log-probs": 0.4,
           "QRPO sweep": 20.2, "DPO sweep": 21.5, "round k": 8.8, "evaluate (align.evaluate)": 11.8},
}


def typical(preset: str, step: str) -> float:
    """The typical seconds of a step (a later round's step is named ``round K``)."""
    table = TYPICAL_SECONDS.get(preset, TYPICAL_SECONDS["full"])
    return table.get("round k" if step.startswith("round ") else step, 1.0)


def pace(preset: str, done: Mapping[str, float]) -> float:
    """Seconds taken over seconds typical, for the steps done (1.0 before any)."""
    expected = sum(typical(preset, step) for step in done)
    return sum(done.values()) / expected if expected > 0 and done else 1.0


def clock(seconds: float) -> str:
    """``45 s``, ``3 min 20 s``, ``1 h 02 min``."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def announce(preset: str, steps: Sequence[str], index: int, done: Mapping[str, float]) -> str:
    """The line printed before step ``index``: which step of how many, about how long, and how long is left."""
    factor = pace(preset, done)
    step = steps[index]
    this = factor * typical(preset, step)
    left = factor * sum(typical(preset, s) for s in steps[index:])
    return (f"[align demo] {step} (step {index + 1} of {len(steps)}): about {clock(this)}; "
            f"about {clock(left)} left in all")
