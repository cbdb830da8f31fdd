"""Rendered text as labelled pieces: which message each piece belongs to, and whether it
is trained on.

Renderers emit segments instead of a bare string so that the loss mask and the per-message
spans are read off the same pieces that make up the text; nothing is re-rendered or
tokenized piecewise to find boundaries.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Segment:
    """A piece of rendered text.

    ``index`` is the message it belongs to (``None`` for text no message produced: BOS,
    the default system text, the developer block, a generation prompt). ``trained`` marks
    text the model learns to produce.
    """

    text: str
    index: int | None
    trained: bool = False


class Transcript:
    """An append-only list of segments; empty pieces are dropped."""

    def __init__(self) -> None:
        self.segments: list[Segment] = []

    def add(self, text: str, index: int | None, trained: bool = False) -> None:
        if text:
            self.segments.append(Segment(text, index, trained))

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.segments)
