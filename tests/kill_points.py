"""Seeded kill points for the kill-and-resume tests, printed so that a failure can be replayed.

Each test draws its kill points from ``kill_rng(default_seed, what)``: the seed is the test's
own default, or ``ALIGN_KILL_SEED`` when set. The seed and every kill point are printed (pytest
shows them with a failure) and go into the assertion messages; rerun the failing test with
``ALIGN_KILL_SEED=<seed>`` to aim its kills at the same points.
"""

from __future__ import annotations

import os
import random

KILL_SEED_ENV = "ALIGN_KILL_SEED"


def kill_rng(default_seed: int, what: str) -> tuple[random.Random, int]:
    """A ``random.Random`` for ``what``'s kill points, and its seed (printed)."""
    seed = int(os.environ.get(KILL_SEED_ENV, default_seed))
    print(f"[kill points] {what}: seed {seed} (replay: {KILL_SEED_ENV}={seed})", flush=True)
    return random.Random(seed), seed
