"""Bytes per GPU, by part, for the four kinds of job a recipe runs.

* ``training_memory``: a training step (SFT, QRPO/DPO) under DDP or DeepSpeed ZeRO-1/2/3:
  weights, gradients, fp32 master weights, optimizer states, activations (with or without
  activation checkpointing), the LM head's peak and, under ZeRO-3, the gathered layer.
* ``forward_memory``: a forward pass without gradients (the reference log-prob pass, a
  reward model), replicated or ZeRO-3-sharded.
* ``vllm_memory``: a vLLM engine: weights over its tensor-parallel GPUs, its working
  memory, and the KV cache that ``gpu_memory_utilization`` leaves.
* ``generate_memory``: transformers' ``generate`` on one GPU.

Parts belong to a phase: ``always`` (held through the step: weights, optimizer states),
``backward`` (the forward/backward pass: activations, the head's or a layer's transient) or
``step`` (the optimizer step: fp32 gradients, the update's temporaries). The peak is
``always`` + the larger of the two others. Every formula is in docs/memory-plan.md with the
symbols used here (Ψ parameters, N ranks, h hidden size, L layers, T tokens per
micro-batch, V vocabulary, a bytes per activation); each ``Part`` carries its formula as text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from align.plan.optimizer_states import OptimizerLayout
from align.plan.shapes import ModelShape

GIB = 1 << 30

# The LM head of align.scoring runs in tiles of HEAD_TILE_BYTES of float32 logits (1 GiB);
# the measured peak above its inputs is 2.0 tiles forward and 4.3 tiles forward + backward
# (H100, align/scoring/logps.py's docstring; 2.0 remeasured in docs/memory-plan.md). Kept
# here as numbers: the plan does arithmetic without loading the scoring stack
# (tests/test_plan.py checks HEAD_TILE_BYTES against align.scoring's).
HEAD_TILE_BYTES = 1 << 30
TILE_FORWARD_PEAK = 2.0
TILE_TRAINING_PEAK = 4.3
# TRL's fused LM head (the SFT trainer): tiles of 4,096 tokens × 32,768 vocabulary entries.
TRL_TOKEN_CHUNK = 4096
TRL_VOCAB_CHUNK = 32768
# Elements per token, in multiples of the MLP width f, that an activation function keeps
# for backward beyond its input and output: transformers' Python xIELU (used when the CUDA
# kernel is not installed) keeps about 3.5 f more (measured on an H100, docs/memory-plan.md).
ACTIVATION_EXTRA = {"xielu": 3.5}
# DeepSpeed ZeRO-3 steps the optimizer one sub-group of parameters at a time (its default
# sub_group_size, 1e9 elements): fp32 gradients and update temporaries exist for one sub-group.
ZERO3_SUB_GROUP = 10**9
# AdEMAMix and AdamW make about two parameter-sized temporaries while updating a tensor
# (the denominator and the update).
STEP_TEMPORARIES = 2
# vLLM: what an engine holds besides weights, activations and the KV cache (CUDA graphs,
# the NCCL communicator); an allowance: vLLM prints the real figures at start-up.
VLLM_RUNTIME_BYTES = GIB
VLLM_MAX_NUM_BATCHED_TOKENS = 8192
VLLM_MAX_NUM_SEQS = 256

PHASES = ("always", "backward", "step")


@dataclass(frozen=True)
class Part:
    """One line of a plan: a name, bytes per GPU, the formula that gave them, and the phase
    in which they are held (``always``, ``backward`` or ``step``)."""

    name: str
    bytes: int
    formula: str
    phase: str = "always"


@dataclass
class Estimate:
    """Bytes per GPU of one job, part by part, and what to know about them."""

    kind: str
    parts: list[Part]
    gpus: int
    notes: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    def phase_bytes(self, phase: str) -> int:
        return sum(p.bytes for p in self.parts if p.phase == phase)

    @property
    def total(self) -> int:
        """The peak: what is always held plus the larger of the backward and step phases."""
        return self.phase_bytes("always") + max(self.phase_bytes("backward"), self.phase_bytes("step"))

    @property
    def peak_phase(self) -> str:
        return "step" if self.phase_bytes("step") > self.phase_bytes("backward") else "backward"

    def part(self, name: str) -> int:
        return sum(p.bytes for p in self.parts if p.name == name)


# --------------------------------------------------------------------------- activations


def saved_per_token(shape: ModelShape) -> float:
    """Elements (of the activation dtype) one decoder layer keeps per token for backward.

    8h: two RMSNorms, each keeping its input in float32 (2h), the normalised copy (h) and
    its output, the next projection's input (h); 3q + 2·kv: attention's queries, keys and
    values and its output with o_proj's contiguous copy of it; 3·(q + kv) more with
    QK-norm (its float32 input and normalised copy); the MLP: 4f gated (gate, act(gate),
    up, product) or 2f plain (up, act), plus what the activation keeps (``ACTIVATION_EXTRA``).
    """
    h, q, kv, f = shape.hidden_size, shape.q_dim, shape.kv_dim, shape.intermediate_size
    attention = 3 * q + 2 * kv + (3 * (q + kv) if shape.qk_norm else 0)
    mlp = (4 if shape.gated_mlp else 2) * f + ACTIVATION_EXTRA.get(shape.hidden_act, 0.0) * f
    return 8 * h + attention + mlp


def live_per_token(shape: ModelShape) -> float:
    """Elements alive at once per token in one layer's forward without gradients: the
    residual stream h, plus the larger of attention (norm h, q + 2·kv, output q, o_proj h)
    and the MLP (norm h, its intermediates, down_proj h): 4f gated (gate, up, act(gate),
    product), 2f plain plus what the activation makes (``ACTIVATION_EXTRA``)."""
    h, q, kv, f = shape.hidden_size, shape.q_dim, shape.kv_dim, shape.intermediate_size
    attention = h + q + 2 * kv + q + h
    mlp = h + (4 if shape.gated_mlp else 2 + ACTIVATION_EXTRA.get(shape.hidden_act, 0.0)) * f + h
    return h + max(attention, mlp)


def stored_activations(shape: ModelShape, tokens: int, act_bytes: int, checkpointing: bool) -> Part:
    """What a micro-batch keeps from its forward for backward: every layer's saved tensors,
    or only each layer's input under activation checkpointing; plus the final norm (4h)."""
    s, h, layers = saved_per_token(shape), shape.hidden_size, shape.num_layers
    if checkpointing:
        return Part("activations", int(tokens * act_bytes * (layers * h + 4 * h)),
                    "T·a·(L·h + 4h) (checkpointing: each layer's input)", "backward")
    return Part("activations", int(tokens * act_bytes * (layers * s + 4 * h)),
                f"T·a·(L·s + 4h), s = {s:,.0f} elements per token per layer", "backward")


def layer_backward(shape: ModelShape, tokens: int, act_bytes: int, checkpointing: bool) -> tuple[int, str]:
    """A layer's own peak during backward: the gradients in flight, g = 2f + 2h (two of the
    MLP's width and two of the residual stream's), plus under checkpointing the layer's
    recomputed saved tensors s."""
    s = saved_per_token(shape)
    g = 2 * shape.intermediate_size + 2 * shape.hidden_size
    if checkpointing:
        return int(tokens * act_bytes * (s + g)), f"T·a·(s + g), g = 2f + 2h = {g:,}"
    return int(tokens * act_bytes * g), f"T·a·g, g = 2f + 2h = {g:,}"


def head_tile_bytes(vocab: int, positions: int) -> int:
    """Bytes of one float32 logits tile of align.scoring's tiled head (fewer rows if fewer positions)."""
    rows = max(1, HEAD_TILE_BYTES // (4 * max(1, vocab)))
    return min(rows, max(1, positions)) * vocab * 4


def head_peak(shape: ModelShape, head: str, positions: int, act_bytes: int, *, training: bool) -> tuple[int, str]:
    """The LM head's peak above the stored activations (K = positions scored, at most T)."""
    v, h = shape.vocab_size, shape.hidden_size
    if head == "score":
        return positions * max(1, shape.num_labels) * act_bytes, "T·labels·a (a classifier's scores)"
    tile = head_tile_bytes(v, positions)
    factor = TILE_TRAINING_PEAK if training else TILE_FORWARD_PEAK
    if head == "tiled":
        return int(factor * tile), f"{factor}·tile, tile = min(K, 2^30/(4V))·V·4 (align.scoring's tiled head)"
    if head == "model":  # the model's own head on the kept positions (under ZeRO-3: the head is sharded)
        copies = 2 if training else 1
        return (copies * positions * v * act_bytes + int(factor * tile),
                f"{copies}·K·V·a + {factor}·tile (the model's head: logits{' and their gradient' if training else ''})")
    if head == "fused":  # TRL's fused head in SFT
        buffer = min(positions, TRL_TOKEN_CHUNK) * min(v, TRL_VOCAB_CHUNK) * act_bytes
        if not training:
            return buffer, "min(T,4096)·min(V,32768)·a (TRL's fused head)"
        formula = ("(4 + a)·V·h + 4·T·h + min(T,4096)·min(V,32768)·a (TRL's fused head: fp32 weight and hidden "
                   "gradients)")
        return (4 + act_bytes) * v * h + 4 * positions * h + buffer, formula
    raise ValueError(f"unknown head {head!r}")


def transient_part(shape: ModelShape, head: str, tokens: int, act_bytes: int, checkpointing: bool) -> Part:
    """The larger of the head's peak and one layer's backward peak (they do not coincide)."""
    head_bytes, head_formula = head_peak(shape, head, tokens, act_bytes, training=True)
    layer_bytes, layer_formula = layer_backward(shape, tokens, act_bytes, checkpointing)
    which = "LM head" if head_bytes >= layer_bytes else "one layer's backward"
    return Part("transient", max(head_bytes, layer_bytes),
                f"max(head {head_bytes / GIB:.2f} GiB = {head_formula}; layer {layer_bytes / GIB:.2f} GiB = "
                f"{layer_formula}): {which}", "backward")


# --------------------------------------------------------------------------- training


@dataclass(frozen=True)
class TrainingJob:
    """One training step's setting, per GPU: ``sequences`` of up to ``max_length`` tokens
    per micro-batch (a preference pair is two), weights of ``weight_bytes`` (2: bf16),
    ``head`` "tiled" (align's preference trainer) or "fused" (TRL's SFT head), and
    ``trainable_params`` / ``trainable_tensors`` for a LoRA adapter (None: every weight)."""

    shape: ModelShape
    sequences: int
    max_length: int
    checkpointing: bool
    weight_bytes: int
    optimizer: OptimizerLayout
    head: str
    trainable_params: int | None = None
    trainable_tensors: int | None = None
    reference_model: bool = False

    @property
    def tokens(self) -> int:
        return self.sequences * self.max_length


@dataclass(frozen=True)
class Launch:
    """How a job is spread: ``world_size`` ranks, DeepSpeed ``zero_stage`` (0: DDP or one
    process, no DeepSpeed) and DeepSpeed's CPU offload of optimizer states / parameters."""

    world_size: int
    zero_stage: int = 0
    offload_optimizer: bool = False
    offload_params: bool = False

    def describe(self) -> str:
        ranks = max(1, self.world_size)
        where = "DDP" if ranks > 1 else "one process"
        text = f"DeepSpeed ZeRO-{self.zero_stage}" if self.zero_stage else where
        offload = [n for n, on in (("optimizer", self.offload_optimizer and self.zero_stage >= 1),
                                   ("parameters", self.offload_params and self.zero_stage >= 3)) if on]
        # an offload DeepSpeed does not do at this stage is not named: the figures do not count it either
        return f"{text} over {ranks} rank{'s' if ranks != 1 else ''}" + (
            f", {' and '.join(offload)} offloaded to CPU" if offload else "")


def training_memory(job: TrainingJob, launch: Launch) -> Estimate:
    """Bytes per GPU of one training step (docs/memory-plan.md, "Training")."""
    shape, n, stage = job.shape, max(1, launch.world_size), launch.zero_stage
    psi, b = shape.num_params, job.weight_bytes
    trainable = psi if job.trainable_params is None else job.trainable_params
    tensors = shape.num_tensors if job.trainable_tensors is None else job.trainable_tensors
    k, scalar = job.optimizer.per_element, job.optimizer.scalar_bytes
    deepspeed = stage > 0
    mixed = deepspeed and b < 4  # DeepSpeed keeps fp32 master weights of 16-bit models
    offloaded = launch.offload_optimizer and deepspeed
    shard_w, shard_g, shard_o = (n if stage >= 3 else 1), (n if stage >= 2 else 1), (n if stage >= 1 else 1)
    over = {n: "/N", 1: ""}
    parts = []
    if launch.offload_params and stage >= 3:
        parts.append(Part("weights", 0, "0 (parameters offloaded to CPU)"))
    else:
        parts.append(Part("weights", math.ceil(psi * b / shard_w), f"{b}Ψ{over[shard_w]}"))
    parts.append(Part("gradients", math.ceil(trainable * b / shard_g), f"{b}Ψt{over[shard_g]}"))
    if mixed:
        parts.append(Part("master_weights", 0 if offloaded else math.ceil(trainable * 4 / n),
                          "0 (offloaded)" if offloaded else "4Ψt/N (fp32)"))
    state_bytes = 4 if deepspeed else b  # DeepSpeed steps fp32 partitions; plain torch keeps the param's dtype
    groups = 2 if deepspeed else tensors  # DeepSpeed flattens each param group into one tensor
    states = math.ceil(k * state_bytes * trainable / shard_o) + scalar * groups
    parts.append(Part("optimizer_states", 0 if offloaded else states,
                      "0 (offloaded)" if offloaded else
                      f"{k}·{state_bytes}Ψt{over[shard_o]} + {scalar} B × {groups} tensors "
                      f"({job.optimizer.name}: {k} state tensors per parameter)"))
    if job.reference_model:
        parts.append(Part("reference_weights", math.ceil(psi * b / shard_w),
                          f"{b}Ψ{over[shard_w]} (frozen reference model)"))
    # the optimizer step: fp32 gradients (DeepSpeed, 16-bit models) and the update's temporaries
    if stage >= 3:
        stepped, stepped_formula = min(math.ceil(trainable / n), ZERO3_SUB_GROUP), "min(Ψt/N, 1e9)"
    elif deepspeed:
        stepped, stepped_formula = math.ceil(trainable / n), "Ψt/N"
    else:
        stepped, stepped_formula = shape.largest_layer_params, "P_largest"
    if mixed and not offloaded:
        parts.append(Part("fp32_gradients", 4 * stepped, f"4·{stepped_formula} (fp32 gradients being stepped)", "step"))
    if not offloaded:
        parts.append(Part("step_temporaries", STEP_TEMPORARIES * state_bytes * stepped,
                          f"{STEP_TEMPORARIES}·{state_bytes}·{stepped_formula} (the update's temporaries)", "step"))
    if stage >= 3:
        parts.append(Part("gathered_layer", 2 * b * shape.largest_layer_params,
                          f"2·{b}·P_largest (ZeRO-3: the largest layer gathered, and the next prefetched)",
                          "backward"))
    parts.append(stored_activations(shape, job.tokens, b, job.checkpointing))
    head = "model" if job.head == "tiled" and stage >= 3 else job.head
    parts.append(transient_part(shape, head, job.tokens, b, job.checkpointing))
    notes = []
    if head != job.head:
        notes.append("under ZeRO-3 the head is sharded, so align.scoring uses the model's own head (the logits "
                     "of the kept positions) instead of its tiles")
    return Estimate("training", parts, n, notes, {"tokens": job.tokens, "head": head})


def model_states(estimate: Estimate) -> int:
    """Weights, gradients (16- and 32-bit), master weights and optimizer states: what
    DeepSpeed's estimators count ("model states")."""
    names = ("weights", "gradients", "master_weights", "optimizer_states", "fp32_gradients", "gathered_layer")
    return sum(p.bytes for p in estimate.parts if p.name in names)


# --------------------------------------------------------------------------- forward only


@dataclass(frozen=True)
class ForwardJob:
    """A forward pass without gradients over ``tokens`` tokens per GPU (a log-prob batch:
    rows × 2 sequences × max_length), with ``head`` "tiled", "model" or "score"."""

    shape: ModelShape
    tokens: int
    weight_bytes: int
    head: str


def forward_memory(job: ForwardJob, launch: Launch) -> Estimate:
    """Bytes per GPU of a forward pass, replicated (``zero_stage`` 0) or ZeRO-3-sharded."""
    shape, b, n = job.shape, job.weight_bytes, max(1, launch.world_size)
    sharded = launch.zero_stage >= 3
    parts = [Part("weights", math.ceil(shape.num_params * b / (n if sharded else 1)),
                  f"{b}Ψ{'/N' if sharded else ''}")]
    if sharded:
        parts.append(Part("gathered_layer", 2 * b * shape.largest_layer_params,
                          f"2·{b}·P_largest (ZeRO-3: the largest layer gathered, and the next prefetched)",
                          "backward"))
    live = live_per_token(shape)
    layer = int(job.tokens * b * live)
    parts.append(Part("activations", job.tokens * shape.hidden_size * b,
                      "T·h·a (the last hidden states the head reads)", "backward"))
    head = "model" if job.head == "tiled" and sharded else job.head
    head_bytes, head_formula = head_peak(shape, head, job.tokens, b, training=False)
    which = "LM head" if head_bytes >= layer else "one layer"
    parts.append(Part("transient", max(layer, head_bytes),
                      f"max(head {head_bytes / GIB:.2f} GiB = {head_formula}; layer {layer / GIB:.2f} GiB = "
                      f"T·a·{live:,.0f}): {which}", "backward"))
    return Estimate("forward", parts, n if sharded else 1, extra={"tokens": job.tokens, "head": head})


# --------------------------------------------------------------------------- vLLM


@dataclass(frozen=True)
class VllmJob:
    """A vLLM engine: ``tensor_parallel`` GPUs, ``gpu_memory_utilization`` of each, a
    context of ``max_model_len`` tokens."""

    shape: ModelShape
    weight_bytes: int
    tensor_parallel: int
    gpu_memory_utilization: float
    max_model_len: int
    max_num_batched_tokens: int = VLLM_MAX_NUM_BATCHED_TOKENS
    max_num_seqs: int = VLLM_MAX_NUM_SEQS
    kv_bytes: int | None = None  # KV cache dtype; None: the weights'


def kv_bytes_per_token(shape: ModelShape, kv_bytes: int, tensor_parallel: int) -> int:
    """2 (K and V) · L · ⌈kv_heads / tp⌉ · d_head · bytes: one token's KV cache on one GPU."""
    heads = max(1, math.ceil(shape.num_kv_heads / tensor_parallel))
    return 2 * shape.num_layers * heads * shape.head_dim * kv_bytes


def vllm_memory(job: VllmJob, gpu_memory_bytes: int) -> Estimate:
    """Bytes per GPU of a vLLM engine: vLLM takes ``gpu_memory_utilization`` of the GPU and
    fills what weights and working memory leave with KV cache."""
    shape, tp, b = job.shape, max(1, job.tensor_parallel), job.weight_bytes
    budget = int(job.gpu_memory_utilization * gpu_memory_bytes)
    weights = math.ceil(shape.num_params * b / tp)
    h, q, kv, f = shape.hidden_size, shape.q_dim, shape.kv_dim, shape.intermediate_size
    per_token = 2 * h + max(h + (q + 2 * kv + q) // tp + h, h + (3 if shape.gated_mlp else 2) * f // tp + h)
    activations = job.max_num_batched_tokens * b * per_token
    sampler = 2 * job.max_num_seqs * shape.vocab_size * 4
    overhead = activations + sampler + VLLM_RUNTIME_BYTES
    per_kv_token = kv_bytes_per_token(shape, job.kv_bytes or b, tp)
    kv_cache = max(0, budget - weights - overhead)
    tokens = kv_cache // per_kv_token
    parts = [
        Part("weights", weights, f"{b}Ψ/tp (tp = {tp})"),
        Part("activations", activations,
             f"max_num_batched_tokens·a·(2h + max(2h + (2q + 2kv)/tp, 2h + g·f/tp)), g = 3 gated or 2; "
             f"{job.max_num_batched_tokens:,} tokens"),
        Part("runtime", sampler + VLLM_RUNTIME_BYTES, "2·max_num_seqs·V·4 (sampler logits) + 1 GiB (CUDA graphs, NCCL)"),
        Part("kv_cache", kv_cache, f"u·M − the rest; {per_kv_token:,} B per token (2·L·⌈kv/tp⌉·d·a)"),
    ]
    extra = {"kv_tokens": tokens, "kv_bytes_per_token": per_kv_token, "budget": budget,
             "sequences_at_max_len": tokens // max(1, job.max_model_len), "max_model_len": job.max_model_len,
             "needed": weights + overhead + job.max_model_len * per_kv_token}
    return Estimate("vllm", parts, tp, [], extra)


# --------------------------------------------------------------------------- transformers generation


@dataclass(frozen=True)
class GenerateJob:
    """``transformers`` generation: ``rows`` sequences at once, each up to ``context`` tokens."""

    shape: ModelShape
    weight_bytes: int
    rows: int
    context: int


def generate_memory(job: GenerateJob) -> Estimate:
    """Bytes on the one GPU of a transformers ``generate`` call: weights, the KV cache of
    every row at its full context, the prefill's activations and the last logits."""
    shape, b = job.shape, job.weight_bytes
    tokens = job.rows * job.context
    parts = [Part("weights", shape.num_params * b, f"{b}Ψ"),
             Part("kv_cache", tokens * kv_bytes_per_token(shape, b, 1), "rows·context·2·L·kv·d·a"),
             Part("transient", int(tokens * b * live_per_token(shape)) + 2 * job.rows * shape.vocab_size * 4,
                  "rows·context·a·(h + max(attention, MLP)) (prefill) + 2·rows·V·4 (last logits)", "backward")]
    return Estimate("generate", parts, 1, extra={"tokens": tokens})
