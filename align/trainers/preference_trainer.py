"""QRPO / DPO training on `transformers.Trainer`: own collator, one forward per batch.

Stages, each a small function:

1. ``prepare_dataset`` (``align.trainers.preference_data``): validate pair rows (errors
   name the row and field), attach quantile rewards (QRPO), tokenize with
   ``align.scoring.encode_record`` — the same tokenization the reference log-prob pass
   used, a completion cut at the sampling budget included (``truncated``) — and check the
   pass scored exactly these token ids (its lengths, its per-completion token hash) with
   the same reference checkpoint; a ``datasets.map`` run on the main process first.
2. ``PreferenceCollator``: chosen and rejected of a batch in one padded or padding-free
   batch, each pair's prompt once before its two completions where the attention allows
   (``prefix_sharing``; ``align.scoring.collators``).
3. ``PreferenceTrainer.compute_loss``: one policy forward scores all 2B completions; the
   reference log-probs come from the dataset (default), a frozen model, or the policy
   with its PEFT adapter disabled; ``align.losses`` gives per-sample losses.

Loss scaling is an exact per-sample mean over the whole optimizer step
(``align.trainers.loss_scale``): the trainer counts the samples of all accumulated
micro-batches on all processes (``num_items_in_batch``). A QRPO sample is one completion (2 per pair, Apertus report E.2: trained on independently); a DPO
sample is one pair.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor
from transformers import AutoTokenizer, PreTrainedModel, Trainer

from align.errors import ConfigError, InputError, loading
from align.losses import LossType, dpo_loss, qrpo_terms
from align.scoring import (
    PreferenceCollator,
    completion_logps,
    is_flash_attention,
    mask_dtype_for,
    resolve_prefix_sharing,
    takes_layout,
    unwrap_model,
)
from align.scoring.block_attention import (
    BLOCK_ATTENTION,
    use_block_attention,
    wants_block_attention,
)
from align.trainers.callbacks import bind_callbacks
from align.trainers.checkpointing import SelectiveCheckpointing
from align.trainers.common import (
    accumulation_from_global_batch,
    create_optimizer,
    deepspeed_reference,
    is_peft_model,
    load_causal_lm,
    lora_config,
)
from align.trainers.guards import (
    CheckpointRecords,
    StopOnRequest,
    check_finite_loss,
    check_finite_weights,
    raise_if_stopped,
)
from align.trainers.loss_scale import local_step_samples, samples_per_pair, step_loss
from align.trainers.preference_config import PreferenceConfig
from align.trainers.preference_data import PREPARED_COLUMNS, prepare_dataset
from align.trainers.target_tracking import TargetWatch, tracking_metrics

__all__ = ["PreferenceTrainer", "deepspeed_reference", "is_peft_model", "load_causal_lm", "lora_config",
           "prepare_dataset", "train"]

logger = logging.getLogger(__name__)

# Per-sequence numbers the collator emits; kept in float64 when batches move to the device.
_EXACT_KEYS = ("ref_logps", "quantiles")


# --------------------------------------------------------------------------- trainer


class PreferenceTrainer(Trainer):
    """QRPO or DPO (``args.loss_type``) on pair rows; see the module docstring for the stages.

    Args:
        model: the policy (a transformers causal LM, a PeftModel, or a path to load).
        args: ``PreferenceConfig``.
        train_dataset / eval_dataset: pair rows (list, ``datasets.Dataset`` or path) with
            the fields of ``align.data.records`` (reference columns for
            ``reference="precomputed"``), or an already prepared dataset.
        processing_class: the tokenizer (default: loaded from the model's path).
        ref_model: the frozen reference for ``reference="model"``.
        peft_config: wrap ``model`` in this PEFT adapter before training.

    Raises ValueError on combinations that cannot work, naming the setting to change.
    """

    loss_is_scaled_for_ga = True  # compute_loss divides by the samples of the whole optimizer step

    def __init__(
        self,
        model: PreTrainedModel | torch.nn.Module | str,
        args: PreferenceConfig,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        ref_model: PreTrainedModel | None = None,
        peft_config: Any = None,
        callbacks: Sequence[Any] | None = None,
        optimizers: tuple[Any, Any] = (None, None),
    ):
        if not isinstance(args, PreferenceConfig):
            raise TypeError(f"args must be a PreferenceConfig, got {type(args).__name__}")
        if isinstance(model, str):
            model = load_causal_lm(model, args)
        if processing_class is None:
            processing_class = AutoTokenizer.from_pretrained(unwrap_model(model).name_or_path)
        if peft_config is not None:
            from peft import get_peft_model
            from transformers import set_seed

            set_seed(args.seed)  # the adapter's random init (LoRA A) follows the seed: a resumed run, or a rerun, matches
            model = get_peft_model(model, peft_config)
        if is_peft_model(model) and args.gradient_checkpointing:
            model.enable_input_require_grads()
        self._check_reference(model, ref_model, args)
        if wants_block_attention(args.block_attention, unwrap_model(model), args.device):
            use_block_attention(unwrap_model(model))  # same numbers: each piece of a row alone
        self.data_summary: dict[str, Any] = {}
        if train_dataset is not None:
            train_dataset = prepare_dataset(train_dataset, processing_class, args, model, self.data_summary)
        if eval_dataset is not None:
            eval_dataset = prepare_dataset(eval_dataset, processing_class, args, model)
        accumulation_from_global_batch(args, "pairs")
        super().__init__(
            model=model,
            args=args,
            data_collator=self._build_collator(model, processing_class, args),
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            callbacks=list(callbacks) if callbacks else None,
            optimizers=optimizers,
        )
        if self.args.n_gpu > 1:
            raise ConfigError("one process drives several GPUs (torch DataParallel), which would split packed "
                              "batches: launch one process per GPU with `accelerate launch` or `torchrun`")
        self.ref_model = self._prepare_reference(ref_model) if ref_model is not None else None
        self._metric_sums: dict[str, dict[str, list[Tensor]]] = {"train": {}, "eval": {}}
        self.target_watch = TargetWatch(args.target_margin if args.loss is LossType.QRPO else None)
        self.add_callback(StopOnRequest())  # before CheckpointRecords: the save it asks for is noted
        self.add_callback(CheckpointRecords(args.save_every_minutes))
        if args.checkpoint_modules != "layer":
            self.add_callback(SelectiveCheckpointing(args.checkpoint_modules))
        bind_callbacks(self)
        self._log_derived_numbers()

    def training_step(self, *args: Any, **kwargs: Any) -> Tensor:
        """The trainer's step, stopped at the first loss that is not finite (``align.trainers.guards``)."""
        loss = super().training_step(*args, **kwargs)
        check_finite_loss(self, loss)
        return loss

    # ----- construction helpers

    def _reference_in_policy_dtype(self, ref_model: PreTrainedModel) -> PreTrainedModel:
        """One batch layout (its attention mask in the policy's dtype) serves both models, so the reference
        runs in the policy's dtype: a reference loaded in another one (a float32 load of a policy saved in
        bf16) is cast, and said so; under DeepSpeed, which places both models itself, it is refused."""
        policy = next((p.dtype for p in self.model.parameters() if p.is_floating_point()), None)
        found = next((p.dtype for p in ref_model.parameters() if p.is_floating_point()), None)
        if policy is None or found is None or policy == found:
            return ref_model
        if self.is_deepspeed_enabled:
            raise ConfigError(f"the reference model is {found} and the policy {policy}: load both in one dtype "
                              "(dtype=..., or bf16 for both)")
        logger.warning("the reference model is %s and the policy %s: the reference runs in %s", found, policy, policy)
        return ref_model.to(policy)

    @staticmethod
    def _check_reference(model: torch.nn.Module, ref_model: Any, args: PreferenceConfig) -> None:
        if args.reference == "model" and ref_model is None:
            raise ConfigError("reference='model' needs ref_model=...: pass the frozen reference, or set "
                              "reference='precomputed' and score the reference first (`align logprobs`, or "
                              "align.compute_ref_logprobs in Python)")
        if args.reference != "model" and ref_model is not None:
            raise ConfigError(f"a ref_model was given but reference={args.reference!r} does not use it: "
                              "set reference='model'")
        if args.reference == "adapter" and not is_peft_model(model):
            raise ConfigError("reference='adapter' needs a PEFT policy: set lora_r or pass peft_config")

    @staticmethod
    def _build_collator(model: torch.nn.Module, tokenizer: Any, args: PreferenceConfig) -> PreferenceCollator:
        config = unwrap_model(model).config
        attn = getattr(config, "_attn_implementation", None) or "eager"
        dtype = torch.bfloat16 if args.bf16 else torch.float16 if args.fp16 else next(model.parameters()).dtype
        if args.padding_free and not (takes_layout(attn) or is_flash_attention(attn)):
            raise ConfigError(f"padding_free=True supports sdpa, eager, flex and flash attention, the model uses "
                              f"{attn!r}: set padding_free=False or attn_implementation='sdpa'")
        return PreferenceCollator(
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0,
            padding_free=args.padding_free,
            attn_implementation=attn,
            mask_dtype=mask_dtype_for(attn, dtype),
            max_row_tokens=args.max_row_tokens,
            pad_to_multiple_of=args.pad_to_multiple_of,
            prefix_sharing=resolve_prefix_sharing(args.prefix_sharing, attn),
            attention_blocks=attn == BLOCK_ATTENTION,
        )

    def _prepare_reference(self, ref_model: PreTrainedModel) -> torch.nn.Module:
        ref_model = self._reference_in_policy_dtype(ref_model)
        if getattr(unwrap_model(self.model).config, "_attn_implementation", None) == BLOCK_ATTENTION:
            use_block_attention(ref_model)  # it reads the same batches (a model not on sdpa ignores the pieces)
        ref_model.eval()
        ref_model.requires_grad_(False)
        if self.is_deepspeed_enabled:
            return deepspeed_reference(ref_model, self.accelerator, self.args)
        return self.accelerator.prepare_model(ref_model, evaluation_mode=True)

    def _log_derived_numbers(self) -> None:
        args = self.args
        pairs = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
        per_pair = samples_per_pair(args.loss.uses_quantile_rewards)
        logger.info("preference training: loss=%s beta=%s reference=%s padding_free=%s prefix_sharing=%s; %d pairs "
                    "(%d loss samples) per optimizer step", args.loss_type, args.beta, args.reference,
                    args.padding_free, self.data_collator.prefix_sharing, pairs, pairs * per_pair)

    # ----- Trainer hooks

    def _set_signature_columns_if_needed(self) -> None:
        if self._signature_columns is None:
            self._signature_columns = list(PREPARED_COLUMNS)

    def create_optimizer(self, model: torch.nn.Module | None = None) -> torch.optim.Optimizer:
        """``align.optim`` by ``optimizer`` (AdEMAMix: T_α, T_β3 default to the total steps)."""
        return create_optimizer(self, model, super().create_optimizer)

    def _get_num_items_in_batch(self, batch_samples: list, device: torch.device) -> Tensor:
        """Loss samples in this optimizer step, over all micro-batches and all processes."""
        per_pair = samples_per_pair(self.args.loss.uses_quantile_rewards)
        count = torch.tensor([local_step_samples(batch_samples, per_pair)], device=device, dtype=torch.long)
        if self.accelerator.num_processes > 1:
            count = self.accelerator.gather(count).sum()
        return count.sum()

    def _prepare_inputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """Move the batch to the device, keeping reference log-probs and quantiles in float64.

        (The Trainer would cast floating tensors to bf16 under DeepSpeed: a log-prob of −600
        in bf16 is off by up to 2.)
        """
        exact = {k: inputs.pop(k) for k in _EXACT_KEYS if k in inputs}
        inputs = super()._prepare_inputs(inputs)
        device = inputs["input_ids"].device
        inputs.update({k: v.to(device) for k, v in exact.items()})
        return inputs

    def compute_loss(self, model, inputs, return_outputs: bool = False, num_items_in_batch=None):
        """Σ per-sample losses / samples in the optimizer step (× processes: DDP averages gradients)."""
        losses, metrics = self.batch_losses(model, inputs)
        loss = step_loss(losses, num_items_in_batch, self.accelerator.num_processes)
        self._accumulate_metrics("train" if model.training else "eval", metrics)
        loss = loss.float()
        return (loss, metrics) if return_outputs else loss

    def prediction_step(self, model, inputs, prediction_loss_only: bool, ignore_keys=None):
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            losses, metrics = self.batch_losses(model, inputs)
        self._accumulate_metrics("eval", metrics)
        return losses.mean().detach().float(), None, None

    # ----- the loss

    def reference_logps(self, model: torch.nn.Module, inputs: Mapping[str, Any]) -> Tensor:
        """Reference log-probs of the batch's sequences, by ``args.reference``."""
        if self.args.reference == "precomputed":
            if "ref_logps" not in inputs:
                raise InputError("the batch has no reference log-probs: run `align logprobs` on the dataset "
                                 "or set reference='model'")
            return inputs["ref_logps"]
        with torch.no_grad():
            if self.args.reference == "model":
                return completion_logps(self.ref_model, inputs)
            was_training = model.training
            model.eval()
            try:
                with self.accelerator.unwrap_model(model).disable_adapter():
                    return completion_logps(model, inputs)
            finally:
                model.train(was_training)

    def batch_losses(self, model: torch.nn.Module, inputs: Mapping[str, Any]) -> tuple[Tensor, dict[str, Tensor]]:
        """Per-sample losses of one batch (2B for QRPO, B for DPO) and per-sample quantities to log."""
        ref = self.reference_logps(model, inputs)
        policy = completion_logps(model, inputs)
        lengths = inputs["lengths"]
        if self.args.loss is LossType.QRPO:
            return self._qrpo(policy, ref, inputs["quantiles"], lengths)
        return self._dpo(policy, ref, lengths)

    def _qrpo(self, policy: Tensor, ref: Tensor, quantiles: Tensor, lengths: Tensor):
        args = self.args
        terms = qrpo_terms(policy, ref, quantiles, lengths, beta=args.beta, length_normalize=args.length_normalize,
                           beta_clamp=args.beta_clamp, normalize_loss_by_length=args.normalize_loss_by_length)
        metrics: dict[str, Tensor] = {"qrpo/log_z": terms.log_z, "qrpo/beta_over_length": terms.beta_i}
        per_side = {"quantile_reward": terms.quantile_rewards, "target": terms.targets,
                    "beta_logratio": terms.beta_logratio, "loss": terms.losses, "logps": policy,
                    "length": lengths}
        for name, values in per_side.items():
            chosen, rejected = values.chunk(2)
            prefix = "qrpo/" if name in ("quantile_reward", "target", "beta_logratio", "loss") else ""
            metrics[f"{prefix}{name}/chosen"], metrics[f"{prefix}{name}/rejected"] = chosen, rejected
        logratio = terms.beta_logratio.detach() / terms.beta_i
        metrics.update(tracking_metrics(logratio, terms.targets, terms.beta_i, lengths.to(logratio.dtype)))
        return terms.losses, metrics

    def _dpo(self, policy: Tensor, ref: Tensor, lengths: Tensor):
        args = self.args
        (pc, pr), (rc, rr), (lc, lr) = policy.chunk(2), ref.chunk(2), lengths.chunk(2)
        losses = dpo_loss(pc, pr, rc, rr, beta=args.beta, chosen_lengths=lc, rejected_lengths=lr,
                          length_normalize=args.length_normalize)
        chosen, rejected = pc - rc, pr - rr
        if args.length_normalize:
            chosen, rejected = chosen / lc, rejected / lr
        chosen, rejected = args.beta * chosen.detach(), args.beta * rejected.detach()
        metrics = {"rewards/chosen": chosen, "rewards/rejected": rejected, "rewards/margins": chosen - rejected,
                   "rewards/accuracies": (chosen > rejected).double(), "logps/chosen": pc, "logps/rejected": pr,
                   "length/chosen": lc, "length/rejected": lr}
        return losses, metrics

    # ----- metrics

    def _accumulate_metrics(self, mode: str, metrics: Mapping[str, Tensor]) -> None:
        """Keep [sum, count] per metric on the device; reduced across processes only when logging."""
        sums = self._metric_sums[mode]
        for name, values in metrics.items():
            values = values.detach().double()
            entry = torch.stack([values.sum(), torch.tensor(float(values.numel()), dtype=torch.float64,
                                                              device=values.device)])
            sums[name] = [entry] if name not in sums else [sums[name][0] + entry]

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        mode = "eval" if any(k.startswith("eval_") for k in logs) else "train"
        sums = self._metric_sums[mode]
        if sums:
            names = sorted(sums)
            stacked = torch.stack([sums[n][0] for n in names]).float()
            if self.accelerator.num_processes > 1:
                stacked = self.accelerator.reduce(stacked, reduction="sum")
            prefix = "eval_" if mode == "eval" else ""
            for name, (total, count) in zip(names, stacked.tolist()):
                logs[prefix + name] = total / count if count else float("nan")
            sums.clear()
        if mode == "train":
            self.target_watch.check(logs, self.state.global_step)  # before the loggers see the step
        super().log(logs, start_time)


# --------------------------------------------------------------------------- entry point


def train(
    config: PreferenceConfig,
    records: Any,
    model: PreTrainedModel | None = None,
    *,
    tokenizer: Any = None,
    ref_model: PreTrainedModel | None = None,
    eval_records: Any = None,
    callbacks: Sequence[Any] | None = None,
) -> PreferenceTrainer:
    """Train a policy on pair rows and save it to ``config.output_dir``; return the trainer.

    Loads what is not given from ``config.model_name_or_path`` (and
    ``ref_model_name_or_path`` for ``reference="model"``); wraps the model in LoRA when
    ``config.lora_r`` is set; resumes from ``config.resume_from_checkpoint`` if set.
    """
    if model is None:
        if not config.model_name_or_path:
            raise ConfigError("pass a model or set model_name_or_path")
        model = load_causal_lm(config.model_name_or_path, config)
    if tokenizer is None:
        source = config.model_name_or_path or unwrap_model(model).name_or_path
        with loading("model_name_or_path", source):
            tokenizer = AutoTokenizer.from_pretrained(source)
    if config.reference == "model" and ref_model is None:
        ref_model = load_causal_lm(config.ref_model_name_or_path or config.model_name_or_path
                                   or unwrap_model(model).name_or_path, config)
    peft_config = lora_config(config) if config.lora_r is not None and not is_peft_model(model) else None
    trainer = PreferenceTrainer(model, config, train_dataset=records, eval_dataset=eval_records,
                                processing_class=tokenizer, ref_model=ref_model, peft_config=peft_config,
                                callbacks=callbacks)
    trainer.train(resume_from_checkpoint=config.resume_from_checkpoint)
    check_finite_weights(trainer)
    raise_if_stopped(trainer)  # ended early on request: its checkpoint is saved, the model is not final
    trainer.save_model()
    return trainer
