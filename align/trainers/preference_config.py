"""Settings of QRPO/DPO preference training: the config docstring is the manual."""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers import TrainingArguments

from align.errors import ConfigError
from align.losses import LossType
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

REFERENCE_MODES = ("precomputed", "model", "adapter")


@dataclass
class PreferenceConfig(ModelFields, LoraFields, OptimizerFields, CheckpointFields, RecomputeFields, TrainingArguments):
    r"""Configuration of [`PreferenceTrainer`]: QRPO or DPO on pair rows (docs/method.md, QRPO; DPO and length-normalised DPO).

    Only the fields below are specific to preference training; every
    `transformers.TrainingArguments` field works as usual (batch size, accumulation,
    schedules, checkpointing, DeepSpeed, ...). Batch sizes count **pairs**.

    > Parameters that control the loss

    loss_type (`str`, defaults to `"qrpo"`):
        `"qrpo"`: chosen and rejected are two independent samples, each regressed on its
        quantile reward: L = mean over samples of (R_q − β_i·log Z_i − β_i·logratio)²
        (QRPO, arXiv:2507.08068; Apertus report §3.4). `"dpo"`: −log σ(β·(logratio_c −
        logratio_r)) per pair (arXiv:2305.18290).
    beta (`float` or `None`, defaults to `None`):
        Temperature β > 0. `None` picks 5.0 with `length_normalize` (the Apertus setting,
        for both losses: β/|y| ≈ 0.03 on typical lengths) and 0.1 without it (the usual
        whole-sequence DPO β).
    length_normalize (`bool`, defaults to `True`):
        QRPO: β_i = β/|y_i| in every term, log Z included. DPO: each log-ratio divided by its
        completion length. The Apertus report found it helps both (§3.4).
    beta_clamp (`float` or `None`, defaults to `None`):
        Cap on β_i. The published QRPO code clamps at 0.1 ("otherwise grad norm is too
        high"); `None` follows the paper.
    normalize_loss_by_length (`bool`, defaults to `False`):
        QRPO only: divide each squared term by |y_i|.
    target_margin (`float` or `None`, defaults to `0.15`):
        QRPO only: warn (in the log, as `qrpo/off_target_warning` in the logged metrics, and in
        the run's summary) when the mean distance of a side's log-ratios outside the span from
        0 to their regression targets stays above this many nats per token for 3 logging steps
        in a row (`align.trainers.target_tracking`); `None` turns the check off.

    > Parameters that control the data

    chat_format (`str`, defaults to `"apertus"`):
        Chat format the rows are rendered with (`align.chat`); must be the one the reference
        log-probs were computed with.
    max_length (`int` or `None`, defaults to `4096`):
        Tokens per prompt + completion. A row with a completion that does not fit is
        handled by `over_max_length`, as in the log-prob pass, so the two agree. `None`: no
        limit. Set it at least to the sampler's `max_model_len` (the longest prompt +
        completion the sampling stage writes) so that no completion is over it.
    over_max_length (`str`, defaults to `"exclude"`):
        `"exclude"`: a row whose prompt + completion exceeds `max_length` is left out of
        training; the count and the first ids are logged as a warning, with the reason (the
        log-prob pass writes such rows unscored, with `ref_skip`). `"cut"`: train on the
        completion's first tokens, without its end-of-turn token, though R_q and β/|y|
        describe the whole text (the count is logged). Must match the log-prob pass's.
    enable_thinking (`bool`, defaults to `False`):
        Render the developer block with deliberation enabled.
    chat_date (`str` or `None`, defaults to `None`):
        Date in the default Apertus system text (rows without a system message). `None` is
        today's date: pin it to the value the log-prob pass used, or prompts differ.
    truncated (`str`, defaults to `"exclude"`):
        Pair rows whose chosen or rejected completion was cut at the sampling token budget
        (`chosen_finish_reason` / `rejected_finish_reason` "length"). `"exclude"`: such a
        row is an error (the pairs stage's default `truncated: exclude` never makes one).
        `"train_without_end"`: train it with no end-of-turn token after the cut text, so the
        model is not taught to end its turn mid-sentence; the count is logged as a warning.
        The reference log-prob pass must use the same setting.
    num_ref_rewards (`int` or `None`, defaults to `None`):
        n, the number of reference rewards per prompt (10 in Apertus). With it, rows may
        carry `chosen_reward`, `rejected_reward` and `ref_rewards` instead of precomputed
        quantiles, and precomputed quantiles are checked to lie on the grid {0, 1/n, …, 1}.

    > Parameters that control the reference policy

    reference (`str`, defaults to `"precomputed"`):
        `"precomputed"`: read `ref_chosen_logps`/`ref_rejected_logps` (and lengths) from the
        dataset, written by `align logprobs`: no reference model in memory. Each row must
        carry the pass's token hashes (`ref_chosen_token_hash`, ...): the trainer recomputes
        them from its own tokenization, and a difference is an error naming the setting that
        differs (chat_date, chat_format, system text, tokenizer...). The pass's
        `ref_model_fingerprint` is checked against `ref_model_name_or_path`, else the policy's
        checkpoint path (a model held only in memory is not checked).
        `"model"`: a live frozen reference model passed as `ref_model=`. `"adapter"`: the
        policy is a PEFT model and the reference is that model with its adapter disabled.

    > Parameters that control batching

    global_batch_size (`int` or `None`, defaults to `None`):
        Pairs per optimizer step over all ranks. When set, the trainer derives
        `gradient_accumulation_steps` = global / (per-device batch × world size), so one
        recipe keeps its global batch on any number of GPUs; a combination that does not
        divide is an error naming the numbers (as in `SFTConfig`).
    padding_free (`bool`, defaults to `True`):
        Concatenate the batch's sequences into rows with restarting position ids and a
        block-diagonal mask chosen by attention implementation, instead of padding.
    max_row_tokens (`int` or `None`, defaults to `None`):
        Padding-free row length budget for mask-based attention (`sdpa`/`eager`), whose cost
        grows with the row length squared. `None`: the batch's longest sequence, so attention
        costs no more than padded rows while short sequences fill the padding. FlashAttention
        always gets one row (it takes the sequence boundaries directly).
    pad_to_multiple_of (`int` or `None`, defaults to `None`):
        Round padded widths up to a multiple (tensor-core friendly shapes).
    prefix_sharing (`"auto"`, `true` or `false`, defaults to `"auto"`):
        Put a pair's prompt once before its chosen and its rejected completion, each
        completion attending to the prompt and to itself only (positions restart at the
        prompt's length), so the prompt's forward and backward run once per pair, not twice;
        log-probs, losses and gradients are those of separate sequences
        (`align.scoring.collators`, the prefix-shared layout). Works padded or padding-free.
        `"auto"`: on where the attention takes a 4D mask (`sdpa`, `eager`), off for
        FlashAttention, whose varlen kernels cannot keep two completions of one prompt apart;
        `true` there is an error.
    block_attention (`false`, `"auto"` or `true`, defaults to `false`):
        Compute attention over each piece of a packed or prefix-shared row alone (a sequence;
        a prompt; a completion with its prompt), not over the row's whole masked grid: the
        same numbers for less arithmetic (`align.scoring.block_attention`, the model switched
        to the `sdpa_blocks` implementation), but one kernel call per piece. Measured on
        2 CPU cores: 1.10–1.16× as fast on rows of about 1,000 tokens, 3–5× slower attention
        on rows of 27 to 140 tokens, so it is off unless asked for. `"auto"`: on CPU, for a
        model on `sdpa`; `true`: on any device, for a model on `sdpa`.

    > Parameters that control the optimizer, the model and the LoRA adapter

    optimizer, ademamix_beta3, ademamix_alpha, ademamix_t_alpha, ademamix_t_beta3,
    model_name_or_path, dtype, attn_implementation, lora_r, lora_alpha, lora_dropout,
    lora_target_modules: shared with `SFTConfig`, one default each (`OptimizerFields`,
    `ModelFields`, `LoraFields` in `align.trainers.common`): AdEMAMix with β3 0.99 and α 8,
    T_α = T_β3 = total steps; the policy from `model_name_or_path` loaded in bf16 when `bf16`
    is on, else float32; full fine-tuning unless `lora_r` is set.
    ref_model_name_or_path (`str` or `None`): reference for `reference="model"`; defaults
        to `model_name_or_path`. With `reference="precomputed"`: the checkpoint the pass's
        `ref_model_fingerprint` must match (when the policy starts elsewhere).

    Defaults that differ from `TrainingArguments`: `learning_rate` 5e-7 (Apertus 8B QRPO),
    `logging_steps` 10, `bf16` on only where a CUDA device supports it, and the optimizer
    (AdEMAMix through `optimizer`).
    """

    # Loss
    loss_type: str = field(default="qrpo", metadata={"help": "qrpo | dpo"})
    beta: float | None = field(default=None, metadata={"help": "β; None: 5.0 length-normalised, else 0.1"})
    length_normalize: bool = field(default=True, metadata={"help": "β/|y| per sample (QRPO), logratio/|y| (DPO)"})
    beta_clamp: float | None = field(default=None, metadata={"help": "cap on β/|y| (0.1 = published code)"})
    normalize_loss_by_length: bool = field(default=False, metadata={"help": "QRPO: divide each term by |y|"})
    target_margin: float | None = field(default=0.15, metadata={
        "help": "QRPO: warn when log-ratios stay this far (nats per token, mean of a side, 3 logging steps in a "
                "row) off their regression targets; None: no check", "min": 0})
    # Data
    chat_format: str = field(default="apertus", metadata={"help": "chat format of align.chat"})
    max_length: int | None = field(default=4096, metadata={"help": "max prompt + completion tokens"})
    enable_thinking: bool = field(default=False, metadata={"help": "deliberation enabled in the developer block"})
    chat_date: str | None = field(default=None, metadata={"help": "date in the default system text"})
    num_ref_rewards: int | None = field(default=None, metadata={"help": "n reference rewards per prompt"})
    truncated: str = field(default="exclude", metadata={"help": "exclude | train_without_end (cut completions)"})
    over_max_length: str = field(default="exclude", metadata={"help": "exclude | cut (rows over max_length)"})
    # Reference
    reference: str = field(default="precomputed", metadata={"help": "precomputed | model | adapter"})
    # Batching
    global_batch_size: int | None = field(default=None, metadata={"help": "pairs per optimizer step over all ranks"})
    padding_free: bool = field(default=True, metadata={"help": "pack sequences instead of padding"})
    max_row_tokens: int | None = field(default=None, metadata={"help": "padding-free row budget (sdpa/eager)"})
    pad_to_multiple_of: int | None = field(default=None, metadata={"help": "round padded widths up"})
    prefix_sharing: bool | str = field(default="auto", metadata={"help": "auto | true | false: each prompt once "
                                                                          "per pair"})
    block_attention: bool | str = field(default=False, metadata={
        "help": "false | auto | true: attention over each piece of a packed or prefix-shared row alone "
                "(auto: on CPU, for a model on sdpa); pays on rows of ~1,000 tokens, costs on short ones"})
    # Entry point (the model, LoRA and optimizer keys: align.trainers.common)
    ref_model_name_or_path: str | None = field(default=None, metadata={"help": "reference to load"})
    # TrainingArguments defaults that differ
    learning_rate: float = field(default=5e-7, metadata={"help": "peak learning rate (Apertus 8B: 5e-7)"})
    logging_steps: float = field(default=10, metadata={"help": "log every N steps"})
    bf16: bool | None = field(default=None, metadata={"help": "None: on where CUDA supports bf16"})

    def __post_init__(self) -> None:
        if self.bf16 is None:
            self.bf16 = bool(not self.use_cpu and bf16_available())
        self._check_loss()
        self._check_data()
        self._check_reference()
        check_model_fields(self)
        check_lora_fields(self)
        check_optimizer_fields(self)
        check_checkpoint_fields(self)
        check_recompute_fields(self)
        with library_checks(self):
            super().__post_init__()

    @property
    def loss(self) -> LossType:
        """The loss as the enum whose properties the trainer queries."""
        return LossType(self.loss_type)

    def _check_loss(self) -> None:
        try:
            LossType(self.loss_type)
        except ValueError:
            raise ConfigError(f"loss_type={self.loss_type!r}: choose one of {[t.value for t in LossType]}") from None
        if self.beta is None:
            self.beta = 5.0 if self.length_normalize else 0.1
        if not self.beta > 0:
            raise ConfigError(f"beta={self.beta}: must be > 0 (Apertus: 5.0 with length_normalize)")
        if self.beta_clamp is not None and not self.beta_clamp > 0:
            raise ConfigError(f"beta_clamp={self.beta_clamp}: must be > 0, or None for no clamp")
        if self.beta_clamp is not None and self.loss is not LossType.QRPO:
            raise ConfigError("beta_clamp applies to QRPO only: set beta_clamp=None or loss_type='qrpo'")
        if self.normalize_loss_by_length and self.loss is not LossType.QRPO:
            raise ConfigError("normalize_loss_by_length applies to QRPO only: set it False or loss_type='qrpo'")

    def _check_data(self) -> None:
        if self.max_length is not None and self.max_length < 2:
            raise ConfigError(f"max_length={self.max_length}: needs room for a prompt and a completion token (or None)")
        if self.num_ref_rewards is not None and self.num_ref_rewards < 1:
            raise ConfigError(f"num_ref_rewards={self.num_ref_rewards}: must be >= 1 (Apertus: 10), or None")
        if self.max_row_tokens is not None and self.max_row_tokens < 2:
            raise ConfigError(f"max_row_tokens={self.max_row_tokens}: must be >= 2, or None")
        if self.pad_to_multiple_of is not None and self.pad_to_multiple_of < 1:
            raise ConfigError(f"pad_to_multiple_of={self.pad_to_multiple_of}: must be >= 1, or None")
        if self.truncated not in ("exclude", "train_without_end"):
            raise ConfigError(f"truncated={self.truncated!r}: choose 'exclude' or 'train_without_end'")
        if self.over_max_length not in ("exclude", "cut"):
            raise ConfigError(f"over_max_length={self.over_max_length!r}: choose 'exclude' or 'cut'")
        self.prefix_sharing = _auto_or_bool("prefix_sharing", self.prefix_sharing)
        self.block_attention = _auto_or_bool("block_attention", self.block_attention)
        if self.global_batch_size is not None and self.global_batch_size < 1:
            raise ConfigError(f"global_batch_size={self.global_batch_size}: must be a positive number of pairs, "
                              "or None")

    def _check_reference(self) -> None:
        if self.reference not in REFERENCE_MODES:
            raise ConfigError(f"reference={self.reference!r}: choose one of {list(REFERENCE_MODES)}")


def _auto_or_bool(key: str, value: bool | str) -> bool | str:
    """``"auto"``, True or False; ``"true"``/``"false"`` from a command line that kept the text."""
    if value in ("true", "false"):
        value = value == "true"
    if value not in ("auto", True, False):
        raise ConfigError(f"{key}={value!r}: choose auto, true or false")
    return value
