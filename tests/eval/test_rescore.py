"""Scoring an evaluation's completions again with another reward: every slot replaced, nothing else."""

from __future__ import annotations

import copy

import pytest

from align.errors import InputError
from align.eval.rescore import rescore_rows
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

    return [{"id": "a", "policies": {"sft": entry("xy", ["x", ""]), "qrpo": entry(None, ["xyz", "xyzw"])},
             "language": "en"},
            {"id": "b", "policies": {"sft": entry("", ["xx", "x"]), "qrpo": entry(None, ["", "x"])}}]


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
        rescore_rows(rows(), [PROMPTS[0], {"id": "b", "messages": []}], VerifiableReward())
    with pytest.raises(InputError, match="evaluation row 'b': no prompt record"):
        rescore_rows(rows(), PROMPTS[:1], LengthReward())
