"""One optimizer step's gradient is the gradient of the plain mean loss over every sample of the step.

The accumulation and two-process tests compare runs with each other, and an Adam-type update
hardly moves when every gradient doubles: a loss scaled twice over passes them. Here the
step's gradient, summed over its micro-batches as the Trainer sums them, is compared with
autograd's gradient of the mean per-sample loss over the whole step, by value. The
processes of a launch are simulated by their arithmetic: each computes its share, and the
gradient average DDP and DeepSpeed take divides by their number.
"""

from __future__ import annotations

import copy
import random

import pytest
import torch

from align.logprobs import compute_ref_logprobs, load_ref_logprobs
from align.testing.tiny import build_causal_lm, corpus_text
from align.trainers import PreferenceConfig, PreferenceTrainer
from align.trainers.loss_scale import local_step_samples, samples_per_pair, step_loss, token_loss

MAX_LENGTH = 96
DATE = "2025-09-01"


def pair_rows(count: int) -> list[dict]:
    rng = random.Random(3)
    words = corpus_text().split()
    text = lambda lo, hi: " ".join(rng.choice(words) for _ in range(rng.randint(lo, hi)))  # noqa: E731
    return [{"id": f"p{i}", "messages": [{"role": "user", "content": text(2, 6)}], "chosen": text(1, 8),
             "rejected": text(1, 8), "chosen_reward": 1.0, "rejected_reward": 0.0, "chosen_quantile": 0.9,
             "rejected_quantile": 0.2, "num_ref_rewards": 10, "pair_fallback": None} for i in range(count)]


@pytest.fixture(scope="module")
def setup(tiny_tokenizer, tmp_path_factory):
    reference = build_causal_lm(tiny_tokenizer)
    out = tmp_path_factory.mktemp("ref")
    rows = pair_rows(6)
    compute_ref_logprobs(rows, reference, tiny_tokenizer, chat_format="apertus", batch_size=6, max_length=MAX_LENGTH,
                         output_dir=out, chat_date=DATE)
    policy = copy.deepcopy(reference)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    return policy, load_ref_logprobs(out, rows)


def step_gradient_and_mean_gradient(policy, rows, tokenizer, tmp_path, loss_type):
    config = PreferenceConfig(output_dir=str(tmp_path / loss_type), per_device_train_batch_size=2, max_steps=1,
                              report_to="none", use_cpu=True, max_length=MAX_LENGTH, chat_date=DATE, loss_type=loss_type,
                              save_strategy="no", disable_tqdm=True, seed=0, gradient_accumulation_steps=3)
    trainer = PreferenceTrainer(copy.deepcopy(policy), config, train_dataset=rows, processing_class=tokenizer)
    model = trainer.model.train()
    # one optimizer step of 3 micro-batches: 2 pairs, 2 pairs, and a short last window of 1 pair
    batches = [trainer._prepare_inputs(trainer.data_collator([trainer.train_dataset[i] for i in ids]))
               for ids in ([0, 1], [2, 3], [4])]
    count = trainer._get_num_items_in_batch(batches, torch.device("cpu"))
    model.zero_grad()
    for batch in batches:
        trainer.compute_loss(model, batch, num_items_in_batch=count).backward()
    step = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    losses = torch.cat([trainer.batch_losses(model, batch)[0] for batch in batches])
    losses.mean().backward()
    mean = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return int(count), losses.numel(), step, mean


@pytest.mark.parametrize("loss_type,samples", [("qrpo", 10), ("dpo", 5)])
def test_a_steps_gradient_is_the_gradient_of_its_mean_loss(loss_type, samples, setup, tiny_tokenizer, tmp_path):
    """QRPO trains chosen and rejected as two samples each (5 pairs: 10); DPO one per pair."""
    policy, rows = setup
    count, n, step, mean = step_gradient_and_mean_gradient(policy, rows[:5], tiny_tokenizer, tmp_path, loss_type)
    assert count == n == samples
    assert step.keys() == mean.keys() and len(step) > 3
    for name in step:
        torch.testing.assert_close(step[name], mean[name], rtol=1e-4, atol=1e-7, msg=name)
    assert max(g.abs().max().item() for g in mean.values()) > 1e-3  # a gradient that would show a factor


def test_two_processes_average_to_the_mean_over_both():
    """Each process backpropagates Σ its losses / the step's samples on all processes × processes; the
    gradient average over processes is then the plain mean over every sample."""
    mine, theirs = torch.tensor([0.5, 2.0, 1.5]), torch.tensor([3.0, 0.25])
    total = mine.numel() + theirs.numel()
    shares = [step_loss(part, torch.tensor(total), 2) for part in (mine, theirs)]
    assert ((shares[0] + shares[1]) / 2).item() == pytest.approx(torch.cat([mine, theirs]).mean().item())
    assert step_loss(mine, None, 4).item() == pytest.approx(mine.mean().item())  # evaluation: the plain mean


def test_a_steps_samples_count_every_micro_batch_and_loss_samples_per_pair():
    batches = [{"lengths": torch.ones(6)}, {"lengths": torch.ones(4)}, {"lengths": torch.ones(2)}]  # 3 + 2 + 1 pairs
    assert samples_per_pair(True) == 2 and samples_per_pair(False) == 1
    assert local_step_samples(batches, samples_per_pair(True)) == 12
    assert local_step_samples(batches, samples_per_pair(False)) == 6


def test_sft_token_loss_is_the_mean_over_the_steps_tokens_on_every_process():
    """Σ w·nll / Σ w over the step; with token counts summed over processes each share is × processes."""
    nll = [torch.tensor(6.0), torch.tensor(1.5)]  # Σ w·nll of each process's micro-batch
    tokens = [3.0, 0.5]  # Σ w of each (fractional prompt weights: under one token is possible)
    shares = [token_loss(n, sum(tokens), 2, counted_on_all_processes=True) for n in nll]
    assert ((shares[0] + shares[1]) / 2).item() == pytest.approx(7.5 / 3.5)
    alone = [token_loss(n, t, 2, counted_on_all_processes=False) for n, t in zip(nll, tokens)]
    assert [a.item() for a in alone] == pytest.approx([2.0, 3.0])  # each its own tokens' mean
    assert token_loss(torch.tensor(0.0), 0, 1, counted_on_all_processes=False).item() == 0.0  # no tokens: no NaN
