"""What the SFT and preference trainers share: config keys, optimizer, LoRA, model loading.

One definition, and one default, per setting:

* ``ModelFields``, ``LoraFields``, ``OptimizerFields``: dataclass mixins holding the
  recipe keys both ``SFTConfig`` and ``PreferenceConfig`` take (the model to load, the LoRA
  adapter, the ``align.optim`` optimizer with its AdEMAMix settings), each with its field
  help (``align <stage> --help``) and its checks (``check_model_fields`` and so on).
* ``create_optimizer``: the optimizer a trainer builds from those keys (weight decay off for
  biases and norms, as transformers does; T_α = T_β3 = the run's total optimizer steps).
* ``lora_config``, ``load_causal_lm``, ``is_peft_model``: the adapter and the model; under
  DeepSpeed ZeRO-3 with ``zero3_init_flag`` the model is built partitioned, so no rank holds
  it whole (``arm_partitioned_loading``, ``check_partitioned``; docs/sharded-passes.md).
* ``deepspeed_reference``: a frozen reference model wrapped for DeepSpeed.
* ``preparation_order``: whether ranks prepare a dataset in turn or all at once.

Defaults follow the Apertus recipe (docs/method.md, AdEMAMix): AdEMAMix with β3 = 0.99
("different from pre-training", the report's §3.4, E.3, E.4) and α = 8, both warmups over
the whole run.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from align.config import device_checks_enabled
from align.errors import AlignError, ConfigError, MissingDependencyError, loading, optional_import
from align.optim import OPTIMIZERS, build_optimizer
from align.scoring.flex import resolve_attn_implementation

__all__ = [
    "LoraFields",
    "ModelFields",
    "OptimizerFields",
    "accumulation_from_global_batch",
    "arm_partitioned_loading",
    "check_lora_fields",
    "check_model_fields",
    "check_optimizer_fields",
    "check_optimizer_offload",
    "check_partitioned",
    "create_optimizer",
    "deepspeed_reference",
    "is_peft_model",
    "library_checks",
    "load_causal_lm",
    "lora_config",
    "optimizer_kwargs",
    "preparation_order",
    "trainer_deepspeed_config",
]

MODEL_DTYPES = ("auto", "float32", "bfloat16", "float16")


def device_note(config: Any) -> str | None:
    """One line for a run on a machine without a GPU: where it trains and in which precision (float32
    unless bf16 was asked for), so a CPU run says what it does instead of failing or guessing."""
    if torch.cuda.is_available():
        return None
    precision = "bfloat16 (bf16=true, as asked)" if config.bf16 else "float32 (bf16=true for bfloat16)"
    return f"no GPU here: training on the CPU in {precision}"


def bf16_available() -> bool:
    """bf16 by default only where it is fast and exact enough: a CUDA device that supports it. Elsewhere
    (a CPU machine, a notebook) training runs in float32 unless bf16 is asked for."""
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


# --------------------------------------------------------------------------- config mixins


@dataclass
class ModelFields:
    """The model a trainer loads when it is given none.

    model_name_or_path (`str` or `None`, default `None`):
        Checkpoint directory or hub name to load (the SFT base model, or the policy of
        preference training) when the Python entry point gets no model object.
    dtype (`str`, default `"auto"`):
        Dtype to load the weights in: `"float32"`, `"bfloat16"`, `"float16"`; `"auto"`:
        bfloat16 when `bf16` is on, else float32 (the one `dtype` key of every config that
        loads a model; `TrainingArguments` and TRL's `SFTConfig` have no field of that name). (SFT: TRL's `model_init_kwargs`, when
        set, are passed to `from_pretrained` on top.)
    attn_implementation (`str` or `None`, default `None`):
        `"sdpa"`, `"eager"`, `"flash_attention_2"`, `"flex_attention"`, ...; `"auto"`:
        FlashAttention-2 on a GPU where flash-attn is installed, FlexAttention on a GPU
        without it (prefix sharing stays on), `sdpa` on CPU; `None` keeps transformers' choice.
    """

    model_name_or_path: str | None = field(default=None, metadata={"help": "model to load (SFT base / policy)"})
    dtype: str = field(default="auto", metadata={"help": "weights dtype: auto (bf16 if bf16 else float32) | "
                                                         "float32 | bfloat16 | float16"})
    attn_implementation: str | None = field(default=None, metadata={"help": "sdpa | eager | flash_attention_2 | "
                                                                            "flex_attention | auto (flash-attn, else "
                                                                            "flex on GPUs; sdpa on CPU); None: "
                                                                            "transformers' choice"})


@dataclass
class LoraFields:
    """A LoRA adapter instead of full fine-tuning.

    lora_r (`int` or `None`, default `None`):
        LoRA rank; `None` trains every weight. With a rank, only the adapter trains.
    lora_alpha (`int`, default 16), lora_dropout (`float`, default 0.0):
        LoRA scaling numerator and dropout.
    lora_target_modules (`list[str]` or `None`, default `None`):
        Modules that get an adapter; `None` means every linear layer but the LM head.
    """

    lora_r: int | None = field(default=None, metadata={"help": "LoRA rank; None = full fine-tuning"})
    lora_alpha: int = field(default=16, metadata={"help": "LoRA alpha"})
    lora_dropout: float = field(default=0.0, metadata={"help": "LoRA dropout"})
    lora_target_modules: list[str] | None = field(
        default=None, metadata={"help": "modules that get a LoRA adapter; None = all linear layers"})


@dataclass
class OptimizerFields:
    """The optimizer, built by `align.optim` (docs/method.md, AdEMAMix).

    optimizer (`str` or `None`, default `"ademamix"`):
        `"ademamix"` (the Apertus optimizer) or `"adamw"`, with `learning_rate`,
        `adam_beta1`, `adam_beta2`, `adam_epsilon` and `weight_decay` from the usual fields.
        `None` defers to transformers' `optim` field instead; setting `optim` while
        `optimizer` is set is an error (one of the two would be ignored).
    ademamix_beta3 (`float`, default 0.99), ademamix_alpha (`float`, default 8.0):
        AdEMAMix slow-EMA decay β3 and its weight α (Pagliardini et al. 2025). Apertus:
        0.99 and 8 for SFT and preference training (pretraining used 0.9999).
    ademamix_t_alpha, ademamix_t_beta3 (`int` or `None`, default `None`):
        Warmup steps of α and β3; `None` means the run's total number of optimizer steps
        (Apertus), 0 turns a warmup off.
    """

    optimizer: str | None = field(default="ademamix", metadata={"help": "ademamix | adamw | None (use optim)"})
    ademamix_beta3: float = field(default=0.99, metadata={"help": "AdEMAMix slow-EMA decay β3 (Apertus: 0.99)"})
    ademamix_alpha: float = field(default=8.0, metadata={"help": "AdEMAMix slow-EMA weight α (Apertus: 8)"})
    ademamix_t_alpha: int | None = field(default=None, metadata={"help": "α warmup steps; None = total steps, "
                                                                          "0 = off"})
    ademamix_t_beta3: int | None = field(default=None, metadata={"help": "β3 warmup steps; None = total steps, "
                                                                          "0 = off"})

    def optimizer_kwargs(self, total_steps: int | None) -> dict[str, Any]:
        """Keyword arguments for ``align.optim.build_optimizer(self.optimizer, ...)``."""
        return optimizer_kwargs(self, total_steps)


def keep_hub_token_out_of_outputs(config: Any) -> None:
    """Move a ``hub_token`` setting into ``$HF_TOKEN`` for this process.

    The Trainer pickles its arguments into every checkpoint and the saved model
    (``training_args.bin``); a token left there would sit in plain text under output_dir.
    The hub client reads ``$HF_TOKEN``, so ``push_to_hub`` still works.
    """
    token = getattr(config, "hub_token", None)
    if token:
        os.environ["HF_TOKEN"] = token
        config.hub_token = None


@contextlib.contextmanager
def library_checks(config: Any = None) -> Iterator[None]:
    """Around ``TrainingArguments.__post_init__`` (and TRL's): their own checks of a setting
    raise ValueError naming it (bf16 without a GPU, a save and eval strategy that disagree),
    a recipe mistake like any other, so a ``ConfigError``.

    Inside ``align.config.deferred_device_checks`` (a recipe read on a login node) the
    mixed-precision switches are off while transformers checks them, then set back: the
    recipe keeps ``bf16: true`` for the job's node, which checks it when it builds its own.
    """
    precision = {}
    if config is not None and not device_checks_enabled():
        precision = {name: True for name in ("bf16", "fp16", "bf16_full_eval", "fp16_full_eval")
                     if getattr(config, name, False)}
        for name in precision:
            setattr(config, name, False)
    try:
        yield
    except ValueError as exc:
        if isinstance(exc, AlignError):
            raise
        raise ConfigError(" ".join(str(exc).split())) from exc
    finally:
        for name in precision:
            setattr(config, name, True)


def check_model_fields(config: Any) -> None:
    if config.dtype not in MODEL_DTYPES:
        raise ConfigError(f"dtype={config.dtype!r}: choose one of {list(MODEL_DTYPES)}")


def check_lora_fields(config: Any) -> None:
    if config.lora_r is not None and config.lora_r < 1:
        raise ConfigError(f"lora_r={config.lora_r}: a LoRA rank must be >= 1 (None trains every weight)")


def _default_optim(config: Any) -> Any:
    """transformers' (or TRL's) default of ``optim`` for this config class."""
    return next(f.default for f in dataclasses.fields(type(config)) if f.name == "optim")


def check_optimizer_fields(config: Any) -> None:
    """Refuse an unknown optimizer, a conflicting ``optim``, or AdEMAMix settings out of range."""
    if config.optimizer is None:
        return
    name = config.optimizer.lower()
    if name not in OPTIMIZERS:
        raise ConfigError(f"optimizer={config.optimizer!r}: choose one of {sorted(OPTIMIZERS)}, "
                          "or None to use transformers' `optim`")
    config.optimizer = name
    optim = getattr(config.optim, "value", config.optim)
    default = getattr(_default_optim(config), "value", _default_optim(config))
    if optim != default:
        raise ConfigError(f"optim={optim!r} is ignored while optimizer={config.optimizer!r} picks the "
                          "optimizer: set optimizer=None to use transformers' optimizers")
    if not 0.0 <= config.ademamix_beta3 < 1.0:
        raise ConfigError(f"ademamix_beta3={config.ademamix_beta3}: must be in [0, 1) (Apertus: 0.99)")
    if not config.ademamix_alpha >= 0:
        raise ConfigError(f"ademamix_alpha={config.ademamix_alpha}: must be >= 0 (Apertus: 8)")
    for key in ("ademamix_t_alpha", "ademamix_t_beta3"):
        value = getattr(config, key)
        if value is not None and value < 0:
            raise ConfigError(f"{key}={value}: must be >= 0, or None for the total number of steps")


# --------------------------------------------------------------------------- optimizer


def optimizer_kwargs(config: Any, total_steps: int | None) -> dict[str, Any]:
    """Keyword arguments for ``align.optim.build_optimizer(config.optimizer, ...)``."""
    kwargs = {"lr": config.learning_rate, "beta1": config.adam_beta1, "beta2": config.adam_beta2,
              "eps": config.adam_epsilon, "weight_decay": config.weight_decay, "total_steps": total_steps}
    if config.optimizer == "ademamix":
        kwargs.update(beta3=config.ademamix_beta3, alpha=config.ademamix_alpha, t_alpha=config.ademamix_t_alpha,
                      t_beta3=config.ademamix_t_beta3)
    return kwargs


def trainer_deepspeed_config(trainer: Any) -> dict | None:
    """The DeepSpeed config dict a trainer runs with (from ``accelerate launch --config_file`` or
    ``deepspeed=`` in the trainer config), or None without DeepSpeed."""
    accelerator = getattr(trainer, "accelerator", None)
    plugin = getattr(getattr(accelerator, "state", None), "deepspeed_plugin", None)
    if plugin is not None and isinstance(getattr(plugin, "deepspeed_config", None), dict):
        return plugin.deepspeed_config
    hf_config = getattr(getattr(trainer, "args", None), "hf_deepspeed_config", None)
    return getattr(hf_config, "config", None)


def check_optimizer_offload(ds_config: dict | None, optimizer: str | None) -> None:
    """Refuse DeepSpeed optimizer offload with AdEMAMix: it would silently not be AdEMAMix.

    With ``offload_optimizer.device`` "cpu" or "nvme", accelerate replaces any client optimizer
    that is not DeepSpeed's by ``DeepSpeedCPUAdam`` (Adam, with only lr and weight decay
    carried over) unless the DeepSpeed config sets ``zero_force_ds_cpu_optimizer: false``; so
    the run would train with Adam and report AdEMAMix. (AdamW maps to the CPU AdamW, the same
    update, and is allowed.)
    """
    if not ds_config or optimizer != "ademamix":
        return
    zero = ds_config.get("zero_optimization") or {}
    device = str((zero.get("offload_optimizer") or {}).get("device", "none") or "none").lower()
    if device == "none" or ds_config.get("zero_force_ds_cpu_optimizer", True) is False:
        return
    raise ConfigError(
        f"offload_optimizer_device={device!r} (DeepSpeed zero_optimization.offload_optimizer.device) with "
        "optimizer='ademamix': accelerate would replace AdEMAMix by DeepSpeed's CPU Adam, silently. Set "
        "offload_optimizer_device: none in the accelerate config (shard further instead: ZeRO-3, more GPUs), or "
        "choose optimizer=adamw (offloaded as DeepSpeed's CPU AdamW), or set zero_force_ds_cpu_optimizer: false in "
        "a DeepSpeed config file (deepspeed_config_file) to keep AdEMAMix, stepping on the CPU (slow)")


def create_optimizer(trainer: Any, model: torch.nn.Module | None, fallback: Any) -> torch.optim.Optimizer:
    """``trainer.create_optimizer``: ``align.optim`` by ``args.optimizer``, else ``fallback(model)``
    (transformers' own ``create_optimizer``, which reads ``optim``).

    Weight decay applies to the parameters transformers decays (not biases and norms); T_α
    and T_β3 left unset are the run's total optimizer steps.
    """
    if trainer.optimizer is not None or trainer.args.optimizer is None:
        return fallback(model)
    check_optimizer_offload(trainer_deepspeed_config(trainer), trainer.args.optimizer)
    opt_model = trainer.model if model is None else model
    decay = set(trainer.get_decay_parameter_names(opt_model))
    params = [(n, p) for n, p in opt_model.named_parameters() if p.requires_grad]
    groups = [{"params": [p for n, p in params if n in decay], "weight_decay": trainer.args.weight_decay},
              {"params": [p for n, p in params if n not in decay], "weight_decay": 0.0}]
    total = trainer.state.max_steps if trainer.state.max_steps > 0 else trainer.args.max_steps
    trainer.optimizer = build_optimizer(trainer.args.optimizer, [g for g in groups if g["params"]],
                                        **optimizer_kwargs(trainer.args, total if total > 0 else None))
    return trainer.optimizer


# --------------------------------------------------------------------------- model and adapter


def accumulation_from_global_batch(args: Any, unit: str = "sequences") -> None:
    """``gradient_accumulation_steps`` = ``global_batch_size`` / (per-device batch × world size), exactly.

    Both trainers call it before building the accelerator, so a recipe's global batch holds
    on any number of GPUs (the same file on 4 or 8 nodes). Nothing happens when
    ``global_batch_size`` is None. An indivisible combination, or an accumulation that a
    recipe also sets to something else, is an error naming the numbers.
    """
    global_batch = getattr(args, "global_batch_size", None)
    if global_batch is None:
        return
    per_device, world_size = args.per_device_train_batch_size, args.world_size
    steps, rest = divmod(global_batch, per_device * world_size)
    if rest or steps < 1:
        raise ConfigError(
            f"global_batch_size={global_batch} is not a multiple of per_device_train_batch_size={per_device} "
            f"× world size {world_size} (= {per_device * world_size} {unit} per micro-step); change one of them")
    if args.gradient_accumulation_steps not in (1, steps):
        raise ConfigError(
            f"gradient_accumulation_steps={args.gradient_accumulation_steps} contradicts global_batch_size="
            f"{global_batch} (which needs {steps} with per_device_train_batch_size={per_device} × world size "
            f"{world_size}); set only one of them")
    args.gradient_accumulation_steps = steps
    logging.getLogger(__name__).info("global batch %d %s = %d per device × %d ranks × %d accumulation steps",
                                     global_batch, unit, per_device, world_size, steps)


def lora_config(config: Any) -> Any:
    """The PEFT LoRA config of the ``lora_*`` keys (all linear layers unless told otherwise), or None."""
    if config.lora_r is None:
        return None
    peft = optional_import("peft", needed_by=f"lora_r={config.lora_r}", install="pip install 'peft>=0.21,<1'")
    return peft.LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                      target_modules=config.lora_target_modules or "all-linear", task_type="CAUSAL_LM")


def preparation_order(args: Any, dataset: Any, desc: str) -> contextlib.AbstractContextManager:
    """Ranks prepare a file-backed dataset in turn: the main process first, and the others
    then reuse its ``datasets`` cache. An in-memory dataset (rows handed over in Python) has
    no cache to share, so waiting would only make every other rank repeat the same work
    after the main process; then all ranks prepare at once."""
    if getattr(dataset, "cache_files", None):
        return args.main_process_first(desc=desc)
    return contextlib.nullcontext()


def is_peft_model(model: torch.nn.Module) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def load_causal_lm(path: str, config: Any) -> Any:
    """A causal LM from ``path`` with the config's ``dtype`` and ``attn_implementation``
    (and TRL's ``model_init_kwargs`` on top, where the config has them)."""
    from transformers import AutoModelForCausalLM

    dtype = config.dtype
    if dtype == "auto":
        dtype = "bfloat16" if config.bf16 else "float32"
    kwargs: dict[str, Any] = {"dtype": getattr(torch, dtype)}
    attn_implementation = resolve_attn_implementation(config.attn_implementation)
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    kwargs.update(getattr(config, "model_init_kwargs", None) or {})
    partitioned = arm_partitioned_loading(config)
    try:
        with loading("model_name_or_path", path):
            model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
        if partitioned:
            check_partitioned(model, path)
        return model
    except ImportError as exc:  # an attention backend not installed (flash_attn for flash_attention_2)
        raise MissingDependencyError(f"attn_implementation={config.attn_implementation!r}: "
                                     f"{' '.join(str(exc).split())}") from exc


# --------------------------------------------------------------------------- DeepSpeed


def arm_partitioned_loading(config: Any) -> bool:
    """Make transformers build the next model partitioned, where accelerate's DeepSpeed
    plugin asks for it (ZeRO stage 3 with ``zero3_init_flag``); returns whether it does.

    transformers builds a model under ``deepspeed.zero.Init`` only while a stage-3
    ``HfDeepSpeedConfig`` is alive: the plugin of the training arguments holds one, but the
    global reference to it is the last one any ``TrainingArguments`` made, and goes when that
    object goes. So it is pointed at this config's plugin again right before loading.
    """
    plugin = getattr(config, "deepspeed_plugin", None)
    if plugin is None or getattr(plugin, "zero_stage", None) != 3 or not plugin.is_zero3_init_enabled():
        return False
    from transformers.integrations import is_deepspeed_zero3_enabled

    if not is_deepspeed_zero3_enabled():
        plugin.set_deepspeed_weakref()
    return True


def check_partitioned(model: torch.nn.Module, path: str) -> None:
    """A model loaded under ``zero3_init_flag`` holds only this rank's partitions; log how much."""
    from align.scoring.sharded import is_partitioned, parameter_bytes

    if not is_partitioned(model):
        raise RuntimeError(f"{path}: loaded whole although zero3_init_flag asks for a partitioned model "
                           "(transformers did not see the DeepSpeed config)")
    held, whole = parameter_bytes(model)
    logging.getLogger(__name__).info("%s: this rank holds %.1f MiB of the model's %.1f MiB of weights (ZeRO-3)",
                                     path, held / 2**20, whole / 2**20)


def _fill_auto(ds_config: dict, args: Any, hidden_size: int | None) -> dict:
    """Concrete values for the ``"auto"`` entries a DeepSpeed config for inference may hold."""
    micro = args.per_device_train_batch_size
    fixed = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": args.gradient_accumulation_steps,
             "train_batch_size": micro * args.gradient_accumulation_steps * args.world_size}
    for key, value in fixed.items():
        if ds_config.get(key) == "auto":
            ds_config[key] = value
    zero = ds_config.get("zero_optimization", {})
    if hidden_size:
        sizes = {"reduce_bucket_size": hidden_size * hidden_size,
                 "stage3_param_persistence_threshold": 10 * hidden_size,
                 "stage3_prefetch_bucket_size": int(0.9 * hidden_size * hidden_size)}
        for key, value in sizes.items():
            if zero.get(key) == "auto":
                zero[key] = value
    return ds_config


def deepspeed_reference(model: Any, accelerator: Any, args: Any) -> torch.nn.Module:
    """Wrap a frozen reference for DeepSpeed: sharded like the policy under ZeRO-3, replicated otherwise."""
    deepspeed = optional_import("deepspeed", needed_by="a DeepSpeed reference model",
                                install="pip install 'deepspeed>=0.19,<1'")
    ds_config = copy.deepcopy(accelerator.state.deepspeed_plugin.deepspeed_config)
    stage = ds_config.get("zero_optimization", {}).get("stage", 0)
    if stage != 3:
        ds_config["zero_optimization"] = {"stage": 0}
    ds_config.pop("optimizer", None)
    ds_config.pop("scheduler", None)
    hidden = getattr(model.config, "hidden_size", None)
    engine, *_ = deepspeed.initialize(model=model, config=_fill_auto(ds_config, args, hidden))
    engine.eval()
    return engine


def last_loss(trainer: Any) -> float | None:
    """The loss the trainer printed last: its last logged ``loss``, else (fewer steps than
    ``logging_steps``: nothing logged during training) the run's mean ``train_loss``, which the
    trainer logs when training ends."""
    for key in ("loss", "train_loss"):
        losses = [log[key] for log in trainer.state.log_history if key in log]
        if losses:
            return losses[-1]
    return None
