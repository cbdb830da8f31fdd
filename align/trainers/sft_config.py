"""Configuration of supervised fine-tuning (SFT) on the Apertus chat format.

`SFTConfig` extends TRL's `SFTConfig` (itself a `transformers.TrainingArguments`), so every
TRL and transformers field still works; the fields below are what align adds. The Apertus
recipe values (report §E.1; docs/method.md, Supervised fine-tuning) come from `apertus_sft_defaults` / `SFTConfig.apertus`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from transformers import TrainingArguments
from trl import SFTConfig as TRLSFTConfig

from align.errors import ConfigError
from align.trainers.common import (
    LoraFields,
    ModelFields,
    OptimizerFields,
    bf16_available,
    check_lora_fields,
    check_model_fields,
    check_optimizer_fields,
    library_checks,
)
from align.trainers.checkpointing import RecomputeFields, check_recompute_fields
from align.trainers.guards import CheckpointFields, check_checkpoint_fields

__all__ = ["APERTUS_SFT_SIZES", "SFTConfig", "apertus_sft_defaults", "checkpointing_field"]

# Per model size: (global batch in sequences, peak learning rate), report §E.1 / docs/method.md, Supervised fine-tuning.
APERTUS_SFT_SIZES: dict[str, tuple[int, float]] = {"8b": (512, 5e-6), "70b": (1024, 2e-6)}


def checkpointing_field() -> str:
    """Name of the activation-checkpointing switch in the installed transformers.

    transformers 5.19+ calls it ``activation_checkpointing`` (the old name warns); older
    versions only know ``gradient_checkpointing``.
    """
    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    return (
        "activation_checkpointing"
        if "activation_checkpointing" in names
        else "gradient_checkpointing"
    )


def apertus_sft_defaults(size: str = "8b") -> dict[str, Any]:
    """The Apertus SFT hyperparameters for one model size, as `SFTConfig` keyword arguments.

    8B: global batch 512, lr 5e-6; 70B: 1024, 2e-6. Both: linear decay without warmup, max
    length 4096, AdEMAMix (β1 0.9, β2 0.999, β3 0.99, α 8, T_α = T_β3 = total steps), one
    epoch, grad clip 1.0, bf16, activation checkpointing, and the data hygiene of E.1.1
    (identity filter, ``\\boxed{}`` stripped). The parallelism (ZeRO-2 for 8B,
    ZeRO-3 for 70B) lives in `recipes/accelerate/`, not here.
    """
    key = size.lower()
    if key not in APERTUS_SFT_SIZES:
        raise ConfigError(
            f"size: unknown Apertus size {size!r}; choose one of {sorted(APERTUS_SFT_SIZES)}"
        )
    global_batch, lr = APERTUS_SFT_SIZES[key]
    return {
        "global_batch_size": global_batch,
        "learning_rate": lr,
        "lr_scheduler_type": "linear",
        "warmup_steps": 0,
        "max_length": 4096,
        "optimizer": "ademamix",
        "adam_beta1": 0.9,
        "adam_beta2": 0.999,
        "ademamix_beta3": 0.99,
        "ademamix_alpha": 8.0,
        "ademamix_t_alpha": None,
        "ademamix_t_beta3": None,
        "num_train_epochs": 1.0,
        "max_grad_norm": 1.0,
        "bf16": True,
        checkpointing_field(): True,
        "prompt_loss_weight": 0.0,
        "identity_filter": True,
        "strip_boxed": True,
    }


@dataclass
class SFTConfig(ModelFields, LoraFields, OptimizerFields, CheckpointFields, RecomputeFields, TRLSFTConfig):
    """TRL's `SFTConfig` plus the Apertus chat format, loss weighting, data hygiene and the
    model, LoRA and optimizer keys shared with `PreferenceConfig` (`align.trainers.common`).

    > Model, LoRA adapter, optimizer

    model_name_or_path, dtype, attn_implementation, lora_r, lora_alpha, lora_dropout,
    lora_target_modules, optimizer, ademamix_beta3, ademamix_alpha, ademamix_t_alpha,
    ademamix_t_beta3: see `ModelFields`, `LoraFields` and `OptimizerFields` in
    `align.trainers.common` (defaults: AdEMAMix with β3 0.99 and α 8, full fine-tuning).

    > Data

    chat_format (`str`, default `"apertus"`):
        Format `align.chat.encode` renders `messages` with; it also gives the loss mask.
    chat_date (`str` or `None`, default `None`):
        Date written into the default system prompt of conversations without a system
        message. Set it so that tokenization does not depend on the day the job runs.
    thinking_turns (`"all"` or `"last_turn"`, default `"all"`):
        With `chat_format="tokenizer"`: which assistant turns' reasoning (`reasoning_content`)
        is trained. `all` refuses a model's template that leaves out the reasoning of turns
        before the last (Qwen3's does) when a conversation has some, since that reasoning
        would be lost silently; `last_turn` trains with such a template, the earlier turns'
        reasoning left out. align's own formats render every turn's thoughts.
    identity_filter (`bool`, default `False`):
        Drop conversations whose assistant text names another model or its maker
        ("I am ChatGPT, made by OpenAI"; Apertus report E.1.1, Lucie-7B §5.2.1), before
        tokenizing. The count is logged and recorded in the stage summary (`identity_dropped`).
    identity_keywords (`list[str]` or `None`, default `None`):
        The names the identity filter looks for (whole words, case-sensitive); `None`:
        `align.trainers.sft_hygiene.IDENTITY_KEYWORDS`.
    strip_boxed (`bool`, default `False`):
        Replace `\\boxed{X}` with `X` in assistant answers (not in thoughts) before
        tokenizing (Apertus report E.1.1). Rows changed are counted (`boxed_stripped`).

    > Loss

    prompt_loss_weight (`float` in [0, 1], default 0.0):
        Weight of the non-assistant tokens (system, developer, user, tool outputs, template
        tokens) relative to assistant tokens, which weigh 1. 0 trains on the assistant
        only (Apertus). The loss is Σ w·nll / Σ w over the global batch.

    > Batching

    global_batch_size (`int` or `None`, default `None`):
        Sequences per optimizer step over all ranks. When set, the trainer derives
        `gradient_accumulation_steps` = global / (per-device batch × world size) and
        raises if that is not a whole number.

    Fields of TRL that align replaces: `assistant_only_loss` and `completion_only_loss`
    (the mask comes from `align.chat`; use `prompt_loss_weight`) must stay unset, and `optim`
    only counts with `optimizer=None`. Differences from TRL's defaults:
    `gradient_checkpointing` is unset (off; the Apertus preset turns activation
    checkpointing on), and the optimizer is AdEMAMix (`optimizer`).
    """

    chat_format: str = field(default="apertus", metadata={"help": "Chat format of align.chat."})
    chat_date: str | None = field(
        default=None,
        metadata={"help": "Date for the default system prompt (reproducible tokenization)."},
    )
    thinking_turns: Literal["all", "last_turn"] = field(
        default="all",
        metadata={"help": "chat_format tokenizer: all (refuse a template dropping earlier turns' reasoning) | "
                          "last_turn (train only the last turn's reasoning)"},
    )
    identity_filter: bool = field(
        default=False,
        metadata={"help": "Drop conversations whose assistant text names another model or maker."},
    )
    identity_keywords: list[str] | None = field(
        default=None,
        metadata={"help": "Names the identity filter looks for; None = sft_hygiene.IDENTITY_KEYWORDS."},
    )
    strip_boxed: bool = field(
        default=False, metadata={"help": "Replace \\boxed{X} with X in assistant answers."}
    )
    prompt_loss_weight: float = field(
        default=0.0,
        metadata={"help": "Weight of non-assistant tokens in [0, 1]; 0 = assistant-only."},
    )
    global_batch_size: int | None = field(
        default=None, metadata={"help": "Sequences per optimizer step over all ranks."}
    )
    # TRL turns checkpointing on by default, and the old name warns on transformers 5.19+.
    gradient_checkpointing: bool | None = field(
        default=None,
        metadata={"help": "Deprecated alias of activation_checkpointing on transformers 5.19+."},
    )

    def __post_init__(self) -> None:
        if self.bf16 is None:  # TRL's default is on everywhere; here only where a GPU supports it
            self.bf16 = bool(not self.use_cpu and bf16_available())
        with library_checks(self):
            super().__post_init__()
        self._check_align_fields()

    def _check_align_fields(self) -> None:
        """Reject values the trainer could not honour, naming the field and the fix."""
        if self.assistant_only_loss or self.completion_only_loss:
            raise ConfigError(
                "assistant_only_loss/completion_only_loss: align builds the loss mask with "
                "align.chat "
                "(assistant-only by default); leave these unset and use prompt_loss_weight instead"
            )
        if not 0.0 <= self.prompt_loss_weight <= 1.0:
            raise ConfigError(f"prompt_loss_weight must be in [0, 1], got {self.prompt_loss_weight}")
        self._check_thinking_turns()
        check_model_fields(self)
        check_lora_fields(self)
        check_optimizer_fields(self)
        check_checkpoint_fields(self)
        check_recompute_fields(self)
        if self.global_batch_size is not None and self.global_batch_size < 1:
            raise ConfigError(
                f"global_batch_size must be a positive int, got {self.global_batch_size}"
            )
        if self.identity_keywords is not None and not [k for k in self.identity_keywords if k]:
            raise ConfigError("identity_keywords: give at least one name, or None for the built-in list")

    def _check_thinking_turns(self) -> None:
        """``last_turn`` changes nothing in align's formats (they render every turn's thoughts), and a
        setting that does nothing is refused rather than ignored."""
        if self.thinking_turns not in ("all", "last_turn"):
            raise ConfigError(f"thinking_turns: {self.thinking_turns!r} is not one of ['all', 'last_turn']")
        if self.thinking_turns == "last_turn" and self.chat_format != "tokenizer":
            raise ConfigError(f"thinking_turns=last_turn applies to chat_format=tokenizer only; the "
                              f"{self.chat_format!r} format renders the thoughts of every turn (set thinking_turns=all)")

    @classmethod
    def apertus(cls, size: str = "8b", **overrides: Any) -> SFTConfig:
        """The Apertus recipe for `size` ("8b" or "70b"), with `overrides` on top."""
        return cls(**{**apertus_sft_defaults(size), **overrides})
