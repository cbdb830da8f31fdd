"""Numbers a recipe gives are checked against their bounds when the config loads.

`align evaluate seed=-1` generated and scored every completion, then numpy's bootstrap refused
the seed and the output was left unmarked; the demo's `reward_length_bias=1e306` made rewards
inf. One rule now: a seed (`seed`, `*_seed`) takes 0 to 2**32 - 1, a field's metadata `min`,
`max` (inclusive) and `above` (exclusive) bound it, and a float is finite unless its field says
`finite: False`; every one is a ConfigError naming the key, the range and the value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest

from align.config import SEED_RANGE, from_dict, load_config
from align.errors import ConfigError


@dataclass
class Settings:
    seed: int = 0
    data_seed: int | None = None
    seeded: int = -5  # not a seed by its name
    batch_size: int = field(default=1, metadata={"min": 1})
    top_p: float = field(default=1.0, metadata={"above": 0, "max": 1})
    weights: list[float] = field(default_factory=list, metadata={"min": 0})
    margin: float = field(default=0.0, metadata={"finite": False})
    offset_seed: int = field(default=0, metadata={"max": 10})


def refusal(**given) -> str:
    with pytest.raises(ConfigError) as caught:
        from_dict(Settings, given)
    return str(caught.value)


@pytest.mark.parametrize("key", ["seed", "data_seed"])
def test_a_seed_takes_what_numpy_torch_and_vllm_all_accept(key):
    assert SEED_RANGE == (0, 2**32 - 1)
    for value in SEED_RANGE:
        assert getattr(from_dict(Settings, {key: value}), key) == value
    for value in (-1, 2**32):
        assert refusal(**{key: value}) == (f"{key}: must be from 0 to 4294967295 (a seed numpy, torch and vLLM all "
                                           f"accept), got {value}")
    assert from_dict(Settings, {"data_seed": None}).data_seed is None
    assert from_dict(Settings, {"seeded": -5}).seeded == -5


def test_a_seed_may_declare_a_tighter_bound():
    assert from_dict(Settings, {"offset_seed": 10}).offset_seed == 10
    assert refusal(offset_seed=11) == ("offset_seed: must be from 0 to 10 (a seed numpy, torch and vLLM all "
                                       "accept), got 11")


def test_metadata_bounds_are_checked_item_by_item():
    assert refusal(batch_size=0) == "batch_size: must be >= 1, got 0"
    assert refusal(top_p=0) == "top_p: must be above 0 and at most 1, got 0.0"
    assert refusal(top_p=1.5) == "top_p: must be above 0 and at most 1, got 1.5"
    assert from_dict(Settings, {"top_p": 1, "batch_size": 1}).top_p == 1.0
    assert refusal(weights=[0.5, -1]) == "weights: must be >= 0, got -1.0"


def test_a_float_is_finite_unless_its_field_says_otherwise():
    assert "not a finite number" in refusal(top_p=float("nan"))
    assert math.isinf(from_dict(Settings, {"margin": "inf"}).margin)


def test_nested_keys_are_named_with_their_parent():
    @dataclass
    class Outer:
        inner: Settings = field(default_factory=Settings)

    with pytest.raises(ConfigError, match=r"^inner\.seed: must be from 0 to 4294967295"):
        from_dict(Outer, {"inner": {"seed": -1}})


def test_evaluate_refuses_a_negative_seed_at_load():
    from align.stages.evaluate import Config

    with pytest.raises(ConfigError, match=r"^seed: must be from 0 to 4294967295 .* got -1$"):
        load_config(Config, None, ["prompts=p.jsonl", "seed=-1"])
    assert load_config(Config, None, ["prompts=p.jsonl", "seed=4294967295"]).seed == 2**32 - 1


def test_the_graded_reward_stays_finite_at_its_largest_settings():
    """At MAX_WEIGHT the worst answer (the most extra digits) scores a finite reward; above it the
    settings are refused, in the demo's recipe and in Python."""
    from align.demo.config import DemoConfig
    from align.demo.reward import MAX_ANSWER_CHARS, MAX_WEIGHT, GradedSortingReward

    reward = GradedSortingReward(noise=MAX_WEIGHT, length_bias=MAX_WEIGHT)
    worst = "1" * (MAX_ANSWER_CHARS - 1) + "2"
    score = reward.one("12", worst)
    assert score.details["extra_digits"] == MAX_ANSWER_CHARS - 2 and math.isfinite(score.value)
    for key in ("noise", "length_bias"):
        with pytest.raises(ConfigError, match=f"reward_{key}: must be from 0 to 1e"):
            GradedSortingReward(**{key: 1e306})
        with pytest.raises(ConfigError, match=rf"^reward_{key}: must be from 0 to 1e\+300, got 1e\+306$"):
            load_config(DemoConfig, None, [f"reward_{key}=1e306"])
    with pytest.raises(ConfigError, match="seed: must be from 0 to 4294967294"):
        load_config(DemoConfig, None, ["seed=4294967295"])  # sampling takes seed + 1
