"""How long the demo's steps take, and so how long is left: one line before each step.

Each step's typical seconds on 2 idle cores are in ``TYPICAL_SECONDS``, per preset (where they
come from is said there). A run on another machine, or of other sizes, goes faster or slower by
about one factor: the ratio of the seconds the steps done so far took to what they
typically take. The estimate for what is left is that ratio times the typical seconds of
the steps to come; before the first step, the typical seconds as they are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

# Seconds per step on 2 idle cores (a report's "seconds"); a later round costs "round k". The ci preset's were
# measured (`align demo preset=ci rounds=2 reward=graded`); the full run's are those shares scaled to its
# measured total of about 310 s (README), a first guess the pace factor corrects after the first step.
TYPICAL_SECONDS: dict[str, dict[str, float]] = {
    "full": {"data and model": 0.8, "SFT": 80.5, "sample references": 8.1, "annotate (reward)": 0.4,
             "judge (tiny model, path check)": 2.8, "pairs": 0.4, "reference log-probs": 1.6, "QRPO sweep": 81.3,
             "DPO sweep": 86.6, "round k": 35.4, "evaluate (align.evaluate)": 47.5},
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
