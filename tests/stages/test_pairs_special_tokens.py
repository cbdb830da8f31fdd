"""A sampled completion holding a chat format's structure token is never paired.

A small model sometimes samples the text of a format token (``<|system_end|>``); such a
completion passes sampling and annotation, but the log-prob pass and the trainer cannot
encode it (``align.chat.encode_completion`` refuses it), so one of them in a pair aborted
a whole log-prob shard or the trainer's data preparation. The pairs stage now leaves it
out and records it in ``skipped.jsonl`` with ``special_token_text`` and its index; its
reward still counts as a reference.
"""

from __future__ import annotations

import pytest

from align.chat import encode_completion, install_format
from align.chat.formats import FORMATS
from align.data.pairs import make_pairs, special_token_problem
from align.scoring import encode_record
from align.testing.tiny import build_tokenizer
from tests.stages.test_pairs_stage import annotated, run_pairs


def with_text(record: dict, index: int, text: str) -> dict:
    record["completions"][index]["text"] = text
    return record


def test_a_completion_with_a_structure_token_is_never_paired_and_is_recorded(tmp_path):
    # the best reward belongs to the completion the trainer could not encode
    record = with_text(annotated("a", [0.0, 1.0, 2.0, 3.0]), 3, "4 5 6<|system_end|> 7")
    summary, pairs, skips = run_pairs(tmp_path, [record, annotated("b", [0.0, 1.0])])
    assert [p["id"] for p in pairs] == ["a", "b"]
    assert all("<|system_end|>" not in p["chosen"] + p["rejected"] for p in pairs)
    assert pairs[0]["num_ref_rewards"] == 4  # its reward still counts as a reference
    assert pairs[0]["chosen_quantile"] < 1.0  # so the best pairable completion is not above every reference
    assert skips == [{"id": "a", "reason": "special_token_text: 1 completions left out; the prompt was still paired",
                      "left_out": [{"completion": 3, "reason": "special_token_text: contains '<|system_end|>', which "
                                    "the apertus format reads as structure"}], "paired": True}]
    assert summary["special_token_text"] == 1 and summary["skipped"] == 0 and summary["pairs"] == 2

    tokenizer = build_tokenizer()
    install_format(tokenizer, chat_format="apertus")
    for row in pairs:  # what the log-prob pass and the trainer do with every row: no RecordError
        encode_record(tokenizer, row, chat_format="apertus", chat_date="2026-01-01")


def test_a_prompt_left_without_a_pair_says_why(tmp_path):
    record = with_text(annotated("a", [0.0, 1.0]), 1, "<|user_start|>hi")
    summary, pairs, skips = run_pairs(tmp_path, [record])
    assert pairs == []
    assert len(skips) == 1 and skips[0]["id"] == "a" and "paired" not in skips[0]
    assert skips[0]["reason"].endswith("(1 completions excluded: special_token_text)")
    assert skips[0]["left_out"] == [{"completion": 1, "reason": "special_token_text: contains '<|user_start|>', "
                                     "which the apertus format reads as structure"}]
    assert summary["skipped"] == 1 and summary["special_token_text"] == 1


def test_markup_a_completion_may_carry_is_kept():
    """Tool-call and thought markers are completion text, not structure."""
    for text in ("<|tools_prefix|>[{\"calc\": {}}]<|tools_suffix|>", "<|inner_prefix|>think<|inner_suffix|>ok"):
        assert special_token_problem(text, "apertus") is None


def test_the_format_key_follows_the_trainer_and_none_turns_the_check_off():
    record = with_text(annotated("a", [0.0, 1.0, 2.0]), 2, "x<|im_end|>y")
    pairs, skips = make_pairs([record], seed=0, chat_format="apertus")
    assert pairs[0]["chosen"] == "x<|im_end|>y" and skips == []  # plain text in the Apertus format
    pairs, skips = make_pairs([record], seed=0, chat_format="chatml")
    assert pairs[0]["chosen"] != "x<|im_end|>y" and skips[0]["left_out"][0]["completion"] == 2
    pairs, skips = make_pairs([record], seed=0, chat_format=None)
    assert pairs[0]["chosen"] == "x<|im_end|>y" and skips == []
    with pytest.raises(ValueError, match="unknown chat format 'nope'"):
        make_pairs([record], seed=0, chat_format="nope")


@pytest.mark.parametrize("chat_format", sorted(FORMATS))
def test_the_check_is_the_encoders(chat_format):
    """Every text the pairs check refuses, the encoder refuses, and what it keeps encodes."""
    fmt = FORMATS[chat_format]
    tokenizer = build_tokenizer(special_tokens=list(fmt.special_tokens))
    install_format(tokenizer, chat_format=chat_format)
    prompt = [{"role": "user", "content": "sort 3 1 2"}]
    for token in (*fmt.special_tokens, *((fmt.bos,) if fmt.bos else ())):
        for text in (f"1 2 {token} 3", f"1 2 3{token}"):
            refused = special_token_problem(text, chat_format) is not None
            try:
                encode_completion(tokenizer, prompt, text, chat_format=chat_format, chat_date="2026-01-01")
                encodes = True
            except ValueError:
                encodes = False
            assert refused == (not encodes), (chat_format, text)
