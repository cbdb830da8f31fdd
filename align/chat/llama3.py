"""The Llama-3 header format as Lucie-7B-Instruct uses it (docs/method.md, The Apertus chat format; the Lucie-7B report)::

    <s><|start_header_id|>user<|end_header_id|>\\n\\n{text}\\n\\n<|eot_id|>
    <|start_header_id|>assistant<|end_header_id|>\\n\\n{text}\\n\\n<|eot_id|>

(one string; broken here for reading). Unlike Meta's Llama 3 the BOS is ``<s>`` and each
text is followed by a blank line before ``<|eot_id|>``. There is no default system text.

Trained on: assistant text plus the ``\\n\\n<|eot_id|>`` that ends it (what the model
generates until it stops); not on headers, system or user text. The format has no
tool-call or thought markup, so tools, tool messages, tool-call/thought blocks and
``enable_thinking`` are errors rather than silently dropped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from align.chat.formats import LLAMA3
from align.chat.messages import (
    check_text,
    normalize,
    plain_assistant_text,
    refuse_tools_and_thinking,
)
from align.chat.segments import Segment, Transcript


def header(role: str) -> str:
    """The header that opens a message of ``role``."""
    return f"<|start_header_id|>{role}<|end_header_id|>\n\n"


def segments(
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Any] | None = None,
    add_generation_prompt: bool = False,
    enable_thinking: bool = False,
    date: Any = None,
) -> list[Segment]:
    """Render a conversation in the Lucie/Llama-3 format (``date`` is unused: no default
    system text)."""
    msgs = normalize(messages)
    refuse_tools_and_thinking(tools, enable_thinking, msgs, LLAMA3.name)
    out = Transcript()
    out.add(LLAMA3.bos, None)
    for m in msgs:
        text = plain_assistant_text(m, LLAMA3.name) if m.role == "assistant" else m.text
        check_text(text, LLAMA3.forbidden_in_text, m.index, m.role, "content")
        out.add(header(m.role), m.index)
        out.add(text + LLAMA3.turn_end, m.index, trained=m.role == "assistant")
    if add_generation_prompt:
        out.add(header("assistant"), None)
    return out.segments
