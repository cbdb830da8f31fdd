"""How a verdict reads: a policy against its baseline gains or declines; two methods side by
side (the demo's QRPO against DPO) are higher or lower than each other, never "a decline"."""

from __future__ import annotations

from types import SimpleNamespace

from align.eval.summary import comparison_summary

SETTINGS = SimpleNamespace(resamples=200, confidence=0.95, seed=0, tie_margin=0.05)


def _rows(mine: float, theirs: float, prompts: int = 30) -> list[dict]:
    def policy(score):
        return {"samples": [{"score": score, "num_tokens": 3}] * 2, "greedy": {"score": score, "num_tokens": 3}}
    return [{"policies": {"qrpo": policy(mine), "dpo": policy(theirs)}} for _ in range(prompts)]


def test_two_methods_side_by_side_are_higher_or_lower():
    lower = comparison_summary(_rows(0.0, 1.0), "qrpo", "dpo", SETTINGS, between=True)["verdicts"]
    higher = comparison_summary(_rows(1.0, 0.0), "qrpo", "dpo", SETTINGS, between=True)["verdicts"]
    assert lower and all("a real difference, lower" in v for v in lower), lower
    assert higher and all("a real difference, higher" in v for v in higher), higher
    assert not any("decline" in v or "improvement" in v for v in lower + higher)


def test_a_policy_against_its_baseline_gains_or_declines():
    verdicts = comparison_summary(_rows(0.0, 1.0), "qrpo", "dpo", SETTINGS)["verdicts"]
    assert verdicts and all("a real decline" in v for v in verdicts), verdicts
