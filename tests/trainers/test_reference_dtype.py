"""A live reference (reference="model") in another dtype than the policy's is cast to the policy's: one
batch layout, its attention mask in the policy's dtype, serves both models. Before, a float32 reference
beside a bf16 policy failed inside attention on the first step."""

from __future__ import annotations

import copy
import logging

import torch

from align.testing.tiny import build_causal_lm
from align.trainers import PreferenceConfig, PreferenceTrainer

ROWS = [{"prompt": "Is 4 even?", "chosen": "yes", "rejected": "no", "chosen_reward": 1.0, "rejected_reward": 0.0,
         "ref_rewards": [0.0, 1.0]}]


def test_a_float32_reference_beside_a_bf16_policy_runs_in_bf16(tiny_tokenizer, tmp_path, caplog, one_torch_thread):
    tokenizer = copy.deepcopy(tiny_tokenizer)
    policy = build_causal_lm(tokenizer).to(torch.bfloat16)
    reference = build_causal_lm(tokenizer)
    assert next(reference.parameters()).dtype == torch.float32
    args = PreferenceConfig(output_dir=str(tmp_path), loss_type="qrpo", num_ref_rewards=2, beta=1.0,
                            reference="model", max_steps=1, per_device_train_batch_size=1, report_to="none")
    with caplog.at_level(logging.WARNING, logger="align.trainers.preference_trainer"):
        trainer = PreferenceTrainer(policy, args=args, train_dataset=ROWS, processing_class=tokenizer,
                                    ref_model=reference)
    assert "the reference model is torch.float32 and the policy torch.bfloat16" in caplog.text
    assert {p.dtype for p in trainer.ref_model.parameters()} == {torch.bfloat16}
    trainer.train()
    assert trainer.state.global_step == 1 and torch.isfinite(torch.tensor(trainer.state.log_history[-1]["train_loss"]))
