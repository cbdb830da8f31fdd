"""Completions given in place of a policy (a `sample` output) are checked against the
held-out prompts: each row carries the prompt it answered, which must be the held-out one;
an id twice, or fewer than `n` completions for a prompt, is an error naming the id."""

from __future__ import annotations

import pytest

from align.data.records import RecordError
from align.eval.evaluate import EvalPolicy, given_generations


def prompts() -> list[dict]:
    return [{"id": f"p{i}", "messages": [{"role": "user", "content": f"what is {i} + 1"}], "answer": str(i + 1)}
            for i in range(3)]


def sampled(n: int = 2, **changes) -> list[dict]:
    rows = [{**p, "completions": [{"text": p["answer"], "num_tokens": 1, "finish_reason": "stop"}] * n}
            for p in prompts()]
    for rid, update in changes.items():
        next(r for r in rows if r["id"] == rid).update(update)
    return rows


def generations(rows: list[dict], n: int = 2) -> dict:
    return given_generations(EvalPolicy("given", completions=rows), prompts(), n)


def test_matching_completions_are_taken_first_n():
    rows = generations(sampled(n=3), n=2)
    assert sorted(rows) == ["p0", "p1", "p2"] and all(len(r["samples"]) == 2 for r in rows.values())


def test_completions_of_another_prompt_with_the_same_id_are_refused():
    other = [{"role": "user", "content": "what is 7 + 1"}]
    with pytest.raises(RecordError, match=r"record 'p1': field 'messages': .*answered another prompt"):
        generations(sampled(p1={"messages": other}))


def test_completions_without_their_prompt_are_refused():
    rows = sampled()
    del rows[0]["messages"]
    with pytest.raises(RecordError, match=r"record 'p0': field 'messages': missing .*must carry the prompt"):
        generations(rows)


def test_completions_sampled_with_other_tools_are_refused():
    tools = [{"type": "function", "function": {"name": "calculator", "parameters": {}}}]
    with pytest.raises(RecordError, match=r"record 'p2': field 'tools'"):
        generations(sampled(p2={"tools": tools}))


def test_a_duplicate_id_is_refused_naming_both_rows():
    rows = sampled()
    rows.append(dict(rows[1]))
    with pytest.raises(RecordError, match=r"record 'p1': field 'id': duplicate id \(rows 1 and 3"):
        generations(rows)


def test_fewer_completions_than_n_is_an_error_naming_the_id():
    rows = sampled(n=4)
    rows[2]["completions"] = rows[2]["completions"][:3]
    with pytest.raises(RecordError, match=r"record 'p2': field 'completions': 3 completions .*n=4"):
        generations(rows, n=4)
    assert len(generations(rows, n=3)["p2"]["samples"]) == 3


def test_a_sample_output_on_disk_is_matched(tmp_path):
    from align.io import write_jsonl

    write_jsonl(tmp_path / "shard-00000-of-00001.jsonl", sampled())
    rows = given_generations(EvalPolicy("given", completions=tmp_path), prompts(), 2)
    assert [s["text"] for s in rows["p2"]["samples"]] == ["3", "3"]


def test_the_report_does_not_describe_given_completions_with_the_sampling_settings():
    """`align evaluate` with one policy's completions given: the sampling settings are said of
    the policies sampled here only, and the given ones are named apart, with no greedy answer."""
    from align.eval.report import _generation_sentence

    settings = {"greedy": True, "n": 4, "temperature": 1.0, "top_p": 1.0, "max_tokens": 64}
    overall = {"policies": {"sft": {}, "given": {}}}
    mixed = _generation_sentence({"settings": settings, "overall": overall, "generated": ["sft"],
                                  "supplied": ["given"]})
    assert mixed.startswith("Sampled here (`sft`): greedy yes; 4 samples per prompt at temperature 1.0")
    assert "Given as completions (`given`): their first 4 per prompt are the samples, with no greedy answer" in mixed
    only_given = _generation_sentence({"settings": settings, "overall": overall, "generated": [],
                                       "supplied": ["sft", "given"]})
    assert "greedy yes" not in only_given and "temperature" not in only_given
    sampled_only = _generation_sentence({"settings": settings, "overall": overall, "generated": ["sft", "given"],
                                         "supplied": []})
    assert sampled_only.startswith("Sampled: greedy yes; 4 samples per prompt")
