"""A memory plan for every job of a recipe, per GPU, before GPUs are booked (``align plan``).

Reads each step's config and its model's ``config.json`` alone (no weights load) and gives,
for each job the step runs, the bytes per GPU by part, whether it fits the hardware and, if
not, the smallest change that does. The formulas are in ``align.plan.memory``
(docs/memory-plan.md); this module decides which jobs a recipe's steps are, on which
hardware each runs, and what to change. ``align.drivers.plan`` reads the recipe and prints.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from align.config import ConfigError, apply_defaults
from align.io.files import read_text
from align.plan.advice import Knob, doublings, halvings, smallest_change
from align.plan.configs import load_model_config, missing_config_error
from align.plan.deepspeed_check import deepspeed_estimate
from align.plan.memory import (
    GIB,
    Estimate,
    ForwardJob,
    GenerateJob,
    Launch,
    Part,
    TrainingJob,
    VllmJob,
    forward_memory,
    generate_memory,
    training_memory,
    vllm_memory,
)
from align.plan.optimizer_states import optimizer_layout
from align.plan.recipe_header import (
    find_file,
    hardware_from_header,
    header_lines,
    launch_from_header,
    model_lineage,
    read_accelerate_config,
    trace_model,
)
from align.plan.report import JobPlan, Verdict
from align.plan.shapes import linear_shapes, model_shape
from align.stage_table import STAGES

# The stages align plan sizes (the stage table says how each is planned).
PLANNED_STAGES = tuple(name for name, entry in STAGES.items() if entry.plan is not None)
DEFAULT_HARDWARE = {"nodes": 1, "gpus_per_node": 8, "gpu_memory_gib": 80.0}
# The tokens of a prompt assumed where a transformers sampler has no context length set.
PROMPT_TOKENS = 1024
DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2}


@dataclass
class PlanSettings:
    """What ``align plan`` plans, for which hardware, and where it writes the plan."""

    recipe: str = field(default="", metadata={
        "help": "the recipe to plan (the first argument): a stage recipe or a pipeline recipe"})
    stage: str | None = field(default=None, metadata={
        "help": "the stage a single-stage recipe is for; None: the `align STAGE` command in its header"})
    nodes: int | None = field(default=None, metadata={
        "help": "machines; None: the recipe's `# hardware:` line, else 1"})
    gpus_per_node: int | None = field(default=None, metadata={
        "help": "GPUs per machine; None: the recipe's `# hardware:` line, else 8"})
    gpu_memory_gib: float | None = field(default=None, metadata={
        "help": "memory of one GPU in GiB (an 80 GB H100 shows 79.6); None: the `# hardware:` line, else 80"})
    headroom_gib: float = field(default=5.0, metadata={
        "help": "GiB per GPU kept free for what the plan does not count (CUDA context, NCCL and DeepSpeed "
                "buffers, allocator fragmentation); vLLM's gpu_memory_utilization plays this part for engines"})
    zero_stage: int | None = field(default=None, metadata={
        "help": "DeepSpeed ZeRO stage of training and of the log-prob pass (0: DDP, replicated); None: from "
                "accelerate_config, else the recipe's `accelerate launch --config_file` command, else the "
                "trainer's deepspeed key"})
    accelerate_config: str | None = field(default=None, metadata={
        "help": "accelerate config the stage is launched with (recipes/accelerate/zero3.yaml); None: the one "
                "the recipe's header names"})
    offload_optimizer: bool | None = field(default=None, metadata={
        "help": "DeepSpeed optimizer offload to CPU; None: the accelerate config's offload_optimizer_device "
                "(align refuses it with AdEMAMix)"})
    model_config: str | None = field(default=None, metadata={
        "help": "config.json (or a directory holding one) of the stage's model, for a model the plan cannot "
                "find offline"})
    set: dict = field(default_factory=dict, metadata={
        "help": "keys of the planned recipe to change first (set.per_device_train_batch_size=2; a pipeline "
                "section: set.train.max_length=2048)"})
    max_nodes: int = field(default=64, metadata={"help": "the most nodes a suggested change may ask for"})
    output: str | None = field(default=None, metadata={"help": "write the plan as JSON to this file"})
    json: bool = field(default=False, metadata={"help": "print the plan as JSON instead of the table (--json)"})

    def __post_init__(self) -> None:
        if not self.recipe:
            raise ConfigError("recipe: give the recipe to plan (align plan RECIPE.yaml [key=value ...])")
        if self.stage is not None and self.stage not in PLANNED_STAGES:
            raise ConfigError(f"stage: {self.stage!r} is not one of {list(PLANNED_STAGES)}")
        for key in ("nodes", "gpus_per_node", "max_nodes"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ConfigError(f"{key}: must be >= 1, got {value}")
        if self.gpu_memory_gib is not None and not self.gpu_memory_gib > 0:
            raise ConfigError(f"gpu_memory_gib: must be > 0, got {self.gpu_memory_gib}")
        if self.zero_stage is not None and self.zero_stage not in (0, 1, 2, 3):
            raise ConfigError(f"zero_stage: must be 0, 1, 2 or 3, got {self.zero_stage}")
        if not self.headroom_gib >= 0:
            raise ConfigError(f"headroom_gib: must be >= 0, got {self.headroom_gib}")


# --------------------------------------------------------------------------- reading the recipe


@dataclass
class Context:
    """What every stage of the recipe shares: hardware, launch, the header, model lineage."""

    config: PlanSettings
    header: list[tuple[int, str]]
    hardware: dict[str, Any]
    launch_source: dict[str, Any]
    lineage: dict[str, str]

    @property
    def gpus(self) -> int:
        return self.hardware["nodes"] * self.hardware["gpus_per_node"]

    @property
    def gpu_memory(self) -> int:
        return int(self.hardware["gpu_memory_gib"] * GIB)

    @property
    def headroom(self) -> int:
        return int(self.config.headroom_gib * GIB)


def _step_keys(recipe: Any, step: Any) -> dict[str, Any]:
    """A step's keys over the defaults its stage knows (what the plan reads: bf16, the model paths)."""
    return apply_defaults(recipe.config_class(step.stage), recipe.settings.defaults, step.keys)


def _hardware(config: PlanSettings, header: list[tuple[int, str]]) -> dict[str, Any]:
    from_header = hardware_from_header(header, config.recipe)
    hardware, sources = {}, []
    for key, default in DEFAULT_HARDWARE.items():
        given = getattr(config, key)
        source = "keys" if given is not None else "the recipe's hardware line" if key in from_header else "defaults"
        hardware[key] = given if given is not None else from_header.get(key, default)
        sources.append(source)
    hardware["source"] = " and ".join(dict.fromkeys(sources))
    return hardware


def _launch_source(config: PlanSettings, header: list[tuple[int, str]]) -> dict[str, Any]:
    """ZeRO stage and offload from the plan's keys, the accelerate config, or the header's command."""
    found = launch_from_header(header)
    source, path = "", config.accelerate_config or found.get("accelerate_config")
    launch: dict[str, Any] = {}
    if path:
        resolved = find_file(path, config.recipe)
        if resolved is None:
            raise ConfigError(f"accelerate_config: {path} not found")
        launch.update(read_accelerate_config(resolved))
        source = f"{path}" + ("" if config.accelerate_config else " (the recipe's launch command)")
    if config.zero_stage is not None:
        launch["zero_stage"], source = config.zero_stage, "zero_stage key"
    if config.offload_optimizer is not None:
        launch["offload_optimizer"] = config.offload_optimizer
    launch["source"] = source
    launch["from_command"] = bool(found.get("accelerate_config")) and not config.accelerate_config
    return launch


def _step_context(ctx: Context, recipe: Any, step: Any) -> Context:
    """A pipeline step planned on the machines its ``slurm:`` job asks for (a launch: its nodes and GPUs per
    node, with its accelerate config; an array task or one task: one node of its GPUs), unless the plan's
    keys name the hardware."""
    from dataclasses import replace

    config = ctx.config
    settings = recipe.settings.slurm.for_stage(step.stage, step.base, step.name)
    kind = step.job_kind()
    hardware = dict(ctx.hardware)
    if config.nodes is None and config.gpus_per_node is None:
        if kind == "launch":
            hardware.update(nodes=settings.nodes, gpus_per_node=settings.gpus_per_node)
        else:
            hardware.update(nodes=1, gpus_per_node=max(settings.gpus_per_task, 1))
        hardware["source"] = f"the recipe's slurm settings for {step.name}"
    launch = ctx.launch_source
    if kind == "launch" and config.accelerate_config is None and config.zero_stage is None:
        resolved = find_file(settings.accelerate_config, config.recipe)
        if resolved is not None:
            launch = {**read_accelerate_config(resolved), "source": f"{settings.accelerate_config} (slurm settings)",
                      "from_command": False}
    return replace(ctx, hardware=hardware, launch_source=launch)


# --------------------------------------------------------------------------- models


def _model(ctx: Context, key: str, name: str, *, explicit: str | None = None) -> tuple[Any, str]:
    """(shape, where its config came from) of a model a stage names."""
    chain = trace_model(name, ctx.lineage)
    for candidate in chain:
        config, source = load_model_config(candidate, explicit=explicit)
        if config is not None:
            via = f" via {' <- '.join(chain[: chain.index(candidate) + 1])}" if candidate != name else ""
            return model_shape(config, key), source + via
    tried = f"; traced through {' <- '.join(chain)}" if len(chain) > 1 else ""
    raise missing_config_error(key, name, tried)


def _weight_bytes(dtype: str | None, bf16: bool | None = None) -> int:
    """Bytes per weight: the dtype named, else bf16 on GPU nodes (auto / None)."""
    if dtype and dtype != "auto":
        if dtype not in DTYPE_BYTES:
            raise ConfigError(f"dtype: {dtype!r} is not one of {sorted(DTYPE_BYTES)}")
        return DTYPE_BYTES[dtype]
    return 4 if bf16 is False else 2


# --------------------------------------------------------------------------- verdicts


def _fits(ctx: Context, estimate: Estimate) -> Verdict:
    gpu, room = ctx.gpu_memory, ctx.headroom
    if estimate.kind == "vllm":
        tp = estimate.gpus
        if tp > ctx.hardware["gpus_per_node"]:
            return Verdict(False, f"tensor_parallel_size {tp} > {ctx.hardware['gpus_per_node']} GPUs per node")
        extra = estimate.extra
        if extra["budget"] > gpu:
            return Verdict(False, "gpu_memory_utilization above 1")
        if extra["needed"] > extra["budget"]:
            return Verdict(False, f"weights and working memory leave {extra['kv_tokens']:,} tokens of KV cache, "
                                  f"less than one max_model_len ({extra['max_model_len']:,}) sequence: vLLM will "
                                  "not start")
        return Verdict(True, f"vLLM takes {extra['budget'] / GIB:.2f} of {gpu / GIB:.1f} GiB; KV cache for "
                             f"{extra['kv_tokens']:,} tokens ({extra['sequences_at_max_len']} sequences of "
                             f"{extra['max_model_len']:,})")
    need = estimate.total + room
    text = (f"{estimate.total / GIB:.2f} GiB + {room / GIB:.1f} GiB headroom "
            f"{'<=' if need <= gpu else '>'} {gpu / GIB:.1f} GiB per GPU")
    return Verdict(need <= gpu, text + ("" if need <= gpu else f" (short by {(need - gpu) / GIB:.2f} GiB)"))


def _plan(ctx: Context, stage: str, job: str, model: str, shape: Any, source: str, setting: str,
          estimate: Estimate, **kw: Any) -> JobPlan:
    return JobPlan(stage, job, model, source, shape, setting, estimate, _fits(ctx, estimate), ctx.gpu_memory,
                   ctx.headroom, **kw)


# --------------------------------------------------------------------------- training stages


def _trainer_launch(ctx: Context, trainer: Any) -> dict[str, Any]:
    launch = {k: v for k, v in ctx.launch_source.items()}
    if "zero_stage" not in launch:
        ds = getattr(trainer, "deepspeed", None)
        if isinstance(ds, str) and ds:
            path = find_file(ds, ctx.config.recipe)
            if path is not None:
                try:
                    ds = json.loads(read_text(path, error=ConfigError, what="deepspeed"))
                except json.JSONDecodeError as exc:
                    raise ConfigError(f"deepspeed {path}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
        stage = ((ds or {}).get("zero_optimization") or {}).get("stage", 0) if isinstance(ds, dict) else 0
        launch["zero_stage"], launch["source"] = int(stage), ("the trainer's deepspeed key" if ds else "no DeepSpeed")
    return launch


def _lora(config: Any, model_config: Any) -> tuple[int | None, int | None]:
    """Trainable parameters and tensors of a LoRA adapter (r·(in + out) per adapted linear layer)."""
    if config.lora_r is None:
        return None, None
    linears = [(n, i, o) for n, i, o in linear_shapes(model_config) if not n.endswith("lm_head") and "score" not in n]
    targets = config.lora_target_modules
    if targets:
        linears = [(n, i, o) for n, i, o in linears if n.rsplit(".", 1)[-1] in targets]
    if not linears:
        raise ConfigError("lora_r: the plan counts a LoRA adapter on the model's linear layers, and found none "
                          "(an architecture transformers does not know, or lora_target_modules matching nothing)")
    return sum(config.lora_r * (i + o) for _, i, o in linears), 2 * len(linears)


def _training_plans(ctx: Context, stage: str, config: Any, keys: dict[str, Any]) -> list[JobPlan]:
    key = "model_name_or_path"
    name = config.model_name_or_path or ""
    if not name:
        raise ConfigError(f"{stage}: set model_name_or_path (the model to train)")
    shape, source = _model(ctx, key, name, explicit=ctx.config.model_config)
    model_config = None
    if config.lora_r is not None:
        chain = trace_model(name, ctx.lineage)
        model_config = next(c for c in (load_model_config(n, explicit=ctx.config.model_config)[0] for n in chain)
                            if c is not None)
    trainable, tensors = _lora(config, model_config)
    bf16 = keys.get("bf16", None)
    weight_bytes = _weight_bytes(config.dtype, None if bf16 is None else bool(bf16) or bool(keys.get("fp16")))
    optimizer = config.optimizer or getattr(config.optim, "value", config.optim)
    layout = optimizer_layout(str(optimizer))
    checkpointing = bool(getattr(config, "activation_checkpointing", False) or config.gradient_checkpointing)
    pairs = stage == "train"
    per_device = config.per_device_train_batch_size
    reference = pairs and config.reference == "model"
    launch = _trainer_launch(ctx, config)
    zero = launch.get("zero_stage", 0)
    offload = bool(launch.get("offload_optimizer", False))

    def job(settings: dict[str, Any]) -> tuple[TrainingJob, Launch]:
        mb = settings.get("per_device_train_batch_size", per_device)
        nodes = settings.get("nodes", ctx.hardware["nodes"])
        return (TrainingJob(shape, mb * (2 if pairs else 1), config.max_length or 4096,
                            settings.get("activation_checkpointing", checkpointing), weight_bytes, layout,
                            "tiled" if pairs else "fused", trainable, tensors, reference),
                Launch(nodes * ctx.hardware["gpus_per_node"], settings.get("zero_stage", zero),
                       settings.get("offload_optimizer", offload)))

    def plan(settings: dict[str, Any]) -> Estimate:
        return training_memory(*job(settings))

    training, launched = job({})
    estimate = training_memory(training, launched)
    unit = "pairs" if pairs else "sequences"
    setting = (f"{launched.describe()} ({launch.get('source') or 'no DeepSpeed'}); "
               f"{'bf16' if weight_bytes == 2 else 'fp32'} weights; {layout.name} ({layout.per_element} state "
               f"tensors per parameter); micro-batch {per_device} {unit if per_device > 1 else unit[:-1]}"
               f"{f' = {training.sequences} sequences' if pairs else ''} × {training.max_length} tokens; activation checkpointing {'on' if checkpointing else 'off'}"
               + (f"; LoRA r={config.lora_r}: {trainable:,} trainable parameters" if trainable else "")
               + ("; a frozen reference model" if reference else ""))
    notes = []
    verdict_override = None
    if offload and layout.name == "ademamix" and zero > 0:
        verdict_override = Verdict(False, "DeepSpeed optimizer offload with AdEMAMix: align refuses it "
                                          "(accelerate would silently swap in DeepSpeed's CPU Adam)")
    global_batch = getattr(config, "global_batch_size", None)

    def divides(settings: dict[str, Any]) -> bool:
        if global_batch is None:
            return True
        mb = settings.get("per_device_train_batch_size", per_device)
        ranks = settings.get("nodes", ctx.hardware["nodes"]) * ctx.hardware["gpus_per_node"]
        return global_batch % (mb * ranks) == 0

    knobs = [
        Knob("nodes", ctx.hardware["nodes"], doublings(ctx.hardware["nodes"], ctx.config.max_nodes), float),
        Knob("offload_optimizer", offload, () if layout.name == "ademamix" else (True,), float),
        Knob("zero_stage", zero, tuple(s for s in (2, 3) if s > zero), float),
        Knob("per_device_train_batch_size", per_device, halvings(per_device), lambda v: -v, recipe_key=True),
        Knob("activation_checkpointing", checkpointing, (True,), float, recipe_key=True),
    ]
    result = _plan(ctx, stage, "training step", name, shape, source, setting, estimate, notes=notes)
    if verdict_override is not None:
        result.verdict = verdict_override
    if zero in (2, 3):
        result.deepspeed_bytes = deepspeed_estimate(shape.num_params, shape.largest_layer_params, zero,
                                                    ctx.hardware["gpus_per_node"], ctx.hardware["nodes"])
    if not result.verdict.fits:
        result.change = smallest_change(knobs, lambda s: plan(s) if divides(s) else None,
                                        lambda e: e is not None and _fits(ctx, e).fits)
        if layout.name == "ademamix":
            result.change_note = ("; CPU offload is not among the changes: align refuses DeepSpeed optimizer "
                                  "offload with AdEMAMix (optimizer=adamw could offload)")
        if result.change is not None and "zero_stage" in result.change.settings:
            result.change_note += (f"; launch with --config_file recipes/accelerate/zero"
                                   f"{result.change.settings['zero_stage']}.yaml")
    return [result]


# --------------------------------------------------------------------------- the log-prob pass


def _logprobs_plans(ctx: Context, config: Any) -> list[JobPlan]:
    """The pass replicated (each process a whole model) or ZeRO-3-sharded: the recipe's
    ``sharding`` key decides where the stage has one, else the launch (``zero_stage``)."""
    name = config.model_name_or_path
    shape, source = _model(ctx, "model_name_or_path", name, explicit=ctx.config.model_config)
    b = _weight_bytes(config.dtype)
    has_key = hasattr(config, "sharding") and ctx.config.zero_stage is None
    sharded_now = (config.sharding == "zero3") if has_key else ctx.launch_source.get("zero_stage", 0) >= 3
    knob_key, knob_value = ("sharding", "zero3") if has_key else ("zero_stage", 3)

    def job(settings: dict[str, Any]) -> tuple[ForwardJob, Launch]:
        rows = settings.get("batch_size", config.batch_size)
        sharded = settings[knob_key] == knob_value if knob_key in settings else sharded_now
        return (ForwardJob(shape, rows * 2 * (config.max_length or 4096), b, "tiled"),
                Launch(ctx.gpus if sharded else 1, 3 if sharded else 0))

    def plan(settings: dict[str, Any]) -> Estimate:
        return forward_memory(*job(settings))

    forward, launch = job({})
    estimate = forward_memory(forward, launch)
    how = (f"ZeRO-3-sharded over {ctx.gpus} GPUs" if sharded_now else "replicated: each process holds the "
           "whole model on its GPU")
    why = "the recipe's sharding key" if has_key else (ctx.launch_source.get("source") or "no ZeRO-3 launch")
    setting = (f"{how} ({why}); {config.batch_size} rows × 2 sequences × {config.max_length} tokens = "
               f"{forward.tokens:,} tokens per forward, {'bf16' if b == 2 else 'fp32'}")
    result = _plan(ctx, "logprobs", "reference log-prob pass", name, shape, source, setting, estimate)
    other = {knob_key: (("replicate" if has_key else 0) if sharded_now else knob_value)}
    other_estimate = plan(other)
    label = "replicated (one model per GPU)" if sharded_now else f"ZeRO-3-sharded over {ctx.gpus} GPUs"
    result.alternatives.append((label, other_estimate, _fits(ctx, other_estimate)))
    if not sharded_now:
        result.notes.append("a ZeRO-3-sharded pass (accelerate launch --config_file recipes/accelerate/zero3.yaml) "
                            "holds 1/N of the weights per GPU; the plan shows both")
    if not result.verdict.fits:
        knobs = [Knob(knob_key, "zero3" if has_key and sharded_now else ("replicate" if has_key else
                                                                        (3 if sharded_now else 0)),
                      () if sharded_now else (knob_value,), lambda v: float(v in (3, "zero3")), recipe_key=has_key),
                 Knob("batch_size", config.batch_size, halvings(config.batch_size), lambda v: -v, recipe_key=True)]
        result.change = smallest_change(knobs, plan, lambda e: _fits(ctx, e).fits)
        if result.change is not None and knob_key in result.change.settings:
            result.change_note = "; launch with --config_file recipes/accelerate/zero3.yaml"
    return [result]


# --------------------------------------------------------------------------- engines (vLLM, transformers)


def _engine_settings(engine_kwargs: Mapping[str, Any], **given: Any) -> dict[str, Any]:
    merged = {k: v for k, v in given.items() if v is not None}
    for key in ("tensor_parallel_size", "gpu_memory_utilization", "max_model_len", "max_num_seqs",
                "max_num_batched_tokens", "kv_cache_dtype"):
        if engine_kwargs.get(key) is not None:
            merged.setdefault(key, engine_kwargs[key])
    return merged


def _vllm_plan(ctx: Context, stage: str, job_name: str, model: str, dtype: str | None, settings: dict[str, Any],
               explicit: str | None) -> JobPlan:
    shape, source = _model(ctx, "model", model, explicit=explicit)
    b = _weight_bytes(dtype)
    tp = int(settings.get("tensor_parallel_size", 1))
    util = float(settings.get("gpu_memory_utilization", 0.9))
    max_len = int(settings.get("max_model_len") or shape.max_position_embeddings or 4096)
    kv_dtype = settings.get("kv_cache_dtype")
    kv_bytes = 1 if kv_dtype and "fp8" in str(kv_dtype) else None

    def plan(changes: dict[str, Any]) -> Estimate:
        return vllm_memory(VllmJob(shape, b, changes.get("tensor_parallel_size", tp),
                                   changes.get("gpu_memory_utilization", util), max_len,
                                   int(settings.get("max_num_batched_tokens") or 8192),
                                   int(settings.get("max_num_seqs") or 256), kv_bytes), ctx.gpu_memory)

    estimate = plan({})
    setting = (f"vLLM, tensor_parallel_size {tp}, gpu_memory_utilization {util}, max_model_len {max_len:,}, "
               f"{'bf16' if b == 2 else 'fp32'}")
    result = _plan(ctx, stage, job_name, model, shape, source, setting, estimate)
    if shape.num_heads % tp:
        result.verdict = Verdict(False, f"tensor_parallel_size {tp} does not divide {shape.num_heads} attention heads")
    if not result.verdict.fits:
        tps = tuple(t for t in doublings(tp, ctx.hardware["gpus_per_node"]) if shape.num_heads % t == 0)
        knobs = [Knob("tensor_parallel_size", tp, tps, float, recipe_key=True),
                 Knob("gpu_memory_utilization", util, tuple(u for u in (0.95,) if u > util), float, recipe_key=True)]
        result.change = smallest_change(knobs, plan, lambda e: _fits(ctx, e).fits)
    return result


def _generate_plan(ctx: Context, stage: str, job_name: str, model: str, dtype: str | None, rows: int,
                   context: int, explicit: str | None, note: str = "") -> JobPlan:
    shape, source = _model(ctx, "model", model, explicit=explicit)
    b = _weight_bytes(dtype)
    estimate = generate_memory(GenerateJob(shape, b, rows, context))
    result = _plan(ctx, stage, job_name, model, shape, source,
                   f"transformers on one GPU, {rows} rows × {context:,} tokens, {'bf16' if b == 2 else 'fp32'}",
                   estimate)
    if note:
        result.notes.append(note)
    return result


def _reward_model_plan(ctx: Context, stage: str, config: Any, explicit: str | None) -> JobPlan:
    shape, source = _model(ctx, "model", config.model, explicit=explicit)
    b = _weight_bytes(config.dtype)
    rows = config.model_batch_size
    tokens = min(rows * config.max_length, config.max_batch_tokens or rows * config.max_length)

    def plan(changes: dict[str, Any]) -> Estimate:
        r = changes.get("model_batch_size", rows)
        t = min(r * config.max_length, config.max_batch_tokens or r * config.max_length)
        return forward_memory(ForwardJob(shape, t, b, "score" if shape.head == "score" else "model"), Launch(1))

    estimate = plan({})
    setting = (f"transformers forward on one GPU, up to {rows} rows × {config.max_length:,} tokens = {tokens:,} "
               f"tokens, {'bf16' if b == 2 else 'fp32'}")
    result = _plan(ctx, stage, "reward model", config.model, shape, source, setting, estimate)
    if not result.verdict.fits:
        knobs = [Knob("model_batch_size", rows, halvings(rows), lambda v: -v, recipe_key=True)]
        result.change = smallest_change(knobs, plan, lambda e: _fits(ctx, e).fits)
    return result


def _engine_plan(ctx: Context, stage: str, job_name: str, engine: Any, explicit: str | None,
                 rows: int, max_tokens: int) -> JobPlan | None:
    """A judge / classifier / generator (``EngineFields``): vLLM, transformers or a server."""
    if engine.backend == "openai":
        return None
    settings = _engine_settings(engine.engine_kwargs or {}, max_model_len=engine.max_model_len)
    if engine.backend == "vllm":
        return _vllm_plan(ctx, stage, job_name, engine.model, engine.dtype, settings, explicit)
    context = engine.max_model_len or PROMPT_TOKENS + max_tokens
    return _generate_plan(ctx, stage, job_name, engine.model, engine.dtype, rows, context, explicit)


def _sampler_plan(ctx: Context, stage: str, job_name: str, sampler: Any, model: str, rows: int,
                  max_tokens: int, explicit: str | None) -> JobPlan | None:
    if sampler.backend == "openai":
        return None
    if sampler.backend == "vllm":
        settings = _engine_settings(sampler.engine_kwargs or {}, tensor_parallel_size=sampler.tensor_parallel_size,
                                    gpu_memory_utilization=sampler.gpu_memory_utilization,
                                    max_model_len=sampler.max_model_len)
        return _vllm_plan(ctx, stage, job_name, model, sampler.dtype, settings, explicit)
    context = sampler.max_model_len or PROMPT_TOKENS + max_tokens
    note = "" if sampler.max_model_len else f"context assumed: {PROMPT_TOKENS} prompt tokens + max_tokens"
    return _generate_plan(ctx, stage, job_name, model, sampler.dtype, rows, context, explicit, note)


def _no_gpu(stage: str, why: str) -> JobPlan:
    return JobPlan(stage, why, "", "", None, "", None, Verdict(True, "uses no GPU"), 0, 0)


def _sampler_plans(ctx: Context, stage: str, config: Any, keys: dict[str, Any]) -> list[JobPlan]:
    plan = _sampler_plan(ctx, stage, "sampler", config.sampler, config.sampler.model,
                         config.sampler.batch_size * config.n, config.max_tokens, ctx.config.model_config)
    return [plan or _no_gpu(stage, "sampler on an OpenAI-compatible server (planned where it is served)")]


def _provider_plans(ctx: Context, stage: str, config: Any, keys: dict[str, Any]) -> list[JobPlan]:
    explicit = ctx.config.model_config
    if config.provider == "verifiable":
        return [_no_gpu(stage, "verifiable reward (answer matching)")]
    if config.provider == "reward_model":
        return [_reward_model_plan(ctx, stage, config, explicit)]
    plan = _engine_plan(ctx, stage, config.provider, config, explicit, config.model_batch_size, config.max_tokens)
    return [plan or _no_gpu(stage, f"{config.provider} on an OpenAI-compatible server")]


def _evaluate_plans(ctx: Context, stage: str, config: Any, keys: dict[str, Any]) -> list[JobPlan]:
    plans = []
    for policy in config.policies:
        name = getattr(policy, "name", None) or policy["name"]
        model = getattr(policy, "model", None) or policy["model"]
        if not model:  # completions generated before: nothing to load
            continue
        plan = _sampler_plan(ctx, stage, f"sampler for policy {name}", config.sampler, model,
                             config.sampler.batch_size * (config.n + 1), config.max_tokens, None)
        if plan is not None:
            plans.append(plan)
    reward = config.reward
    if reward.provider == "reward_model":
        plans.append(_reward_model_plan(ctx, stage, reward, None))
    elif reward.provider != "verifiable":
        plan = _engine_plan(ctx, stage, f"reward ({reward.provider})", reward, None, reward.model_batch_size,
                            config.max_tokens)
        if plan is not None:
            plans.append(plan)
    for plan in plans:
        plan.notes.append("evaluate builds one engine at a time: each job is planned alone")
    return plans or [_no_gpu(stage, "every model is served elsewhere or none is needed")]


def _kl_plans(ctx: Context, stage: str, config: Any, keys: dict[str, Any]) -> list[JobPlan]:
    """The KL step of an evaluation as a launch of its own: each policy and π_ref held together, partitioned
    over the launch's ranks (``kl_sharding: zero3``), forwarding ``kl_batch_size`` samples at a time."""
    models = {(getattr(p, "name", None) or p["name"]): (getattr(p, "model", None) or p["model"])
              for p in config.policies}
    reference = config.kl_reference or config.baseline
    context = (config.sampler.max_model_len or PROMPT_TOKENS + config.max_tokens)
    b = _weight_bytes(config.sampler.dtype)
    sharded = config.kl_sharding == "zero3"
    launch = Launch(ctx.gpus if sharded else 1, 3 if sharded else 0)
    ref_model = models.get(reference)
    plans = []
    for name, model in models.items():
        if not model or name == reference or ref_model is None:
            continue
        shape, source = _model(ctx, "model", model, explicit=None)
        ref_shape, _ = _model(ctx, "model", ref_model, explicit=None)
        estimate = forward_memory(ForwardJob(shape, config.kl_batch_size * context, b, "model"), launch)
        held = math.ceil(ref_shape.num_params * b / (launch.world_size if sharded else 1))
        estimate.parts.append(Part("reference_weights", held, f"{b}Ψ_ref{'/N' if sharded else ''} (π_ref "
                                   f"{reference}, held beside the policy)"))
        setting = (f"{launch.describe()}; {config.kl_batch_size} samples × {context:,} tokens per forward, "
                   f"{'bf16' if b == 2 else 'fp32'}; π_ref: {reference}")
        plans.append(_plan(ctx, stage, f"KL of policy {name}", model, shape, source, setting, estimate))
    return plans or [_no_gpu(stage, "no policy has a model to score (KL)")]


def _judge_plans(ctx: Context, stage: str, config: Any, keys: dict[str, Any]) -> list[JobPlan]:
    plans = [p for p in (_engine_plan(ctx, stage, "judge", config, ctx.config.model_config, config.model_batch_size,
                                      16),) if p is not None]
    generator = getattr(config, "generator", None)
    if getattr(config, "degrader", "rules") == "llm" and generator is not None and generator.model:
        plan = _engine_plan(ctx, stage, "degrader", generator, None, generator.model_batch_size,
                            generator.max_tokens)
        if plan is not None:
            plans.append(plan)
    return plans or [_no_gpu(stage, "the judge is served elsewhere")]


def _rows_plans(ctx: Context, stage: str, config: Any, keys: dict[str, Any]) -> list[JobPlan]:
    return [_no_gpu(stage, "reads and writes rows")]


def _pass_plans(ctx: Context, stage: str, config: Any, keys: dict[str, Any]) -> list[JobPlan]:
    return _logprobs_plans(ctx, config)


# How each kind of job is planned (the stage table names the kind: ``StageSpec.plan``, and a phase its name).
PLANNERS = {"training": _training_plans, "pass": _pass_plans, "sampler": _sampler_plans, "provider": _provider_plans,
            "evaluate": _evaluate_plans, "judge": _judge_plans, "rows": _rows_plans, "kl": _kl_plans}


def step_plans(ctx: Context, step: Any, config: Any, keys: dict[str, Any]) -> list[JobPlan]:
    """The plans of one job of a recipe: a step, or a phase of one (an evaluation's KL launch, its report)."""
    if step.phase == "report":
        return [_no_gpu(step.stage, "the report, from the shards' rows")]
    how = step.phase if step.phase in PLANNERS else STAGES[step.stage].plan
    if how is None:
        return [_no_gpu(step.stage, "not planned")]
    return PLANNERS[how](ctx, step.stage, config, keys)


# --------------------------------------------------------------------------- run


def plan_jobs(config: PlanSettings, recipe: Any, steps: list[Any]) -> tuple[list[JobPlan], dict[str, Any]]:
    """Every job's plan (the jobs ``align submit`` writes for ``steps``: an evaluation's KL and report
    phases included), and the plan's header (recipe, hardware, launch)."""
    path = Path(config.recipe)
    header = header_lines(path)
    sections = {step.name: _step_keys(recipe, step) for step in recipe if not step.phase}
    for step in recipe:
        if step.phase:
            sections[step.name] = sections[step.name.removesuffix(f".{step.phase}")]
    ctx = Context(config, header, _hardware(config, header), _launch_source(config, header),
                  model_lineage(path, {name: keys for name, keys in sections.items() if "." not in name}, header))
    plans = []
    for step in steps:
        here = _step_context(ctx, recipe, step) if recipe.kind == "pipeline" else ctx
        for plan in step_plans(here, step, recipe.config(step), sections[step.name]):
            plan.step = step.name
            plans.append(plan)
    hardware = {k: ctx.hardware[k] for k in DEFAULT_HARDWARE}
    info = {"recipe": str(path), "hardware": hardware, "hardware_source": ctx.hardware["source"],
            "headroom_gib": config.headroom_gib,
            "launch": {k: v for k, v in ctx.launch_source.items() if k != "from_command"}}
    return plans, info
