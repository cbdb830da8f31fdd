"""``render``: a conversation as the one string the model sees, in any registered format."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

from align.chat import apertus, headers
from align.chat.formats import get_format
from align.chat.segments import Segment

_RENDERERS: dict[str, Callable[..., list[Segment]]] = {
    "apertus": apertus.segments,
    "llama3": partial(headers.segments, style=headers.LLAMA3_HEADERS),
    "chatml": partial(headers.segments, style=headers.CHATML_HEADERS),
}


def render_segments(
    messages: Sequence[Mapping[str, Any]],
    *,
    chat_format: str = "apertus",
    tools: Sequence[Any] | None = None,
    add_generation_prompt: bool = False,
    enable_thinking: bool = False,
    chat_date: _dt.date | str | None = None,
) -> list[Segment]:
    """The rendered conversation as labelled segments (text, message index, trained)."""
    fmt = get_format(chat_format)
    return _RENDERERS[fmt.name](
        messages,
        tools=tools,
        add_generation_prompt=add_generation_prompt,
        enable_thinking=enable_thinking,
        chat_date=chat_date,
    )


def render(
    messages: Sequence[Mapping[str, Any]],
    *,
    chat_format: str = "apertus",
    tools: Sequence[Any] | None = None,
    add_generation_prompt: bool = False,
    enable_thinking: bool = False,
    chat_date: _dt.date | str | None = None,
) -> str:
    """Render a conversation to text, starting with the format's BOS.

    ``chat_date`` (a ``datetime.date`` or a ``YYYY-MM-DD`` string; default today) only feeds the
    Apertus default system text, used when the conversation has no system message. Bad
    input raises ``InputError`` (a ``ValueError``) naming the message index and the problem.
    """
    return "".join(
        s.text
        for s in render_segments(
            messages,
            chat_format=chat_format,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            enable_thinking=enable_thinking,
            chat_date=chat_date,
        )
    )
