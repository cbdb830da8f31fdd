"""Judge backend on a local transformers causal LM: full logits, charter prefix computed once.

Every judge prompt starts with the same rendered charter (~2,500 tokens) and differs only
in the question and response after it (a few hundred tokens). Running the charter once,
keeping its key/value cache, and feeding each batch only the remaining tokens on top of a
copy of that cache gives the same logits as running every prompt in full, at a fraction
of the cost (bench/annotation_throughput.py measures how much).

Prefix boundary: the cached prefix is the tokenization of the shared prefix text minus
its last token (a BPE merge can join the last prefix token with the first token after
it). A prompt whose own tokens do not start with the cached ones is run in full instead,
so reuse can never change a score.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from align.errors import ConfigError, loading
from rewards.judge_backends.base import JudgeBackend, LabelLogprobs
from rewards.reward_model import resolve_device, resolve_dtype
from rewards.text import encode_rendered, sorted_batches

PrefixKV = list[tuple[torch.Tensor, torch.Tensor]]


class TransformersJudgeBackend(JudgeBackend):
    """Full-vocabulary next-token logprobs from a local causal LM."""

    name = "transformers"

    def __init__(
        self,
        model: str | Path | Any,
        tokenizer: Any = None,
        *,
        batch_size: int = 8,
        device: str | None = None,
        dtype: str | torch.dtype | None = None,
        reuse_prefix: bool = True,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        show_progress: bool = True,
        max_model_len: int | None = None,
    ):
        """`model` is a path/hub id or a loaded model; `tokenizer` defaults to the model's.
        `max_model_len`: prompts longer than this (with the answer token) are skipped, not run
        (default: no limit)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        if isinstance(model, (str, Path)):
            with loading("model", model):
                tokenizer = tokenizer or AutoTokenizer.from_pretrained(str(model))
                model = AutoModelForCausalLM.from_pretrained(str(model), dtype=self.dtype)
        if tokenizer is None:
            raise ConfigError("pass the tokenizer along with a loaded model")
        super().__init__(tokenizer, chat_template_kwargs, max_model_len)
        self.model = model.to(device=self.device, dtype=self.dtype).eval()
        self.batch_size, self.reuse_prefix, self.show_progress = batch_size, reuse_prefix, show_progress
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self._prefixes: OrderedDict[tuple[int, ...], PrefixKV] = OrderedDict()
        self.stats = {"prefix_forwards": 0, "rows_with_prefix": 0, "rows_in_full": 0}

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "model": str(getattr(self.model, "name_or_path", "")), "dtype": str(self.dtype)}

    def close(self) -> None:
        """Drop the model and the cached charter prefixes (the backend cannot answer afterwards)."""
        self.__dict__.pop("model", None)
        self._prefixes.clear()

    def label_logprobs(
        self, prompts: Sequence[str], labels: Sequence[str], *, shared_prefix: str | None = None
    ) -> list[LabelLogprobs]:
        label_ids = self.check_labels(labels)
        sequences = [encode_rendered(self.tokenizer, p) for p in prompts]
        prefix = self._usable_prefix(shared_prefix)
        with_prefix = [i for i, s in enumerate(sequences) if prefix and len(s) > len(prefix) and s[: len(prefix)] == prefix]
        in_full = sorted(set(range(len(sequences))) - set(with_prefix))
        results: list[LabelLogprobs] = [{} for _ in sequences]
        if with_prefix:
            kv = self._prefix_kv(prefix)
            suffixes = [sequences[i][len(prefix) :] for i in with_prefix]
            for i, row in zip(with_prefix, self._run(suffixes, label_ids, kv, len(prefix))):
                results[i] = row
        if in_full:
            for i, row in zip(in_full, self._run([sequences[i] for i in in_full], label_ids, None, 0)):
                results[i] = row
        self.stats["rows_with_prefix"] += len(with_prefix)
        self.stats["rows_in_full"] += len(in_full)
        return results

    def _usable_prefix(self, shared_prefix: str | None) -> list[int] | None:
        """Prefix tokens safe to cache (all but the last, which may merge across the boundary)."""
        if not (self.reuse_prefix and shared_prefix):
            return None
        ids = encode_rendered(self.tokenizer, shared_prefix)[:-1]
        return ids if len(ids) >= 1 else None

    @torch.inference_mode()
    def _prefix_kv(self, prefix: list[int]) -> PrefixKV:
        """Key/value tensors of the shared prefix (batch 1), computed once per distinct prefix."""
        key = tuple(prefix)
        if key in self._prefixes:
            self._prefixes.move_to_end(key)
            return self._prefixes[key]
        out = self.model(input_ids=torch.tensor([prefix], device=self.device), use_cache=True)
        kv = _cache_tensors(out.past_key_values)
        self._prefixes[key] = kv
        self.stats["prefix_forwards"] += 1
        while len(self._prefixes) > 4:  # pointwise + pairwise prefixes, with room to spare
            self._prefixes.popitem(last=False)
        return kv

    def _run(
        self, sequences: list[list[int]], label_ids: dict[str, list[int]], kv: PrefixKV | None, offset: int
    ) -> list[LabelLogprobs]:
        """Label logprobs at the last token of each sequence, in length-sorted batches."""
        out: list[LabelLogprobs] = [{} for _ in sequences]
        batches = sorted_batches([len(s) for s in sequences], self.batch_size)
        show = self.show_progress and len(batches) > 1
        for batch in tqdm(batches, desc=f"judge ({self.name})", unit="batch", disable=not show, leave=False):
            logprobs = self._forward([sequences[i] for i in batch], kv, offset)
            # a label's logprob: log Σ p over every token that spells it ("9", " 9", "▁9")
            picked = {label: torch.logsumexp(logprobs[:, ids], dim=-1).tolist() for label, ids in label_ids.items()}
            for row, index in enumerate(batch):
                out[index] = {label: values[row] for label, values in picked.items()}
        return out

    @torch.inference_mode()
    def _forward(self, batch: list[list[int]], kv: PrefixKV | None, offset: int) -> torch.Tensor:
        """Next-token log-softmax (fp32) after each right-padded row's last real token."""
        width = max(len(s) for s in batch)
        input_ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), offset + width), dtype=torch.long)
        mask[:, :offset] = 1
        for row, ids in enumerate(batch):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            mask[row, offset : offset + len(ids)] = 1
        last = [len(s) - 1 for s in batch]
        keep = sorted(set(last))
        kwargs: dict[str, Any] = {}
        if kv is not None:
            kwargs["past_key_values"] = _expanded_cache(kv, len(batch), self.model.config)
            positions = torch.arange(offset, offset + width).unsqueeze(0).expand(len(batch), -1)
            kwargs["position_ids"] = positions.to(self.device)
        logits = self.model(
            input_ids=input_ids.to(self.device),
            attention_mask=mask.to(self.device),
            logits_to_keep=torch.tensor(keep, device=self.device),
            use_cache=kv is not None,
            **kwargs,
        ).logits
        rows = torch.arange(len(batch))
        cols = torch.tensor([keep.index(p) for p in last])
        return torch.log_softmax(logits[rows, cols].float(), dim=-1).cpu()


def _cache_tensors(cache: Any) -> PrefixKV:
    """(keys, values) per layer from a transformers cache, old or new layout."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    if hasattr(cache, "key_cache"):
        return list(zip(cache.key_cache, cache.value_cache))
    return [(k, v) for k, v in cache]


def _expanded_cache(kv: PrefixKV, batch_size: int, config: Any) -> Any:
    """A fresh DynamicCache holding the prefix for every row of the batch.

    Fresh per batch because a transformers cache object is updated in place as the suffix
    runs (each layer's tensors are replaced by their concatenation with the new keys);
    reusing one cache object across batches would make the second batch see the first
    batch's tokens. The stored prefix tensors themselves are never written: the cache
    receives broadcast views (`expand`, no copy), and its first update concatenates them
    into new tensors (an in-place write into a broadcast view would raise, not corrupt).
    """
    from transformers import DynamicCache

    data = [(k.expand(batch_size, -1, -1, -1), v.expand(batch_size, -1, -1, -1)) for k, v in kv]
    try:
        return DynamicCache(ddp_cache_data=data, config=config)
    except TypeError:  # transformers < 4.56 has neither keyword
        return DynamicCache.from_legacy_cache(tuple(data))
