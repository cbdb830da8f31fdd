"""Where the judge's next-token probabilities come from.

All backends answer one question: for each prompt, what log-probability does the model
give each answer label (`"1"` ... `"9"`, or `"A"` / `"B"`) as its first answer token?

- `TransformersJudgeBackend`: a local model, full logits, the charter prefix's KV cache
  computed once and reused for every prompt (runs anywhere; CI).
- `VLLMJudgeBackend`: vLLM top-20 logprobs, automatic prefix caching (GPU nodes).
- `OpenAIJudgeBackend`: any OpenAI-compatible `completions` endpoint (`vllm serve`).
"""

from rewards.judge_backends.base import (
    JudgeBackend,
    LabelLogprobs,
    label_text,
    label_token_ids,
    single_token_ids,
)
from rewards.judge_backends.hf import TransformersJudgeBackend
from rewards.judge_backends.openai import OpenAIJudgeBackend
from rewards.judge_backends.vllm_backend import VLLMJudgeBackend

__all__ = [
    "JudgeBackend",
    "LabelLogprobs",
    "OpenAIJudgeBackend",
    "TransformersJudgeBackend",
    "VLLMJudgeBackend",
    "label_text",
    "label_token_ids",
    "single_token_ids",
]
