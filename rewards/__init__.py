"""Annotation side of align: reward providers and the stages that use them.

Runs on inference nodes and never imports `align.trainers` (no training stack needed).

    from rewards import RewardModel, ConstitutionalJudge, TransformersJudgeBackend, annotate
    rm = RewardModel("Skywork/Skywork-Reward-V2-Llama-3.1-8B", batch_size=8)
    annotate(records, rm, "out/rewards", shard_index=0, num_shards=1)

Heavy modules (torch, transformers) load on first use of the names that need them.
"""

from __future__ import annotations

import importlib
from typing import Any

from rewards.annotate import annotate, score_records  # eager: the name must not resolve to the submodule
from rewards.base import RewardProvider, Score, checked
from rewards.charter import Charter, CharterError, charter_dir, load_charter, load_template, parse_charter
from rewards.verifiable import VerifiableReward, answers_match, normalize_answer

_LAZY = {
    "RewardModel": "rewards.reward_model",
    "ConstitutionalJudge": "rewards.judge",
    "JudgeConfig": "rewards.judge",
    "TransformersJudgeBackend": "rewards.judge_backends",
    "VLLMJudgeBackend": "rewards.judge_backends",
    "OpenAIJudgeBackend": "rewards.judge_backends",
    "ControversyClassifier": "rewards.classifier",
    "classify_records": "rewards.classifier",
    "Generator": "rewards.generation",
    "validate_judge": "rewards.validation",
    "build_ladders": "rewards.degrade",
    "RuleDegrader": "rewards.degrade",
    "LLMDegrader": "rewards.degrade",
    "GeneratorConfig": "rewards.config",
    "JudgeModelConfig": "rewards.config",
    "RewardProviderConfig": "rewards.config",
    "build_generator": "rewards.config",
    "build_judge": "rewards.config",
    "build_judge_backend": "rewards.config",
    "build_reward_provider": "rewards.config",
}

__all__ = [
    "Charter",
    "LLMDegrader",
    "RuleDegrader",
    "build_ladders",
    "validate_judge",
    "CharterError",
    "ConstitutionalJudge",
    "ControversyClassifier",
    "Generator",
    "GeneratorConfig",
    "JudgeConfig",
    "JudgeModelConfig",
    "OpenAIJudgeBackend",
    "RewardModel",
    "RewardProvider",
    "RewardProviderConfig",
    "Score",
    "TransformersJudgeBackend",
    "VLLMJudgeBackend",
    "VerifiableReward",
    "annotate",
    "answers_match",
    "build_generator",
    "build_judge",
    "build_judge_backend",
    "build_reward_provider",
    "charter_dir",
    "checked",
    "classify_records",
    "load_charter",
    "load_template",
    "normalize_answer",
    "parse_charter",
    "score_records",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'rewards' has no attribute {name!r}")
