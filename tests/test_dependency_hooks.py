"""The private (and overridden) hooks of transformers and TRL that align's trainers rely on.

`align.trainers` subclasses transformers' `Trainer` and TRL's `SFTTrainer` and overrides or
reads members that are not public API. A release that renames one, or changes its
parameters, would break training quietly (an override never called, a metric never
logged). The floors in pyproject.toml are the versions these checks pass on; a failure
names the hook, where align uses it, and what changed.

Where align uses each hook:

transformers.Trainer (`align.trainers.preference_trainer.PreferenceTrainer`):
    _get_num_items_in_batch   overridden: loss samples per optimizer step (exact loss scaling)
    _prepare_inputs           overridden and called: reference log-probs stay float64
    _set_signature_columns_if_needed / _signature_columns   overridden: keep the prepared columns
    loss_is_scaled_for_ga     class attribute set: compute_loss already divides by the step's samples
    is_deepspeed_enabled      read: wrap the frozen reference for DeepSpeed
    compute_loss, prediction_step, log, create_optimizer, get_batch_samples,
    get_decay_parameter_names, compute_loss_context_manager   overridden or called with these parameters
transformers (models and masks):
    PretrainedConfig._attn_implementation   read by the collators, the trainers and the log-prob pass
    masking_utils.find_packed_sequence_indices   padding-free SFT on sdpa/eager needs it
TRL (`align.trainers.sft_trainer.SFTTrainer`, `align.eval.callback`):
    SFTTrainer._metrics, SFTTrainer._total_train_tokens   written by the prompt-weighted loss path
    add_fused_lm_head and FusedCausalLMOutput   the weighted loss calls model(..., fused_lm_head=True)
        and reads log_probs, entropy, is_top1 (SFTTrainer patches the model with those outputs)
    SFTTrainer.compute_loss, get_batch_samples   overridden with these parameters
    trl.models.utils.unwrap_model_for_generation   generation during training (ZeRO-3 gathers)
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect

import pytest
import transformers


def _hook(owner: object, name: str, where: str):
    label = f"{getattr(owner, '__module__', '')}.{getattr(owner, '__qualname__', owner)}.{name}"
    if not hasattr(owner, name):
        pytest.fail(f"{label} is gone (used by {where}); pin the version the floors in pyproject.toml name, "
                    "or port the override", pytrace=False)
    return getattr(owner, name), label


def _check_params(owner: object, name: str, expected: list[str], where: str) -> None:
    member, label = _hook(owner, name, where)
    found = list(inspect.signature(member).parameters)
    if found[: len(expected)] != expected:
        pytest.fail(f"{label} changed its parameters (used by {where}): align expects {expected}, "
                    f"this version has {found}", pytrace=False)


def _check_source(owner: object, name: str, needle: str, where: str) -> None:
    member, label = _hook(owner, name, where)
    if needle not in inspect.getsource(member):
        pytest.fail(f"{label} no longer mentions {needle!r} (used by {where}); the hook align relies on "
                    "moved", pytrace=False)


TRAINER_METHODS = [
    ("_get_num_items_in_batch", ["self", "batch_samples", "device"], "PreferenceTrainer (exact loss scaling)"),
    ("_prepare_inputs", ["self", "inputs"], "PreferenceTrainer (float64 reference log-probs)"),
    ("_set_signature_columns_if_needed", ["self"], "PreferenceTrainer (prepared columns kept)"),
    ("compute_loss", ["self", "model", "inputs", "return_outputs", "num_items_in_batch"],
     "PreferenceTrainer and SFTTrainer.compute_loss"),
    ("prediction_step", ["self", "model", "inputs", "prediction_loss_only", "ignore_keys"],
     "PreferenceTrainer.prediction_step"),
    ("log", ["self", "logs", "start_time"], "PreferenceTrainer.log and GenerationEvalCallback._log"),
    ("create_optimizer", ["self", "model"], "the trainers' align.optim optimizers"),
    ("get_batch_samples", ["self", "epoch_iterator", "num_batches", "device"],
     "SFTTrainer.get_batch_samples (prompt-loss-weight normaliser)"),
    ("get_decay_parameter_names", ["self", "model"], "the trainers' optimizer parameter groups"),
    ("compute_loss_context_manager", ["self"], "PreferenceTrainer.prediction_step"),
]


@pytest.mark.parametrize(("name", "params", "where"), TRAINER_METHODS, ids=[m[0] for m in TRAINER_METHODS])
def test_trainer_methods_keep_their_parameters(name, params, where):
    _check_params(transformers.Trainer, name, params, where)


def test_trainer_reads_loss_is_scaled_for_ga():
    where = "PreferenceTrainer.loss_is_scaled_for_ga (no second division by the accumulation steps)"
    _hook(transformers.Trainer, "loss_is_scaled_for_ga", where)
    _check_source(transformers.Trainer, "training_step", "loss_is_scaled_for_ga", where)


def test_trainer_attributes_set_in_init():
    _check_source(transformers.Trainer, "__init__", "self._signature_columns =",
                  "PreferenceTrainer._set_signature_columns_if_needed")
    _check_source(transformers.Trainer, "create_accelerator_and_postprocess", "self.is_deepspeed_enabled =",
                  "PreferenceTrainer._prepare_reference")
    _check_source(transformers.Trainer, "_set_signature_columns_if_needed", "self._signature_columns",
                  "PreferenceTrainer._set_signature_columns_if_needed")


def test_config_attn_implementation():
    where = "the collators, the trainers and the log-prob pass (which attention mask to build)"
    config = transformers.LlamaConfig(attn_implementation="sdpa")
    if getattr(config, "_attn_implementation", None) != "sdpa":
        pytest.fail(f"PretrainedConfig._attn_implementation no longer holds the attention implementation "
                    f"(used by {where})", pytrace=False)


def test_packed_sequence_masks():
    where = "SFTTrainer padding-free/packing on sdpa and eager (check_padding_free)"
    masking = importlib.import_module("transformers.masking_utils")
    _hook(masking, "find_packed_sequence_indices", where)


def test_trl_sft_trainer_metrics_and_token_count():
    from trl import SFTTrainer

    where = "align SFTTrainer._log_token_metrics (prompt-loss-weight path)"
    for attribute in ("_metrics", "_total_train_tokens"):
        _check_source(SFTTrainer, "__init__", f"self.{attribute} =", where)
    _check_params(SFTTrainer, "compute_loss", ["self", "model", "inputs", "return_outputs", "num_items_in_batch"],
                  "align SFTTrainer.compute_loss")
    _check_params(SFTTrainer, "get_batch_samples", ["self", "epoch_iterator", "num_batches", "device"],
                  "align SFTTrainer.get_batch_samples")


def test_trl_fused_lm_head():
    from trl import SFTTrainer

    utils = importlib.import_module("trl.trainer.utils")
    where = "align SFTTrainer._weighted_loss (model(..., fused_lm_head=True))"
    _check_params(utils, "add_fused_lm_head", ["model", "temperature", "cast_lm_head_to_fp32", "outputs"], where)
    _check_source(SFTTrainer, "__init__", "add_fused_lm_head(", where)
    for output in ('"entropy"', '"is_top1"'):
        _check_source(SFTTrainer, "__init__", output, where + f": SFTTrainer must patch with {output}")
    output_cls, label = _hook(utils, "FusedCausalLMOutput", where)
    names = {f.name for f in dataclasses.fields(output_cls)}
    missing = {"log_probs", "entropy", "is_top1"} - names
    if missing:
        pytest.fail(f"{label} lacks {sorted(missing)} (used by {where})", pytrace=False)


def test_trl_unwrap_model_for_generation():
    models_utils = importlib.import_module("trl.models.utils")
    _check_params(models_utils, "unwrap_model_for_generation", ["model", "accelerator"],
                  "align.eval.callback.GenerationEvalCallback (generation during training)")
