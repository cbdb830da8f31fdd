"""``global_batch_size`` for preference training: accumulation = global / (per-device × world size).

The 70B recipes run on 4 or 8 nodes from one file; a hard-coded accumulation would double
the global batch (and halve the steps) on 8. World sizes are faked: no process group needed.
"""

from __future__ import annotations

import copy

from pathlib import Path

import pytest

from align.trainers.common import accumulation_from_global_batch
from align.trainers.preference_config import PreferenceConfig


def config(tmp_path, monkeypatch, world_size: int, **kwargs) -> PreferenceConfig:
    monkeypatch.setattr(PreferenceConfig, "world_size", property(lambda self: world_size))
    return PreferenceConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **kwargs)


@pytest.mark.parametrize("world_size, expected", [(1, 16), (2, 8)])
def test_accumulation_follows_the_world_size(tmp_path, monkeypatch, world_size, expected):
    args = config(tmp_path, monkeypatch, world_size, global_batch_size=64, per_device_train_batch_size=4)
    accumulation_from_global_batch(args, "pairs")
    assert args.gradient_accumulation_steps == expected
    assert args.per_device_train_batch_size * world_size * args.gradient_accumulation_steps == 64


def test_an_indivisible_global_batch_names_the_numbers(tmp_path, monkeypatch):
    args = config(tmp_path, monkeypatch, 2, global_batch_size=20, per_device_train_batch_size=3)
    with pytest.raises(ValueError, match=r"global_batch_size=20 is not a multiple of per_device_train_batch_size=3 "
                                         r"× world size 2"):
        accumulation_from_global_batch(args, "pairs")


def test_a_contradicting_accumulation_is_an_error(tmp_path, monkeypatch):
    args = config(tmp_path, monkeypatch, 2, global_batch_size=64, per_device_train_batch_size=4,
                  gradient_accumulation_steps=4)
    with pytest.raises(ValueError, match=r"gradient_accumulation_steps=4 contradicts global_batch_size=64 "
                                         r"\(which needs 8"):
        accumulation_from_global_batch(args, "pairs")


def test_a_bad_global_batch_is_refused_by_the_config(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="global_batch_size=0"):
        config(tmp_path, monkeypatch, 1, global_batch_size=0)


def test_the_trainer_derives_it(tiny_model, tiny_tokenizer, tmp_path):
    from align.trainers.preference_trainer import PreferenceTrainer

    rows = [{"id": f"r{i}", "messages": [{"role": "user", "content": f"Q{i}?"}], "chosen": "yes", "rejected": "no",
             "chosen_quantile": 1.0, "rejected_quantile": 0.0} for i in range(4)]
    args = PreferenceConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", chat_date="2025-09-01",
                            reference="model", global_batch_size=4, per_device_train_batch_size=2, max_steps=1)
    # copies: the session's tiny model is shared, and a reference model is frozen in place
    trainer = PreferenceTrainer(copy.deepcopy(tiny_model), args, train_dataset=rows, processing_class=tiny_tokenizer,
                                ref_model=copy.deepcopy(tiny_model))
    assert trainer.args.gradient_accumulation_steps == 2


@pytest.mark.parametrize("size, world_sizes", [("apertus-8b", (8, 16)), ("apertus-70b", (32, 64))])
@pytest.mark.parametrize("name", ["qrpo", "dpo"])
def test_the_apertus_recipes_keep_the_published_global_batch(size, name, world_sizes, tmp_path, monkeypatch):
    from align.drivers.args import stage_config

    recipe = Path(__file__).resolve().parents[2] / "recipes" / size / f"{name}.yaml"
    for world_size in world_sizes:
        monkeypatch.setattr(PreferenceConfig, "world_size", property(lambda self, w=world_size: w))
        args = stage_config("train", [str(recipe), "use_cpu=true"])
        assert args.global_batch_size == 512
        accumulation_from_global_batch(args, "pairs")
        assert args.per_device_train_batch_size * world_size * args.gradient_accumulation_steps == 512
