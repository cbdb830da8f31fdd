"""The registry of chat formats: which special tokens each one needs and how turns end.

Everything that must agree between rendering, token masks, the exported jinja template
and ``install_format`` (BOS, end-of-turn text, the tokens that must stay single tokens)
is read from here, so the three never drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from align.errors import ConfigError


@dataclass(frozen=True)
class ChatFormat:
    """One chat format.

    Attributes:
        name: registry key (``render(..., chat_format=name)``).
        bos: text the rendered conversation starts with, or ``None`` (ChatML has none).
        eos: the model's end-of-turn token; ``install_format`` makes it the tokenizer's
            and the model's EOS.
        turn_end: the text that closes a trained assistant turn (``eos`` plus any
            newlines the format puts before it); ``encode_completion`` appends it.
        special_tokens: every added token the format renders; each must be one token.
        structural_tokens: tokens that delimit turns. No message text may contain them,
            since they would be read as turn boundaries.
        supports_tools / supports_thinking: whether tool declarations, tool calls and
            thoughts have a rendering in this format (the others raise).
        stop_tokens: tokens a sampler should stop at. For Apertus this includes
            ``<|tools_suffix|>``: after a tool call the environment writes the output.
    """

    name: str
    bos: str | None
    eos: str
    turn_end: str
    special_tokens: tuple[str, ...]
    structural_tokens: tuple[str, ...]
    supports_tools: bool
    supports_thinking: bool
    stop_tokens: tuple[str, ...]

    @property
    def forbidden_in_text(self) -> tuple[str, ...]:
        """Token texts no message may contain: turn delimiters and the BOS."""
        return self.structural_tokens + ((self.bos,) if self.bos else ())


APERTUS = ChatFormat(
    name="apertus",
    bos="<s>",
    eos="<|assistant_end|>",
    turn_end="<|assistant_end|>",
    special_tokens=(
        "<|system_start|>",
        "<|system_end|>",
        "<|developer_start|>",
        "<|developer_end|>",
        "<|user_start|>",
        "<|user_end|>",
        "<|assistant_start|>",
        "<|assistant_end|>",
        "<|inner_prefix|>",
        "<|inner_suffix|>",
        "<|tools_prefix|>",
        "<|tools_suffix|>",
    ),
    structural_tokens=(
        "<|system_start|>",
        "<|system_end|>",
        "<|developer_start|>",
        "<|developer_end|>",
        "<|user_start|>",
        "<|user_end|>",
        "<|assistant_start|>",
        "<|assistant_end|>",
    ),
    supports_tools=True,
    supports_thinking=True,
    stop_tokens=("<|assistant_end|>", "<|tools_suffix|>"),
)

LLAMA3 = ChatFormat(
    name="llama3",
    bos="<s>",
    eos="<|eot_id|>",
    turn_end="\n\n<|eot_id|>",
    special_tokens=("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
    structural_tokens=("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
    supports_tools=False,
    supports_thinking=False,
    stop_tokens=("<|eot_id|>",),
)

CHATML = ChatFormat(
    name="chatml",
    bos=None,
    eos="<|im_end|>",
    turn_end="<|im_end|>",
    special_tokens=("<|im_start|>", "<|im_end|>"),
    structural_tokens=("<|im_start|>", "<|im_end|>"),
    supports_tools=False,
    supports_thinking=False,
    stop_tokens=("<|im_end|>",),
)

FORMATS: dict[str, ChatFormat] = {f.name: f for f in (APERTUS, LLAMA3, CHATML)}


def get_format(name: str) -> ChatFormat:
    """Look a format up by name; an unknown name lists the known ones."""
    try:
        return FORMATS[name]
    except (KeyError, TypeError):
        known = ", ".join(sorted(FORMATS))
        raise ConfigError(f"unknown chat format {name!r}; known formats: {known}") from None


STRUCTURE_TEXT = "special_token_text"  # the skip reason of a row whose text a format reads as structure


def structure_text_problem(value: Any, chat_format: str) -> str | None:
    """Why a row's text cannot be rendered in ``chat_format`` (a message, a system prompt, a tool
    declaration or call holding a token string the format reads as structure: a turn delimiter,
    the BOS, as ``<s>`` in HTML), or None. Every stage applies this one rule before it starts
    writing: such a prompt or conversation is a recorded skip with this reason, never an error
    mid-run (docs/bad-inputs.md, "Format tokens in text"). Formats this module does not define
    (a tokenizer's own template) are not checked here.
    """
    if chat_format not in FORMATS:
        return None
    fmt = FORMATS[chat_format]
    todo = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, str):
            for token in fmt.forbidden_in_text:
                if token in item:
                    return (f"{STRUCTURE_TEXT}: the text holds {token!r}, which the {fmt.name} format reads as "
                            "structure (a turn delimiter or BOS); the row is skipped, never rendered")
        elif isinstance(item, dict):
            todo.extend(item.values())
        elif isinstance(item, (list, tuple)):
            todo.extend(item)
    return None
