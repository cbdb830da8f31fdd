"""The ChatML format::

    <|im_start|>system\\n{text}<|im_end|>\\n<|im_start|>user\\n{text}<|im_end|>\\n
    <|im_start|>assistant\\n{text}<|im_end|>\\n

(one string; broken here for reading). As in the original ChatML there is no BOS and no
default system text.

Trained on: assistant text plus ``<|im_end|>``; the newline after ``<|im_end|>`` is not
(generation stops at ``<|im_end|>``). ChatML has no agreed tool or thought markup, so
tools, tool messages, tool-call/thought blocks and ``enable_thinking`` are errors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from align.chat.formats import CHATML
from align.chat.messages import (
    check_text,
    normalize,
    plain_assistant_text,
    refuse_tools_and_thinking,
)
from align.chat.segments import Segment, Transcript


def header(role: str) -> str:
    """The line that opens a message of ``role``."""
    return f"<|im_start|>{role}\n"


def segments(
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Any] | None = None,
    add_generation_prompt: bool = False,
    enable_thinking: bool = False,
    date: Any = None,
) -> list[Segment]:
    """Render a conversation in ChatML (``date`` is unused: no default system text)."""
    msgs = normalize(messages)
    refuse_tools_and_thinking(tools, enable_thinking, msgs, CHATML.name)
    out = Transcript()
    for m in msgs:
        text = plain_assistant_text(m, CHATML.name) if m.role == "assistant" else m.text
        check_text(text, CHATML.forbidden_in_text, m.index, m.role, "content")
        out.add(header(m.role), m.index)
        out.add(text + CHATML.turn_end, m.index, trained=m.role == "assistant")
        out.add("\n", m.index)
    if add_generation_prompt:
        out.add(header("assistant"), None)
    return out.segments
