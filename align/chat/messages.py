"""Normalise and validate conversations before any format renders them.

Datasets carry messages in several shapes (plain strings, the Apertus structured
content, OpenAI-style ``tool_calls`` and ``role: "tool"`` messages). Every shape is turned
into the same small typed form here, once, so renderers never guess. Anything that cannot
be rendered faithfully raises ``InputError`` (a ``ValueError``) naming the message index and the problem;
nothing is dropped silently.

Turn order, in every format (``check_opening``, ``check_follows``, applied by the
renderers): a conversation opens with a user message, after an optional system message;
an assistant message never directly follows another assistant message, except after one
whose last block is ``tool_outputs``. A tool call, its outputs and the answer are one
assistant turn in either of two shapes: assistant (with the calls), then ``tool``
messages, then assistant; or one assistant message whose blocks hold the calls, the
``tool_outputs`` and the response. Two assistant messages in a row otherwise were merged
silently into one turn; now they are an error naming the later message.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from align.errors import InputError

ROLES = ("system", "user", "assistant", "tool")
BLOCK_TYPES = ("thoughts", "tool_calls", "tool_outputs", "response")
# Fields other libraries use for an assistant's reasoning. They are refused rather than
# dropped: a silently lost chain of thought would change what the model is trained on.
REASONING_FIELDS = ("reasoning_content", "reasoning", "thinking")


def message_error(index: int, role: Any, problem: str) -> InputError:
    """The one error shape for bad input: ``message 3 (tool): <problem>``."""
    return InputError(f"message {index} ({role}): {problem}")


@dataclass(frozen=True)
class ToolCall:
    """One call: the tool name and its arguments as the JSON object text that is rendered."""

    name: str
    arguments: str


@dataclass(frozen=True)
class Block:
    """One block of structured assistant content (see ``BLOCK_TYPES``)."""

    type: str
    text: str = ""
    calls: tuple[ToolCall, ...] = ()
    outputs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Message:
    """A validated message.

    ``text`` holds system, user and tool text and string assistant content; ``blocks``
    holds structured assistant content; an assistant message has at most one of the two
    (neither when it only carries OpenAI-style ``tool_calls`` with empty content).
    """

    index: int
    role: str
    text: str | None = None
    blocks: tuple[Block, ...] | None = None
    tool_calls: tuple[ToolCall, ...] = ()


def json_text(value: Any) -> str:
    """Serialise non-string tool payloads the way the jinja ``tojson`` filter does."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def make_call(name: Any, arguments: Any, where: str) -> ToolCall:
    """Validate one tool call; arguments may be a dict or a JSON object string."""
    if not isinstance(name, str) or not name:
        raise InputError(f"{where}: tool call name must be a non-empty string, got {name!r}")
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except (json.JSONDecodeError, RecursionError) as err:
            raise InputError(
                f"{where}: arguments of the call to {name!r} are not valid JSON ({err}): "
                f"{arguments!r}"
            ) from None
        if not isinstance(parsed, dict):
            raise InputError(
                f"{where}: arguments of the call to {name!r} must be a JSON object, "
                f"got {type(parsed).__name__}: {arguments!r}"
            )
        return ToolCall(name, arguments)
    if isinstance(arguments, Mapping):
        return ToolCall(name, json.dumps(dict(arguments), ensure_ascii=False))
    raise InputError(
        f"{where}: arguments of the call to {name!r} must be a JSON object string or a dict, "
        f"got {type(arguments).__name__}"
    )


def _system_text(content: Any, index: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Mapping) and isinstance(content.get("text"), str):
        return content["text"]
    raise message_error(index, "system", 'content must be a string or {"text": str}')


def _user_text(content: Any, index: int) -> str:
    if isinstance(content, str):
        return content
    if not (isinstance(content, Mapping) and isinstance(content.get("parts"), list)):
        raise message_error(
            index, "user", 'content must be a string or {"parts": [{"type": "text", "text": str}]}'
        )
    texts = []
    for k, part in enumerate(content["parts"]):
        if not isinstance(part, Mapping) or part.get("type") != "text":
            kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
            raise message_error(index, "user", f"part {k} has type {kind!r}; only 'text' parts")
        if not isinstance(part.get("text"), str):
            raise message_error(index, "user", f"part {k} has no string 'text'")
        texts.append(part["text"])
    return "".join(texts)


def _tool_text(content: Any, index: int) -> str:
    if content is None:
        raise message_error(index, "tool", "tool message has no content")
    return json_text(content)


def _block(raw: Any, index: int, k: int) -> Block:
    where = f"message {index} (assistant): block {k}"
    if not isinstance(raw, Mapping):
        raise InputError(f"{where} must be a mapping with a 'type', got {type(raw).__name__}")
    kind = raw.get("type")
    if kind in ("thoughts", "response"):
        if not isinstance(raw.get("text"), str):
            raise InputError(f"{where} ({kind}) needs a string 'text'")
        return Block(kind, text=raw["text"])
    if kind == "tool_calls":
        calls = raw.get("calls")
        if not isinstance(calls, list) or not calls:
            raise InputError(f"{where} (tool_calls) needs a non-empty list 'calls'")
        for c in calls:
            if not isinstance(c, Mapping):
                raise InputError(f"{where} (tool_calls): each call must be a mapping")
        return Block(kind, calls=tuple(make_call(c.get("name"), c.get("arguments"), where)
                                       for c in calls))
    if kind == "tool_outputs":
        outputs = raw.get("outputs")
        if not isinstance(outputs, list) or not outputs:
            raise InputError(f"{where} (tool_outputs) needs a non-empty list 'outputs'")
        texts = []
        for o in outputs:
            if isinstance(o, Mapping) and "output" in o and o["output"] is not None:
                texts.append(json_text(o["output"]))
            elif isinstance(o, str):
                texts.append(o)
            else:
                raise InputError(f"{where} (tool_outputs): each output must be a string or "
                                 '{"output": ...}')
        return Block(kind, outputs=tuple(texts))
    raise InputError(
        f"{where} has unknown block type {kind!r}; known types: {', '.join(BLOCK_TYPES)}"
    )


def _openai_calls(raw: Any, index: int) -> tuple[ToolCall, ...]:
    where = f"message {index} (assistant): tool_calls"
    if not isinstance(raw, list):
        raise InputError(f"{where} must be a list")
    calls = []
    for k, call in enumerate(raw):
        if not isinstance(call, Mapping):
            raise InputError(f"{where}[{k}] must be a mapping")
        if call.get("type", "function") != "function":
            raise InputError(f"{where}[{k}] has type {call.get('type')!r}; only 'function'")
        fn = call.get("function")
        if not isinstance(fn, Mapping):
            raise InputError(f"{where}[{k}] needs a 'function' with 'name' and 'arguments'")
        calls.append(make_call(fn.get("name"), fn.get("arguments"), f"{where}[{k}]"))
    return tuple(calls)


def _assistant(raw: Mapping, index: int) -> Message:
    for field in REASONING_FIELDS:
        if raw.get(field) is not None:
            raise message_error(index, "assistant", f"field {field!r} is not rendered; put the "
                                'reasoning in a {"type": "thoughts"} block instead')
    calls = _openai_calls(raw["tool_calls"], index) if raw.get("tool_calls") else ()
    content = raw.get("content")
    if content is None:
        if not calls:
            raise message_error(index, "assistant", "message has neither content nor tool_calls")
        return Message(index, "assistant", tool_calls=calls)
    if isinstance(content, str):
        return Message(index, "assistant", text=content, tool_calls=calls)
    if isinstance(content, Mapping) and isinstance(content.get("blocks"), list):
        blocks = tuple(_block(b, index, k) for k, b in enumerate(content["blocks"]))
        return Message(index, "assistant", blocks=blocks, tool_calls=calls)
    raise message_error(index, "assistant", 'content must be a string or {"blocks": [...]}')


def normalize(messages: Sequence[Mapping[str, Any]]) -> list[Message]:
    """Validate a conversation and return its messages in typed form.

    Checks each message on its own (role, content shape, tool-call JSON); checks that
    depend on the sequence (tool messages inside an assistant turn, mixed content in one
    turn) belong to the renderers, which track turns.
    """
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise InputError(f"a conversation must be a list of messages, got {type(messages).__name__}")
    if not messages:
        raise InputError("conversation is empty: nothing to render")
    out = []
    for i, raw in enumerate(messages):
        if not isinstance(raw, Mapping):
            raise InputError(f"message {i}: must be a mapping with 'role' and 'content', "
                             f"got {type(raw).__name__}")
        role = raw.get("role")
        if role not in ROLES:
            hint = ("; the developer block is generated from tools/enable_thinking"
                    if role == "developer" else "")
            raise message_error(i, role, f"unknown role {role!r}; known roles: "
                                f"{', '.join(ROLES)}{hint}")
        if role == "system":
            if i != 0:
                raise message_error(i, role, "a system message is only allowed at index 0")
            out.append(Message(i, role, text=_system_text(raw.get("content"), i)))
        elif role == "user":
            out.append(Message(i, role, text=_user_text(raw.get("content"), i)))
        elif role == "tool":
            out.append(Message(i, role, text=_tool_text(raw.get("content"), i)))
        else:
            out.append(_assistant(raw, i))
    return out


def check_opening(msgs: Sequence[Message]) -> None:
    """A conversation opens with a user turn (after an optional system message).

    An opening assistant message has no request to answer: rendered, it would sit right
    after the system block as if the model spoke unprompted, which no prompt the model is
    served ever looks like. It is an error, not rendered as given.
    """
    first = next((m for m in msgs if m.role != "system"), None)
    if first is not None and first.role == "assistant":
        raise message_error(first.index, "assistant", "the conversation opens with an assistant message; it must "
                            "start with a user message (after an optional system message)")


def check_follows(previous: Message | None, m: Message) -> None:
    """An assistant message directly after another one is an error, unless the earlier one
    ends with its tool outputs (a ``tool_outputs`` block): two assistant messages in a row
    would otherwise be rendered as one turn (Apertus) or as two replies to one request."""
    if previous is None or previous.role != "assistant" or m.role != "assistant":
        return
    if previous.blocks and previous.blocks[-1].type == "tool_outputs":
        return
    raise message_error(m.index, "assistant", f"follows assistant message {previous.index} with no user or tool "
                        "message between them; join the two into one message, or put the tool outputs between them")


def check_text(text: str, forbidden: Sequence[str], index: int, role: str, what: str) -> None:
    """Refuse text that contains a token string which would be read as format structure."""
    for token in forbidden:
        if token in text:
            raise message_error(index, role, f"{what} contains the special token {token!r}, "
                                "which would be tokenized as format structure")


def plain_assistant_text(m: Message, format_name: str) -> str:
    """Assistant text for formats without tool or thought markup.

    String content, or blocks that are all ``response`` (joined). Anything that needs
    markup the format lacks is an error rather than being dropped.
    """
    if m.tool_calls:
        raise message_error(m.index, m.role, f"tool calls cannot be rendered in format "
                            f"{format_name!r}; use chat_format='apertus'")
    if m.blocks is None:
        return m.text or ""
    for k, b in enumerate(m.blocks):
        if b.type != "response":
            raise message_error(m.index, m.role, f"block {k} ({b.type}) cannot be rendered in "
                                f"format {format_name!r}; use chat_format='apertus'")
    return "".join(b.text for b in m.blocks)


def refuse_tools_and_thinking(
    tools: Any, enable_thinking: bool, msgs: Sequence[Message], format_name: str
) -> None:
    """Formats without tools/thinking refuse them instead of ignoring them silently."""
    if tools:
        raise InputError(f"format {format_name!r} has no tool declarations; use "
                         "chat_format='apertus' or pass tools=None")
    if enable_thinking:
        raise InputError(f"format {format_name!r} has no thinking mode; use chat_format='apertus' "
                         "or pass enable_thinking=False")
    for m in msgs:
        if m.role == "tool":
            raise message_error(m.index, m.role, f"tool messages cannot be rendered in format "
                                f"{format_name!r}; use chat_format='apertus'")
