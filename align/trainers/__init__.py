"""Trainers: SFT and preference (QRPO/DPO) on transformers/TRL, with their configs and collators."""

from align.trainers.collators import (
    PreferenceCollator,
    SequenceCollator,
    collate_padded,
    collate_padding_free,
)
from align.trainers.preference_config import PreferenceConfig
from align.trainers.preference_trainer import PreferenceTrainer, prepare_dataset, train

__all__ = [
    "PreferenceCollator",
    "PreferenceConfig",
    "PreferenceTrainer",
    "SequenceCollator",
    "collate_padded",
    "collate_padding_free",
    "prepare_dataset",
    "train",
]
