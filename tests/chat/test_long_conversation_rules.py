"""A conversation far over the token budget is masked from the kept characters only.

``encode(..., max_tokens=N)`` tokenizes a bounded prefix of the rendered text; the loss mask
and the message spans are then read from the segments of that prefix. A 20 MB conversation
in an SFT mixture would otherwise build a per-character table of the whole text (hundreds of
megabytes) to mask its first N tokens. Here the table's length is recorded for conversations
whose long turns cross the cut or lie past it.
"""

from __future__ import annotations

import importlib

import pytest

from align.chat import encode, install_format
from align.testing.tiny import build_tokenizer

encode_module = importlib.import_module("align.chat.encode")  # `align.chat.encode` the name is the function

LONG = 300_000  # characters of each long turn
MAX_TOKENS = 64
BOUND = 20_000  # far above the prefix the first MAX_TOKENS tokens need, far below one long turn


def words(chars: int) -> str:
    return ("lorem ipsum dolor sit amet " * (chars // 27 + 1))[:chars]


@pytest.fixture(scope="module")
def tokenizer():
    tokenizer = build_tokenizer()
    install_format(tokenizer)
    return tokenizer


@pytest.fixture()
def tables(monkeypatch) -> list[int]:
    """The number of characters of every per-character mask table built."""
    lengths: list[int] = []
    real = encode_module._trained_prefix

    def counting(segments):
        lengths.append(sum(len(s.text) for s in segments))
        return real(segments)

    monkeypatch.setattr(encode_module, "_trained_prefix", counting)
    return lengths


@pytest.mark.parametrize("turns", [
    ["long", "long"],           # the cut inside the first long turn, a second one past it
    ["short", "long", "long"],  # the cut inside the second turn
    ["short", "short", "long", "long"],
], ids=["cut-in-first", "cut-in-second", "cut-late"])
def test_the_mask_of_a_cut_conversation_reads_only_the_kept_characters(tokenizer, tables, turns):
    roles = ["user", "assistant"] * 2
    conversation = [{"role": role, "content": words(LONG) if size == "long" else "Is 4 even?"}
                    for role, size in zip(roles, turns)]
    if conversation[-1]["role"] == "user":
        conversation.append({"role": "assistant", "content": "yes"})
    first = encode(tokenizer, conversation, max_tokens=MAX_TOKENS)
    assert len(first.input_ids) == MAX_TOKENS
    assert tables and max(tables) <= BOUND, tables
