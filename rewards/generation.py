"""`generate(conversations) -> texts` callables for the classifier, on transformers or vLLM.

The classifier only needs "chat in, text out"; these adapters give it that on a local
transformers model (anywhere, CI) or on a vLLM engine (GPU nodes), with the model's own
chat template, the generation prompt added and thinking disabled.

Each callable also carries ``prompt_length(conversation)`` (the rendered prompt's tokens,
exactly the ids generated from) and ``max_model_len`` (the context length, None when
unknown), so a caller can leave out a prompt that leaves no room for ``max_tokens``
instead of losing the batch (`rewards.classifier`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from rewards.judge_backends.base import DEFAULT_CHAT_TEMPLATE_KWARGS
from rewards.text import encode_rendered

Conversations = list[list[dict[str, str]]]


def transformers_generate(
    model: Any,
    tokenizer: Any,
    *,
    max_tokens: int = 256,
    temperature: float = 0.0,
    batch_size: int = 8,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    max_model_len: int | None = None,
) -> Any:
    """A generate callable over a local causal LM (left-padded batches, greedy when T=0);
    ``max_model_len``: the context length its ``max_model_len`` reports (default: none)."""
    kwargs = dict(DEFAULT_CHAT_TEMPLATE_KWARGS if chat_template_kwargs is None else chat_template_kwargs)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def prompt_length(conversation: list[dict[str, str]]) -> int:
        rendered = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True, **kwargs)
        return len(encode_rendered(tokenizer, rendered))

    @torch.inference_mode()
    def generate(conversations: Conversations) -> list[str]:
        texts: list[str] = []
        for start in range(0, len(conversations), batch_size):
            chunk = conversations[start : start + batch_size]
            rendered = [tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True, **kwargs) for c in chunk]
            ids = [encode_rendered(tokenizer, r) for r in rendered]
            width = max(len(i) for i in ids)
            input_ids = torch.full((len(ids), width), pad_id, dtype=torch.long)
            mask = torch.zeros_like(input_ids)
            for row, seq in enumerate(ids):  # left padding: generation continues every row's end
                input_ids[row, width - len(seq) :] = torch.tensor(seq)
                mask[row, width - len(seq) :] = 1
            sampling = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
            out = model.generate(
                input_ids=input_ids.to(model.device), attention_mask=mask.to(model.device),
                max_new_tokens=max_tokens, pad_token_id=pad_id, **sampling,
            )
            texts += tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
        return texts

    generate.prompt_length, generate.max_model_len = prompt_length, max_model_len  # type: ignore[attr-defined]
    generate.max_tokens = max_tokens  # type: ignore[attr-defined]
    return generate


def vllm_generate(
    llm: Any, *, max_tokens: int = 256, temperature: float = 0.0, chat_template_kwargs: Mapping[str, Any] | None = None
) -> Any:
    """A generate callable over a vLLM engine: prompts rendered with the engine's tokenizer and
    its chat template, sent as token ids (so their measured length is what vLLM receives)."""
    from vllm import SamplingParams

    from rewards.judge_backends.vllm_backend import engine_max_model_len

    params = SamplingParams(max_tokens=max_tokens, temperature=temperature)
    kwargs = dict(DEFAULT_CHAT_TEMPLATE_KWARGS if chat_template_kwargs is None else chat_template_kwargs)
    tokenizer = llm.get_tokenizer()

    def prompt_ids(conversation: list[dict[str, str]]) -> list[int]:
        rendered = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True, **kwargs)
        return encode_rendered(tokenizer, rendered)

    def generate(conversations: Conversations) -> list[str]:
        inputs = [{"prompt_token_ids": prompt_ids(c)} for c in conversations]
        outputs = llm.generate(inputs, params, use_tqdm=False)
        return [o.outputs[0].text for o in outputs]

    generate.prompt_length = lambda conversation: len(prompt_ids(conversation))  # type: ignore[attr-defined]
    generate.max_model_len = engine_max_model_len(llm)  # type: ignore[attr-defined]
    generate.max_tokens = max_tokens  # type: ignore[attr-defined]
    return generate
