"""SFT data hygiene: \\boxed{} stripping and the identity filter (docs/method.md, Supervised fine-tuning)."""

from __future__ import annotations

import pytest
from datasets import Dataset

from align.data.records import RecordError
from align.trainers.sft_hygiene import (
    filter_identity,
    identity_claim,
    strip_boxed,
    strip_boxed_dataset,
    strip_boxed_messages,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"The answer is $\boxed{42}$.", "The answer is $42$."),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed {x^{2}} and \boxed{y}", "x^{2} and y"),
        (r"\boxed{\boxed{7}}", "7"),
        (r"\boxed{\{a\}}", r"\{a\}"),
        ("no box here", "no box here"),
    ],
)
def test_strip_boxed_keeps_the_content(text, expected):
    assert strip_boxed(text) == expected


@pytest.mark.parametrize("text", [r"\boxed{1", r"\boxed 1", r"ends with \boxed"])
def test_strip_boxed_refuses_unbalanced_boxes(text):
    with pytest.raises(ValueError, match="boxed"):
        strip_boxed(text)


def test_only_assistant_responses_are_stripped():
    messages = [
        {"role": "user", "content": r"Put the answer in \boxed{}."},
        {
            "role": "assistant",
            "content": {
                "blocks": [
                    {"type": "thoughts", "text": r"I will write \boxed{4}"},
                    {"type": "response", "text": r"It is $\boxed{4}$."},
                ]
            },
        },
        {"role": "assistant", "content": r"\boxed{5}"},
    ]
    out = strip_boxed_messages(messages)
    assert out[0] == messages[0]
    assert out[1]["content"]["blocks"] == [
        {"type": "thoughts", "text": r"I will write \boxed{4}"},
        {"type": "response", "text": "It is $4$."},
    ]
    assert out[2]["content"] == "5"
    assert messages[2]["content"] == r"\boxed{5}"  # input left untouched


def test_strip_boxed_dataset_names_the_bad_record():
    data = Dataset.from_list(
        [
            {
                "id": "a",
                "messages": [
                    {"role": "user", "content": "q"},
                    {"role": "assistant", "content": r"\boxed{1}"},
                ],
            },
            {
                "id": "b",
                "messages": [
                    {"role": "user", "content": "q"},
                    {"role": "assistant", "content": r"\boxed{1"},
                ],
            },
        ]
    )
    assert strip_boxed_dataset(data.select([0]))[0]["messages"][1]["content"] == "1"
    with pytest.raises(RecordError, match=r"'b'.*messages\[1\]\.content"):
        strip_boxed_dataset(data)


def _chat(answer: str, question: str = "Who are you?") -> list[dict]:
    return [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]


@pytest.mark.parametrize(
    "answer, keyword",
    [
        ("I am ChatGPT, a model trained by OpenAI.", "ChatGPT"),
        ("As a language model developed by Anthropic, I cannot.", "Anthropic"),
        ("I'm based on GPT-3.5.", "GPT-3.5"),
        ("Je suis LLaMA.", "LLaMA"),
    ],
)
def test_identity_claims_are_found_with_the_keyword(answer, keyword):
    reason = identity_claim(_chat(answer))
    assert reason is not None and repr(keyword) in reason and "messages[1].content" in reason


@pytest.mark.parametrize(
    "answer",
    [
        "I am Apertus, an open model.",
        "Claudette and Bardot are names.",  # whole words only
        "The GPT-4o-mini tokenizer",  # a longer name is not 'GPT-4'
    ],
)
def test_clean_answers_pass(answer):
    assert identity_claim(_chat(answer)) is None


def test_user_text_naming_a_model_is_not_a_claim():
    assert identity_claim(_chat("I am a helpful assistant.", question="Are you ChatGPT?")) is None


def test_filter_identity_returns_dropped_rows_with_reasons():
    data = Dataset.from_list(
        [
            {"id": "keep", "messages": _chat("I am an assistant.")},
            {"id": "drop", "messages": _chat("Hello! I am Claude.")},
            {"id": "keep2", "messages": _chat("Sure.")},
        ]
    )
    kept, dropped = filter_identity(data)
    assert kept["id"] == ["keep", "keep2"]
    assert dropped["id"] == ["drop"] and dropped["row_index"] == [1]
    assert dropped["drop_reason"] == [
        "messages[1].content names another model or its maker: 'Claude'"
    ]
    kept, dropped = filter_identity(data, keywords=["assistant"])
    assert kept["id"] == ["drop", "keep2"] and dropped["id"] == ["keep"]
