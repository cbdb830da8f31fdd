"""Scoring an evaluation's completions again with another reward: every slot replaced, nothing else."""

from __future__ import annotations

import copy

import pytest

from align.errors import InputError, RecordError
from align.eval.rescore import prompt_digest, rescore_rows
from rewards.base import Score


class LengthReward:
    """The completion's length; a skip for an empty one."""

    name, reference_field = "length", None

    def score_groups(self, conversations, groups, *, references=None):
        return [[Score(float(len(t))) if t else Score.skip("empty") for t in g] for g in groups]


def rows():
    def entry(greedy, samples):
        out = {"samples": [{"text": t, "num_tokens": len(t), "score": 1.0, "skip": None} for t in samples]}
        if greedy is not None:
            out["greedy"] = {"text": greedy, "num_tokens": len(greedy), "score": 0.0, "skip": None}
        return out

    return [{"id": "a", "prompt_digest": prompt_digest(PROMPTS[0]),
             "policies": {"sft": entry("xy", ["x", ""]), "qrpo": entry(None, ["xyz", "xyzw"])}, "language": "en"},
            {"id": "b", "prompt_digest": prompt_digest(PROMPTS[1]),
             "policies": {"sft": entry("", ["xx", "x"]), "qrpo": entry(None, ["", "x"])}}]


PROMPTS = [{"id": "a", "messages": [{"role": "user", "content": "1"}], "answer": "x"},
           {"id": "b", "messages": [{"role": "user", "content": "2"}], "answer": "xx"}]


@pytest.mark.parametrize("batch_size", [1, 256])
def test_every_completion_gets_the_new_score_and_the_rest_is_kept(batch_size):
    given = rows()
    before = copy.deepcopy(given)
    out = rescore_rows(given, PROMPTS, LengthReward(), batch_size=batch_size)
    assert given == before  # the input rows are not changed
    a, b = out
    assert a["policies"]["sft"]["greedy"] == {"text": "xy", "num_tokens": 2, "score": 2.0, "skip": None}
    assert [(s["score"], s["skip"]) for s in a["policies"]["sft"]["samples"]] == [(1.0, None), (None, "empty")]
    assert [s["score"] for s in a["policies"]["qrpo"]["samples"]] == [3.0, 4.0]
    assert "greedy" not in a["policies"]["qrpo"] and a["language"] == "en"
    assert (b["policies"]["sft"]["greedy"]["score"], b["policies"]["sft"]["greedy"]["skip"]) == (None, "empty")
    assert [s["score"] for s in b["policies"]["sft"]["samples"]] == [2.0, 1.0]


def test_the_summaries_read_the_new_scores():
    from align.eval.evaluate import EvalSettings
    from align.eval.summary import policy_summary

    out = rescore_rows(rows(), PROMPTS, LengthReward())
    summary = policy_summary(out, "qrpo", EvalSettings(greedy=False, n=2, kl=False))
    assert summary["reward_sampled"]["estimate"] == pytest.approx((3.5 + 1.0) / 2)  # per-prompt means of scored ones


def test_the_reference_field_is_passed_and_required():
    from rewards.verifiable import VerifiableReward

    out = rescore_rows(rows(), PROMPTS, VerifiableReward(match="exact"))
    assert [s["score"] for s in out[0]["policies"]["sft"]["samples"]] == [1.0, 0.0]  # "x" is prompt a's answer
    assert out[1]["policies"]["sft"]["samples"][0]["score"] == 1.0  # "xx" is prompt b's
    with pytest.raises(InputError, match="prompt 'b': no 'answer' field"):
        rescore_rows(rows(), [PROMPTS[0], {"id": "b", "messages": PROMPTS[1]["messages"]}], VerifiableReward())
    with pytest.raises(InputError, match="evaluation row 'b': no prompt record"):
        rescore_rows(rows(), PROMPTS[:1], LengthReward())


class CountingReward(LengthReward):
    """LengthReward that counts its calls: a refused input is refused before anything is scored."""

    calls = 0

    def score_groups(self, conversations, groups, *, references=None):
        CountingReward.calls += 1
        return super().score_groups(conversations, groups, references=references)


def refused(given, prompts=PROMPTS) -> RecordError:
    CountingReward.calls = 0
    with pytest.raises(RecordError) as caught:
        rescore_rows(given, prompts, CountingReward(), batch_size=1)
    assert CountingReward.calls == 0
    return caught.value


def test_rows_of_other_prompts_with_the_same_ids_are_refused():
    """Prompt records with the rows' ids but other messages: no completion is scored against them."""
    other = [dict(p, messages=[{"role": "user", "content": p["messages"][0]["content"] + "0"}]) for p in PROMPTS]
    error = refused(rows(), other)
    assert (error.record_id, error.field) == ("a", "prompt_digest") and "the prompt differs" in str(error)
    with_tools = [PROMPTS[0], dict(PROMPTS[1], tools=[{"type": "function", "function": {"name": "f"}}])]
    assert refused(rows(), with_tools).record_id == "b"


def test_a_row_without_its_prompt_digest_is_refused():
    given = rows()
    del given[1]["prompt_digest"]
    error = refused(given)
    assert (error.record_id, error.field) == ("b", "prompt_digest") and "missing" in str(error)


def test_an_id_twice_is_refused_in_the_rows_and_in_the_prompts():
    error = refused(rows() + rows()[:1])
    assert (error.record_id, error.field) == ("a", "id") and "rows 0 and 2" in str(error)
    error = refused(rows(), PROMPTS + [dict(PROMPTS[1], answer="y")])
    assert (error.record_id, error.field) == ("b", "id") and "prompt records" in str(error)


@pytest.mark.parametrize(("policy", "slot", "field"), [("sft", "greedy", "policies.sft.greedy.text"),
                                                        ("qrpo", 1, "policies.qrpo.samples[1].text")])
def test_a_null_completion_text_names_the_record_and_field(policy, slot, field):
    given = rows()
    entry = given[1]["policies"][policy]
    (entry["greedy"] if slot == "greedy" else entry["samples"][slot])["text"] = None
    error = refused(given)
    assert (error.record_id, error.field) == ("b", field) and "got None" in str(error)


def test_the_rows_an_evaluation_writes_carry_the_digest_rescoring_matches():
    from types import SimpleNamespace

    from align.eval.evaluate import assemble_rows

    gen = {"greedy": None, "samples": [{"text": "xyz", "num_tokens": 3}]}
    score = {"samples": [{"value": 0.0, "skip": None}]}
    written = assemble_rows([dict(p) for p in PROMPTS], [SimpleNamespace(name="sft")], {"sft": [gen, gen]},
                            {"sft": [score, score]}, {}, {})
    assert [r["prompt_digest"] for r in written] == [prompt_digest(p) for p in PROMPTS]
    assert [r["policies"]["sft"]["samples"][0]["score"] for r in rescore_rows(written, PROMPTS, LengthReward())] == \
        [3.0, 3.0]
