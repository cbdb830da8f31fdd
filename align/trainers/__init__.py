"""Trainers: SFT and preference (QRPO/DPO) on transformers/TRL, with their configs.

Names load on first use, so importing one trainer module (``align.trainers.sft_trainer``)
does not load the other. Batches and log-prob kernels are ``align.scoring``'s.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "PreferenceConfig": "align.trainers.preference_config",
    "PreferenceTrainer": "align.trainers.preference_trainer",
    "prepare_dataset": "align.trainers.preference_trainer",
    "train": "align.trainers.preference_trainer",
}

__all__ = ["PreferenceConfig", "PreferenceTrainer", "prepare_dataset", "train"]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'align.trainers' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
