"""Chat in, text out, on a sampler: what the controversy classifier and the LLM degrader generate with.

`Generator` puts a `align.sampling.Sampler` (transformers, vLLM or an OpenAI-compatible
server; built from a recipe by `rewards.config.build_generator`) behind the one call those
two need, ``generate(conversations, seed=...) -> texts``: one text per conversation, greedy
at temperature 0 and sampled otherwise. The sampler seeds each conversation's draw from its
seed and its prompt, so an answer does not depend on the batch it came in, and a resumed
job draws it again; the classifier passes its attempt number (so a retry draws anew), the
degrader its ladder step's seed.

A text is the generated tokens decoded without special tokens (no end-of-turn token, no
marker a model emits): what the classifier parses as JSON and what the degrader keeps as
the rewritten response.

``prompt_length(conversation)`` (the tokens of the prompt exactly as the sampler sends it)
and ``max_model_len`` (its context length) come from the sampler, so a caller can leave out
a prompt that leaves no room for ``max_tokens`` instead of losing the batch
(`rewards.classifier`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from align.errors import ConfigError

if TYPE_CHECKING:
    from align.sampling.base import Completion, Sampler

Conversation = Sequence[Mapping[str, Any]]


class Generate(Protocol):
    """What the classifier and the degrader call: one text per conversation."""

    def __call__(self, conversations: Sequence[Conversation], *, seed: int | Sequence[int] = 0) -> list[str]: ...


class Generator:
    """``generate(conversations, seed=...) -> texts`` on a sampler.

    Args:
        sampler: any `align.sampling.Sampler`; its chat format renders the prompts
            (`build_generator`: the model's own chat template, thinking off).
        max_tokens: answer length budget in tokens (cut to what the context leaves).
        temperature: 0 is greedy; above 0 samples (top_p 1).
    """

    def __init__(self, sampler: Sampler, *, max_tokens: int = 256, temperature: float = 0.0):
        if max_tokens < 1:
            raise ConfigError(f"max_tokens: must be >= 1, got {max_tokens}")
        if temperature < 0:
            raise ConfigError(f"temperature: must be >= 0, got {temperature}")
        self.sampler, self.max_tokens, self.temperature = sampler, max_tokens, temperature

    def __call__(self, conversations: Sequence[Conversation], *, seed: int | Sequence[int] = 0) -> list[str]:
        """One text per conversation; ``seed``: one int for all, or one per conversation."""
        if not conversations:
            return []
        rows = self.sampler.sample(conversations, n=1, temperature=self.temperature,
                                   max_tokens=self.max_tokens, seed=seed)
        return [self.text(row[0]) for row in rows]

    def text(self, completion: Completion) -> str:
        """A completion's generated tokens as plain text (special tokens left out)."""
        return self.sampler.encoder.tokenizer.decode(list(completion.token_ids), skip_special_tokens=True)

    def prompt_length(self, conversation: Conversation) -> int:
        """Tokens of the prompt the sampler sends for one conversation."""
        return self.sampler.prompt_length(conversation)

    @property
    def max_model_len(self) -> int:
        """The sampler's context length: prompt plus answer."""
        return self.sampler.max_model_len

    def close(self) -> None:
        """Release the sampler's engine where it has one (vLLM), so another can start."""
        close = getattr(self.sampler, "close", None)
        if close is not None:
            close()
