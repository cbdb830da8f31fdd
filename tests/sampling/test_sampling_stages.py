"""sample_references / sample_offline on the tiny model: record schema, sources, the
overlong policy, skips, resume equal to an uninterrupted run, and bad input."""

from __future__ import annotations

import pytest

from align.data.records import RecordError, validate_completions
from align.io import read_output
from align.sampling.hf import TransformersSampler
from align.sampling.stages import offline_variants, sample_offline, sample_references

DATE = "2026-01-01"
QUESTIONS = ["What is two plus two?", "Name a colour.", "Hi there", "Tell me a story",
             "Why is the sky blue?", "Say a word"]


def _records(k: int = len(QUESTIONS)) -> list[dict]:
    return [{"id": f"p{i}", "messages": [{"role": "user", "content": q}]} for i, q in enumerate(QUESTIONS[:k])]


@pytest.fixture(scope="module")
def sampler(tiny_model, tiny_tokenizer):
    return TransformersSampler(tiny_model, tiny_tokenizer, chat_date=DATE, batch_size=4)


def test_reference_records_have_n_reference_completions_with_sources(sampler, tmp_path):
    summary = sample_references(_records(4), sampler, output_dir=tmp_path, n=3, max_tokens=8, seed=5)
    rows = read_output(tmp_path, expect_ids=[r["id"] for r in _records(4)])
    for row in rows:
        validate_completions(row)
        assert len(row["completions"]) == 3
        for c in row["completions"]:
            assert c["is_reference"] is True
            assert c["source"] == (
                "model=LlamaForCausalLM backend=transformers temperature=1.0 top_p=1.0 max_tokens=8 seed=5"
            )
        assert row["num_overlong"] == sum(c["finish_reason"] == "length" for c in row["completions"])
    assert summary == {"records": 4, "completions": 12, "skipped_prompts": 0,
                       "overlong": sum(r["num_overlong"] for r in rows)}


def test_overlong_completions_are_dropped_and_counted(sampler, tmp_path):
    summary = sample_references(_records(4), sampler, output_dir=tmp_path, n=4, max_tokens=2, overlong="drop")
    rows = read_output(tmp_path)
    assert summary["overlong"] > 0
    for row in rows:
        assert all(c["finish_reason"] == "stop" for c in row["completions"])
        assert len(row["completions"]) + row["num_overlong"] == 4
    assert summary["completions"] + summary["overlong"] == 16


def test_reference_rows_record_how_many_references_overlong_drop_removed(sampler, tmp_path):
    sample_references(_records(4), sampler, output_dir=tmp_path / "drop", n=4, max_tokens=2, overlong="drop")
    dropped = read_output(tmp_path / "drop")
    assert sum(r["num_ref_dropped"] for r in dropped) > 0
    for row in dropped:
        assert row["num_ref_dropped"] == row["num_overlong"] == 4 - len(row["completions"])
    sample_references(_records(4), sampler, output_dir=tmp_path / "flag", n=4, max_tokens=2, overlong="flag")
    assert all(r["num_ref_dropped"] == 0 for r in read_output(tmp_path / "flag"))
    # offline sampling passes the reference count through
    sample_offline(dropped, sampler, output_dir=tmp_path / "offline", max_tokens=2, overlong="drop")
    offline = {r["id"]: r for r in read_output(tmp_path / "offline")}
    assert all(offline[r["id"]]["num_ref_dropped"] == r["num_ref_dropped"] for r in dropped)


def test_resumed_sampling_equals_an_uninterrupted_run(sampler, tmp_path):
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    kwargs = {"n": 2, "max_tokens": 10, "seed": 1, "batch_size": 4}
    sample_references(_records(), sampler, output_dir=whole, **kwargs)
    sample_references(_records(2), sampler, output_dir=resumed, **kwargs)  # "killed" after 2
    sample_references(_records(), sampler, output_dir=resumed, **kwargs)
    ids = [r["id"] for r in _records()]
    assert read_output(resumed, expect_ids=ids) == read_output(whole, expect_ids=ids)


def test_resuming_with_other_sampling_settings_is_refused(sampler, tmp_path):
    sample_references(_records(1), sampler, output_dir=tmp_path, n=1, max_tokens=4)
    with pytest.raises(ValueError, match=r"differs in \['temperature'\]"):
        sample_references(_records(2), sampler, output_dir=tmp_path, n=1, max_tokens=4, temperature=0.7)


def test_a_prompt_that_fills_the_context_is_kept_with_a_skip_reason(tiny_model, tiny_tokenizer, tmp_path):
    records = _records(2)
    records[1]["messages"][0]["content"] = "a long question " * 200
    small = TransformersSampler(tiny_model, tiny_tokenizer, chat_date=DATE, max_model_len=200)
    summary = sample_references(records, small, output_dir=tmp_path, n=2, max_tokens=4)
    ok, skipped = read_output(tmp_path, expect_ids=["p0", "p1"])
    assert len(ok["completions"]) == 2 and "skip_reason" not in ok
    assert skipped["completions"] == [] and "context length is 200" in skipped["skip_reason"]
    assert summary["skipped_prompts"] == 1


def test_bad_record_fails_before_any_sampling_naming_record_and_field(sampler, tmp_path):
    records = _records(2) + [{"id": "bad", "messages": [{"role": "assistant", "content": "x"}]}]
    with pytest.raises(RecordError, match=r"record 'bad': field 'messages'"):
        sample_references(records, sampler, output_dir=tmp_path, n=1)
    assert read_output(tmp_path) == []


def test_existing_completions_are_kept_in_front(sampler, tmp_path):
    records = _records(1)
    old = {"text": "old", "num_tokens": 2, "finish_reason": "stop", "is_reference": False, "source": "model=x"}
    records[0]["completions"] = [old]
    sample_references(records, sampler, output_dir=tmp_path, n=2, max_tokens=4)
    [row] = read_output(tmp_path)
    assert row["completions"][0] == old and len(row["completions"]) == 3


def test_offline_variants_put_the_family_prompt_in_the_conversation():
    plain = {"id": "a", "messages": [{"role": "user", "content": "Q"}]}
    variants = offline_variants(plain, seed=0)
    assert [tag for tag, _ in variants][1] == "default"
    family_tag, conversation = variants[0]
    assert family_tag.split("/")[0] in ("truthful", "helpful", "honest")
    assert conversation[0]["role"] == "system" and conversation[1:] == plain["messages"]
    assert variants[1][1] == plain["messages"]

    own_system = {"id": "b", "controversial": True,
                  "messages": [{"role": "system", "content": "House rules."}, {"role": "user", "content": "Q"}]}
    [(tag, conversation)] = offline_variants(own_system, seed=0)
    assert tag.startswith("persona/")
    assert conversation[0]["content"].endswith("\n\nHouse rules.") and len(conversation) == 2
    tags = [t for t, _ in offline_variants(own_system, seed=0, charter_persona=True)]
    assert tags[-1] == "charter/0"


def test_offline_completions_name_their_system_prompt(sampler, tmp_path):
    records = _records(3)
    records[2]["controversial"] = True
    summary = sample_offline(records, sampler, output_dir=tmp_path, n=1, max_tokens=6, seed=2)
    rows = read_output(tmp_path, expect_ids=["p0", "p1", "p2"])
    for row in rows[:2]:
        validate_completions(row)
        tags = [c["source"].split("system_prompt=")[1] for c in row["completions"]]
        assert len(tags) == 2 and tags[1] == "default"
        assert tags[0].split("/")[0] in ("truthful", "helpful", "honest")
    [persona] = rows[2]["completions"]
    assert persona["is_reference"] is False and "system_prompt=persona/" in persona["source"]
    assert "temperature=1.0" in persona["source"]
    assert summary["completions"] == 5


def test_offline_rejects_a_non_boolean_controversial_flag(sampler, tmp_path):
    records = _records(2)
    records[1]["controversial"] = "2"
    with pytest.raises(RecordError, match=r"record 'p1': field 'controversial'"):
        sample_offline(records, sampler, output_dir=tmp_path)


def test_offline_unclassified_record_is_an_error_by_default_and_named(sampler, tmp_path):
    records = _records(2)
    records[1]["controversial"] = None  # what the classifier writes when it failed
    with pytest.raises(RecordError, match=r"record 'p1': field 'controversial'.*on_unclassified"):
        sample_offline(records, sampler, output_dir=tmp_path)


@pytest.mark.parametrize("policy, family", [("persona", "persona/"), ("attribute", "system_prompt=")])
def test_offline_unclassified_record_follows_the_chosen_policy(sampler, tmp_path, policy, family):
    records = _records(2)
    records[1]["controversial"] = None
    sample_offline(records, sampler, output_dir=tmp_path, n=1, max_tokens=4, default_prompt=False,
                   on_unclassified=policy)
    row = next(r for r in read_output(tmp_path) if r["id"] == "p1")
    sources = [c["source"] for c in row["completions"]]
    assert sources and all(family in s for s in sources)
    if policy == "attribute":
        assert not any("persona/" in s for s in sources)
