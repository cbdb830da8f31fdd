"""The demo's rounds without running them: which steps run in which order, and a round with no pairs.

The rounds themselves run end to end in tests/demo/test_demo.py (``preset=ci rounds=2``)."""

from __future__ import annotations

import pytest

from align.demo.config import DemoConfig
from align.demo.output import RUN_OUTPUTS
from align.demo.rounds import RoundResult, policy_name, round_dirs
from align.demo.run import STEPS, demo_steps
from align.errors import ConfigError


def test_later_rounds_run_after_both_sweeps_and_before_the_evaluation():
    names = [name for name, _ in demo_steps(DemoConfig(rounds=3))]
    assert names == [name for name, _ in STEPS[:-1]] + ["round 2", "round 3", "evaluate (align.evaluate)"]
    assert [name for name, _ in demo_steps(DemoConfig())] == [name for name, _ in STEPS]


def test_rounds_is_at_least_one():
    with pytest.raises(ConfigError, match="rounds"):
        DemoConfig(rounds=0)


def test_round_outputs_and_policy_names():
    assert round_dirs(1) == [] and round_dirs(3) == ["round-2", "round-3"]
    assert not set(round_dirs(3)) & set(RUN_OUTPUTS)
    assert [policy_name("qrpo", k) for k in (1, 2, 3)] == ["qrpo", "qrpo-round-2", "qrpo-round-3"]


def test_a_round_without_pairs_keeps_the_policy_it_started_from():
    found = RoundResult(method="dpo", round=2, start_dir="/runs/dpo/points/beta-16", pairs=0, skipped_prompts=5,
                        skip_reasons={"no contrast": 5})
    assert found.policy_dir == "/runs/dpo/points/beta-16" and found.name == "dpo-round-2"
    described = found.as_json()
    assert described["trained"] is False and described["settings"] is None and described["pairs"] == 0
    assert described["policy"] == described["start"]
