"""RewardModel's token budget: each forward holds at most max_batch_tokens padded tokens, at most
batch_size sequences, and the scores do not change."""

from __future__ import annotations

import copy

import pytest
from reward_cases import ANSWERS, QUESTIONS, prompt

from rewards.config import RewardProviderConfig, build_reward_provider
from rewards.reward_model import RewardModel, budget_batches

PAIRS = [(prompt(q), a * (1 + i % 4)) for i, (q, a) in enumerate((q, a) for q in QUESTIONS for a in ANSWERS if a)]


def make_rm(rm_model, tok, **kwargs) -> RewardModel:
    return RewardModel("tiny-rm", model=copy.deepcopy(rm_model), tokenizer=tok, **kwargs)


def forwards(rm: RewardModel) -> list[list[int]]:
    """Record the lengths of the sequences of every forward the reward model runs."""
    seen: list[list[int]] = []
    forward = rm._forward

    def recording(batch):
        seen.append([len(ids) for ids in batch])
        return forward(batch)

    rm._forward = recording
    return seen


def run(rm: RewardModel) -> list[float]:
    return [s.value for s in rm.score([c for c, _ in PAIRS], [a for _, a in PAIRS])]


def lengths(rm: RewardModel) -> list[int]:
    return [len(rm.encode(c, a)[0]) for c, a in PAIRS]


@pytest.mark.parametrize("sort_by_length", [True, False])
def test_every_forward_holds_at_most_the_token_budget_and_the_scores_are_unchanged(rm_model, chat_tokenizer,
                                                                                   sort_by_length):
    baseline = make_rm(rm_model, chat_tokenizer, batch_size=1)
    sizes = lengths(baseline)
    assert max(sizes) > 2 * min(sizes)  # lengths that differ, so the budget matters
    expected = run(baseline)
    budget = 2 * max(sizes) + 3
    rm = make_rm(rm_model, chat_tokenizer, batch_size=16, max_batch_tokens=budget, sort_by_length=sort_by_length)
    seen = forwards(rm)
    assert run(rm) == pytest.approx(expected, abs=1e-5)
    assert sorted(n for batch in seen for n in batch) == sorted(sizes)  # every input scored once
    for batch in seen:
        assert len(batch) * max(batch) <= budget and len(batch) <= 16
    assert max(len(b) for b in seen) > 2  # short inputs share a forward beyond what the longest allow
    if sort_by_length:
        assert len(seen[0]) <= 2  # the longest first, two at most within the budget


def test_without_a_budget_batch_size_alone_decides(rm_model, chat_tokenizer):
    rm = make_rm(rm_model, chat_tokenizer, batch_size=4)
    seen = forwards(rm)
    run(rm)
    assert [len(b) for b in seen] == [4] * (len(PAIRS) // 4) + ([len(PAIRS) % 4] if len(PAIRS) % 4 else [])


def test_batch_size_still_caps_the_rows_under_a_large_budget(rm_model, chat_tokenizer):
    rm = make_rm(rm_model, chat_tokenizer, batch_size=3, max_batch_tokens=10**9)
    seen = forwards(rm)
    run(rm)
    assert max(len(b) for b in seen) == 3


def test_an_input_longer_than_the_budget_is_scored_alone(rm_model, chat_tokenizer):
    expected = run(make_rm(rm_model, chat_tokenizer, batch_size=1))
    rm = make_rm(rm_model, chat_tokenizer, batch_size=8, max_batch_tokens=5)
    seen = forwards(rm)
    assert run(rm) == pytest.approx(expected, abs=1e-5)
    assert all(len(b) == 1 for b in seen)


def test_budget_batches_cut_at_either_cap():
    sizes = [10, 9, 5, 5, 4, 2, 2, 2, 1]
    assert budget_batches(range(9), sizes, 4, 20) == [[0, 1], [2, 3, 4, 5], [6, 7, 8]]
    assert budget_batches(range(9), sizes, 2, None) == [[0, 1], [2, 3], [4, 5], [6, 7], [8]]
    assert budget_batches([8, 0, 5], sizes, 8, 15) == [[8], [0], [5]]  # unsorted: the widest row counts
    assert budget_batches([], sizes, 4, 20) == []


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_a_bad_budget_is_refused(rm_model, chat_tokenizer, bad):
    with pytest.raises(ValueError, match="max_batch_tokens"):
        make_rm(rm_model, chat_tokenizer, max_batch_tokens=bad)


def test_the_recipe_key_reaches_the_reward_model(rm_model, chat_tokenizer, tmp_path):
    rm_model.save_pretrained(tmp_path)
    chat_tokenizer.save_pretrained(tmp_path)
    provider = build_reward_provider(RewardProviderConfig(model=str(tmp_path), model_batch_size=6,
                                                          max_batch_tokens=4096))
    assert (provider.config.batch_size, provider.config.max_batch_tokens) == (6, 4096)
    assert build_reward_provider(RewardProviderConfig(model=str(tmp_path))).config.max_batch_tokens is None
