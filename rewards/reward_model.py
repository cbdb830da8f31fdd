"""Sequence-classifier reward models (Skywork-Reward-V2 and any one-label classifier).

docs/method.md, Reward model: render `[user, assistant]` with the reward model's *own* chat template, strip a
leading BOS the template wrote (the tokenizer adds its own), score = raw `logits[0][0]`
(no softmax), at most 16,384 tokens, no system prompt.

Choices made here:
- Multi-turn prompts: the whole conversation (every user and assistant turn, system
  turns dropped) followed by the completion as the final assistant turn. Reward models of
  this family are trained on multi-turn preference data, and the earlier turns are the
  context the completion must fit.
- Padding: right padding. The model pools at the rightmost token whose id is not the pad
  id, so the pad id must never occur in real text: a pad equal to EOS (or missing) is an
  error (see `check_padding`).
- Batches are formed from inputs sorted by length (longest first), which removes most
  padding; scores come back in input order and do not depend on the batching. A batch
  holds at most `batch_size` sequences and, with `max_batch_tokens`, at most that many
  padded tokens (rows × its longest input): short inputs go many to a forward, long ones
  few, so one budget fits a GPU whatever the lengths. An input longer than the budget is
  scored alone.
- Over-long inputs are flagged (`details["truncated"]`), never silently: by default
  (`on_truncation="skip"`) they get no reward, with the reason, because a score of the
  first `max_length` tokens is not a score of the answer; `on_truncation="score"` scores
  the input truncated on the right.
- Empty completions get a defined reward, so a prompt is not lost because one reference
  came back empty: by default the lowest score among the same prompt's scored non-empty
  completions (an empty answer is no better than the worst real one), or a fixed
  `empty_score`. `details["empty_completion"]` says which rule gave the value.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from align.errors import ConfigError, InputError, loading
from rewards.base import Conversation, RewardProvider, Score, checked, is_empty
from rewards.text import encode_rendered, plain_messages

ON_TRUNCATION = ("skip", "score")


@dataclass
class RewardModelConfig:
    """Settings of a sequence-classifier reward model.

    model_name_or_path: hub id or local dir of a one-label AutoModelForSequenceClassification.
    batch_size:   sequences per forward pass, at most (default 8).
    max_batch_tokens: padded tokens per forward pass (rows × the longest row), at most;
                  None (default): no token budget, `batch_size` alone decides. An input
                  longer than the budget is scored alone.
    max_length:   token budget per rendered conversation; longer ones are truncated on the
                  right and flagged (default 16,384, the Skywork-Reward-V2 limit).
    device:       "cuda", "cpu", ...; None picks cuda when available.
    dtype:        "bfloat16", "float32", ...; None means bf16 on GPU, fp32 on CPU.
    sort_by_length: batch inputs of similar length together (default True; False keeps
                  input order, the baseline of bench/annotation_throughput.py).
    on_truncation: "skip" (default): an input longer than max_length gets no reward, with
                  the reason; "score": score its first max_length tokens (flagged).
    empty_score:  reward of an empty (whitespace-only) completion; None (default): the
                  lowest score among the same prompt's scored non-empty completions.
    """

    model_name_or_path: str
    batch_size: int = 8
    max_length: int = 16384
    device: str | None = None
    dtype: str | None = None
    sort_by_length: bool = True
    on_truncation: str = "skip"
    empty_score: float | None = None
    max_batch_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.max_batch_tokens is not None and (
                isinstance(self.max_batch_tokens, bool) or not isinstance(self.max_batch_tokens, int)
                or self.max_batch_tokens < 1):
            raise ConfigError(f"max_batch_tokens must be an integer >= 1 or None, got {self.max_batch_tokens!r}")
        if self.max_length < 2:
            raise ConfigError(f"max_length must be >= 2, got {self.max_length}")
        if self.on_truncation not in ON_TRUNCATION:
            raise ConfigError(f"on_truncation must be one of {list(ON_TRUNCATION)}, got {self.on_truncation!r}")
        if self.empty_score is not None and (
            isinstance(self.empty_score, bool) or not isinstance(self.empty_score, (int, float))
            or not math.isfinite(self.empty_score)
        ):
            raise ConfigError(f"empty_score must be a finite number or None, got {self.empty_score!r}")


def budget_batches(order: Sequence[int], lengths: Sequence[int], batch_size: int,
                   max_batch_tokens: int | None) -> list[list[int]]:
    """``order``'s indices cut into consecutive batches of at most ``batch_size`` sequences and
    at most ``max_batch_tokens`` padded tokens (rows × the batch's longest length).

    A batch is closed when the next index would break either cap; an index longer than the
    budget on its own gets a batch of its own. With ``order`` sorted longest first, each
    batch is as wide as its first index.
    """
    batches: list[list[int]] = []
    batch: list[int] = []
    width = 0
    for index in order:
        grown = max(width, lengths[index])
        if batch and (len(batch) >= batch_size
                      or (max_batch_tokens is not None and (len(batch) + 1) * grown > max_batch_tokens)):
            batches.append(batch)
            batch, grown = [], lengths[index]
        batch.append(index)
        width = grown
    if batch:
        batches.append(batch)
    return batches


def resolve_device(device: str | None) -> torch.device:
    return torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """bf16 on accelerators, fp32 on CPU (CPU bf16 matmuls are slow and less exact)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None:
        return torch.bfloat16 if device.type != "cpu" else torch.float32
    resolved = getattr(torch, dtype, None)
    if not isinstance(resolved, torch.dtype):
        raise ConfigError(f"unknown dtype {dtype!r} (use e.g. 'bfloat16' or 'float32')")
    return resolved


def check_padding(tokenizer: Any, model: Any, name: str) -> int:
    """Return the pad id the model pools with, or raise if batches would pool wrongly.

    A sequence classifier finds each row's last real token as the rightmost position whose
    id differs from `config.pad_token_id`. If the tokenizer has no pad token, rows cannot
    be padded at all. If pad == EOS, an EOS that the chat template writes at the end of
    the turn is taken for padding, so the score is read at the token before it, not at
    the token the reward model was trained to pool on (older transformers versions, which
    took the first pad position, even cut the sequence at the first EOS inside the text).
    """
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    if pad is None:
        raise InputError(
            f"reward model {name}: the tokenizer has no pad token; set one that never occurs "
            "in text (not EOS), e.g. tokenizer.pad_token = '<|finetune_right_pad_id|>' for Llama 3"
        )
    eos_ids = set(eos) if isinstance(eos, list) else {eos}
    if pad in eos_ids:
        raise InputError(
            f"reward model {name}: pad token id {pad} equals the EOS id; the model pools at the last "
            "non-pad token, so an EOS at the end of the turn would be treated as padding. Set a "
            "distinct pad token."
        )
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if config.pad_token_id is None:
        config.pad_token_id = pad
        model.config.pad_token_id = pad
    elif config.pad_token_id != pad:
        raise InputError(
            f"reward model {name}: model.config.pad_token_id={config.pad_token_id} but the tokenizer pads "
            f"with {pad}; pooling would look for the wrong id. Make them agree."
        )
    return pad


class RewardModel(RewardProvider):
    """Score completions with a one-label sequence classifier (raw logit; docs/method.md, Reward model)."""

    name = "reward_model"

    def __init__(
        self,
        model_name_or_path: str | Path,
        *,
        batch_size: int = 8,
        max_length: int = 16384,
        device: str | None = None,
        dtype: str | torch.dtype | None = None,
        sort_by_length: bool = True,
        on_truncation: str = "skip",
        empty_score: float | None = None,
        max_batch_tokens: int | None = None,
        model: Any = None,
        tokenizer: Any = None,
    ):
        """`model`/`tokenizer` may be passed already loaded (tests, benchmarks)."""
        self.config = RewardModelConfig(
            str(model_name_or_path), batch_size, max_length, device,
            dtype if not isinstance(dtype, torch.dtype) else str(dtype).removeprefix("torch."),
            sort_by_length, on_truncation, empty_score, max_batch_tokens,
        )
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        self.tokenizer, self.model = self._load(model, tokenizer)
        self.pad_id = check_padding(self.tokenizer, self.model, self.config.model_name_or_path)
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise InputError(f"reward model {model_name_or_path}: the tokenizer has no chat template to render with")

    def _load(self, model: Any, tokenizer: Any) -> tuple[Any, Any]:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        path = self.config.model_name_or_path
        if tokenizer is None:
            with loading("model", path):
                tokenizer = AutoTokenizer.from_pretrained(path)
        if model is None:
            with loading("model", path):
                model = AutoModelForSequenceClassification.from_pretrained(path, dtype=self.dtype)
        if model.config.num_labels != 1:
            raise InputError(f"reward model {path}: expected a one-label classifier, got num_labels={model.config.num_labels}")
        return tokenizer, model.to(device=self.device, dtype=self.dtype).eval()

    def render(self, conversation: Conversation, completion: str) -> str:
        """The text the reward model reads: its own chat template over prompt + answer."""
        messages = plain_messages(conversation) + [{"role": "assistant", "content": completion}]
        return self.tokenizer.apply_chat_template(messages, tokenize=False)

    def encode(self, conversation: Conversation, completion: str) -> tuple[list[int], dict[str, Any]]:
        """Token ids (one BOS at most, right-truncated to max_length) and their details."""
        ids = encode_rendered(self.tokenizer, self.render(conversation, completion))
        details: dict[str, Any] = {"num_tokens": len(ids), "truncated": len(ids) > self.config.max_length}
        return ids[: self.config.max_length], details

    def score(
        self,
        conversations: Sequence[Conversation],
        completions: Sequence[str],
        *,
        references: Sequence[Any] | None = None,
    ) -> list[Score]:
        """Raw logits for every pair; an empty completion gets the empty-completion rule, over
        the pairs that share its conversation (the same prompt)."""
        if len(conversations) != len(completions):
            raise InputError(f"{len(conversations)} conversations for {len(completions)} completions")
        scores = self._score_non_empty(conversations, completions)
        prompts: dict[str, list[int]] = {}
        for i, conversation in enumerate(conversations):
            key = json.dumps(plain_messages(conversation), sort_keys=True, ensure_ascii=False)
            prompts.setdefault(key, []).append(i)
        for group in prompts.values():
            self._score_empty(scores, group)
        return scores  # type: ignore[return-value]

    def score_groups(
        self,
        conversations: Sequence[Conversation],
        completion_groups: Sequence[Sequence[str]],
        *,
        references: Sequence[Any] | None = None,
    ) -> list[list[Score]]:
        """Scores of each prompt's completions; an empty one gets the rule over its own group."""
        flat_conv = [c for c, group in zip(conversations, completion_groups, strict=True) for _ in group]
        flat_comp = [text for group in completion_groups for text in group]
        scores = self._score_non_empty(flat_conv, flat_comp)
        grouped, start = [], 0
        for group in completion_groups:
            indices = list(range(start, start + len(group)))
            self._score_empty(scores, indices)
            grouped.append([scores[i] for i in indices])
            start += len(group)
        return grouped  # type: ignore[return-value]

    def _score_non_empty(self, conversations: Sequence[Conversation], completions: Sequence[str]) -> list[Score | None]:
        """Scores of the non-empty completions (or recorded skips); None where the text is empty."""
        scores: list[Score | None] = [None] * len(completions)
        todo: list[int] = []
        encoded: list[tuple[list[int], dict[str, Any]]] = []
        for i, (conversation, completion) in enumerate(zip(conversations, completions)):
            if is_empty(completion):
                continue
            ids, details = self.encode(conversation, completion)
            if self.pad_id in ids:
                # the model would take this token for padding and pool before it
                scores[i] = Score.skip(f"text contains the pad token (id {self.pad_id})", **details)
                continue
            if details["truncated"] and self.config.on_truncation == "skip":
                scores[i] = Score.skip(
                    f"input has {details['num_tokens']} tokens, over max_length={self.config.max_length} "
                    "(on_truncation=skip)", **details)
                continue
            todo.append(i)
            encoded.append((ids, details))
        values = self._forward_all([ids for ids, _ in encoded])
        for i, value, (_, details) in zip(todo, values, encoded):
            scores[i] = checked(value, **details)
        return scores

    def _score_empty(self, scores: list[Score | None], group: Sequence[int]) -> None:
        """Fill the empty completions (None so far) of one prompt's ``group`` of indices."""
        empty = [i for i in group if scores[i] is None]
        if not empty:
            return
        if self.config.empty_score is not None:
            value, rule = float(self.config.empty_score), "the configured empty_score"
        else:
            others = [scores[i].value for i in group if scores[i] is not None and scores[i].value is not None]
            if not others:
                for i in empty:
                    scores[i] = Score.skip("empty completion, and no other completion of the prompt was scored "
                                           "to take the lowest score from (set empty_score)")
                return
            value = min(others)
            rule = f"the lowest score of the prompt's {len(others)} scored non-empty completions"
        for i in empty:
            scores[i] = Score(value, None, {"empty_completion": f"empty completion: given {rule}"})

    def _forward_all(self, sequences: list[list[int]]) -> list[float]:
        """Raw scores for token sequences, batched by length (or in order) under the sequence
        and token caps, input order out."""
        lengths = [len(s) for s in sequences]
        order = range(len(lengths))
        if self.config.sort_by_length:  # longest first, so memory errors show at once
            order = sorted(order, key=lambda i: lengths[i], reverse=True)
        batches = budget_batches(order, lengths, self.config.batch_size, self.config.max_batch_tokens)
        values: list[float] = [float("nan")] * len(sequences)
        for batch in tqdm(batches, desc="reward model", unit="batch", disable=len(batches) < 2, leave=False):
            for index, value in zip(batch, self._forward([sequences[i] for i in batch])):
                values[index] = value
        return values

    @torch.inference_mode()
    def _forward(self, batch: list[list[int]]) -> list[float]:
        width = max(len(s) for s in batch)
        input_ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, ids in enumerate(batch):
            input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            attention_mask[row, : len(ids)] = 1
        out = self.model(input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device))
        return out.logits[:, 0].float().cpu().tolist()

    def fingerprint(self) -> dict[str, Any]:
        c = self.config
        return {"provider": self.name, "model": c.model_name_or_path, "max_length": c.max_length, "dtype": str(self.dtype),
                "on_truncation": c.on_truncation, "empty_score": c.empty_score}
