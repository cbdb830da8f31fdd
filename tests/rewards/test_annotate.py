"""The annotation stage: every completion scored or skipped with a reason, resumable."""

from __future__ import annotations

import copy
import math

import pytest
from reward_cases import prompt

from align.data.records import RecordError, validate_rewards
from align.io import output_files, read_output
from rewards.annotate import annotate, score_records
from rewards.base import RewardProvider, Score, checked


def completion(text: str, *, reference: bool = True) -> dict:
    return {"text": text, "num_tokens": len(text.split()), "finish_reason": "stop",
            "is_reference": reference, "source": "policy"}


def records(n: int = 4) -> list[dict]:
    return [
        {"id": f"r{i}", "messages": prompt(f"What is {i} + {i}?"), "answer": str(2 * i),
         "completions": [completion(f"\\boxed{{{2 * i}}}"), completion("I think 7."), completion("")]}
        for i in range(n)
    ]


class NaNOnSeven(RewardProvider):
    """A fixed-output provider (the stage is under test here, not a model)."""

    name = "nan_on_seven"

    def score(self, conversations, completions, *, references=None):
        return [Score(math.nan if "7" in c else float(len(c))) if c else Score.skip("empty") for c in completions]


def test_score_and_skip_is_invalid_both_ways():
    with pytest.raises(ValueError, match="needs a reason"):
        Score(None)
    with pytest.raises(ValueError, match="must not carry a skip reason"):
        Score(1.0, "why")
    assert checked(float("inf")).reason == "non-finite score (inf)"
    assert checked(2.5, truncated=False) == Score(2.5, None, {"truncated": False})


def test_verifiable_annotation_writes_one_reward_per_completion(tmp_path):
    from rewards import VerifiableReward

    result = annotate(records(), VerifiableReward(), tmp_path, batch_size=3)
    assert result.complete and result.num_processed == 4
    rows = read_output(tmp_path, expect_ids=[r["id"] for r in records()])
    for row in rows:
        validate_rewards(row)
        assert row["rewards"] == [1.0, 0.0, 0.0]  # the empty completion gets the lowest score
        assert row["reward_skips"] == [None, None, None]
        assert "empty_completion" in row["reward_details"][2]
        assert row["reward_provider"] == "verifiable" and len(row["reward_details"]) == 3


def test_nan_scores_become_recorded_skips():
    out = score_records(records(1), NaNOnSeven())[0]
    assert out["rewards"][1] is None and out["reward_skips"][1] == "non-finite score (nan)"
    assert out["rewards"][0] == float(len("\\boxed{0}"))
    validate_rewards(out)


def test_annotation_resumes_and_refuses_other_settings(tmp_path):
    from rewards import VerifiableReward

    data = records(6)
    annotate(data[:2], VerifiableReward(), tmp_path)
    again = annotate(data, VerifiableReward(), tmp_path)
    assert (again.num_already_done, again.num_processed) == (2, 4)
    assert len(read_output(tmp_path)) == 6
    with pytest.raises(ValueError, match="max_bare_answer"):
        annotate(data, VerifiableReward(max_bare_answer=10), tmp_path)


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda r: r.pop("messages"), "messages"),
        (lambda r: r.update(messages=[{"role": "assistant", "content": "hi"}]), "messages"),
        (lambda r: r.pop("completions"), "completions"),
        (lambda r: r["completions"][1].update(text=None), "completions[1].text"),
        (lambda r: r.pop("answer"), "answer"),
        (lambda r: r["messages"][0].update(content={"parts": [{"type": "text", "text": 3}]}), "messages"),
    ],
)
def test_bad_records_are_named_before_scoring_starts(tmp_path, mutate, field):
    from rewards import VerifiableReward

    data = records(3)
    mutate(data[2])
    with pytest.raises(RecordError) as info:
        annotate(data, VerifiableReward(), tmp_path)
    assert (info.value.record_id, info.value.field) == ("r2", field)
    assert not list(tmp_path.glob("*.jsonl")) or all(p.stat().st_size == 0 for p in tmp_path.glob("*.jsonl"))


def test_reward_model_annotation_on_the_tiny_model(tmp_path, rm_model, chat_tokenizer):
    from rewards import RewardModel

    rm = RewardModel("tiny-rm", model=copy.deepcopy(rm_model), tokenizer=chat_tokenizer, batch_size=2)
    data = records(3)
    annotate(data, rm, tmp_path, batch_size=2)
    rows = read_output(tmp_path, expect_ids=[r["id"] for r in data])
    direct = rm.score([r["messages"] for r in data for _ in range(2)], [c["text"] for r in data for c in r["completions"][:2]])
    assert [v for row in rows for v in row["rewards"][:2]] == pytest.approx([s.value for s in direct])
    assert all(row["rewards"][2] == min(row["rewards"][:2]) and row["reward_skips"][2] is None for row in rows)
    assert all(d["truncated"] is False for row in rows for d in row["reward_details"][:2])

    import datasets

    loaded = datasets.load_dataset("json", data_files=output_files(tmp_path), split="train")
    assert loaded.num_rows == 3 and "rewards" in loaded.column_names


def test_judge_annotation_ranks_each_prompt_group(tmp_path, judge_lm, chat_tokenizer, short_charter):
    from rewards import ConstitutionalJudge, TransformersJudgeBackend

    backend = TransformersJudgeBackend(judge_lm, chat_tokenizer, batch_size=4, show_progress=False)
    judge = ConstitutionalJudge(backend, short_charter, top_k_pairwise=2)
    data = records(2)
    annotate(data, judge, tmp_path, batch_size=2)
    for row in read_output(tmp_path):
        validate_rewards(row)
        ranks = sorted(d.get("pairwise_rank") for d in row["reward_details"] if "pairwise_rank" in d)
        assert ranks == [1, 2]


def test_annotate_stage_skips_and_counts_truncated_reward_model_inputs(tmp_path, rm_model, chat_tokenizer):
    from align.io import write_jsonl
    from align.stages import annotate as stage
    from rewards import RewardModel

    rm_model.save_pretrained(tmp_path / "rm")
    chat_tokenizer.save_pretrained(tmp_path / "rm")
    rm = RewardModel("tiny-rm", model=copy.deepcopy(rm_model), tokenizer=chat_tokenizer)
    short = records(1)[0]["completions"][1]["text"]
    limit = len(rm.encode(records(1)[0]["messages"], short)[0])  # "I think 7." fits; the long answer does not
    data = records(2)
    for row in data:
        row["completions"][0]["text"] = "A much longer answer that goes on. " * 8
    write_jsonl(tmp_path / "in.jsonl", data)
    common = {"input": str(tmp_path / "in.jsonl"), "provider": "reward_model", "model": str(tmp_path / "rm"),
              "max_length": limit}
    summary = stage.run(stage.Config(output_dir=str(tmp_path / "skip"), **common))
    assert summary["truncated_inputs"] == 2 and summary["skipped"] == 2 and summary["empty_completions"] == 2
    rows = read_output(tmp_path / "skip")
    for row in rows:
        assert row["rewards"][0] is None and "on_truncation=skip" in row["reward_skips"][0]
        assert row["rewards"][2] == row["rewards"][1]  # empty: the lowest of the scored ones
    summary = stage.run(stage.Config(output_dir=str(tmp_path / "score"), on_truncation="score", **common))
    assert summary["truncated_inputs"] == 2 and summary["skipped"] == 0
    assert all(row["reward_details"][0]["truncated"] is True for row in read_output(tmp_path / "score"))
