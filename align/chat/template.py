"""``chat_format: tokenizer``: a model's own chat template (Qwen, Llama 3, Mistral, Gemma...),
rendered by ``tokenizer.apply_chat_template``, with exact assistant masks.

The template is a black box, so the mask is read off renders of the conversation itself:

- an assistant turn starts where the template's generation prompt for the conversation
  before it ends (``render(messages[:i], add_generation_prompt=True)``), which must be a
  prefix of the whole conversation's render (or, for a template that opens turns in history
  with less than its generation prompt, after the part of it the history shares);
- it ends with the first end-of-turn text after that point (what the template writes after
  an assistant's content, e.g. ``<|im_end|>`` or ``<|eot_id|>``, found by rendering a probe).
  No message may hold one of the tokenizer's special tokens, so that first one is this
  turn's.

Everything in between is trained on (the content, a template's empty ``<think></think>``
block, tool calls, the end-of-turn token); the newline some templates write after the end
of turn is not. A template that renders the conversation before a turn differently from its
own generation prompt (so the model was never prompted with what it would be trained on)
cannot give exact masks: that conversation is refused, naming the message.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from align.errors import ConfigError, InputError

TOKENIZER_FORMAT = "tokenizer"
_PROBE = "align-turn-end-probe"
_turn_ends: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def check_template(tokenizer: Any) -> None:
    """The tokenizer has a chat template (what sampling with it needs)."""
    if not getattr(tokenizer, "chat_template", None):
        name = getattr(tokenizer, "name_or_path", "") or "the model"
        raise ConfigError(f"chat_format='tokenizer' but the tokenizer of {name!r} has no chat_template "
                          "(name an align.chat format instead: apertus, llama3, chatml)")


def check_fast(tokenizer: Any) -> None:
    """Masks are read off the offsets mapping, which only a fast tokenizer gives."""
    if not getattr(tokenizer, "is_fast", False):
        raise InputError("chat_format='tokenizer' needs a fast tokenizer (offsets mapping); got "
                         f"{type(tokenizer).__name__}")


def apply_template(tokenizer: Any, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Any] | None = None,
                   add_generation_prompt: bool = False, enable_thinking: bool = False) -> str:
    """The template's text for ``messages``: the one rendering the samplers, the pass and the
    trainers share. ``enable_thinking`` reaches it as the template variable of that name
    (Qwen3's switch; templates without one ignore it)."""
    from jinja2 import TemplateError

    check_template(tokenizer)
    try:
        return tokenizer.apply_chat_template(list(messages), tools=tools, tokenize=False,
                                             add_generation_prompt=add_generation_prompt,
                                             enable_thinking=enable_thinking)
    except (TemplateError, TypeError, KeyError) as err:  # a conversation the template cannot read
        raise InputError(f"the tokenizer's chat template cannot render the conversation: {err!r}") from None


def turn_end(tokenizer: Any, *, enable_thinking: bool = False) -> str:
    """The text the template closes an assistant turn with (trailing whitespace left out)."""
    key = (tokenizer.chat_template, enable_thinking)
    cached = _turn_ends.get(tokenizer)
    if cached and cached[0] == key:
        return cached[1]
    text = apply_template(tokenizer, [{"role": "user", "content": "?"}, {"role": "assistant", "content": _PROBE}],
                          enable_thinking=enable_thinking)
    at = text.rfind(_PROBE)
    if at < 0:
        raise InputError("the tokenizer's chat template does not write an assistant's content as given, so where a "
                         "turn ends cannot be found; use an align.chat format (apertus, llama3, chatml)")
    end = text[at + len(_PROBE):].rstrip()
    if not end:
        raise InputError("the tokenizer's chat template writes nothing after an assistant's content: a model trained "
                         "on it could not learn to stop; use an align.chat format (apertus, llama3, chatml)")
    _turn_ends[tokenizer] = (key, end)
    return end


def special_tokens(tokenizer: Any) -> list[str]:
    """Token strings no message text may hold: the tokenizer's special tokens (turn markers,
    BOS/EOS, padding), which the template writes as structure."""
    return [t for t in dict.fromkeys(tokenizer.all_special_tokens) if t]


def check_text(tokenizer: Any, messages: Sequence[Mapping[str, Any]], *extra: str) -> None:
    """No message (content, reasoning) nor ``extra`` text holds a special token."""
    tokens = special_tokens(tokenizer)
    pieces = [(f"message {i}", m.get(field)) for i, m in enumerate(messages)
              for field in ("content", "reasoning_content") if isinstance(m.get(field), str)]
    pieces += [("the completion", text) for text in extra]
    for where, text in pieces:
        for token in tokens:
            if token in text:
                raise InputError(f"{where} holds {token!r}, a special token of the tokenizer that its chat template "
                                 "writes as structure")


def _turn_start(tokenizer: Any, messages: Sequence[Mapping[str, Any]], i: int, full: str, *,
                tools: Sequence[Any] | None, enable_thinking: bool) -> int:
    """Where assistant turn ``i`` starts being trained in ``full``: after the generation prompt
    for the conversation before it. A template may open a turn in history with less than its
    generation prompt (Qwen3 with enable_thinking=false prompts with an empty think block
    that earlier turns do not carry): then the turn starts after the part of the generation
    prompt the history shares, provided the history before the turn renders the same and the
    turn's own content follows right there."""
    prompt = apply_template(tokenizer, messages[:i], tools=tools, add_generation_prompt=True,
                            enable_thinking=enable_thinking)
    if full.startswith(prompt):
        return len(prompt)
    before = apply_template(tokenizer, messages[:i], tools=tools, enable_thinking=enable_thinking)
    if prompt.startswith(before) and full.startswith(before):
        opener, rest = prompt[len(before):], full[len(before):]
        shared = next((k for k, (a, b) in enumerate(zip(opener, rest)) if a != b), min(len(opener), len(rest)))
        content = messages[i].get("content")
        # only where what follows the shared opener is the turn's own text: never mid-way into
        # a block the model must write itself (a reasoning block rendered in history)
        if shared and isinstance(content, str) and content.strip() and rest[shared:].startswith(content.strip()):
            return len(before) + shared
    at = next((k for k, (a, b) in enumerate(zip(prompt, full)) if a != b), min(len(prompt), len(full)))
    raise InputError(
        f"message {i}: the tokenizer's chat template renders the conversation before this assistant turn otherwise "
        f"than its generation prompt for it (they differ at character {at}: {prompt[at:at + 30]!r} against "
        f"{full[at:at + 30]!r}), so the turn's tokens cannot be masked exactly; cut the conversation after this "
        "turn, or use an align.chat format")


def assistant_char_spans(tokenizer: Any, messages: Sequence[Mapping[str, Any]], full: str, *,
                         tools: Sequence[Any] | None = None, enable_thinking: bool = False) -> dict[int, tuple[int, int]]:
    """Character range [start, end) of each assistant turn in ``full`` (see the module docstring)."""
    end_text = turn_end(tokenizer, enable_thinking=enable_thinking)
    spans: dict[int, tuple[int, int]] = {}
    last = 0
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        if i == 0:
            raise InputError("message 0 is an assistant turn: there is no prompt before it to train it after")
        start = _turn_start(tokenizer, messages, i, full, tools=tools, enable_thinking=enable_thinking)
        stop = full.find(end_text, start)
        if start < last or stop < 0:
            raise InputError(f"message {i}: no end of turn {end_text!r} after the assistant's text in the "
                             "template's render")
        spans[i] = (start, stop + len(end_text))
        last = spans[i][1]
    return spans
