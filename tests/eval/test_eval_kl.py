"""The KL estimator against an exact KL, enumerated over a tiny model's vocabulary."""

from __future__ import annotations

import pytest
import torch

from align.eval import stats
from align.eval.kl import check_kl_sampling, sequence_logps, sequence_logratios


@pytest.fixture(scope="module")
def two_models():
    from align.testing.tiny import build_causal_lm, build_tokenizer

    tokenizer = build_tokenizer()
    policy = build_causal_lm(tokenizer, seed=0, tie_word_embeddings=False)
    reference = build_causal_lm(tokenizer, seed=1, tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.no_grad():  # random tiny models are near uniform; give them sharp, different heads
        for model in (policy, reference):
            model.lm_head.weight.copy_(torch.randn_like(model.lm_head.weight) * 0.5)
    return tokenizer, policy, reference


def test_one_token_kl_estimate_covers_the_exact_kl(two_models):
    tokenizer, policy, reference = two_models
    prompt = tokenizer("<s>hello there", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        p = torch.log_softmax(policy(torch.tensor([prompt])).logits[0, -1].double(), -1)
        q = torch.log_softmax(reference(torch.tensor([prompt])).logits[0, -1].double(), -1)
    exact = float((p.exp() * (p - q)).sum())
    generator = torch.Generator().manual_seed(0)
    tokens = torch.multinomial(p.exp(), 3000, replacement=True, generator=generator).tolist()
    ratios = sequence_logratios(policy, reference, [(prompt, [t]) for t in tokens],
                                pad_token_id=tokenizer.pad_token_id, batch_size=500)
    # each per-sequence ratio is log p(t) - log q(t), exactly
    assert ratios[0] == pytest.approx(float(p[tokens[0]] - q[tokens[0]]), abs=1e-4)
    interval = stats.bootstrap_mean(ratios)
    assert exact > 0.05  # the check below must be about a KL that is not zero
    assert interval.low <= exact <= interval.high


def test_sequence_logps_sum_the_completion_tokens_only(two_models):
    tokenizer, policy, _ = two_models
    prompt, completion = [1, 50, 60], [70, 80]
    with torch.no_grad():
        logits = policy(torch.tensor([prompt + completion])).logits[0].double()
    logp = torch.log_softmax(logits, -1)
    expected = float(logp[2, 70] + logp[3, 80])
    [value] = sequence_logps(policy, [(prompt, completion)], pad_token_id=tokenizer.pad_token_id)
    assert value == pytest.approx(expected, abs=1e-4)


def test_sequence_without_completion_tokens_is_an_error(two_models):
    tokenizer, policy, _ = two_models
    with pytest.raises(ValueError, match="sequence 0: no completion tokens"):
        sequence_logps(policy, [([1, 2], [])], pad_token_id=tokenizer.pad_token_id)


def test_kl_needs_samples_at_temperature_one():
    assert check_kl_sampling(1.0, 1.0) is None
    assert "temperature 0.7" in check_kl_sampling(0.7, 1.0)
