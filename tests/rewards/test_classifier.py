"""Controversy classifier: JSON validation, retries, recorded failures, the real tiny model."""

from __future__ import annotations

import json

import pytest
from reward_cases import prompt

from align.data.records import RecordError
from rewards.classifier import ControversyClassifier, classify_records, parse_answer
from rewards.generation import Generator


def answer(label, reasoning="Values shape the answer.") -> str:
    return json.dumps({"reasoning": reasoning, "classification": label})


def scripted(*rounds):
    """A generator that answers round by round (each round: one answer per pending prompt)."""
    seen: list[list] = []

    def generate(conversations, seed=0):
        seen.append(conversations)
        generate.seeds.append(seed)
        replies = rounds[len(seen) - 1]
        return [replies(c) if callable(replies) else replies for c in conversations]

    generate.seeds = []
    return generate, seen


@pytest.mark.parametrize(
    ("text", "label"),
    [
        (answer("3"), 3),
        ("  " + answer("0") + "\n", 0),
        ("```json\n" + answer("2") + "\n```", 2),
        (json.dumps({"reasoning": "r", "classification": 1}), 1),
    ],
)
def test_valid_answers(text, label):
    assert parse_answer(text)[0] == label


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("Sure! This is a 2.", "not valid JSON"),
        ('{"reasoning": "r", "classification": "Low"}', "classification must be one of"),
        ('{"reasoning": "r", "classification": "4"}', "classification must be one of"),
        ('{"reasoning": "r", "classification": true}', "classification must be one of"),
        ('{"classification": "1"}', "reasoning must be a string"),
        ('["0"]', "expected a JSON object"),
        ('Here you go: {"reasoning": "r", "classification": "1"}', "not valid JSON"),
    ],
)
def test_invalid_answers_say_why(text, problem):
    with pytest.raises(ValueError, match=problem):
        parse_answer(text)


def test_invalid_then_valid_answer_is_retried():
    generate, seen = scripted(lambda c: "not json", lambda c: answer("2"))
    verdict = ControversyClassifier(generate).classify([prompt("Should taxes be higher?")])[0]
    assert (verdict.label, verdict.attempts, verdict.error) == (2, 2, None)
    assert verdict.raw == ["not json", answer("2")]
    assert len(seen) == 2 and generate.seeds == [0, 1]  # attempt k is asked with seed k: a sampled retry draws anew


def test_only_failed_prompts_are_asked_again():
    generate, seen = scripted(lambda c: answer("0") if "2+2" in c[1]["content"] else "{", lambda c: answer("3"))
    verdicts = ControversyClassifier(generate).classify([prompt("What is 2+2?"), prompt("Is eating meat wrong?")])
    assert [v.label for v in verdicts] == [0, 3]
    assert len(seen[1]) == 1 and "meat" in seen[1][0][1]["content"]


def test_always_invalid_is_recorded_as_failed_never_guessed():
    generate, seen = scripted(*[lambda c: '{"classification": "2"}'] * 3)
    classifier = ControversyClassifier(generate, max_attempts=3)
    record = {"id": "p1", "messages": prompt("Is nuclear power good?")}
    out = classifier.annotate_records([record])[0]
    assert out["controversy_label"] is None and out["controversial"] is None
    assert out["controversy_attempts"] == 3 and len(out["controversy_raw"]) == 3
    assert "reasoning must be a string" in out["controversy_error"]
    assert len(seen) == 3


@pytest.mark.parametrize(("label", "threshold", "controversial"), [("2", 2, True), ("2", 3, False), ("1", 2, False), ("3", 2, True)])
def test_threshold_is_a_setting(label, threshold, controversial):
    generate, _ = scripted(lambda c: answer(label))
    out = ControversyClassifier(generate, threshold=threshold).annotate_records([{"id": "a", "messages": prompt("Q?")}])
    assert out[0]["controversial"] is controversial and out[0]["controversy_label"] == int(label)


def test_prompt_carries_system_prompt_and_first_user_turn():
    generate, seen = scripted(lambda c: answer("1"))
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "How do I write a cover letter?"},
        {"role": "assistant", "content": "Start with..."},
        {"role": "user", "content": "LATER-TURN"},
    ]
    ControversyClassifier(generate).classify([messages])
    system, user = seen[0][0]
    assert system["role"] == "system" and '"classification"' in system["content"]
    assert "Be brief." in user["content"] and "How do I write a cover letter?" in user["content"]
    assert "LATER-TURN" not in user["content"]


def test_bad_records_are_named():
    generate, _ = scripted(lambda c: answer("1"))
    classifier = ControversyClassifier(generate)
    with pytest.raises(RecordError, match="record 'x': field 'messages'"):
        classifier.annotate_records([{"id": "x", "messages": []}])
    with pytest.raises(RecordError, match="record 'y': field 'messages'.*content"):
        classifier.annotate_records([{"id": "y", "messages": [{"role": "user", "content": 5}]}])


def test_real_tiny_model_answers_are_recorded_failures(judge_lm, chat_tokenizer):
    from align.sampling.hf import TransformersSampler

    sampler = TransformersSampler(judge_lm, chat_tokenizer, chat_format="tokenizer", batch_size=2)
    generate = Generator(sampler, max_tokens=12)
    classifier = ControversyClassifier(generate, max_attempts=2)
    records = [{"id": "a", "messages": prompt("What is 2+2?")}, {"id": "b", "messages": prompt("Is war ever just?")}]
    out = classifier.annotate_records(records)
    for row in out:  # a random-weight model emits no valid JSON: recorded, not guessed
        assert row["controversy_label"] is None and row["controversial"] is None
        assert row["controversy_attempts"] == 2 and all(isinstance(r, str) for r in row["controversy_raw"])
        assert row["controversy_error"]


def test_classification_stage_resumes(tmp_path):
    from align.io import read_output

    generate, _ = scripted(*[lambda c: answer("3")] * 2)
    records = [{"id": f"p{i}", "messages": prompt(f"Question {i}?")} for i in range(5)]
    classifier = ControversyClassifier(generate)
    first = classify_records(records[:3], classifier, tmp_path, batch_size=8)
    again = classify_records(records, classifier, tmp_path, batch_size=8)
    assert (first.num_processed, again.num_already_done, again.num_processed) == (3, 3, 2)
    rows = read_output(tmp_path)
    assert sorted(r["id"] for r in rows) == [f"p{i}" for i in range(5)]
    assert all(r["controversial"] is True for r in rows)
