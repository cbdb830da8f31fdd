"""A conversation far over max_length is tokenized only as far as max_length needs.

A 20 MB conversation in an SFT mixture was dropped correctly (its assistant turn lies past
max_length) but only after all of it was tokenized: gigabytes of token offsets and minutes
for one row. Here every tokenizer call is recorded: a row of a million characters is decided
from a prefix of a few thousand, and what is kept equals the whole text's first max_length
tokens exactly.
"""

from __future__ import annotations

import importlib
import json

import pytest
from datasets import Dataset

from align.chat import encode, install_format
from align.chat.encode import PREFIX_CHARS_PER_TOKEN, PREFIX_MARGIN, first_tokens
from align.trainers.sft_data import encode_sft_row, prepare_sft_dataset

encode_module = importlib.import_module("align.chat.encode")  # `align.chat.encode` the name is the function

DATE = "2025-01-01"
MAX_LENGTH = 128  # the short rows' 74 tokens (the default system text) fit
HUGE = 1_000_000  # characters of the long turn


@pytest.fixture()
def chat_tok(tokenizer):
    install_format(tokenizer)
    return tokenizer


@pytest.fixture()
def tokenized(monkeypatch) -> list[int]:
    """The length of every text align.chat tokenizes, in order."""
    lengths: list[int] = []
    real = encode_module.tokenize

    def counting(tokenizer, text):
        lengths.append(len(text))
        return real(tokenizer, text)

    monkeypatch.setattr(encode_module, "tokenize", counting)
    return lengths


def row(rid: str, user: str, answer: str) -> dict:
    return {"id": rid, "messages": json.dumps([{"role": "user", "content": user},
                                              {"role": "assistant", "content": answer}])}


def words(chars: int) -> str:
    return ("lorem ipsum dolor sit amet " * (chars // 27 + 1))[:chars]


def test_a_huge_row_past_max_length_is_dropped_from_a_bounded_prefix(chat_tok, tokenized):
    """Its assistant turn lies past max_length: dropped, as before, with the other row kept; no
    tokenizer call saw more than a few times max_length x PREFIX_CHARS_PER_TOKEN characters."""
    data = Dataset.from_list([row("short", "Is 4 even?", "yes"), row("huge", words(HUGE), "ok")])
    out = prepare_sft_dataset(data, chat_tok, chat_date=DATE, max_length=MAX_LENGTH)
    assert len(out) == 1 and len(out[0]["input_ids"]) < MAX_LENGTH  # the short row alone
    assert max(tokenized) <= 4 * MAX_LENGTH * PREFIX_CHARS_PER_TOKEN < HUGE / 100, tokenized


def test_the_drop_is_reported_with_its_reason(chat_tok, tokenized, caplog):
    data = Dataset.from_list([row("short", "Is 4 even?", "yes"), row("huge", words(HUGE), "ok")])
    with caplog.at_level("WARNING", logger="align.trainers.sft_data"):
        prepare_sft_dataset(data, chat_tok, chat_date=DATE, max_length=MAX_LENGTH)
    assert "dropped 1 of 2 rows whose trained tokens all lie beyond max_length=128" in caplog.text


def test_a_long_row_kept_gets_the_whole_texts_first_tokens(chat_tok, tokenized):
    """A short question with a huge answer: truncated, not dropped; its ids and labels are the
    first max_length of the whole conversation's, though only a prefix was tokenized."""
    long = row("long", "Write a lot.", words(HUGE // 10))
    whole = encode(chat_tok, json.loads(long["messages"]), chat_date=DATE)
    tokenized.clear()
    got = encode_sft_row(long, chat_tok, chat_date=DATE, max_length=MAX_LENGTH)
    assert got["input_ids"] == whole.input_ids[:MAX_LENGTH]
    assert got["labels"] == [t if m else -100 for t, m in zip(whole.input_ids, whole.loss_mask)][:MAX_LENGTH]
    assert max(tokenized) < HUGE / 100


def test_a_row_within_the_limit_is_encoded_as_before(chat_tok, tokenized):
    """A conversation shorter than the prefix is tokenized whole, once: the same ids and labels."""
    short = row("short", "Is 4 even?", "yes, it is")
    assert encode_sft_row(short, chat_tok, chat_date=DATE, max_length=MAX_LENGTH) == \
        encode_sft_row(short, chat_tok, chat_date=DATE)
    assert len(tokenized) == 2  # once each


def test_first_tokens_grows_the_prefix_until_it_holds_the_margin(chat_tok, tokenized):
    """Text whose tokens each cover many characters: the prefix doubles until it holds
    max_tokens + PREFIX_MARGIN tokens, and the ids are the whole text's first ones."""
    text = "the " * 5000  # about 3.3 characters a token in the tiny vocabulary
    chars, ids, offsets = first_tokens(chat_tok, text, 16)
    assert ids == chat_tok(text, add_special_tokens=False)["input_ids"][:16] and len(offsets) == 16
    assert len(tokenized) > 1 and tokenized == [16 * PREFIX_CHARS_PER_TOKEN * 2**k for k in range(len(tokenized))]
    assert chars == tokenized[-1] < len(text)
    assert len(chat_tok(text[:chars], add_special_tokens=False)["input_ids"]) >= 16 + PREFIX_MARGIN


def test_a_models_own_template_is_tokenized_as_far_as_needed(tokenized):
    """``chat_format: tokenizer`` takes the same bounded path: the whole text's first tokens."""
    from align.testing.tiny import build_template_tokenizer

    own = build_template_tokenizer("qwen3")
    long = row("long", "Write a lot.", words(HUGE // 10))
    whole = encode(own, json.loads(long["messages"]), chat_format="tokenizer")
    tokenized.clear()
    got = encode_sft_row(long, own, chat_format="tokenizer", max_length=MAX_LENGTH)
    assert got["input_ids"] == whole.input_ids[:MAX_LENGTH]
    assert got["labels"] == [t if m else -100 for t, m in zip(whole.input_ids, whole.loss_mask)][:MAX_LENGTH]
    assert any(label != -100 for label in got["labels"]) and max(tokenized) < HUGE / 100
