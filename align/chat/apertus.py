"""The Apertus chat format (docs/method.md, The Apertus chat format), rendered as labelled segments.

Layout (one line; the only newlines are inside the developer block and the texts)::

    <s><|system_start|>{system}<|system_end|><|developer_start|>Deliberation: disabled
    Tool Capabilities: disabled<|developer_end|><|user_start|>{user}<|user_end|>
    <|assistant_start|>{assistant}<|assistant_end|>...

Choices, and where they differ from the released template:

- Turns. An assistant message, the tool messages after it and the assistant message that
  answers them form one assistant turn. The training form closes every assistant turn with
  ``<|assistant_end|>`` (the released template only closes a turn when a user message
  follows), so the model learns to stop. A conversation opening with an assistant message,
  or an assistant message directly after another (not after its tool outputs), is an error
  (``align.chat.messages``, turn order), not merged into one turn.
- Generation prompt. ``add_generation_prompt=True`` leaves the model where it writes
  next: after ``<|assistant_start|>`` when the conversation ends with a user turn (as the
  released template), or inside the still-open assistant turn when it ends with tool
  outputs or assistant content (the released template would emit a second
  ``<|assistant_start|>`` mid-turn, which training data never contains). Either way
  ``render(prompt, add_generation_prompt=True) + completion + "<|assistant_end|>"`` equals
  ``render(prompt + [{"role": "assistant", "content": completion}])``.
- Thoughts open ``<|inner_prefix|>`` once; the first ``response`` after them closes it with
  ``<|inner_suffix|>``. Thoughts are rendered whatever ``enable_thinking`` says (it only
  sets the ``Deliberation`` line), as in the released template.
- Tool outputs (``tool_outputs`` blocks, or ``role: "tool"`` messages joined as
  ``[a, b]``) come from the environment and are never trained on; everything else in an
  assistant turn is, including ``<|inner_prefix|>``/``<|inner_suffix|>``, the tool-call
  markers and the closing ``<|assistant_end|>``, since the model generates them. The
  opening ``<|assistant_start|>`` is not.
- Declared tools. With ``tools`` given (non-empty), a call to a tool that is not declared
  is an error, not a warning: training on it teaches the model to call tools that do not
  exist. With ``tools=None`` (or ``[]``) calls are not checked.
- Default system text. A conversation without a system message gets the project's own
  default text with the date (the ``chat_date`` argument). It is not the released model's
  wording, so to reproduce a served prompt exactly, give the system message explicitly.
- Mixed content. String and block assistant content in the same turn is an error.
- Special tokens in text. No message may contain a turn delimiter or ``<s>``; assistant
  content may contain ``<|inner_prefix|>``/``<|inner_suffix|>``/``<|tools_prefix|>``/
  ``<|tools_suffix|>`` (raw model output) and they are trained on.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping, Sequence
from typing import Any

from align.chat.formats import APERTUS
from align.chat.messages import (
    Block,
    Message,
    ToolCall,
    check_follows,
    check_opening,
    check_text,
    message_error,
    normalize,
)
from align.chat.segments import Segment, Transcript
from align.chat.tools import declaration, format_calls, function_schemas
from align.errors import ConfigError

BOS = "<s>"
SYSTEM_START, SYSTEM_END = "<|system_start|>", "<|system_end|>"
DEVELOPER_START, DEVELOPER_END = "<|developer_start|>", "<|developer_end|>"
USER_START, USER_END = "<|user_start|>", "<|user_end|>"
ASSISTANT_START, ASSISTANT_END = "<|assistant_start|>", "<|assistant_end|>"
INNER_PREFIX, INNER_SUFFIX = "<|inner_prefix|>", "<|inner_suffix|>"

# The project's own default system text (used when a conversation has none). A served
# model's template may insert a different default: conversations that carry their own
# system message render identically either way, which is what we recommend for data.
DEFAULT_SYSTEM = (
    "You are a helpful, honest and harmless assistant.\n"
    "Current date: {date}"
)


def date_text(date: _dt.date | str | None) -> str:
    """The date shown in the default system text: ``YYYY-MM-DD``, today when ``None``."""
    if date is None:
        return _dt.date.today().isoformat()
    if isinstance(date, _dt.datetime):
        return date.date().isoformat()
    if isinstance(date, _dt.date):
        return date.isoformat()
    if isinstance(date, str) and date:
        return date
    raise ConfigError(f"date must be a datetime.date or a non-empty string, got {date!r}")


def developer_block(tools: Sequence[Any] | None, enable_thinking: bool) -> str:
    """The developer block: deliberation switch and tool capabilities."""
    thinking = "enabled" if enable_thinking else "disabled"
    if tools:
        caps = "\n" + "\n".join(declaration(s) for s in function_schemas(tools))
    else:
        caps = " disabled"
    return f"{DEVELOPER_START}Deliberation: {thinking}\nTool Capabilities:{caps}{DEVELOPER_END}"


class _Renderer:
    """Walks the messages once, tracking the open assistant turn."""

    def __init__(self, declared: set[str] | None) -> None:
        self.out = Transcript()
        self.declared = declared
        self.in_turn = False
        self.turn_kind: tuple[str, int] | None = None  # ("string"|"blocks", first index)
        self.in_inner = False
        self.open_outputs: int | None = None  # index of the last tool message in "[a, b"
        self.turn_last = -1
        self.previous: Message | None = None

    # -- turn bookkeeping -------------------------------------------------------------
    def close_outputs(self) -> None:
        if self.open_outputs is not None:
            self.out.add("]", self.open_outputs)
            self.open_outputs = None

    def close_turn(self) -> None:
        self.close_outputs()
        if self.in_turn:
            self.out.add(ASSISTANT_END, self.turn_last, trained=True)
        self.in_turn = False

    def open_turn(self, index: int) -> None:
        if not self.in_turn:
            self.out.add(ASSISTANT_START, index)
            self.in_turn, self.turn_kind, self.in_inner = True, None, False
        self.turn_last = index

    def set_kind(self, kind: str, index: int) -> None:
        if self.turn_kind is not None and self.turn_kind[0] != kind:
            other, first = self.turn_kind
            raise message_error(index, "assistant", f"{kind} content in an assistant turn whose "
                                f"message {first} has {other} content; one turn must use one")
        if self.turn_kind is None:
            self.turn_kind = (kind, index)

    # -- messages ---------------------------------------------------------------------
    def user(self, m: Message) -> None:
        self.close_turn()
        self.out.add(USER_START + m.text + USER_END, m.index)

    def tool(self, m: Message) -> None:
        if not self.in_turn:
            raise message_error(m.index, "tool", "tool message outside an assistant turn; it "
                                "must follow an assistant message (with its tool calls)")
        self.out.add(", " if self.open_outputs is not None else "[", m.index)
        self.out.add(m.text, m.index)
        self.open_outputs = m.index
        self.turn_last = m.index

    def assistant(self, m: Message) -> None:
        self.open_turn(m.index)
        if m.blocks is not None:
            self.set_kind("blocks", m.index)
        elif m.text is not None:
            self.set_kind("string", m.index)
        check_follows(self.previous, m)
        if m.blocks is not None:
            for k, block in enumerate(m.blocks):
                self.block(block, m.index, k)
        elif m.text is not None:
            self.close_outputs()
            self.out.add(m.text, m.index, trained=True)
        if m.tool_calls:
            self.calls(m.tool_calls, m.index)

    def calls(self, calls: Sequence[ToolCall], index: int) -> None:
        if self.declared is not None:
            for c in calls:
                if c.name not in self.declared:
                    known = ", ".join(sorted(self.declared))  # tools given: never empty
                    raise message_error(index, "assistant", f"call to tool {c.name!r}, which is "
                                        f"not among the declared tools ({known})")
        self.close_outputs()
        self.out.add(format_calls(calls), index, trained=True)

    def block(self, b: Block, index: int, k: int) -> None:
        if b.type == "tool_outputs":
            if self.open_outputs is not None:
                raise message_error(index, "assistant", f"block {k}: tool outputs given both as "
                                    "tool messages and as a tool_outputs block")
            self.out.add("[" + ", ".join(b.outputs) + "]", index)
        elif b.type == "tool_calls":
            self.calls(b.calls, index)
        elif b.type == "thoughts":
            self.close_outputs()
            if not self.in_inner:
                self.out.add(INNER_PREFIX, index, trained=True)
                self.in_inner = True
            self.out.add(b.text, index, trained=True)
        else:  # response
            self.close_outputs()
            if self.in_inner:
                self.out.add(INNER_SUFFIX, index, trained=True)
                self.in_inner = False
            self.out.add(b.text, index, trained=True)

    def finish(self, add_generation_prompt: bool) -> None:
        self.close_outputs()
        if self.in_turn:
            if not add_generation_prompt:
                self.close_turn()
        elif add_generation_prompt:
            self.out.add(ASSISTANT_START, None)


def _check_texts(msgs: Sequence[Message]) -> None:
    forbidden = APERTUS.forbidden_in_text
    everything = forbidden + tuple(t for t in APERTUS.special_tokens if t not in forbidden)
    for m in msgs:
        if m.role == "assistant":
            texts = [m.text or ""] + [b.text for b in m.blocks or ()]
            for t in texts:
                check_text(t, forbidden, m.index, m.role, "content")
            calls = [*m.tool_calls, *(c for b in m.blocks or () for c in b.calls)]
            for c in calls:
                check_text(c.arguments, forbidden, m.index, m.role, "tool-call arguments")
            for b in m.blocks or ():
                for out in b.outputs:
                    check_text(out, everything, m.index, m.role, "a tool output")
        else:
            check_text(m.text or "", everything, m.index, m.role, "content")


def segments(
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Any] | None = None,
    add_generation_prompt: bool = False,
    enable_thinking: bool = False,
    chat_date: _dt.date | str | None = None,
) -> list[Segment]:
    """Render a conversation in the Apertus format as labelled segments."""
    msgs = normalize(messages)
    _check_texts(msgs)
    declared = {s["name"] for s in function_schemas(tools)} if tools else None
    r = _Renderer(declared)
    r.out.add(BOS, None)
    if msgs[0].role == "system":
        r.out.add(SYSTEM_START + msgs[0].text + SYSTEM_END, 0)
        msgs = msgs[1:]
    else:
        r.out.add(SYSTEM_START + DEFAULT_SYSTEM.format(date=date_text(chat_date)) + SYSTEM_END, None)
    r.out.add(developer_block(tools, enable_thinking), None)
    check_opening(msgs)
    for m in msgs:
        getattr(r, m.role)(m)
        r.previous = m
    r.finish(add_generation_prompt)
    return r.out.segments
