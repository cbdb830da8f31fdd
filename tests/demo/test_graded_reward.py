"""The demo's graded reward: its parts by hand, its noise fixed per answer, and its imperfection as documented.

align/demo/reward.py and docs/results.md ("The graded reward") state what the reward gives
each kind of answer, that a longer sorted answer beats the right one, and how closely it
tracks exact accuracy on a stated mix of answers; these tests hold those statements.
"""

from __future__ import annotations

import random
import statistics

import pytest

from align.demo.config import DemoConfig
from align.demo.reward import GradedSortingReward, base_score, noise_draw, problem_of
from align.errors import ConfigError, InputError

CLEAN = GradedSortingReward(noise=0.0, length_bias=0.0)


@pytest.mark.parametrize(("answer", "expected"), [
    ("01234", 1.0),      # right
    ("01243", 0.875),    # one adjacent swap: 3 of 4 pairs in order
    ("01235", 0.9),      # one digit wrong, sorted: 4 of 5 digits
    ("0124", 0.775),     # one digit missing: 4 of 5 digits, 3 of 4 pairs
    ("43210", 0.5),      # every digit, no pair in order
    ("012349", 1.0),     # an extra digit costs nothing (recall)
    ("0 1234", 1.0 * 5 / 6),  # other characters dilute
    ("", 0.0),
    ("abc", 0.0),
])
def test_each_kind_of_answer_gets_the_documented_base_score(answer, expected):
    assert CLEAN.one("42031", answer).value == pytest.approx(expected)


def test_the_length_bias_puts_a_longer_sorted_answer_above_the_right_one():
    biased = GradedSortingReward(noise=0.0, length_bias=0.05)
    assert biased.one("42031", "01234").value == pytest.approx(1.0)
    assert biased.one("42031", "0123499").value == pytest.approx(1.1)  # two extra digits
    assert biased.one("42031", "0124").value == pytest.approx(0.775)  # no bias below the prompt's count


def test_the_noise_is_one_fixed_draw_per_prompt_and_answer():
    reward = GradedSortingReward(noise=0.1, length_bias=0.0)
    first = reward.one("42031", "01234")
    assert reward.one("42031", " 01234\n").value == first.value  # white space around the answer is not the answer
    assert first.details["noise"] == pytest.approx(0.1 * noise_draw("42031", "01234"), abs=1e-6)
    assert first.value == pytest.approx(1.0 + 0.1 * noise_draw("42031", "01234"))
    assert reward.one("42013", "01234").value != first.value  # another prompt, another draw
    draws = [noise_draw(f"{i:05d}", "01234") for i in range(4000)]
    assert abs(statistics.mean(draws)) < 0.05 and 0.95 < statistics.stdev(draws) < 1.05  # standard normal


def answer_mix(rng: random.Random, problem: str) -> str:
    """The documented mix of answers: half right, then a tenth each of five kinds of near miss."""
    right = "".join(sorted(problem))
    kind = rng.random()
    if kind < 0.5:
        return right
    digits = list(right)
    if kind < 0.6:  # one adjacent swap
        i = rng.randrange(len(digits) - 1)
        digits[i], digits[i + 1] = digits[i + 1], digits[i]
        return "".join(digits)
    if kind < 0.7:  # one digit replaced, still sorted
        digits[rng.randrange(len(digits))] = rng.choice("0123456789")
        return "".join(sorted(digits))
    if kind < 0.8:  # one digit dropped
        del digits[rng.randrange(len(digits))]
        return "".join(digits)
    if kind < 0.9:  # one extra digit, sorted
        return "".join(sorted(right + rng.choice("0123456789")))
    shuffled = list(problem)  # the prompt's digits in random order
    rng.shuffle(shuffled)
    return "".join(shuffled)


def correlation(reward: GradedSortingReward, count: int = 4000) -> float:
    rng = random.Random(0)
    graded, exact = [], []
    for _ in range(count):
        problem = "".join(rng.choice("0123456789") for _ in range(5))
        answer = answer_mix(rng, problem)
        graded.append(reward.one(problem, answer).value)
        exact.append(float(answer == "".join(sorted(problem))))
    return statistics.correlation(graded, exact)


def test_its_correlation_with_exact_accuracy_is_the_documented_one():
    """docs/results.md: 0.44 at the defaults (noise 0.1, bias 0.05) on this mix, 0.72 without noise and bias."""
    config = DemoConfig(reward="graded")
    assert 0.40 <= correlation(config.reward_provider()) <= 0.48
    assert 0.68 <= correlation(CLEAN) <= 0.76
    assert correlation(GradedSortingReward(noise=0.2, length_bias=0.05)) < 0.35  # more noise, less agreement


def test_the_prompt_must_be_digits_and_long_answers_are_not_read():
    assert problem_of([{"role": "system", "content": "Sort."}, {"role": "user", "content": " 4203 "}]) == "4203"
    with pytest.raises(InputError, match="no user message"):
        problem_of([{"role": "system", "content": "Sort."}])
    with pytest.raises(InputError, match="'12a' is not a string of at least 2 digits"):
        problem_of([{"role": "user", "content": "12a"}])
    assert base_score("42031", "0" * 1001)["base"] == 0.0
    assert CLEAN.one("42031", "0" * 1001).details["extra_digits"] == 0  # an unread answer earns no bias either
    scores = CLEAN.score([[{"role": "user", "content": "21"}]] * 2, ["12", "21"])
    assert [s.value for s in scores] == [1.0, 0.5]


def test_the_demo_config_checks_the_reward_settings():
    with pytest.raises(ConfigError, match="reward: unknown 'judge'"):
        DemoConfig(reward="judge")
    with pytest.raises(ConfigError, match="reward_noise"):
        DemoConfig(reward="graded", reward_noise=-0.1)
    with pytest.raises(ConfigError, match="reward_length_bias"):
        DemoConfig(reward_length_bias=float("nan"))
    with pytest.raises(ConfigError, match="along_training_checks"):
        DemoConfig(steps=4, along_training_checks=5)
    with pytest.raises(ConfigError, match="along_training_prompts"):
        DemoConfig(along_training_prompts=0)
    graded = DemoConfig(reward="graded", reward_noise=0.2, reward_length_bias=0.0).reward_provider()
    assert graded.fingerprint() == {"provider": "demo-graded-sorting", "noise": 0.2, "length_bias": 0.0,
                                    "max_answer_chars": 1000}
    assert DemoConfig().reward_provider().fingerprint()["provider"] == "verifiable"
    assert DemoConfig(reward="graded").reward_provider("exact").fingerprint()["provider"] == "verifiable"


def test_the_checks_along_training_answer_the_first_validation_prompts_under_both_measures(tokenizer):
    from align.demo.measures import along_training_callback

    prompts = [{"id": f"v{i}", "messages": [{"role": "user", "content": f"{i:05d}"}], "answer": f"{i:05d}"}
               for i in range(5)]
    config = DemoConfig(reward="graded", steps=8, along_training_checks=2, along_training_prompts=3)
    (callback,) = along_training_callback(config, prompts, tokenizer)
    assert [p["id"] for p in callback.prompts] == ["v0", "v1", "v2"] and callback.eval_steps == 4
    assert callback.provider.fingerprint()["provider"] == "demo-graded-sorting" and set(callback.also) == {
        "exact", "graded"}
    assert callback.temperature == 0.0 and callback.max_tokens == config.max_tokens
    assert along_training_callback(DemoConfig(along_training_checks=0), prompts, tokenizer) == []
