"""``report_to: [tensorboard]``: the curves a user watches reach the event files, under names
that browse as a tree (``train/qrpo/target/chosen``, ``eval/rewards/margins``).

The event files are read back with TensorBoard's own reader, as the TensorBoard UI would.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from test_preference_trainer import config as preference_config
from test_preference_trainer import make_rows, with_ref_logps
from test_sft import make_config as sft_config
from test_sft import rows as sft_rows

from align.trainers import PreferenceTrainer
from align.trainers.sft_trainer import SFTTrainer

QRPO_CURVES = [f"qrpo/{name}/{side}" for name in ("quantile_reward", "target", "beta_logratio", "loss")
               for side in ("chosen", "rejected")] + ["qrpo/log_z", "qrpo/beta_over_length"]
DPO_CURVES = ["rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies"]
BOTH = ["loss", "logps/chosen", "logps/rejected", "length/chosen", "length/rejected"]


def read_scalars(output_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the run's event files: tag -> [(step, value)]."""
    files = sorted(Path(output_dir).rglob("events.out.tfevents.*"))
    assert files, f"no TensorBoard event file under {output_dir}"
    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in files:
        events = EventAccumulator(str(path), size_guidance={"scalars": 0})
        events.Reload()
        for tag in events.Tags()["scalars"]:
            scalars.setdefault(tag, []).extend((e.step, e.value) for e in events.Scalars(tag))
    return scalars


@pytest.fixture(scope="module")
def pair_data(tiny_model, tiny_tokenizer, tmp_path_factory):
    return with_ref_logps(make_rows(16), tiny_model, tiny_tokenizer, tmp_path_factory.mktemp("ref"))


@pytest.mark.parametrize("loss_type", ["qrpo", "dpo"])
def test_preference_curves_reach_tensorboard(loss_type, tiny_model, tiny_tokenizer, pair_data, tmp_path):
    args = preference_config(tmp_path, loss_type=loss_type, report_to=["tensorboard"], max_steps=2,
                             eval_strategy="steps", eval_steps=2, num_ref_rewards=10)
    trainer = PreferenceTrainer(copy.deepcopy(tiny_model), args, train_dataset=pair_data,
                                eval_dataset=pair_data[:8], processing_class=tiny_tokenizer)
    trainer.train()
    scalars = read_scalars(Path(args.output_dir))
    curves = BOTH + (QRPO_CURVES if loss_type == "qrpo" else DPO_CURVES)
    for name in curves:
        train = scalars.get(f"train/{name}")
        assert train is not None, f"train/{name} missing; TensorBoard got {sorted(scalars)}"
        assert [step for step, _ in train] == [1, 2], name
        assert all(math.isfinite(v) for _, v in train), name
        assert f"eval/{name}" in scalars, f"eval/{name} missing"
    # one level per idea: no doubled prefix, and the other loss's curves are absent
    assert not [t for t in scalars if "qrpo/qrpo" in t or "rewards/rewards" in t]
    other = DPO_CURVES if loss_type == "qrpo" else QRPO_CURVES
    assert not [t for t in scalars if t.split("/", 1)[1] in other]
    # what TensorBoard shows is what the trainer logged
    logged = [h for h in trainer.state.log_history if "loss" in h and "eval_loss" not in h]
    key = "qrpo/target/chosen" if loss_type == "qrpo" else "rewards/margins"
    assert [v for _, v in scalars[f"train/{key}"]] == pytest.approx([h[key] for h in logged], rel=1e-5)
    if loss_type == "qrpo":  # R_q of a chosen completion is 1 in these rows
        assert [v for _, v in scalars["train/qrpo/quantile_reward/chosen"]] == pytest.approx([1.0, 1.0])


def test_sft_curves_reach_tensorboard(tokenizer, tmp_path):
    from align.chat import install_format
    from align.testing.tiny import build_causal_lm

    install_format(tokenizer)
    args = sft_config(tmp_path, report_to=["tensorboard"], max_steps=2)
    trainer = SFTTrainer(model=build_causal_lm(tokenizer), args=args, train_dataset=sft_rows(8),
                         processing_class=tokenizer)
    trainer.train()
    scalars = read_scalars(Path(args.output_dir))
    for name in ("loss", "learning_rate", "grad_norm", "mean_token_accuracy", "num_tokens"):
        assert [step for step, _ in scalars.get(f"train/{name}", [])] == [1, 2], \
            f"train/{name}: TensorBoard got {sorted(scalars)}"
