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

The template itself is probed once, before it renders any row (``check_own_template``): it
has a generation prompt wherever it opens an assistant turn with text, it renders user,
assistant and system messages apart, and it raises nothing on a plain conversation. Each of
these went unnoticed before: SFT trained the turn opener as the model's text, a role-blind
template trained the user's words as the model's, a crashing template left a traceback.
Whether it renders the reasoning of assistant turns before the last is checked only on
conversations that have such reasoning (``dropped_reasoning``).
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from align.chat.messages import REASONING_FIELDS
from align.errors import ConfigError, InputError

TOKENIZER_FORMAT = "tokenizer"
_PROBE = "align-turn-end-probe"
_ASK = "align probe question"
_SAME = "align probe text"
_turn_ends: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_probed: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> {(template, enable_thinking)}
_last_reasoning: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> {key: renders it}


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
    except Exception as err:  # noqa: BLE001 - anything else is the template's own fault, whatever the row
        raise ConfigError(f"the chat template of {template_name(tokenizer)!r} fails on a conversation: "
                          f"{_what_failed(err)}; fix the template, or use an align.chat format (apertus, llama3, "
                          "chatml)") from None


def template_name(tokenizer: Any) -> str:
    """What errors call the template: the tokenizer's (or model's) path or name."""
    return str(getattr(tokenizer, "name_or_path", "") or "the tokenizer")


def _what_failed(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0] if lines else ''}"


def check_own_template(tokenizer: Any, *, enable_thinking: bool = False) -> None:
    """Probe a model's own template once (per template and ``enable_thinking``), before it renders
    any row: it renders a plain conversation without raising, has a generation prompt wherever it
    opens an assistant turn with text, and renders user, assistant and system messages apart. Each
    failure is a ``ConfigError`` naming the template; later calls cost one lookup."""
    check_template(tokenizer)
    key = (str(tokenizer.chat_template), bool(enable_thinking))
    done = _probed.setdefault(tokenizer, set())
    if key in done:
        return
    _check_generation_prompt(tokenizer, enable_thinking)
    _check_roles(tokenizer, enable_thinking)
    _check_marker_tokens(tokenizer, enable_thinking)
    done.add(key)


_MARKER = re.compile(r"<\|[^<>|\s]{1,40}\|>")  # <|im_start|>, <|eot_id|>, <|assistant_end|>: a template's structure


def _check_marker_tokens(tokenizer: Any, enable_thinking: bool) -> None:
    """Every ``<|...|>`` marker the template writes is one token of the vocabulary. A template carried over
    from another model (ChatML on a tokenizer without ``<|im_end|>``) would otherwise train its markers as
    ordinary text, split into pieces, and the end of turn could not become EOS: generation would not stop."""
    text = _probe_render(tokenizer, [{"role": "user", "content": "U"}, {"role": "assistant", "content": "A"}],
                         enable_thinking=enable_thinking)
    vocab = tokenizer.get_vocab()
    missing = {m: len(tokenizer(m, add_special_tokens=False)["input_ids"]) for m in dict.fromkeys(_MARKER.findall(text))
               if m not in vocab}
    if missing:
        shown = ", ".join(f"{m!r} ({n} tokens)" for m, n in missing.items())
        raise ConfigError(f"the chat template of {template_name(tokenizer)!r} writes {shown}, which its tokenizer "
                          "does not hold as tokens: they would be trained as ordinary text and the end of a turn "
                          "could not stop generation; use the tokenizer the template was written for, or add them "
                          "as special tokens (tokenizer.add_special_tokens, then model.resize_token_embeddings) and "
                          "save both")


def _probe_render(tokenizer: Any, messages: list[dict], *, enable_thinking: bool,
                  add_generation_prompt: bool = False) -> str:
    """A probe conversation any chat template must render; whatever it raises is the template's fault."""
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                             enable_thinking=enable_thinking)
    except Exception as err:  # noqa: BLE001 - a plain conversation: any error is the template's
        shown = ", ".join(m["role"] for m in messages)
        raise ConfigError(f"the chat template of {template_name(tokenizer)!r} fails on a plain conversation "
                          f"({shown}): {_what_failed(err)}; fix the template, or use an align.chat format "
                          "(apertus, llama3, chatml)") from None


def _shared_prefix(a: str, b: str) -> int:
    return next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _check_generation_prompt(tokenizer: Any, enable_thinking: bool) -> None:
    """A template that opens an assistant turn with text (``<|im_start|>assistant``) must write
    that opener as its generation prompt: otherwise SFT trains the opener as the model's text and
    a sampled model writes it into every completion. A template that opens no turn (Mistral's
    ``[/INST]`` ends the user turn) needs none."""
    user = [{"role": "user", "content": _ASK}]
    plain = _probe_render(tokenizer, user, enable_thinking=enable_thinking)
    prompted = _probe_render(tokenizer, user, enable_thinking=enable_thinking, add_generation_prompt=True)
    answered = _probe_render(tokenizer, user + [{"role": "assistant", "content": _PROBE}],
                             enable_thinking=enable_thinking)
    if answered.count(_PROBE) > 1:
        raise ConfigError(
            f"the chat template of {template_name(tokenizer)!r} writes an assistant's text more than once in its "
            "turn, so where the turn starts and ends cannot be told and its tokens cannot be masked; use an "
            "align.chat format (apertus, llama3, chatml)")
    at = answered.find(_PROBE)
    opener = answered[_shared_prefix(plain, answered):at] if at >= 0 else ""
    added = prompted[_shared_prefix(plain, prompted):]
    if opener.strip() and not added.strip():
        raise ConfigError(
            f"the chat template of {template_name(tokenizer)!r} has no generation prompt (add_generation_prompt "
            f"adds nothing after the last turn), yet it opens an assistant turn with {opener.strip()!r}: SFT would "
            "train that opener as the model's own text, and a sampled model would write it into every completion; "
            "add the generation prompt to the template, or use an align.chat format (apertus, llama3, chatml)")


# Each pair renders the same text in two roles, in a place where both are valid. A render the
# template refuses counts as telling the roles apart (it read the role to refuse it).
_ROLE_PROBES = (
    ("user", "assistant", lambda role: [{"role": "user", "content": _ASK}, {"role": role, "content": _SAME}]),
    ("user", "system", lambda role: [{"role": role, "content": _SAME}, {"role": "user", "content": _ASK}]),
    ("assistant", "system", lambda role: [{"role": role, "content": _SAME}, {"role": "user", "content": _ASK}]),
)


def _render_or_none(tokenizer: Any, messages: list[dict], enable_thinking: bool) -> str | None:
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, enable_thinking=enable_thinking)
    except Exception:  # noqa: BLE001 - a refused role order: the template read the roles
        return None


def _check_roles(tokenizer: Any, enable_thinking: bool) -> None:
    """The same text as a user's, an assistant's and a system message renders three ways: a
    template that writes every role alike trains the user's words as the model's and leaves the
    model no way to tell whose turn it is."""
    for first, second, conversation in _ROLE_PROBES:
        a = _render_or_none(tokenizer, conversation(first), enable_thinking)
        b = _render_or_none(tokenizer, conversation(second), enable_thinking)
        if a is not None and a == b:
            raise ConfigError(
                f"the chat template of {template_name(tokenizer)!r} renders {_article(first)} message and "
                f"{_article(second)} message the same way ({a[:120]!r}): the model could not tell whose turn it is, "
                "and SFT would train one role's words as the other's; use a template that writes each role, or an "
                "align.chat format (apertus, llama3, chatml)")


def _article(role: str) -> str:
    return f"{'an' if role == 'assistant' else 'a'} {role}"


def reasoning_fields(message: Mapping[str, Any]) -> list[str]:
    """The reasoning fields (``reasoning_content``, ...) an assistant message fills with text."""
    return [f for f in REASONING_FIELDS if isinstance(message.get(f), str) and message[f].strip()]


def earlier_reasoning(messages: Sequence[Mapping[str, Any]]) -> list[tuple[int, str]]:
    """(message index, field) of each reasoning text in an assistant message before the last
    assistant message: a scan of the fields, no rendering."""
    turns = [i for i, m in enumerate(messages) if isinstance(m, Mapping) and m.get("role") == "assistant"]
    return [(i, f) for i in turns[:-1] for f in reasoning_fields(messages[i])]


def renders_last_reasoning(tokenizer: Any, field: str, *, enable_thinking: bool = False) -> bool:
    """Whether the template renders the reasoning ``field`` of the last assistant turn at all (one
    probe, remembered per template, field and ``enable_thinking``)."""
    key = (str(tokenizer.chat_template), field, bool(enable_thinking))
    known = _last_reasoning.setdefault(tokenizer, {})
    if key not in known:
        marker = "align-reasoning-probe"
        conversation = [{"role": "user", "content": _ASK}, {"role": "assistant", "content": _SAME, field: marker}]
        known[key] = marker in _probe_render(tokenizer, conversation, enable_thinking=enable_thinking)
    return known[key]


def dropped_reasoning(tokenizer: Any, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Any] | None = None,
                      enable_thinking: bool = False) -> list[tuple[int, str]]:
    """(message index, field) of each earlier-turn reasoning (``earlier_reasoning``) the template
    leaves out of this conversation's render (Qwen3's drops the reasoning of turns before the last
    user message). Each reasoning text is replaced by a marker of its own, so a text that also
    appears elsewhere cannot pass for rendered. No earlier-turn reasoning: no render. A
    conversation the template cannot render at all gives [] (encoding it names the row)."""
    earlier = earlier_reasoning(messages)
    if not earlier:
        return []
    marked = [dict(m) if isinstance(m, Mapping) else m for m in messages]
    for k, (i, field) in enumerate(earlier):
        marked[i][field] = f"align-reasoning-probe-{k}"
    try:
        text = apply_template(tokenizer, marked, tools=tools, enable_thinking=enable_thinking)
    except InputError:
        return []
    return [place for k, place in enumerate(earlier) if f"align-reasoning-probe-{k}" not in text]


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


def check_text(tokenizer: Any, messages: Sequence[Mapping[str, Any]]) -> None:
    """No message's text (content, reasoning) holds a special token."""
    tokens = special_tokens(tokenizer)
    pieces = [(f"message {i}", m.get(field)) for i, m in enumerate(messages)
              for field in ("content", "reasoning_content") if isinstance(m.get(field), str)]
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
        shared = _shared_prefix(opener, rest)
        content = messages[i].get("content")
        # only where what follows the shared opener is the turn's own text: never mid-way into
        # a block the model must write itself (a reasoning block rendered in history)
        if shared and isinstance(content, str) and content.strip() and rest[shared:].startswith(content.strip()):
            return len(before) + shared
    at = _shared_prefix(prompt, full)
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
