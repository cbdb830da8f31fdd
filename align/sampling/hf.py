"""The transformers backend: batched `generate` on any device, CPU included.

Each of the ``n`` samples of each conversation draws its tokens from its own seeded
generator (a logits processor does the sampling and hands `generate` a one-hot choice),
so a conversation's samples depend on its seed, not on which batch it landed in — the
property a resumed sampling job needs. Rows are left-padded for generation.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from typing import Any

import torch

from align.errors import ConfigError, loading
from align.sampling.base import (
    Completion,
    Conversation,
    PromptEncoder,
    Sampler,
    derive_seed,
    stream_seed,
)


class SeededRowSampling:
    """Logits processor: sample each row with its own generator (temperature, top-p).

    Returns scores that are 0 at the drawn token and -inf elsewhere, so greedy decoding
    picks the draw. Temperature 0 is greedy.
    """

    def __init__(self, seeds: Sequence[int], temperature: float, top_p: float):
        self.temperature, self.top_p = temperature, top_p
        self.generators = [torch.Generator().manual_seed(s) for s in seeds]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.temperature == 0:
            choice = scores.argmax(dim=-1)
        else:
            probs = torch.softmax(scores.float() / self.temperature, dim=-1)
            if self.top_p < 1:
                probs = top_p_filter(probs, self.top_p)
            cdf = probs.cumsum(dim=-1)
            u = torch.stack([torch.rand((), generator=g) for g in self.generators]).to(cdf.device)
            target = (u * cdf[:, -1]).unsqueeze(-1)
            # first index whose cdf exceeds the target: always a token with probability > 0
            choice = torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp(max=cdf.shape[-1] - 1)
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(1, choice.unsqueeze(-1), 0.0)


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero out tokens outside the smallest set whose mass reaches top_p (keeps >= 1)."""
    sorted_p, order = probs.sort(dim=-1, descending=True)
    outside = (sorted_p.cumsum(dim=-1) - sorted_p) >= top_p
    sorted_p = sorted_p.masked_fill(outside, 0.0)
    return torch.zeros_like(probs).scatter_(-1, order, sorted_p)


class TransformersSampler(Sampler):
    """Sample with `model.generate`, batched, seeded per conversation and sample.

    Args:
        model: a causal LM, or a path / hub name to load one from.
        tokenizer: its tokenizer (default: loaded from ``model``'s path).
        chat_format: an `align.chat` format name, or "tokenizer" for the tokenizer's own
            chat template.
        batch_size: conversations per `generate` call (each expands to ``n`` rows).
        max_model_len: context length (default: the model's max_position_embeddings).
        dtype / device: used when loading from a path (dtype None or "auto": the model's own).
        chat_date / enable_thinking: passed to `align.chat.render`. Pin ``chat_date`` for
            reproducible prompts: without a system message the Apertus default system
            text shows today's date.
        stop_tokens: tokens that end a completion (default: the format's stop tokens);
            the tokenizer's and the model's EOS always stop too.
    """

    backend = "transformers"

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        chat_format: str = "apertus",
        batch_size: int = 8,
        max_model_len: int | None = None,
        dtype: str | torch.dtype | None = None,
        device: str | None = None,
        chat_date: _dt.date | str | None = None,
        enable_thinking: bool = False,
        stop_tokens: Sequence[str] | None = None,
        model_name: str | None = None,
    ):
        if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
            from transformers import AutoModelForCausalLM, AutoTokenizer

            path = str(model)
            with loading("model", path):
                tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(path)
                model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or "auto")
            if device:
                model = model.to(device)
            model_name = model_name or path
        if tokenizer is None:
            raise ConfigError("pass the tokenizer along with a model object")
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        self.model, self.tokenizer = model.eval(), tokenizer
        self.model_name = model_name or getattr(model.config, "_name_or_path", "") or type(model).__name__
        self.batch_size = batch_size
        self._max_model_len = max_model_len or model.config.max_position_embeddings
        self.encoder = PromptEncoder(
            tokenizer, chat_format, chat_date=chat_date, enable_thinking=enable_thinking,
            stop_tokens=stop_tokens, extra_stop_ids=_model_eos_ids(model),
        )

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

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
        prompts, budgets, seeds = self._prepare(conversations, n, temperature, top_p, max_tokens, seed, tools)
        results: list[list[Completion]] = []
        for start in range(0, len(prompts), self.batch_size):
            stop = start + self.batch_size
            results.extend(
                self._sample_batch(prompts[start:stop], budgets[start:stop], seeds[start:stop],
                                   n, temperature, top_p, max_tokens)
            )
        return results

    def _sample_batch(
        self, prompts: list[list[int]], budgets: list[int], seeds: list[int],
        n: int, temperature: float, top_p: float, max_tokens: int,
    ) -> list[list[Completion]]:
        from transformers import GenerationConfig, LogitsProcessorList

        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.encoder.stop_ids[0]
        rows = [p for p in prompts for _ in range(n)]
        width = max(map(len, rows))
        device = self.model.device
        input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=device)
        attention = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
        row_seeds = [derive_seed(stream_seed(s, p), j) for s, p in zip(seeds, prompts) for j in range(n)]
        config = GenerationConfig(
            do_sample=False, max_new_tokens=max(budgets), eos_token_id=self.encoder.stop_ids,
            pad_token_id=pad, num_beams=1,
        )
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=input_ids, attention_mask=attention, generation_config=config,
                logits_processor=LogitsProcessorList([SeededRowSampling(row_seeds, temperature, top_p)]),
            )
        generated = out[:, width:].tolist()
        batch: list[list[Completion]] = []
        for i, (budget, conv_seed) in enumerate(zip(budgets, seeds)):
            params = self.params(temperature, top_p, max_tokens, conv_seed)
            batch.append([
                self.encoder.completion(generated[i * n + j][:budget], self.model_name, params)
                for j in range(n)
            ])
        return batch


def _model_eos_ids(model: Any) -> list[int]:
    """EOS ids of the model's generation config (vLLM stops at these too)."""
    config = getattr(model, "generation_config", None)
    eos = getattr(config, "eos_token_id", None)
    if eos is None:
        return []
    return [eos] if isinstance(eos, int) else list(eos)
