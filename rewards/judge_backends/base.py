"""The backend interface and the pieces every backend shares (prompt rendering, labels)."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

from align.errors import ConfigError, InputError

LabelLogprobs = dict[str, float]
"""Log-probability of each answer label at the first answer position; a label missing
from the dict was not among the tokens the backend could see (outside the top-k)."""

DEFAULT_CHAT_TEMPLATE_KWARGS: dict[str, Any] = {"enable_thinking": False}
"""Thinking disabled (Apertus report E.4.2): Qwen3-style templates read `enable_thinking`; templates
that do not know the variable ignore it."""


PROMPT_TOO_LONG = "prompt_too_long"
"""The reason a prompt was not sent: it does not fit the model's context length."""


def prompt_too_long(num_tokens: int, max_model_len: int | None, room: int = 1, what: str = "one answer token") -> str | None:
    """The skip reason when ``num_tokens`` prompt tokens plus ``room`` do not fit ``max_model_len``
    (None: fits, or no limit is known)."""
    if max_model_len is None or num_tokens + room <= max_model_len:
        return None
    return (f"{PROMPT_TOO_LONG}: the prompt has {num_tokens} tokens, max_model_len is {max_model_len} "
            f"(the prompt and {what} must fit)")


class JudgeBackend(ABC):
    """Renders judge prompts with the judge model's chat template and reads label logprobs.

    ``max_model_len``: the judge model's context length (prompt and the one answer token);
    a prompt over it is never sent (`too_long`), since one such prompt makes vLLM or a
    server refuse the whole batch. None: no limit known, nothing is measured.
    """

    name: str = "backend"
    #: after ``label_logprobs``: prompt index -> why the backend could not ask it (a server that refused the
    #: prompt for its length); its answer is empty and the judge records a skip with that reason
    refusals: dict[int, str] = {}

    def __init__(self, tokenizer: Any, chat_template_kwargs: Mapping[str, Any] | None = None,
                 max_model_len: int | None = None):
        self.tokenizer = tokenizer
        self.chat_template_kwargs = dict(DEFAULT_CHAT_TEMPLATE_KWARGS if chat_template_kwargs is None else chat_template_kwargs)
        if max_model_len is not None and max_model_len < 2:
            raise ConfigError(f"max_model_len: must be >= 2, got {max_model_len}")
        self.max_model_len = max_model_len

    def prompt_length(self, prompt: str) -> int:
        """Tokens of a rendered prompt, as the backend sends it (one BOS)."""
        from rewards.text import encode_rendered

        return len(encode_rendered(self.tokenizer, prompt))

    def too_long(self, prompt: str) -> str | None:
        """Why a rendered prompt cannot be sent (``prompt_too_long: ...``), or None."""
        if self.max_model_len is None:
            return None
        return prompt_too_long(self.prompt_length(prompt), self.max_model_len)

    def render(self, user_message: str) -> str:
        """The full prompt text: one user turn, generation prompt added, thinking disabled."""
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise InputError(
                f"{self.name}: the judge tokenizer has no chat template; give it one "
                "(e.g. align.chat.install_format(tokenizer)) so the prompt matches how the judge was trained"
            )
        messages = [{"role": "user", "content": user_message}]
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **self.chat_template_kwargs
        )

    @abstractmethod
    def label_logprobs(
        self, prompts: Sequence[str], labels: Sequence[str], *, shared_prefix: str | None = None
    ) -> list[LabelLogprobs]:
        """Per rendered prompt, the logprob of each label as the next token.

        `shared_prefix` is rendered text that every prompt starts with (the charter); a
        backend may compute it once and reuse it. It must not change the result.
        """

    def check_labels(self, labels: Sequence[str]) -> dict[str, list[int]]:
        """The token ids each label is read from; raises (naming the label) if a label is not
        one token. The judge calls this when it is built, so a bad scale fails at once."""
        key = tuple(labels)
        cache = self.__dict__.setdefault("_label_ids", {})
        if key not in cache:
            cache[key] = label_token_ids(self.tokenizer, labels)
        return cache[key]

    def close(self) -> None:
        """Drop the model or engine this backend holds, so its memory is freed before another
        engine starts (a no-op for backends that hold nothing)."""

    def describe(self) -> dict[str, Any]:
        """Identity of the judge model, for the annotation job's fingerprint."""
        return {"backend": self.name, "model": str(getattr(self.tokenizer, "name_or_path", ""))}


SPACE_MARKERS = "\u2581"
"""SentencePiece's word-boundary marker; byte-level BPE markers (Ġ) vanish when a token is decoded."""


def label_text(token_text: str) -> str:
    """What a decoded token says as an answer label: whitespace and SentencePiece markers stripped."""
    for marker in SPACE_MARKERS:
        token_text = token_text.replace(marker, " ")
    return token_text.strip()


def label_token_ids(tokenizer: Any, labels: Sequence[str]) -> dict[str, list[int]]:
    """Every token id that decodes to each label, e.g. "9", " 9" and "▁9" for the label "9".

    A label's probability is the sum over all of these tokens (Appendix E.4.5 of the Apertus
    report rates with single answer tokens; tokenizers spell a digit with and without a
    leading space or marker, and the judge may put its mass on either). Special tokens
    never count. A label that no single token spells (e.g. "10" where the vocabulary has
    only "1" and "0") is refused with an error when the judge is built: the judge reads
    one next-token distribution, and half a label is not an answer.
    """
    wanted: dict[str, str] = {}
    for label in labels:
        key = label_text(label)
        if not key:
            raise ConfigError(f"answer label {label!r} is empty once whitespace is stripped")
        if key in wanted:
            raise ConfigError(f"answer labels {wanted[key]!r} and {label!r} are the same once whitespace is stripped")
        wanted[key] = label
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    quick = all(key.isascii() for key in wanted)  # ASCII label characters appear verbatim in raw tokens
    groups: dict[str, list[int]] = {label: [] for label in labels}
    candidates = sorted(
        token_id for token, token_id in tokenizer.get_vocab().items()
        if token_id not in special and (not quick or token.startswith("<0x") or any(key in token for key in wanted))
    )
    decoded = tokenizer.batch_decode([[token_id] for token_id in candidates]) if candidates else []
    for token_id, text in zip(candidates, decoded):
        key = label_text(text)
        if key in wanted:
            groups[wanted[key]].append(token_id)
    missing = [label for label, ids in groups.items() if not ids]
    if missing:
        spelled = {
            label: tokenizer.convert_ids_to_tokens(tokenizer(label, add_special_tokens=False)["input_ids"]) for label in missing
        }
        raise ConfigError(
            f"answer labels {missing} are not a single token in this tokenizer (spelled {spelled}); the judge reads "
            "one answer token, so every label must be one token, with or without a leading space (e.g. use the scale 1-9)"
        )
    return groups


def single_token_ids(tokenizer: Any, labels: Sequence[str]) -> dict[str, int]:
    """Token id of each label as written (no variants); raises if a label is not exactly one token.

    Kept for callers that need the plain spelling; the backends read every variant
    through `label_token_ids`.
    """
    ids: dict[str, int] = {}
    for label in labels:
        pieces = tokenizer(label, add_special_tokens=False)["input_ids"]
        if len(pieces) != 1:
            shown = tokenizer.convert_ids_to_tokens(pieces)
            raise ConfigError(
                f"answer label {label!r} is {len(pieces)} tokens {shown} in this tokenizer; the judge reads "
                "one answer token, so every label must be a single token (e.g. use the scale 1-9)"
            )
        ids[label] = pieces[0]
    if len(set(ids.values())) != len(ids):
        raise ConfigError(f"answer labels {list(labels)} do not map to distinct tokens: {ids}")
    return ids


def logsumexp(values: Sequence[float]) -> float:
    """log Σ exp(v), stable; -inf for no values."""
    finite = [v for v in values if v != float("-inf")]
    if not finite:
        return float("-inf")
    top = max(finite)
    return top + math.log(sum(math.exp(v - top) for v in finite))
