"""Rules of the annotation stage that tests/rewards/test_annotate.py leaves open.

A mutation check found changes to ``rewards.annotate`` that no test noticed: a row without an
id named by no row number, a bad reference found only after earlier batches were scored, an
empty completion list let through, a skip row refused instead of passed on, records no longer
batched by length, a provider's missing group dropping a record silently. Each test here
states one of those rules as a user sees it.
"""

from __future__ import annotations

import pytest
from reward_cases import prompt

from align.data.records import RecordError
from align.io import read_output
from rewards.annotate import annotate, score_records
from rewards.base import RewardProvider, Score


def record(i: int, *texts: str) -> dict:
    return {"id": f"r{i}", "messages": prompt(f"What is {i} + {i}?"), "answer": str(2 * i),
            "completions": [{"text": t} for t in texts or (str(2 * i), "no idea")]}


class Recording(RewardProvider):
    """The completion's length; remembers the ids of each batch it was handed (by their prompts)."""

    name, reference_field = "recording", "answer"

    def __init__(self):
        self.batches: list[list[str]] = []

    def score_groups(self, conversations, groups, *, references=None):
        self.batches.append([c[-1]["content"] for c in conversations])
        return super().score_groups(conversations, groups, references=references)

    def score(self, conversations, completions, *, references=None):
        return [Score(float(len(c))) if c else Score.skip("empty") for c in completions]


def refused(tmp_path, data, **kwargs) -> RecordError:
    provider = Recording()
    with pytest.raises(RecordError) as info:
        annotate(data, provider, tmp_path, **kwargs)
    assert provider.batches == []  # refused before the first batch is scored
    assert all(p.stat().st_size == 0 for p in tmp_path.glob("*.jsonl"))  # nothing written
    return info.value


def test_a_row_without_an_id_is_named_by_its_row_number(tmp_path):
    data = [record(0), record(1), record(2)]
    del data[2]["id"]
    error = refused(tmp_path, data)
    assert (error.record_id, error.field) == ("<row 2>", "id")


@pytest.mark.parametrize(("field", "named"), [("id", "<row 1>"), ("answer", "r1")])
def test_score_records_names_the_row_and_the_field_it_refuses(field, named):
    """A row without its id is named by its row number; one without its reference by its id."""
    data = [record(0), record(1)]
    del data[1][field]
    with pytest.raises(RecordError) as info:
        score_records(data, Recording())
    assert (info.value.record_id, info.value.field) == (named, field)


def test_a_bad_reference_in_a_later_batch_stops_the_job_before_any_scoring(tmp_path):
    data = [record(i) for i in range(3)]
    del data[2]["answer"]
    error = refused(tmp_path, data, batch_size=1)
    assert (error.record_id, error.field) == ("r2", "answer")



def test_an_empty_completion_list_is_refused(tmp_path):
    data = [record(0), record(1)]
    data[1]["completions"] = []
    error = refused(tmp_path, data)
    assert (error.record_id, error.field) == ("r1", "completions")


def test_a_skip_row_needs_only_its_id_and_passes_on_unchanged(tmp_path):
    skip = {"id": "r1", "skip_reason": "sampling failed: prompt too long"}
    provider = Recording()
    annotate([record(0), skip, record(2)], provider, tmp_path)
    rows = {row["id"]: row for row in read_output(tmp_path, expect_ids=["r0", "r1", "r2"])}
    assert rows["r1"] == skip
    assert rows["r0"]["rewards"] == [1.0, 7.0] and rows["r2"]["rewards"] == [1.0, 7.0]
    assert sorted(q for batch in provider.batches for q in batch) == ["What is 0 + 0?", "What is 2 + 2?"]


def test_records_are_batched_by_the_length_of_their_completions(tmp_path):
    """Records of like length go to the provider together (less padding), shortest first."""
    long, short = "a long answer " * 20, "4"
    data = [record(0, long), record(1, short), record(2, long, long), record(3, short), record(4), {"id": "r5",
            "skip_reason": "no completions"}]
    provider = Recording()
    annotate(data, provider, tmp_path, batch_size=2)
    # by total completion length: r5 (a skip row, passed on), r1, r3, r4, r0, r2
    assert provider.batches == [["What is 1 + 1?"], ["What is 3 + 3?", "What is 4 + 4?"],
                                ["What is 0 + 0?", "What is 2 + 2?"]]


class DropsLastGroup(Recording):
    def score_groups(self, conversations, groups, *, references=None):
        return super().score_groups(conversations, groups, references=references)[:-1]


def test_a_provider_returning_too_few_groups_is_an_error_not_a_lost_record():
    with pytest.raises(ValueError):
        score_records([record(0), record(1)], DropsLastGroup())


def test_a_skip_row_without_its_id_is_refused_naming_its_row():
    from rewards.annotate import validate_for_annotation

    for bad in ({"skip_reason": "prompt too long"}, {"id": "", "skip_reason": "prompt too long"},
                {"id": 7, "skip_reason": "prompt too long"}):
        with pytest.raises(RecordError) as info:
            validate_for_annotation(bad, 3, None)
        assert (info.value.record_id, info.value.field) == ("<row 3>", "id")
        assert "a skip row needs the id of the prompt it stands for (skip_reason: 'prompt too long')" in str(info.value)
    validate_for_annotation({"id": "p1", "skip_reason": "prompt too long"}, 3, None)
