"""The backend interface and the pieces every backend shares (prompt rendering, labels)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

LabelLogprobs = dict[str, float]
"""Log-probability of each answer label at the first answer position; a label missing
from the dict was not among the tokens the backend could see (outside the top-k)."""

DEFAULT_CHAT_TEMPLATE_KWARGS: dict[str, Any] = {"enable_thinking": False}
"""Thinking disabled (SPEC §5): Qwen3-style templates read `enable_thinking`; templates
that do not know the variable ignore it."""


class JudgeBackend(ABC):
    """Renders judge prompts with the judge model's chat template and reads label logprobs."""

    name: str = "backend"

    def __init__(self, tokenizer: Any, chat_template_kwargs: Mapping[str, Any] | None = None):
        self.tokenizer = tokenizer
        self.chat_template_kwargs = dict(DEFAULT_CHAT_TEMPLATE_KWARGS if chat_template_kwargs is None else chat_template_kwargs)

    def render(self, user_message: str) -> str:
        """The full prompt text: one user turn, generation prompt added, thinking disabled."""
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise ValueError(
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

    def describe(self) -> dict[str, Any]:
        """Identity of the judge model, for the annotation job's fingerprint."""
        return {"backend": self.name, "model": str(getattr(self.tokenizer, "name_or_path", ""))}


def single_token_ids(tokenizer: Any, labels: Sequence[str]) -> dict[str, int]:
    """Token id of each label; raises if a label is not exactly one token.

    The judge reads a single next-token distribution, so a label spelled with two tokens
    ("10" in many tokenizers) cannot be scored from it; say so instead of reading half a
    label.
    """
    ids: dict[str, int] = {}
    for label in labels:
        pieces = tokenizer(label, add_special_tokens=False)["input_ids"]
        if len(pieces) != 1:
            shown = tokenizer.convert_ids_to_tokens(pieces)
            raise ValueError(
                f"answer label {label!r} is {len(pieces)} tokens {shown} in this tokenizer; the judge reads "
                "one answer token, so every label must be a single token (e.g. use the scale 1-9)"
            )
        ids[label] = pieces[0]
    if len(set(ids.values())) != len(ids):
        raise ValueError(f"answer labels {list(labels)} do not map to distinct tokens: {ids}")
    return ids
