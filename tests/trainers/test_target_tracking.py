"""QRPO's log-ratios watched against their regression targets (`align.trainers.target_tracking`):
the implied KL against a float64 integral of its definition, the off-course distance by hand, the
warning's rule step by step, and a tiny run that collapses at a small β (the warning fires) beside
a healthy one (it does not)."""

from __future__ import annotations

import copy
import logging
import math

import numpy as np
import pytest
import torch
from test_preference_trainer import config, make_rows, with_ref_logps

from align.scoring import completion_logps
from align.testing.tiny import build_causal_lm
from align.trainers import PreferenceTrainer
from align.trainers.target_tracking import (
    PATIENCE,
    TargetWatch,
    implied_kl,
    off_target,
    summary_line,
)


def kl_by_integral(beta: float) -> float:
    """KL(π*‖π_ref) with π* ∝ π_ref·exp(q/β) and q uniform on [0, 1] under π_ref, by quadrature in float64:
    the density of q under π* is p(q) = exp(q/β)/∫exp, and KL = ∫ p log p dq."""
    q = np.linspace(0.0, 1.0, 400_001)
    log_w = q / beta
    log_norm = np.log(np.trapezoid(np.exp(log_w - log_w.max()), q)) + log_w.max()
    log_p = log_w - log_norm
    return float(np.trapezoid(np.exp(log_p) * log_p, q))


@pytest.mark.parametrize("beta", [0.02, 0.04, 0.25, 1.0, 4.0, 50.0])
def test_implied_kl_equals_the_integral_of_its_definition(beta):
    got = float(implied_kl(torch.tensor([beta], dtype=torch.float64))[0])
    assert got == pytest.approx(kl_by_integral(beta), rel=1e-6, abs=1e-10)


def test_implied_kl_is_finite_where_exp_of_one_over_beta_overflows_and_falls_as_beta_grows():
    betas = torch.tensor([1e-4, 1e-3, 0.01, 0.1, 1.0, 10.0], dtype=torch.float64)
    kls = implied_kl(betas)
    assert torch.isfinite(kls).all()
    assert (kls[:-1] > kls[1:]).all()  # a smaller beta lets the targets ask for more
    # u = 1/β large: KL → u − 1 − (u − log u) = log u − 1
    assert float(kls[0]) == pytest.approx(math.log(1e4) - 1, rel=1e-4)


def test_off_target_is_zero_between_zero_and_the_target_and_the_distance_outside():
    logratio = torch.tensor([0.5, 3.0, -1.0, -2.0, -6.0, 1.0, 0.0])
    target = torch.tensor([2.0, 2.0, 2.0, -4.0, -4.0, -4.0, 0.0])
    assert off_target(logratio, target).tolist() == [0.0, 1.0, 1.0, 0.0, 2.0, 1.0, 0.0]


def logs(chosen: float, rejected: float) -> dict[str, float]:
    return {"loss": 1.0, "qrpo/off_target/chosen": chosen, "qrpo/off_target/rejected": rejected}


def test_the_warning_needs_the_margin_passed_on_consecutive_logging_steps(caplog):
    assert PATIENCE == 3
    watch = TargetWatch(0.3)
    flags = []
    with caplog.at_level(logging.WARNING, logger="align.trainers.target_tracking"):
        for step, (c, r) in enumerate([(0.5, 0.0), (0.5, 0.0), (0.1, 0.0), (0.5, 0.0), (0.31, 0.4),
                                       (0.4, 0.0), (0.3, 0.9), (0.9, 0.9)], start=1):
            entry = logs(c, r)
            watch.check(entry, step)
            flags.append(entry["qrpo/off_target_warning"])
    # a dip resets the count; 0.3 is not past a margin of 0.3; the rejected side counts on its own
    assert flags == [0, 0, 0, 0, 0, 1, 0, 0]
    assert watch.warnings == [{"step": 6, "chosen": 0.4}]
    assert len(caplog.records) == 1 and "step 6" in caplog.records[0].getMessage()
    assert watch.summary() == {"margin": 0.3, "logs_past_margin": 1, "first_step": 6,
                               "worst": {"step": 6, "chosen": 0.4}}
    for step in (9, 10):
        watch.check(logs(0.9, 0.95), step)
    # step 9: the rejected side's third log in a row past the margin, the chosen side's second
    assert watch.warnings[1:] == [{"step": 9, "rejected": 0.95}, {"step": 10, "chosen": 0.9, "rejected": 0.95}]
    assert watch.summary()["worst"] == {"step": 9, "rejected": 0.95}  # the first of the highest
    assert watch.summary()["logs_past_margin"] == 3
    assert len(caplog.records) == 1  # said once; the summary counts the rest
    line = summary_line(watch.summary())
    assert line.startswith("warning: QRPO log-ratios ran off their regression targets at 3 logging step(s) from "
                           "step 6 (beyond 0.3 nats per token")


def test_no_margin_no_check_and_logs_without_the_numbers_are_left_alone():
    off = TargetWatch(None)
    entry = logs(5.0, 5.0)
    for step in range(5):
        off.check(entry, step)
    assert "qrpo/off_target_warning" not in entry and off.summary() is None
    watch = TargetWatch(0.3)
    eval_like = {"eval_loss": 1.0}
    watch.check(eval_like, 1)
    assert eval_like == {"eval_loss": 1.0} and watch.summary()["logs_past_margin"] == 0
    assert summary_line(watch.summary()) is None and summary_line(None) is None


@pytest.fixture(scope="module")
def tracked(tiny_tokenizer, tmp_path_factory):
    base = build_causal_lm(tiny_tokenizer)
    return base, with_ref_logps(make_rows(24), base, tiny_tokenizer, tmp_path_factory.mktemp("ref"))


def test_the_logged_numbers_are_the_batchs_log_ratios_and_targets(tracked, tiny_tokenizer, tmp_path):
    base, data = tracked
    trainer = PreferenceTrainer(copy.deepcopy(base), config(tmp_path, beta=0.5), train_dataset=data,
                                processing_class=tiny_tokenizer)
    batch = trainer._prepare_inputs(trainer.data_collator([trainer.train_dataset[i] for i in range(8)]))
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(0.01 * torch.randn_like(p))
        _, metrics = trainer.batch_losses(trainer.model, batch)
        ratio = completion_logps(trainer.model, batch).double() - batch["ref_logps"].double()
    chosen, rejected = ratio.chunk(2)
    assert torch.allclose(metrics["qrpo/logratio/chosen"].double(), chosen, atol=1e-5)
    assert torch.allclose(metrics["qrpo/logratio/rejected"].double(), rejected, atol=1e-5)
    beta_i = metrics["qrpo/beta_over_length"].double()
    for side in ("chosen", "rejected"):
        target = metrics[f"qrpo/target/{side}"].double()
        half = beta_i.chunk(2)[0 if side == "chosen" else 1]
        assert torch.allclose(metrics[f"qrpo/target_logratio/{side}"].double() * half, target, atol=1e-9)
    lengths = batch["lengths"].double()
    expected_off = off_target(ratio, torch.cat([metrics["qrpo/target_logratio/chosen"],
                                                metrics["qrpo/target_logratio/rejected"]]).double()) / lengths
    got_off = torch.cat([metrics["qrpo/off_target/chosen"], metrics["qrpo/off_target/rejected"]]).double()
    assert torch.allclose(got_off, expected_off, atol=1e-6)
    assert torch.allclose(metrics["qrpo/implied_kl"].double(), implied_kl(beta_i), atol=1e-9)


@pytest.mark.parametrize(("beta", "collapses"), [(0.05, True), (5.0, False)])
def test_the_warning_fires_at_a_collapsing_beta_and_not_at_a_healthy_one(tracked, tiny_tokenizer, tmp_path, beta,
                                                                         collapses):
    """β 0.05 over these 5-30 token completions is β/|y| ≈ 0.003: the chosen log-ratios fall by
    tens of nats while their targets are about +6; at β 5 they head for their targets."""
    base, data = tracked
    cfg = config(tmp_path, beta=beta, max_steps=30, learning_rate=3e-3, optimizer="adamw",
                 lr_scheduler_type="constant")
    trainer = PreferenceTrainer(copy.deepcopy(base), cfg, train_dataset=data, processing_class=tiny_tokenizer)
    trainer.train()
    history = [h for h in trainer.state.log_history if "qrpo/off_target/chosen" in h]
    assert len(history) == 30
    flags = [h["qrpo/off_target_warning"] for h in history]
    summary = trainer.target_watch.summary()
    if collapses:
        first = summary["first_step"]
        assert first is not None and flags[first - 1] == 1 and not any(flags[: first - 1])
        assert history[-1]["qrpo/logratio/chosen"] < -10 < 0 < history[0]["qrpo/target_logratio/chosen"]
        assert summary["logs_past_margin"] >= 10
    else:
        assert not any(flags) and summary["logs_past_margin"] == 0
        assert history[-1]["qrpo/logratio/chosen"] > 0


def test_dpo_has_no_targets_to_watch(tracked, tiny_tokenizer, tmp_path):
    base, data = tracked
    trainer = PreferenceTrainer(copy.deepcopy(base), config(tmp_path, loss_type="dpo", max_steps=1),
                                train_dataset=data, processing_class=tiny_tokenizer)
    trainer.train()
    assert trainer.target_watch.summary() is None
    assert not [k for k in trainer.state.log_history[0] if "off_target" in k]
