"""Rules of rescoring an evaluation that tests/eval/test_rescore.py leaves open.

A mutation check found changes to ``align.eval.rescore`` that no test noticed: a digest an
earlier evaluation wrote no longer matching, a provider without a reference field refused,
a completion scored twice, a provider's short answer leaving the old reward's scores in
place. Each test here states one of those rules as a user sees it.
"""

from __future__ import annotations

import pytest

from align.eval.rescore import prompt_digest, rescore_rows
from rewards.base import Score

PROMPTS = [{"id": "a", "messages": [{"role": "user", "content": "1"}]},
           {"id": "b", "messages": [{"role": "user", "content": "2"}]}]


def entry(*samples: str, greedy: str | None = None) -> dict:
    out = {"samples": [{"text": t, "num_tokens": len(t), "score": -1.0, "skip": None} for t in samples]}
    if greedy is not None:
        out["greedy"] = {"text": greedy, "num_tokens": len(greedy), "score": -1.0, "skip": None}
    return out


def rows() -> list[dict]:
    return [{"id": p["id"], "prompt_digest": prompt_digest(p),
             "policies": {"sft": entry("x", "xy", greedy="xyz"), "qrpo": entry("xyzw", "")}} for p in PROMPTS]


class Length:
    """The completion's length; no ``reference_field`` attribute at all (a minimal provider)."""

    def __init__(self):
        self.scored: list[str] = []

    def score_groups(self, conversations, groups, *, references=None):
        assert references is None
        self.scored += [t for g in groups for t in g]
        return [[Score(float(len(t))) if t else Score.skip("empty") for t in g] for g in groups]


def test_a_digest_written_by_an_earlier_evaluation_still_matches():
    """The digest is stored in eval.jsonl files on disk: it must not change between versions."""
    assert prompt_digest(PROMPTS[0]) == "0398f8e2e3434016"
    with_tools = dict(PROMPTS[0], tools=[{"type": "function", "function": {"name": "f"}}])
    assert prompt_digest(with_tools) == "242de39d8848c68e"
    stored = [{"id": "a", "prompt_digest": "0398f8e2e3434016", "policies": {"sft": entry("xy")}}]
    assert rescore_rows(stored, PROMPTS[:1], Length())[0]["policies"]["sft"]["samples"][0]["score"] == 2.0


def test_a_provider_without_a_reference_field_attribute_is_accepted():
    out = rescore_rows(rows(), PROMPTS, Length())
    assert out[1]["policies"]["sft"]["greedy"]["score"] == 3.0
    assert [(s["score"], s["skip"]) for s in out[1]["policies"]["qrpo"]["samples"]] == [(4.0, None), (None, "empty")]


@pytest.mark.parametrize("batch_size", [None, 1, 2, 3])
def test_every_completion_is_scored_exactly_once(batch_size):
    provider = Length()
    rescore_rows(rows(), PROMPTS, provider, **({} if batch_size is None else {"batch_size": batch_size}))
    assert provider.scored == ["xyz", "x", "xy", "xyzw", ""] * 2


class DropsLastGroup(Length):
    def score_groups(self, conversations, groups, *, references=None):
        return super().score_groups(conversations, groups)[:-1]


class DropsLastScore(Length):
    def score_groups(self, conversations, groups, *, references=None):
        return [g[:-1] for g in super().score_groups(conversations, groups)]


@pytest.mark.parametrize("provider", [DropsLastGroup, DropsLastScore])
def test_a_provider_returning_too_few_scores_is_an_error_not_stale_scores(provider):
    """Slots the provider did not score would keep the old reward's score, passed off as the new one."""
    with pytest.raises(ValueError):
        rescore_rows(rows(), PROMPTS, provider())
