"""Supervised fine-tuning on TRL's `SFTTrainer`, with the loss mask from `align.chat`.

What this adds to TRL's trainer, and why:

* **Masks from align.chat.** Conversation rows are tokenized by `align.trainers.sft_data`
  into ``input_ids`` + ``labels`` (-100 off the assistant mask) before TRL sees them; TRL
  treats such a dataset as processed and trains on exactly those labels.
* **Prompt-loss weight.** With ``prompt_loss_weight`` w > 0, every real token is a target:
  assistant tokens weigh 1, the others w, and the loss is Σ w·nll / Σ w over the global
  batch (all accumulation steps and ranks), so batch 8 × accumulation 1 and 1 × 8 agree.
  w = 0 is TRL's own assistant-only path.
* **Padding-free / packing only where attention stays inside each sequence.** Flattened
  batches carry restarted ``position_ids`` and no attention mask. FlashAttention reads the
  boundaries from them; on ``sdpa`` and ``eager`` transformers builds a block-diagonal mask
  from them, but only when no KV cache is created (TRL calls the model with
  ``use_cache=False``; with a cache the sequences attend to each other). Anything else
  raises, since the leak would be silent.
* **Optimizers by name** from `align.optim` (AdEMAMix with T_α = T_β3 = total steps),
  built as the preference trainer builds them (`align.trainers.common`).
* **Data hygiene** (``identity_filter``, ``strip_boxed``) before tokenizing; the counts
  are in ``trainer.data_summary``.
* **Global batch size** turned into gradient accumulation for the world size at hand.

Raises:
    ValueError: padding-free or packing with an attention implementation that would leak
        across sequences; wrapped packing (it cuts conversations and their masks apart);
        a global batch not divisible by per-device batch × world size; a pre-tokenized
        dataset without labels; a row that cannot be encoded (naming the row and field).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import types
from pathlib import Path
from typing import Any

import datasets
import torch
from datasets import Dataset
from trl import SFTTrainer as TRLSFTTrainer

from align.chat import install_format
from align.errors import ConfigError, loading
from align.scoring.collators import padded_width
from align.scoring.flex import FLEX_ATTENTION
from align.scoring.logps import unwrap_model
from align.trainers.callbacks import bind_callbacks
from align.trainers.checkpointing import SelectiveCheckpointing
from align.trainers.common import (
    accumulation_from_global_batch,
    create_optimizer,
    is_peft_model,
    load_causal_lm,
    lora_config,
    preparation_order,
)
from align.trainers.guards import (
    CheckpointRecords,
    StopOnRequest,
    check_finite_loss,
    check_finite_weights,
    raise_if_stopped,
)
from align.trainers.loss_scale import token_loss
from align.trainers.sft_config import SFTConfig
from align.trainers.sft_data import IGNORE_INDEX, load_sft_dataset, prepare_sft_dataset

__all__ = ["SFTTrainer", "check_padding_free", "token_weights", "train_sft", "uses_padding_free"]

logger = logging.getLogger(__name__)

# Attention implementations that keep flattened sequences apart given restarted position_ids.
VARLEN_IMPLEMENTATIONS = ("flash_attention_2", "flash_attention_3")
POSITION_MASK_IMPLEMENTATIONS = ("sdpa", "eager", "flex_attention")


def uses_padding_free(args: SFTConfig) -> bool:
    """Whether TRL will flatten batches (explicit padding-free, or BFD packing)."""
    return bool(
        args.padding_free or (args.packing and args.packing_strategy in {"bfd", "bfd_split"})
    )


def _transformers_masks_packed_sequences() -> bool:
    """transformers ≥ 4.54 derives a block-diagonal mask from restarted position_ids."""
    try:
        from transformers.masking_utils import find_packed_sequence_indices  # noqa: F401
    except ImportError:
        return False
    return True


def check_padding_free(args: SFTConfig, attn_implementation: str | None) -> None:
    """Refuse flattened batches where sequences would silently attend to each other."""
    if args.packing and args.packing_strategy == "wrapped":
        raise ConfigError(
            "packing_strategy='wrapped' cuts conversations mid-way and lets them attend to each "
            "other; use packing_strategy='bfd' (or packing=False)"
        )
    if not uses_padding_free(args):
        return
    impl = attn_implementation or "eager"
    if impl in VARLEN_IMPLEMENTATIONS or "flash" in impl:
        return
    if impl in POSITION_MASK_IMPLEMENTATIONS and _transformers_masks_packed_sequences():
        return
    raise ConfigError(
        f"padding_free/packing with attn_implementation={impl!r} would let packed sequences "
        "attend to each other. Use one of "
        f"{VARLEN_IMPLEMENTATIONS + POSITION_MASK_IMPLEMENTATIONS} (sdpa/eager need "
        "transformers >= 4.54), or set padding_free=False and packing=False"
    )


class BucketedBatches:
    """TRL's SFT collator with each batch padded to its length bucket (``align.scoring.collators.bucket_width``):
    transformers compiles FlexAttention for static shapes, so a run compiles once per bucket, not per batch.
    TRL pads the batch itself (its ``pad_to_multiple_of``, set per batch to the bucket), so the padding and a
    padding-free batch's sequence bounds are TRL's own."""

    def __init__(self, collator: Any):
        self.collator = collator

    def __call__(self, features: list[Any]) -> dict[str, Any]:
        lengths = [len(feature["input_ids"]) for feature in features]
        tokens = sum(lengths) if self.collator.padding_free else max(lengths)  # one flat row, or the longest
        width = padded_width(tokens, self.collator.pad_to_multiple_of, buckets=True)
        return dataclasses.replace(self.collator, pad_to_multiple_of=width)(features)


def token_weights(batch: dict[str, torch.Tensor], prompt_loss_weight: float) -> torch.Tensor:
    """Per-token loss weight, aligned with ``labels``: 1 on trained tokens, w on other targets.

    A position is a prediction target when it is a real token that is not the first of its
    sequence: ``attention_mask`` == 1 in padded batches, ``position_ids`` != 0 in
    padding-free ones (where padding also has position 0). Position 0 of each row is never
    a target; callers use ``weights[:, 1:]``, like the shifted labels.
    """
    labels = batch["labels"]
    if "attention_mask" in batch and batch["attention_mask"].dim() == 2:
        real = batch["attention_mask"].bool()
    elif "position_ids" in batch:
        real = batch["position_ids"] != 0
    else:
        raise RuntimeError("token_weights needs a 2D 'attention_mask' or 'position_ids' in the batch")
    trained = labels != IGNORE_INDEX
    weights = torch.where(trained, 1.0, torch.where(real, float(prompt_loss_weight), 0.0))
    weights[:, 0] = 0.0
    return weights


def rebind_fused_forward(model: torch.nn.Module) -> None:
    """Make TRL's fused-LM-head forward follow the model it is called on, so copies are safe.

    TRL's SFTTrainer replaces ``model.forward`` with a wrapper whose plain path calls the
    bound ``forward`` of the model it patched, captured in a closure. ``copy.deepcopy`` of
    the trained model rebinds the wrapper to the copy but keeps that closure, so the copy's
    ``generate`` and plain forward silently ran the original's weights. Here the plain path
    calls the class's forward on ``self``; the fused path (training) is TRL's, unchanged.
    """
    target = model.get_base_model() if is_peft_model(model) else model
    patched = target.__dict__.get("forward")
    fused = getattr(patched, "__func__", None)
    if fused is None:
        return

    def forward(self, *args: Any, fused_lm_head: bool = False, **kwargs: Any) -> Any:
        if fused_lm_head:
            return fused(self, *args, fused_lm_head=True, **kwargs)
        return type(self).forward(self, *args, **kwargs)

    functools.update_wrapper(forward, type(target).forward)  # `generate` checks kwargs against the signature
    target.forward = types.MethodType(forward, target)


class SFTTrainer(TRLSFTTrainer):
    """TRL's SFTTrainer fed by align.chat masks; see the module docstring for the additions.

    Args:
        model: a model instance or a path/hub id (loaded by TRL with `model_init_kwargs`).
        args: `align.trainers.sft_config.SFTConfig`.
        train_dataset: rows with ``messages`` (+ ``tools``), or ``input_ids`` + ``labels``.
        processing_class: the tokenizer, already prepared with `align.chat.install_format`.
        eval_dataset, peft_config, callbacks: as in TRL.
    """

    def __init__(
        self,
        model: Any,
        args: SFTConfig,
        train_dataset: Dataset,
        processing_class: Any,
        eval_dataset: Dataset | None = None,
        peft_config: Any = None,
        callbacks: list[Any] | None = None,
    ):
        if not isinstance(args, SFTConfig):
            raise TypeError(
                f"args must be align.trainers.sft_config.SFTConfig, got {type(args).__name__}"
            )
        if not isinstance(model, str):
            check_padding_free(args, getattr(model.config, "_attn_implementation", None))
        self.data_summary: dict[str, Any] = {}
        train_dataset = self._prepare(train_dataset, processing_class, args, self.data_summary)
        if eval_dataset is not None:
            eval_dataset = self._prepare(eval_dataset, processing_class, args)
        _set_accumulation_from_global_batch(args)
        super().__init__(
            model=model,
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            peft_config=peft_config,
            callbacks=callbacks,
        )
        check_padding_free(args, getattr(self.model.config, "_attn_implementation", None))
        if getattr(unwrap_model(self.model).config, "_attn_implementation", None) == FLEX_ATTENTION:
            self.data_collator = BucketedBatches(self.data_collator)
        rebind_fused_forward(self.model)
        self.prompt_loss_weight = float(args.prompt_loss_weight)
        self.add_callback(StopOnRequest())  # before CheckpointRecords: the save it asks for is noted
        self.add_callback(CheckpointRecords(args.save_every_minutes))
        if args.checkpoint_modules != "layer":
            self.add_callback(SelectiveCheckpointing(args.checkpoint_modules))
        bind_callbacks(self)

    @staticmethod
    def _prepare(dataset: Dataset, tokenizer: Any, args: SFTConfig, summary: dict[str, Any] | None = None
                 ) -> Dataset:
        """Clean and tokenize with align.chat (file-backed data: the main process first, the others reuse its cache)."""
        if args.process_index != 0:  # one set of `datasets` progress bars: the main process's
            datasets.disable_progress_bars()
        with preparation_order(args, dataset, "SFT dataset preparation"):
            return prepare_sft_dataset(
                dataset,
                tokenizer,
                chat_format=args.chat_format,
                chat_date=args.chat_date,
                max_length=args.max_length,
                num_proc=args.dataset_num_proc,
                strip_boxed=args.strip_boxed,
                identity_filter=args.identity_filter,
                identity_keywords=args.identity_keywords,
                summary=summary,
            )

    # ---- loss -------------------------------------------------------------------------

    def training_step(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """TRL's step, stopped at the first loss that is not finite (``align.trainers.guards``)."""
        loss = super().training_step(*args, **kwargs)
        check_finite_loss(self, loss)
        return loss

    def compute_loss(
        self,
        model: torch.nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, Any]:
        """Assistant-only: TRL's loss on our labels. With w > 0: the weighted loss below."""
        if self.prompt_loss_weight == 0.0:
            return super().compute_loss(
                model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
            )
        loss = self._weighted_loss(model, inputs, num_items_in_batch)
        if not return_outputs:
            return loss
        # Evaluation asks for logits; the fused head never builds them, so run the plain forward.
        with torch.no_grad():
            outputs = model(**{k: v for k, v in inputs.items() if k != "labels"}, use_cache=False)
        return loss, outputs

    def _weighted_loss(
        self,
        model: torch.nn.Module,
        inputs: dict[str, Any],
        num_items_in_batch: torch.Tensor | int | None,
    ) -> torch.Tensor:
        """Σ w·nll / Σ w, with every real token a target (see `token_weights`)."""
        weights = token_weights(inputs, self.prompt_loss_weight)
        targets = inputs["input_ids"].masked_fill(weights == 0, IGNORE_INDEX)
        outputs = model(**{**inputs, "labels": targets, "use_cache": False}, fused_lm_head=True)
        shifted = weights[:, 1:].to(outputs.log_probs.dtype)
        total = shifted.sum() if num_items_in_batch is None else num_items_in_batch
        every_process = bool(self.args.average_tokens_across_devices and num_items_in_batch is not None)
        loss = token_loss(-(outputs.log_probs * shifted).sum(), total, self.accelerator.num_processes, every_process)
        self._log_token_metrics(outputs, inputs["labels"][:, 1:] != IGNORE_INDEX, inputs)
        return loss

    def _log_token_metrics(
        self, outputs: Any, trained: torch.Tensor, inputs: dict[str, Any]
    ) -> None:
        """Entropy, accuracy (on trained tokens) and token count, like TRL's own path."""
        mode = "train" if self.model.training else "eval"
        gather = self.accelerator.gather_for_metrics
        num_valid = gather(trained.sum()).sum()
        entropy = gather((outputs.entropy * trained).detach().sum()).sum()
        correct = gather((outputs.is_top1 * trained).sum()).sum()
        self._metrics[mode]["entropy"].append(
            (entropy / num_valid).item() if num_valid > 0 else 0.0
        )
        self._metrics[mode]["mean_token_accuracy"].append(
            (correct / num_valid).item() if num_valid > 0 else 0.0
        )
        if mode == "train":
            if "attention_mask" in inputs:
                local = inputs["attention_mask"].sum()
            else:
                local = torch.tensor(
                    inputs["position_ids"].size(1), device=inputs["position_ids"].device
                )
            self._total_train_tokens += gather(local).sum().item()
        self._metrics[mode]["num_tokens"] = [self._total_train_tokens]

    def get_batch_samples(
        self, epoch_iterator: Any, num_batches: int, device: torch.device
    ) -> tuple[list[dict[str, Any]], torch.Tensor | int | None]:
        """With w > 0 the normaliser is Σ w over the accumulation window and all ranks."""
        batch_samples, num_items = super().get_batch_samples(epoch_iterator, num_batches, device)
        if self.prompt_loss_weight == 0.0 or num_items is None or not batch_samples:
            return batch_samples, num_items
        total = sum(
            token_weights(batch, self.prompt_loss_weight)[:, 1:].sum() for batch in batch_samples
        )
        total = torch.as_tensor(total, device=device)
        if self.args.average_tokens_across_devices and self.args.world_size > 1:
            total = self.accelerator.gather(total).sum()
        return batch_samples, total

    # ---- optimizer --------------------------------------------------------------------

    def create_optimizer(self, model: torch.nn.Module | None = None) -> torch.optim.Optimizer:
        """The `align.optim` optimizer named by ``args.optimizer``, else transformers' choice."""
        return create_optimizer(self, model, super().create_optimizer)


def _set_accumulation_from_global_batch(args: SFTConfig) -> None:
    """gradient_accumulation_steps = global batch / (per-device batch × world size), exactly."""
    accumulation_from_global_batch(args, "sequences")


def _load(config: SFTConfig, model: Any, tokenizer: Any) -> tuple[Any, Any]:
    """Load whatever was not passed from ``config.model_name_or_path``."""
    if model is not None and tokenizer is not None:
        return model, tokenizer
    if config.model_name_or_path is None:
        raise ConfigError(
            "model_name_or_path: required when train_sft is called without a model and tokenizer"
        )
    from transformers import AutoTokenizer

    if tokenizer is None:
        with loading("model_name_or_path", config.model_name_or_path):
            tokenizer = AutoTokenizer.from_pretrained(config.model_name_or_path)
    if model is None:
        model = load_causal_lm(config.model_name_or_path, config)
    return model, tokenizer


def sft_rows_cache_dir() -> Path:
    """Where conversation rows handed over as a list are written, named by their content
    (under the `datasets` cache, ``$HF_DATASETS_CACHE``)."""
    return Path(datasets.config.HF_DATASETS_CACHE) / "align_sft_rows"


def train_sft(
    config: SFTConfig,
    records: Dataset | str | list[dict[str, Any]],
    model: Any = None,
    tokenizer: Any = None,
    *,
    eval_records: Dataset | None = None,
    peft_config: Any = None,
    callbacks: list[Any] | None = None,
) -> SFTTrainer:
    """Fine-tune, save the model and tokenizer to ``config.output_dir``, return the trainer.

    ``records`` is a `Dataset`, a list of rows or a JSONL/Parquet path (see
    `align.trainers.sft_data`). The tokenizer (and model) get the chat format installed
    (`align.chat.install_format`: special tokens, template, EOS = end of turn, pad ≠ EOS).
    ``peft_config`` overrides the ``lora_*`` fields. Resumes from
    ``config.resume_from_checkpoint`` when set.
    """
    model, tokenizer = _load(config, model, tokenizer)
    install_format(tokenizer, model, chat_format=config.chat_format)
    trainer = SFTTrainer(
        model=model,
        args=config,
        train_dataset=load_sft_dataset(records, cache_dir=sft_rows_cache_dir(),
                                       main_process_first=config.main_process_first(desc="SFT rows to a file")),
        processing_class=tokenizer,
        eval_dataset=eval_records,
        peft_config=peft_config if peft_config is not None else lora_config(config),
        callbacks=callbacks,
    )
    trainer.train(resume_from_checkpoint=config.resume_from_checkpoint)
    check_finite_weights(trainer)
    raise_if_stopped(trainer)  # ended early on request: its checkpoint is saved, the model is not final
    trainer.save_model(config.output_dir)
    return trainer
