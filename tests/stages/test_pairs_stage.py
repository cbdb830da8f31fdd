"""The pairs stage (`align pairs`) on records as the sample and annotate stages write them:
truncated completions, references dropped by ``overlong=drop``, several pairs per prompt."""

from __future__ import annotations

import pytest

from align.data.records import PAIR_FIELDS, RecordError
from align.io import read_records, write_jsonl
from align.stages import pairs as pairs_stage


def annotated(rid: str, rewards: list[float], *, truncated=(), dropped: int | None = None) -> dict:
    completions = [
        {"text": f"{rid}-{j}", "num_tokens": 4, "finish_reason": "length" if j in truncated else "stop",
         "is_reference": True, "source": "model=tiny"}
        for j in range(len(rewards))
    ]
    row = {"id": rid, "messages": [{"role": "user", "content": f"q {rid}"}], "completions": completions,
           "num_overlong": len(truncated), "rewards": rewards, "reward_skips": [None] * len(rewards)}
    if dropped is not None:
        row["num_ref_dropped"] = dropped
    return row


def run_pairs(tmp_path, records, **settings):
    write_jsonl(tmp_path / "in.jsonl", records)
    out = tmp_path / "pairs"
    summary = pairs_stage.run(pairs_stage.Config(input=str(tmp_path / "in.jsonl"), output_dir=str(out),
                                                 overwrite=True, **settings))
    return summary, read_records(out / "pairs.jsonl"), read_records(out / "skipped.jsonl")


def test_pairs_stage_expects_n_minus_the_references_overlong_drop_removed(tmp_path):
    records = [annotated("full", [0.0, 1.0, 2.0, 3.0], dropped=0),
               annotated("cut", [0.0, 1.0, 2.0], dropped=1),  # 4 drawn, 1 dropped as overlong
               annotated("gone", [], dropped=4)]
    records[2]["completions"] = [{"text": "offline", "num_tokens": 3, "finish_reason": "stop",
                                  "is_reference": False, "source": "model=other"}]
    records[2]["rewards"], records[2]["reward_skips"] = [1.0], [None]
    summary, pairs, skips = run_pairs(tmp_path, records, num_ref_rewards=4)
    assert [p["id"] for p in pairs] == ["full", "cut"]
    assert [p["num_ref_rewards"] for p in pairs] == [4, 3] and [p["num_ref_dropped"] for p in pairs] == [0, 1]
    assert skips == [{"id": "gone", "reason": "all 4 reference samples were dropped as overlong "
                      "(sampling overlong=drop, num_ref_dropped)"}]
    assert summary["pairs"] == 2 and summary["skipped"] == 1


def test_pairs_stage_names_both_keys_when_references_and_num_ref_rewards_disagree(tmp_path):
    with pytest.raises(RecordError, match=r"'cut'.*num_ref_rewards=4 minus num_ref_dropped=2"):
        run_pairs(tmp_path, [annotated("cut", [0.0, 1.0, 2.0], dropped=2)], num_ref_rewards=4)


def test_pairs_stage_excludes_truncated_completions_and_counts_them(tmp_path):
    records = [annotated("a", [0.0, 1.0, 2.0, 3.0, 4.0], truncated=(0, 4)), annotated("b", [0.0, 1.0])]
    summary, pairs, _ = run_pairs(tmp_path, records)
    assert summary["truncated_completions"] == 2 and summary["truncated_in_pairs"] == 0
    row = pairs[0]
    assert tuple(row) == PAIR_FIELDS
    assert row["chosen"] not in ("a-0", "a-4") and row["rejected"] not in ("a-0", "a-4")
    assert row["chosen_finish_reason"] == row["rejected_finish_reason"] == "stop"


def test_pairs_stage_pairs_truncated_completions_when_told_to_train_them_without_end(tmp_path):
    records = [annotated("a", [0.0, 1.0], truncated=(0, 1))]
    summary, pairs, _ = run_pairs(tmp_path, records, truncated="train_without_end")
    assert summary["truncated_completions"] == 2 and summary["truncated_in_pairs"] == 2
    assert pairs[0]["chosen_finish_reason"] == pairs[0]["rejected_finish_reason"] == "length"


def test_pairs_stage_makes_several_pairs_per_prompt(tmp_path):
    records = [annotated("a", [float(k) for k in range(10)]), annotated("b", [0.0, 1.0])]
    summary, pairs, _ = run_pairs(tmp_path, records, num_pairs_per_prompt=2)
    assert [p["id"] for p in pairs] == ["a", "a#2", "b"] and summary["pairs"] == 3
    used = [p[k] for p in pairs[:2] for k in ("chosen", "rejected")]
    assert len(set(used)) == 4
