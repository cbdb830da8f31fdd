"""The one sampling interface, and what every backend shares: prompts and completions.

A backend turns conversations into token ids the same way (render with the chat format
and its generation prompt, tokenize with ``add_special_tokens=False`` so BOS is never
doubled) and turns generated ids into `Completion`s the same way (text without the
end-of-turn token, token counts with it), so the transformers and vLLM backends produce
interchangeable records.
"""

from __future__ import annotations

import abc
import datetime as _dt
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from align.errors import ConfigError, InputError

Conversation = Sequence[Mapping[str, Any]]


class PromptTooLongError(InputError):
    """A prompt that leaves no room to generate within the model's context length."""

    def __init__(self, index: int, num_tokens: int, limit: int):
        self.index, self.num_tokens, self.limit = index, num_tokens, limit
        super().__init__(
            f"conversation {index}: the prompt has {num_tokens} tokens, the model's context "
            f"length is {limit}; nothing can be generated"
        )


@dataclass(frozen=True)
class Completion:
    """One sampled completion.

    ``text`` excludes the end-of-turn token (and padding) but keeps every other token the
    model generated, special ones included (tool-call markers, thoughts). ``num_tokens``
    counts the generated tokens including the end-of-turn token when one was emitted, as
    the length-normalised losses count |y|. ``finish_reason`` is "stop" (a stop token was
    generated) or "length" (the token budget ran out). ``token_ids`` are the ``num_tokens``
    generated ids themselves (what log-prob estimates score, with no re-tokenization); they
    stay out of the stage records.
    """

    text: str
    num_tokens: int
    finish_reason: str
    model: str
    params: Mapping[str, Any] = field(default_factory=dict)
    token_ids: tuple[int, ...] = ()

    def source(self, **extra: Any) -> str:
        """The record's ``source``: model and sampling parameters, as ``key=value`` pairs."""
        items = {**self.params, **extra}
        return " ".join([f"model={self.model}"] + [f"{k}={v}" for k, v in items.items()])

    def to_record(self, *, is_reference: bool, **source_extra: Any) -> dict[str, Any]:
        """The completion as an entry of a prompt record's ``completions`` list."""
        return {
            "text": self.text,
            "num_tokens": self.num_tokens,
            "finish_reason": self.finish_reason,
            "is_reference": is_reference,
            "source": self.source(**source_extra),
        }


def derive_seed(*parts: Any) -> int:
    """A 63-bit seed from any parts (e.g. the base seed, a record id, a sample index)."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") & (2**63 - 1)


def per_conversation_seeds(seed: int | Sequence[int], count: int) -> list[int]:
    """One seed per conversation: an int applies to each, or give one per conversation."""
    if isinstance(seed, int):
        return [seed] * count
    seeds = list(seed)
    if len(seeds) != count:
        raise InputError(f"got {len(seeds)} seeds for {count} conversations")
    return seeds


def stream_seed(seed: int, prompt_ids: Sequence[int]) -> int:
    """The seed a conversation's draws use: its given seed mixed with its prompt tokens.

    Depends on neither the batch nor the position in it (so a resumed job redraws the
    same samples), and two different prompts given the same seed still get independent
    draws.
    """
    digest = hashlib.blake2b(repr(list(prompt_ids)).encode(), digest_size=8).hexdigest()
    return derive_seed(seed, digest)


def check_sampling_args(n: int, temperature: float, top_p: float, max_tokens: int) -> None:
    """Raise on sampling parameters no backend can honour, naming the parameter."""
    if n < 1:
        raise ConfigError(f"n must be >= 1, got {n}")
    if temperature < 0:
        raise ConfigError(f"temperature must be >= 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise ConfigError(f"top_p must be in (0, 1], got {top_p}")
    if max_tokens < 1:
        raise ConfigError(f"max_tokens must be >= 1, got {max_tokens}")


class PromptEncoder:
    """Conversation -> prompt token ids, and generated ids -> Completion, for one tokenizer.

    ``chat_format`` is a format of `align.chat` ("apertus", "llama3", "chatml"), or
    "tokenizer" to use the tokenizer's own chat template (offline models such as Qwen or
    Llama keep their own formats). ``enable_thinking`` reaches both: the Apertus developer
    block, or the template variable ``enable_thinking`` of the tokenizer's own template
    (Qwen3's switch; ``false`` renders the prompt that turns its reasoning off).
    """

    def __init__(
        self,
        tokenizer: Any,
        chat_format: str = "apertus",
        *,
        chat_date: _dt.date | str | None = None,
        enable_thinking: bool = False,
        stop_tokens: Sequence[str] | None = None,
        extra_stop_ids: Sequence[int] = (),
    ):
        self.tokenizer, self.chat_format = tokenizer, chat_format
        self.chat_date, self.enable_thinking = chat_date, enable_thinking
        if chat_format == "tokenizer":
            from align.chat.template import check_own_template

            check_own_template(tokenizer, enable_thinking=enable_thinking)
            stops, ends = list(stop_tokens or []), []
        else:
            from align.chat import get_format
            from align.chat.encode import check_tokenizer

            fmt = get_format(chat_format)
            check_tokenizer(tokenizer, fmt)
            stops, ends = list(stop_tokens or fmt.stop_tokens), [fmt.eos]
        eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        self.stop_ids = _unique([self._token_id(t) for t in stops] + eos + list(extra_stop_ids))
        # tokens dropped from a completion's text when they end it (the others are content)
        self.end_ids = set([self._token_id(t) for t in ends] + eos + list(extra_stop_ids))

    def _token_id(self, token: str) -> int:
        token_id = self.tokenizer.convert_tokens_to_ids(token)
        if token_id is None or token_id == self.tokenizer.unk_token_id:
            raise ConfigError(f"stop token {token!r} is not a token of this tokenizer")
        return token_id

    def render(self, conversation: Conversation, tools: Sequence[Any] | None = None) -> str:
        """The prompt text: the conversation plus the assistant generation prompt."""
        if self.chat_format == "tokenizer":
            from align.chat.template import apply_template

            # the same rendering the pass and the trainers use (align.chat.template)
            return apply_template(self.tokenizer, conversation, tools=tools, add_generation_prompt=True,
                                  enable_thinking=self.enable_thinking)
        from align.chat import render

        return render(
            conversation, chat_format=self.chat_format, tools=tools, add_generation_prompt=True,
            enable_thinking=self.enable_thinking, chat_date=self.chat_date,
        )

    def prompt_ids(self, conversation: Conversation, tools: Sequence[Any] | None = None) -> list[int]:
        """Token ids of the rendered prompt; the text carries its own BOS, so none is added."""
        ids = list(self.tokenizer(self.render(conversation, tools), add_special_tokens=False)["input_ids"])
        bos = self.tokenizer.bos_token_id
        if bos is not None and len(ids) > 1 and ids[0] == ids[1] == bos:
            raise InputError("the rendered prompt starts with a doubled BOS")  # the chat template's
        return ids

    def completion(self, ids: Sequence[int], model: str, params: Mapping[str, Any]) -> Completion:
        """A Completion from generated ids: up to the first stop token (padding may follow)."""
        ids = list(ids)
        stop_at = next((k for k, t in enumerate(ids) if t in self.stop_ids), None)
        if stop_at is not None:
            kept, num_tokens, reason = ids[: stop_at + 1], stop_at + 1, "stop"
            if kept[-1] in self.end_ids:
                kept = kept[:-1]
        else:
            kept, num_tokens, reason = ids, len(ids), "length"
        text = self.tokenizer.decode(kept, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        return Completion(text, num_tokens, reason, model, dict(params), tuple(ids[:num_tokens]))


def engine_completion(encoder: PromptEncoder, ids: Sequence[int], engine_reason: Any, model: str,
                      params: Mapping[str, Any], *, engine: str) -> Completion:
    """A Completion from ids an engine (vLLM, a server) generated: the ids decide how it ended.

    ``encoder.completion`` reads the ids: a stop token among them means "stop", whatever the
    engine says. An engine may answer "length" for a completion whose last allowed token was
    the end-of-turn token (it counts the budget before it checks the stop); that turn did
    end, so the ids win, the same on every backend. Still refused, naming both readings: an
    engine reason other than "stop" / "length" (an abort), and "stop" with no stop token in
    the ids (the engine stopped at something this encoder does not know).
    """
    completion = encoder.completion(ids, model, params)
    if engine_reason == "length" and completion.finish_reason == "stop":
        return completion
    if engine_reason not in ("stop", "length") or engine_reason != completion.finish_reason:
        ids = list(ids)
        raise RuntimeError(f"{engine} finished with {engine_reason!r} but the generated ids say "
                           f"{completion.finish_reason!r} (last ids {ids[-3:]}, stop ids {encoder.stop_ids})")
    return completion


@dataclass(frozen=True)
class SampleRequest:
    """One group of a `Sampler.sample_many` call: the arguments of one `Sampler.sample` call.

    The evaluation sends two per job batch (its greedy and its sampled completions), so an
    engine that batches continuously schedules them together.
    """

    conversations: Sequence[Conversation]
    n: int
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 4096
    seed: int | Sequence[int] = 0
    tools: Sequence[Sequence[Any] | None] | None = None


def _unique(ids: Sequence[int]) -> list[int]:
    return list(dict.fromkeys(ids))


class Sampler(abc.ABC):
    """Draw ``n`` completions per conversation. Backends: transformers and vLLM."""

    #: model name or path, recorded in each completion's ``source``
    model_name: str
    encoder: PromptEncoder
    #: after ``sample``: conversation index -> why the backend refused it (a server that found the prompt
    #: too long); those conversations get no completions and are recorded as skipped
    refusals: dict[int, str] = {}

    @property
    @abc.abstractmethod
    def max_model_len(self) -> int:
        """Context length: prompt plus completion tokens."""

    @abc.abstractmethod
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
        """``n`` completions per conversation, in order.

        ``seed`` (one int, or one per conversation) seeds each conversation's draws on
        their own, so a conversation's samples do not depend on the batch it is in (up to
        the float noise of batched kernels). Raises `PromptTooLongError` for a prompt
        that fills the context; the budget of a long prompt is cut to what fits.
        """

    def sample_many(self, requests: Sequence[SampleRequest]) -> list[list[list[Completion]]]:
        """Several `sample` calls at once: one result per request, each as `sample` returns it.

        Every completion is what ``sample`` with the request's arguments gives (the same
        seeds per conversation), so grouping changes no output. This default calls
        ``sample`` per request, one after the other (the transformers and OpenAI-compatible
        backends); the vLLM backend overrides it to submit every request of every group in
        one ``generate`` call, so the engine schedules them together and no group waits for
        the longest completion of the one before.
        """
        return [self.sample(r.conversations, r.n, temperature=r.temperature, top_p=r.top_p,
                            max_tokens=r.max_tokens, seed=r.seed, tools=r.tools) for r in requests]

    def prompt_length(self, conversation: Conversation, tools: Sequence[Any] | None = None) -> int:
        """Tokens of the rendered prompt (to skip prompts that do not fit, before sampling)."""
        return len(self.encoder.prompt_ids(conversation, tools))

    def params(self, temperature: float, top_p: float, max_tokens: int, seed: Any) -> dict[str, Any]:
        """The parameters recorded with each completion."""
        return {"backend": self.backend, "temperature": temperature, "top_p": top_p,
                "max_tokens": max_tokens, "seed": seed}

    backend: str = "?"

    def _prepare(
        self,
        conversations: Sequence[Conversation],
        n: int,
        temperature: float,
        top_p: float,
        max_tokens: int,
        seed: int | Sequence[int],
        tools: Sequence[Sequence[Any] | None] | None,
    ) -> tuple[list[list[int]], list[int], list[int]]:
        """What every backend's ``sample`` starts with: checked arguments, then per conversation
        the prompt ids (no doubled BOS), the token budget that fits the context, and the seed."""
        check_sampling_args(n, temperature, top_p, max_tokens)
        seeds = per_conversation_seeds(seed, len(conversations))
        tools = list(tools) if tools is not None else [None] * len(conversations)
        prompts = [self.encoder.prompt_ids(c, t) for c, t in zip(conversations, tools)]
        return prompts, self._budgets(prompts, max_tokens), seeds

    def _budgets(self, prompts: Sequence[Sequence[int]], max_tokens: int) -> list[int]:
        """Per-prompt token budget: max_tokens, cut to what the context length leaves."""
        budgets = []
        for index, ids in enumerate(prompts):
            room = self.max_model_len - len(ids)
            if room < 1:
                raise PromptTooLongError(index, len(ids), self.max_model_len)
            budgets.append(min(max_tokens, room))
        return budgets
