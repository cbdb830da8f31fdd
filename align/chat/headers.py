"""Header formats: each message is a role header, its text and the format's turn end, with
no tool or thought markup. Llama-3 (as Lucie-7B uses it) and ChatML are this one renderer
with two ``HeaderFormat`` settings (one string each; broken here for reading)::

    llama3:  <s><|start_header_id|>user<|end_header_id|>\\n\\n{text}\\n\\n<|eot_id|>
             <|start_header_id|>assistant<|end_header_id|>\\n\\n{text}\\n\\n<|eot_id|>

    chatml:  <|im_start|>system\\n{text}<|im_end|>\\n<|im_start|>user\\n{text}<|im_end|>\\n
             <|im_start|>assistant\\n{text}<|im_end|>\\n

Llama-3 follows the Lucie-7B report (docs/method.md, The Apertus chat format): unlike
Meta's Llama 3 the BOS is ``<s>`` and each text is followed by a blank line before
``<|eot_id|>``. ChatML, as the original, has no BOS. Neither has a default system text.

Turn order as in every format (``align.chat.messages``): a user message first (after an
optional system message), never two assistant messages in a row.

Trained on: assistant text plus the format's ``turn_end`` (``\\n\\n<|eot_id|>``,
``<|im_end|>``: what the model generates until it stops); not on headers, system or user
text, nor on the newline ChatML puts after ``<|im_end|>``. Tools, tool messages,
tool-call/thought blocks and ``enable_thinking`` are errors rather than silently dropped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from align.chat.formats import CHATML, LLAMA3, ChatFormat
from align.chat.messages import (
    check_follows,
    check_opening,
    check_text,
    normalize,
    plain_assistant_text,
    refuse_tools_and_thinking,
)
from align.chat.segments import Segment, Transcript


@dataclass(frozen=True)
class HeaderFormat:
    """How one header format writes a message.

    format: the registry entry (BOS, turn end, structural tokens).
    header: the text that opens a message, with ``{role}`` in it.
    after_turn: untrained text after the turn end (ChatML's newline), or "".
    """

    format: ChatFormat
    header: str
    after_turn: str = ""

    def header_for(self, role: str) -> str:
        """The header that opens a message of ``role``."""
        return self.header.format(role=role)


LLAMA3_HEADERS = HeaderFormat(LLAMA3, "<|start_header_id|>{role}<|end_header_id|>\n\n")
CHATML_HEADERS = HeaderFormat(CHATML, "<|im_start|>{role}\n", after_turn="\n")


def segments(
    messages: Sequence[Mapping[str, Any]],
    *,
    style: HeaderFormat,
    tools: Sequence[Any] | None = None,
    add_generation_prompt: bool = False,
    enable_thinking: bool = False,
    chat_date: Any = None,
) -> list[Segment]:
    """Render a conversation in a header format (``chat_date`` is unused: no default system text)."""
    fmt = style.format
    msgs = normalize(messages)
    refuse_tools_and_thinking(tools, enable_thinking, msgs, fmt.name)
    check_opening(msgs)
    out = Transcript()
    if fmt.bos:
        out.add(fmt.bos, None)
    for previous, m in zip([None, *msgs], msgs):
        check_follows(previous, m)
        text = plain_assistant_text(m, fmt.name) if m.role == "assistant" else m.text
        check_text(text, fmt.forbidden_in_text, m.index, m.role, "content")
        out.add(style.header_for(m.role), m.index)
        out.add(text + fmt.turn_end, m.index, trained=m.role == "assistant")
        if style.after_turn:
            out.add(style.after_turn, m.index)
    if add_generation_prompt:
        out.add(style.header_for("assistant"), None)
    return out.segments
