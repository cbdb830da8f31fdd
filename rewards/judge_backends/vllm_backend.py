"""Judge backend on vLLM: top-k next-token logprobs, prefix caching on.

`SamplingParams(max_tokens=1, temperature=0, logprobs=20)` returns the 20 most likely
first answer tokens with their logprobs; the judge's score uses the scale labels among
them (SPEC §5). With `enable_prefix_caching=True` vLLM keeps the charter's KV blocks and
reuses them for every prompt that starts with it, so no prefix handling is needed here.
Prompts are passed as token ids (encoded like the other backends, one BOS), so vLLM does
not add a second BOS to a template that already wrote one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rewards.judge_backends.base import JudgeBackend, LabelLogprobs, single_token_ids
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
        from vllm import LLM

        if llm is None:
            if model is None:
                raise ValueError("VLLMJudgeBackend needs a model path or an LLM instance")
            llm = LLM(model=model, enable_prefix_caching=enable_prefix_caching, **llm_kwargs)
        self.llm, self.model_name = llm, model
        self.top_logprobs, self.show_progress = top_logprobs, show_progress
        super().__init__(llm.get_tokenizer(), chat_template_kwargs)

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "model": str(self.model_name), "top_logprobs": self.top_logprobs}

    def label_logprobs(
        self, prompts: Sequence[str], labels: Sequence[str], *, shared_prefix: str | None = None
    ) -> list[LabelLogprobs]:
        from vllm import SamplingParams

        label_ids = single_token_ids(self.tokenizer, labels)
        params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=self.top_logprobs)
        inputs = [{"prompt_token_ids": encode_rendered(self.tokenizer, p)} for p in prompts]
        outputs = self.llm.generate(inputs, params, use_tqdm=self.show_progress and len(inputs) > 1)
        results = []
        for output in outputs:
            top = output.outputs[0].logprobs[0]  # {token_id: Logprob}, the first generated position
            results.append({label: top[tid].logprob for label, tid in label_ids.items() if tid in top})
        return results
