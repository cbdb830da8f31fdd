"""Every figure of align/plan/memory.py, pinned to numbers worked out by hand.

Each expected value below is written as the formula of memory.py's docstrings and of
docs/memory-plan.md, in the symbols of the small hand-made shapes here (h 48, L 3, 5 query
heads and 3 KV heads of d_head 13, f 80, V 101, Ψ 123,457): none is produced by calling
memory.py's own helpers. Numbers are chosen so that a swapped, dropped or changed term moves
the result (q ≠ kv ≠ h ≠ f, Ψ not divisible by N = 3, KV heads that do not divide tp). A
part is checked whole, as the plan's table shows it: name, bytes, formula and phase.

Symbols (docs/memory-plan.md): Ψ parameters, Ψt trainable, N ranks, b bytes per weight, a bytes
per activation (= b), T tokens per micro-batch, s saved elements per token per layer, g = 2f + 2h.
"""

from __future__ import annotations

import math

import pytest

from align.plan.memory import (
    ACTIVATION_EXTRA,
    GIB,
    HEAD_TILE_BYTES,
    PHASES,
    STEP_TEMPORARIES,
    TILE_FORWARD_PEAK,
    TILE_TRAINING_PEAK,
    TRL_TOKEN_CHUNK,
    TRL_VOCAB_CHUNK,
    VLLM_MAX_NUM_BATCHED_TOKENS,
    VLLM_MAX_NUM_SEQS,
    VLLM_RUNTIME_BYTES,
    ZERO3_SUB_GROUP,
    Estimate,
    ForwardJob,
    GenerateJob,
    Launch,
    Part,
    TrainingJob,
    VllmJob,
    forward_memory,
    generate_memory,
    head_peak,
    head_tile_bytes,
    kv_bytes_per_token,
    layer_backward,
    live_per_token,
    model_states,
    saved_per_token,
    stored_activations,
    training_memory,
    transient_part,
    vllm_memory,
)
from align.plan.optimizer_states import OptimizerLayout
from align.plan.report import JobPlan, Verdict, render
from align.plan.shapes import ModelShape

# --------------------------------------------------------------------------- the shapes

H, L, HEADS, KV_HEADS, D, F, V = 48, 3, 5, 3, 13, 80, 101
Q, KV = 65, 39  # q = 5 heads · 13, kv = 3 KV heads · 13
PSI, TENSORS, LARGEST = 123_457, 29, 5_003  # Ψ (odd, not a multiple of 3), parameter tensors, P_largest

ADAMW = OptimizerLayout(name="adamw", per_element=2, scalar_bytes=4)  # m, v; a float32 step per tensor
ADEMAMIX = OptimizerLayout(name="ademamix", per_element=3, scalar_bytes=0)  # m1, m2, ν; no scalar state


def make_shape(**changes) -> ModelShape:
    """A gated (SwiGLU), QK-norm decoder with SiLU: h 48, L 3, 5/3 heads of 13, f 80, V 101."""
    base = {"model_type": "test", "hidden_size": H, "num_layers": L, "num_heads": HEADS,
            "num_kv_heads": KV_HEADS, "head_dim": D, "intermediate_size": F, "vocab_size": V,
            "tie_word_embeddings": False, "gated_mlp": True, "qk_norm": True, "attention_bias": False,
            "hidden_act": "silu", "max_position_embeddings": 4096, "head": "lm", "num_labels": 0,
            "num_params": PSI, "num_tensors": TENSORS, "largest_layer_params": LARGEST, "counted_by": "formula"}
    return ModelShape(**{**base, **changes})


SHAPE = make_shape()
# s: 8h (norms) + 3q + 2kv (attention) + 3(q + kv) (QK-norm) + 4f (gated MLP) = 1,289
S = 8 * H + 3 * Q + 2 * KV + 3 * (Q + KV) + 4 * F
# live: h + max(attention h + q + 2kv + q + h = 304, MLP h + 4f + h = 416) = 464
LIVE = H + max(H + Q + 2 * KV + Q + H, H + 4 * F + H)
G = 2 * F + 2 * H  # gradients in flight in one layer's backward: 256

T = 2 * 7  # 2 sequences of 7 tokens per micro-batch
TILE = 14 * V * 4  # one float32 logits tile: min(T, 2^30/(4V)) = 14 rows · V · 4 bytes = 5,656

TILED_TRAINING = "4.3·tile, tile = min(K, 2^30/(4V))·V·4 (align.scoring's tiled head)"
TILED_FORWARD = "2.0·tile, tile = min(K, 2^30/(4V))·V·4 (align.scoring's tiled head)"
MODEL_TRAINING = "2·K·V·a + 4.3·tile (the model's head: logits and their gradient)"
MODEL_FORWARD = "1·K·V·a + 2.0·tile (the model's head: logits)"
FUSED_TRAINING = ("(4 + a)·V·h + 4·T·h + min(T,4096)·min(V,32768)·a (TRL's fused head: fp32 weight and hidden "
                  "gradients)")
FUSED_FORWARD = "min(T,4096)·min(V,32768)·a (TRL's fused head)"
SCORE = "T·labels·a (a classifier's scores)"
LAYER_G = "T·a·g, g = 2f + 2h = 256"
LAYER_SG = "T·a·(s + g), g = 2f + 2h = 256"
ZERO3_NOTE = ("under ZeRO-3 the head is sharded, so align.scoring uses the model's own head (the logits of the "
              "kept positions) instead of its tiles")
GATHERED = "2·2·P_largest (ZeRO-3: the largest layer gathered, and the next prefetched)"


def transient_text(head: str, layer: str, which: str, head_gib: str = "0.00", layer_gib: str = "0.00") -> str:
    return f"max(head {head_gib} GiB = {head}; layer {layer_gib} GiB = {layer}): {which}"


# the backward parts of a bf16 micro-batch of SHAPE without checkpointing, tiled head
ACTIVATIONS = Part("activations", T * 2 * (L * S + 4 * H),  # T·a·(L·s + 4h)
                   "T·a·(L·s + 4h), s = 1,289 elements per token per layer", "backward")
HEAD_TILED = int(4.3 * TILE)  # 4.3 tiles: ⌊24,320.8⌋
HEAD_MODEL = 2 * T * V * 2 + int(4.3 * TILE)  # logits and their gradient 2·K·V·a + 4.3 tiles
TRANSIENT_TILED = Part("transient", HEAD_TILED, transient_text(TILED_TRAINING, LAYER_G, "LM head"), "backward")
TRANSIENT_MODEL = Part("transient", HEAD_MODEL, transient_text(MODEL_TRAINING, LAYER_G, "LM head"), "backward")


def job(**changes) -> TrainingJob:
    base = {"shape": SHAPE, "sequences": 2, "max_length": 7, "checkpointing": False, "weight_bytes": 2,
            "optimizer": ADAMW, "head": "tiled"}
    return TrainingJob(**{**base, **changes})


def test_the_constants_the_formulas_use():
    assert GIB == 1_073_741_824 and HEAD_TILE_BYTES == 2**30
    assert (TILE_FORWARD_PEAK, TILE_TRAINING_PEAK) == (2.0, 4.3)
    assert (TRL_TOKEN_CHUNK, TRL_VOCAB_CHUNK) == (4096, 32768)
    assert ACTIVATION_EXTRA == {"xielu": 3.5}
    assert ZERO3_SUB_GROUP == 1_000_000_000 and STEP_TEMPORARIES == 2
    assert (VLLM_RUNTIME_BYTES, VLLM_MAX_NUM_BATCHED_TOKENS, VLLM_MAX_NUM_SEQS) == (GIB, 8192, 256)
    assert PHASES == ("always", "backward", "step")
    assert (SHAPE.q_dim, SHAPE.kv_dim) == (Q, KV) == (65, 39)
    assert (S, LIVE, G, TILE) == (1289, 464, 256, 5656)


# --------------------------------------------------------------------------- per-token counts


@pytest.mark.parametrize(("changes", "expected"), [
    # 8h + 3q + 2kv + 3(q + kv) + 4f
    ({}, 8 * 48 + 3 * 65 + 2 * 39 + 3 * (65 + 39) + 4 * 80),
    # no QK-norm: 8h + 3q + 2kv + 4f
    ({"qk_norm": False}, 8 * 48 + 3 * 65 + 2 * 39 + 4 * 80),
    # plain MLP, GELU (no extra): 8h + 3q + 2kv + 2f
    ({"qk_norm": False, "gated_mlp": False, "hidden_act": "gelu"}, 8 * 48 + 3 * 65 + 2 * 39 + 2 * 80),
    # plain MLP with xIELU: + 3.5f more (f 81: a half element)
    ({"qk_norm": False, "gated_mlp": False, "hidden_act": "xielu", "intermediate_size": 81},
     8 * 48 + 3 * 65 + 2 * 39 + 2 * 81 + 3.5 * 81),
    # gated MLP with xIELU keeps the extra too: 4f + 3.5f
    ({"hidden_act": "xielu"}, 8 * 48 + 3 * 65 + 2 * 39 + 3 * (65 + 39) + 4 * 80 + 3.5 * 80),
], ids=["gated-qknorm", "gated", "plain-gelu", "plain-xielu", "gated-qknorm-xielu"])
def test_saved_per_token(changes, expected):
    assert saved_per_token(make_shape(**changes)) == expected


@pytest.mark.parametrize(("changes", "expected"), [
    # h + max(attention 2h + 2q + 2kv = 304, MLP 2h + 4f = 416): the MLP
    ({}, 48 + max(48 + 65 + 2 * 39 + 65 + 48, 48 + 4 * 80 + 48)),
    # f 20: h + max(304, 2h + 4f = 176): attention
    ({"intermediate_size": 20}, 48 + (48 + 65 + 2 * 39 + 65 + 48)),
    # plain GELU, f 80: h + max(304, 2h + 2f = 256): attention
    ({"gated_mlp": False}, 48 + (48 + 65 + 2 * 39 + 65 + 48)),
    # plain GELU, f 200: h + 2h + 2f
    ({"gated_mlp": False, "intermediate_size": 200}, 48 + (48 + 2 * 200 + 48)),
    # plain xIELU, f 81: h + 2h + (2 + 3.5)f = 589.5
    ({"gated_mlp": False, "hidden_act": "xielu", "intermediate_size": 81}, 48 + (48 + 5.5 * 81 + 48)),
    # gated xIELU: the extra counts only with a plain MLP (docstring: "4f gated, 2f plain plus ...")
    ({"hidden_act": "xielu"}, 48 + (48 + 4 * 80 + 48)),
    # QK-norm does not change the forward count
    ({"qk_norm": False}, 48 + (48 + 4 * 80 + 48)),
], ids=["gated", "gated-small-f", "plain", "plain-wide", "plain-xielu", "gated-xielu", "no-qknorm"])
def test_live_per_token(changes, expected):
    assert live_per_token(make_shape(**changes)) == expected


# --------------------------------------------------------------------------- activations, layer, head


def test_stored_activations_with_and_without_checkpointing():
    assert stored_activations(SHAPE, 14, 2, False) == Part(
        "activations", 14 * 2 * (3 * 1289 + 4 * 48),  # T·a·(L·s + 4h)
        "T·a·(L·s + 4h), s = 1,289 elements per token per layer", "backward")
    assert stored_activations(SHAPE, 14, 2, True) == Part(
        "activations", 14 * 2 * (3 * 48 + 4 * 48),  # T·a·(L·h + 4h)
        "T·a·(L·h + 4h) (checkpointing: each layer's input)", "backward")
    # a·bytes 1, 3 tokens, s = 1,102.5 (plain xIELU, f 81): ⌊3·(3·1,102.5 + 192)⌋ = ⌊10,498.5⌋; s shown rounded
    xielu = make_shape(qk_norm=False, gated_mlp=False, hidden_act="xielu", intermediate_size=81)
    assert stored_activations(xielu, 3, 1, False) == Part(
        "activations", 10_498, "T·a·(L·s + 4h), s = 1,102 elements per token per layer", "backward")
    assert 3 * 1 * (3 * (8 * 48 + 3 * 65 + 2 * 39 + 2 * 81 + 3.5 * 81) + 4 * 48) == 10_498.5


def test_layer_backward_with_and_without_checkpointing():
    assert layer_backward(SHAPE, 14, 2, False) == (14 * 2 * (2 * 80 + 2 * 48), LAYER_G)  # T·a·g
    assert layer_backward(SHAPE, 14, 2, True) == (14 * 2 * (1289 + 256), LAYER_SG)  # T·a·(s + g)
    wide = make_shape(intermediate_size=800)  # g = 1,696 is shown with its thousands separator
    assert layer_backward(wide, 1, 1, False) == (2 * 800 + 2 * 48, "T·a·g, g = 2f + 2h = 1,696")


@pytest.mark.parametrize(("vocab", "positions", "expected"), [
    (101, 14, 14 * 101 * 4),  # fewer positions than a tile's rows: 14 rows
    (101, 0, 1 * 101 * 4),  # no position: still one row
    # V 1,000,001: a tile has ⌊2^30 / (4·1,000,001)⌋ = 268 rows
    (1_000_001, 1000, (2**30 // (4 * 1_000_001)) * 1_000_001 * 4),
    (2**28 + 3, 5, 1 * (2**28 + 3) * 4),  # a row is more than 2^30 bytes: one row, not zero
    (1, 2**28 + 5, (2**30 // 4) * 1 * 4),  # V 1: 2^28 rows of one logit
    (0, 7, 0),  # no vocabulary: no bytes (and no division by zero)
])
def test_head_tile_bytes(vocab, positions, expected):
    assert head_tile_bytes(vocab, positions) == expected


def test_head_tile_rows_are_rounded_down():
    assert 2**30 // (4 * 1_000_001) == 268 < 2**30 / (4 * 1_000_001)
    assert head_tile_bytes(1_000_001, 1000) == 268 * 1_000_001 * 4


def test_head_peak_of_every_head():
    assert head_peak(SHAPE, "tiled", 14, 2, training=True) == (int(4.3 * 5656), TILED_TRAINING)
    assert head_peak(SHAPE, "tiled", 14, 2, training=False) == (int(2.0 * 5656), TILED_FORWARD)
    # model: K·V·a logits (and their gradient in training) + the tiles
    assert head_peak(SHAPE, "model", 14, 2, training=True) == (2 * 14 * 101 * 2 + int(4.3 * 5656), MODEL_TRAINING)
    assert head_peak(SHAPE, "model", 14, 2, training=False) == (1 * 14 * 101 * 2 + int(2.0 * 5656), MODEL_FORWARD)
    # fused (TRL): (4 + a)·V·h + 4·T·h + min(T,4096)·min(V,32768)·a; forward: the buffer alone
    assert head_peak(SHAPE, "fused", 14, 2, training=True) == (
        (4 + 2) * 101 * 48 + 4 * 14 * 48 + 14 * 101 * 2, FUSED_TRAINING)
    assert head_peak(SHAPE, "fused", 14, 2, training=False) == (14 * 101 * 2, FUSED_FORWARD)
    # score: T·labels·a, at least one label
    seven = make_shape(head="score", num_labels=7)
    assert head_peak(seven, "score", 14, 2, training=True) == (14 * 7 * 2, SCORE)
    assert head_peak(seven, "score", 14, 2, training=False) == (14 * 7 * 2, SCORE)
    assert head_peak(make_shape(head="score", num_labels=0), "score", 14, 2, training=True) == (14 * 1 * 2, SCORE)


def test_fused_head_chunks_cap_tokens_and_vocabulary():
    big = make_shape(vocab_size=40_000)
    # min(5,000, 4,096) tokens × min(40,000, 32,768) vocabulary entries × a
    assert head_peak(big, "fused", 5000, 2, training=False) == (4096 * 32768 * 2, FUSED_FORWARD)
    assert head_peak(big, "fused", 5000, 2, training=True) == (
        (4 + 2) * 40_000 * 48 + 4 * 5000 * 48 + 4096 * 32768 * 2, FUSED_TRAINING)
    # exactly at the chunks: nothing capped
    at = make_shape(vocab_size=32768)
    assert head_peak(at, "fused", 4096, 1, training=False)[0] == 4096 * 32768 * 1


def test_head_peak_of_an_unknown_head_is_an_error():
    with pytest.raises(ValueError, match="unknown head 'bogus'"):
        head_peak(SHAPE, "bogus", 14, 2, training=True)


def test_transient_part_is_the_larger_of_head_and_layer():
    # tiled head 24,320 > one layer's backward T·a·g = 7,168
    assert 14 * 2 * 256 == 7168 < int(4.3 * 5656) == 24_320
    assert transient_part(SHAPE, "tiled", 14, 2, False) == Part(
        "transient", 24_320, transient_text(TILED_TRAINING, LAYER_G, "LM head"), "backward")
    # checkpointing: the recomputed layer T·a·(s + g) = 43,260 > 24,320
    assert 14 * 2 * (1289 + 256) == 43_260
    assert transient_part(SHAPE, "tiled", 14, 2, True) == Part(
        "transient", 43_260, transient_text(TILED_TRAINING, LAYER_SG, "one layer's backward"), "backward")


def test_transient_part_tie_goes_to_the_head():
    # a classifier with g = 256 labels: T·labels·a = T·a·g, and the head is named
    tie = make_shape(head="score", num_labels=256)
    assert transient_part(tie, "score", 14, 2, False) == Part(
        "transient", 14 * 256 * 2, transient_text(SCORE, LAYER_G, "LM head"), "backward")
    # one label fewer: the layer's backward is the larger
    below = make_shape(head="score", num_labels=255)
    assert transient_part(below, "score", 14, 2, False) == Part(
        "transient", 14 * 2 * 256, transient_text(SCORE, LAYER_G, "one layer's backward"), "backward")


def test_transient_part_shows_gib_with_two_decimals():
    tokens = 2**20  # 64 sequences of 16,384 tokens
    tile = tokens * 101 * 4  # 2^20 rows < 2^30/(4·101) = 2,657,742
    head = int(4.3 * tile)  # 1,821,586,227 B = 1.70 GiB
    layer = tokens * 2 * 256  # T·a·g = 2^29 = 0.50 GiB
    assert (head, layer) == (1_821_586_227, 2**29)
    assert transient_part(SHAPE, "tiled", tokens, 2, False) == Part(
        "transient", head, transient_text(TILED_TRAINING, LAYER_G, "LM head", "1.70", "0.50"), "backward")
    recomputed = tokens * 2 * (1289 + 256)  # 3,240,099,840 B = 3.02 GiB
    assert transient_part(SHAPE, "tiled", tokens, 2, True) == Part(
        "transient", recomputed,
        transient_text(TILED_TRAINING, LAYER_SG, "one layer's backward", "1.70", "3.02"), "backward")


# --------------------------------------------------------------------------- training: DDP


def test_tokens_of_a_training_job():
    assert job().tokens == 2 * 7
    assert job(sequences=3, max_length=11).tokens == 33


def test_one_process_no_deepspeed():
    est = training_memory(job(), Launch(world_size=1))
    states = 2 * 2 * 123_457 + 4 * 29  # k·b·Ψt + s·tensors (torch keeps the param's dtype, one step per tensor)
    assert est.parts == [
        Part("weights", 2 * 123_457, "2Ψ"),
        Part("gradients", 2 * 123_457, "2Ψt"),
        Part("optimizer_states", states, "2·2Ψt + 4 B × 29 tensors (adamw: 2 state tensors per parameter)"),
        Part("step_temporaries", 2 * 2 * 5003, "2·2·P_largest (the update's temporaries)", "step"),
        ACTIVATIONS,
        TRANSIENT_TILED,
    ]
    assert (est.kind, est.gpus, est.notes, est.extra) == ("training", 1, [], {"tokens": 14, "head": "tiled"})
    always = 2 * 123_457 + 2 * 123_457 + states
    backward = 14 * 2 * (3 * 1289 + 4 * 48) + int(4.3 * 5656)
    step = 2 * 2 * 5003
    assert backward > step
    assert (est.phase_bytes("always"), est.phase_bytes("backward"), est.phase_bytes("step")) == (always, backward, step)
    assert est.total == always + backward and est.peak_phase == "backward"


def test_ddp_replicates_everything_and_ignores_offload():
    """Without DeepSpeed nothing is sharded, whatever the world size, and CPU offload is DeepSpeed's."""
    one = training_memory(job(), Launch(world_size=1))
    for launch in (Launch(world_size=3), Launch(world_size=3, offload_optimizer=True, offload_params=True)):
        est = training_memory(job(), launch)
        assert est.parts == one.parts
        assert est.gpus == 3 and est.notes == [] and est.extra == {"tokens": 14, "head": "tiled"}


def test_ademamix_without_deepspeed_has_no_scalar_state():
    est = training_memory(job(optimizer=ADEMAMIX), Launch(world_size=1))
    assert est.parts[2] == Part("optimizer_states", 3 * 2 * 123_457 + 0 * 29,  # k·b·Ψt + s·tensors
                                "3·2Ψt + 0 B × 29 tensors (ademamix: 3 state tensors per parameter)")


def test_lora_without_deepspeed():
    """A LoRA adapter: gradients and states of Ψt = 1,001 parameters in 6 tensors; weights stay Ψ."""
    est = training_memory(job(trainable_params=1001, trainable_tensors=6), Launch(world_size=1))
    assert est.parts[:4] == [
        Part("weights", 2 * 123_457, "2Ψ"),
        Part("gradients", 2 * 1001, "2Ψt"),
        Part("optimizer_states", 2 * 2 * 1001 + 4 * 6, "2·2Ψt + 4 B × 6 tensors (adamw: 2 state tensors per parameter)"),
        Part("step_temporaries", 2 * 2 * 5003, "2·2·P_largest (the update's temporaries)", "step"),
    ]


def test_world_size_zero_counts_as_one():
    for stage in (0, 2, 3):
        zero = training_memory(job(), Launch(world_size=0, zero_stage=stage))
        one = training_memory(job(), Launch(world_size=1, zero_stage=stage))
        assert zero.parts == one.parts and zero.gpus == one.gpus == 1
    est = training_memory(job(), Launch(world_size=0, zero_stage=2))
    assert est.parts[1] == Part("gradients", 2 * 123_457, "2Ψt")  # bΨt/N with N = 1: no "/N"


# --------------------------------------------------------------------------- training: ZeRO-1, 2, 3

MASTER_3 = Part("master_weights", math.ceil(4 * 123_457 / 3), "4Ψt/N (fp32)")  # 164,610
STATES_3 = Part("optimizer_states", math.ceil(2 * 4 * 123_457 / 3) + 4 * 2,  # k·4Ψt/N + s·2 groups = 329,227
                "2·4Ψt/N + 4 B × 2 tensors (adamw: 2 state tensors per parameter)")
STEPPED_3 = math.ceil(123_457 / 3)  # Ψt/N = 41,153


def test_zero1_shards_only_optimizer_states():
    est = training_memory(job(), Launch(world_size=3, zero_stage=1))
    assert est.parts == [
        Part("weights", 2 * 123_457, "2Ψ"),  # replicated
        Part("gradients", 2 * 123_457, "2Ψt"),  # replicated: ZeRO-1 keeps full gradients
        MASTER_3,
        STATES_3,
        Part("fp32_gradients", 4 * STEPPED_3, "4·Ψt/N (fp32 gradients being stepped)", "step"),
        Part("step_temporaries", 2 * 4 * STEPPED_3, "2·4·Ψt/N (the update's temporaries)", "step"),
        ACTIVATIONS,
        TRANSIENT_TILED,
    ]
    assert (MASTER_3.bytes, STATES_3.bytes, STEPPED_3) == (164_610, 329_227, 41_153)
    assert (est.kind, est.gpus, est.notes, est.extra) == ("training", 3, [], {"tokens": 14, "head": "tiled"})
    always = 2 * 123_457 + 2 * 123_457 + 164_610 + 329_227
    step = 4 * 41_153 + 2 * 4 * 41_153
    assert step > est.phase_bytes("backward")
    assert est.total == always + step and est.peak_phase == "step"


def test_zero2_also_shards_gradients():
    est = training_memory(job(), Launch(world_size=3, zero_stage=2))
    assert est.parts == [
        Part("weights", 2 * 123_457, "2Ψ"),  # replicated
        Part("gradients", math.ceil(2 * 123_457 / 3), "2Ψt/N"),  # 82,305
        MASTER_3,
        STATES_3,
        Part("fp32_gradients", 4 * STEPPED_3, "4·Ψt/N (fp32 gradients being stepped)", "step"),
        Part("step_temporaries", 2 * 4 * STEPPED_3, "2·4·Ψt/N (the update's temporaries)", "step"),
        ACTIVATIONS,
        TRANSIENT_TILED,  # the tiled head stays tiled below ZeRO-3
    ]
    assert est.part("gradients") == 82_305
    assert (est.gpus, est.notes, est.extra) == (3, [], {"tokens": 14, "head": "tiled"})


def test_zero3_also_shards_weights_gathers_a_layer_and_uses_the_models_head():
    est = training_memory(job(), Launch(world_size=3, zero_stage=3))
    assert est.parts == [
        Part("weights", math.ceil(2 * 123_457 / 3), "2Ψ/N"),
        Part("gradients", math.ceil(2 * 123_457 / 3), "2Ψt/N"),
        MASTER_3,
        STATES_3,
        Part("fp32_gradients", 4 * min(STEPPED_3, 10**9), "4·min(Ψt/N, 1e9) (fp32 gradients being stepped)", "step"),
        Part("step_temporaries", 2 * 4 * min(STEPPED_3, 10**9),
             "2·4·min(Ψt/N, 1e9) (the update's temporaries)", "step"),
        Part("gathered_layer", 2 * 2 * 5003, GATHERED, "backward"),  # 2·b·P_largest
        ACTIVATIONS,
        TRANSIENT_MODEL,  # the model's head: 2·K·V·a + 4.3 tiles
    ]
    assert (est.gpus, est.notes, est.extra) == (3, [ZERO3_NOTE], {"tokens": 14, "head": "model"})
    always = 82_305 + 82_305 + 164_610 + 329_227
    backward = 2 * 2 * 5003 + 14 * 2 * (3 * 1289 + 4 * 48) + (2 * 14 * 101 * 2 + int(4.3 * 5656))
    step = 4 * 41_153 + 8 * 41_153
    assert step > backward
    assert est.total == always + step and est.peak_phase == "step"


def test_zero3_on_one_rank_writes_no_over_n():
    est = training_memory(job(), Launch(world_size=1, zero_stage=3))
    assert est.parts[:6] == [
        Part("weights", 2 * 123_457, "2Ψ"),
        Part("gradients", 2 * 123_457, "2Ψt"),
        Part("master_weights", 4 * 123_457, "4Ψt/N (fp32)"),
        Part("optimizer_states", 2 * 4 * 123_457 + 4 * 2, "2·4Ψt + 4 B × 2 tensors (adamw: 2 state tensors per parameter)"),
        Part("fp32_gradients", 4 * 123_457, "4·min(Ψt/N, 1e9) (fp32 gradients being stepped)", "step"),
        Part("step_temporaries", 2 * 4 * 123_457, "2·4·min(Ψt/N, 1e9) (the update's temporaries)", "step"),
    ]
    assert est.gpus == 1 and est.notes == [ZERO3_NOTE]


def test_zero1_and_zero2_on_one_rank_shard_nothing():
    for stage in (1, 2):
        est = training_memory(job(), Launch(world_size=1, zero_stage=stage))
        assert [(p.name, p.bytes, p.formula) for p in est.parts[:6]] == [
            ("weights", 2 * 123_457, "2Ψ"),
            ("gradients", 2 * 123_457, "2Ψt"),
            ("master_weights", 4 * 123_457, "4Ψt/N (fp32)"),
            ("optimizer_states", 2 * 4 * 123_457 + 4 * 2,
             "2·4Ψt + 4 B × 2 tensors (adamw: 2 state tensors per parameter)"),
            ("fp32_gradients", 4 * 123_457, "4·Ψt/N (fp32 gradients being stepped)"),
            ("step_temporaries", 2 * 4 * 123_457, "2·4·Ψt/N (the update's temporaries)"),
        ]


def test_deepspeed_with_ademamix_steps_fp32_partitions():
    est = training_memory(job(optimizer=ADEMAMIX), Launch(world_size=3, zero_stage=2))
    assert est.parts[3] == Part("optimizer_states", math.ceil(3 * 4 * 123_457 / 3) + 0 * 2,  # k·4Ψt/N
                                "3·4Ψt/N + 0 B × 2 tensors (ademamix: 3 state tensors per parameter)")


def test_fp32_weights_under_deepspeed_have_no_master_copy_nor_fp32_gradients():
    est = training_memory(job(weight_bytes=4), Launch(world_size=3, zero_stage=2))
    assert est.parts == [
        Part("weights", 4 * 123_457, "4Ψ"),
        Part("gradients", math.ceil(4 * 123_457 / 3), "4Ψt/N"),
        Part("optimizer_states", math.ceil(2 * 4 * 123_457 / 3) + 4 * 2,
             "2·4Ψt/N + 4 B × 2 tensors (adamw: 2 state tensors per parameter)"),
        Part("step_temporaries", 2 * 4 * math.ceil(123_457 / 3), "2·4·Ψt/N (the update's temporaries)", "step"),
        Part("activations", 14 * 4 * (3 * 1289 + 4 * 48), "T·a·(L·s + 4h), s = 1,289 elements per token per layer",
             "backward"),
        # the logits tile is float32 whatever a: 4.3 tiles = 24,320 > T·a·g = 14·4·256 = 14,336
        Part("transient", int(4.3 * 5656), transient_text(TILED_TRAINING, LAYER_G, "LM head"), "backward"),
    ]


def test_fp32_weights_without_deepspeed_keep_fp32_states():
    est = training_memory(job(weight_bytes=4), Launch(world_size=1))
    assert est.parts[2:4] == [
        Part("optimizer_states", 2 * 4 * 123_457 + 4 * 29,
             "2·4Ψt + 4 B × 29 tensors (adamw: 2 state tensors per parameter)"),
        Part("step_temporaries", 2 * 4 * 5003, "2·4·P_largest (the update's temporaries)", "step"),
    ]


def test_lora_under_zero2_shards_the_adapter_states_in_two_groups():
    est = training_memory(job(trainable_params=1001, trainable_tensors=6), Launch(world_size=3, zero_stage=2))
    assert est.parts[:6] == [
        Part("weights", 2 * 123_457, "2Ψ"),
        Part("gradients", math.ceil(2 * 1001 / 3), "2Ψt/N"),  # 668
        Part("master_weights", math.ceil(4 * 1001 / 3), "4Ψt/N (fp32)"),  # 1,335
        Part("optimizer_states", math.ceil(2 * 4 * 1001 / 3) + 4 * 2,  # 2,670 + 8: DeepSpeed's 2 groups, not 6
             "2·4Ψt/N + 4 B × 2 tensors (adamw: 2 state tensors per parameter)"),
        Part("fp32_gradients", 4 * math.ceil(1001 / 3), "4·Ψt/N (fp32 gradients being stepped)", "step"),
        Part("step_temporaries", 2 * 4 * math.ceil(1001 / 3), "2·4·Ψt/N (the update's temporaries)", "step"),
    ]
    assert (est.part("gradients"), est.part("master_weights"), est.part("optimizer_states")) == (668, 1335, 2678)


def test_zero3_steps_one_sub_group_of_1e9_at_a_time():
    # one rank: Ψt = 1e9 + 12,345 is capped at the sub-group
    one = training_memory(job(trainable_params=10**9 + 12_345), Launch(world_size=1, zero_stage=3))
    assert one.part("fp32_gradients") == 4 * 10**9 and one.part("step_temporaries") == 2 * 4 * 10**9
    # three ranks: ⌈(3e9 + 5)/3⌉ = 1e9 + 2, capped
    three = training_memory(job(trainable_params=3 * 10**9 + 5), Launch(world_size=3, zero_stage=3))
    assert three.part("fp32_gradients") == 4 * 10**9 and three.part("step_temporaries") == 8 * 10**9
    assert three.part("master_weights") == math.ceil(4 * (3 * 10**9 + 5) / 3)  # not capped: 4Ψt/N
    # just under the sub-group: not capped
    under = training_memory(job(trainable_params=10**9 - 7), Launch(world_size=1, zero_stage=3))
    assert under.part("fp32_gradients") == 4 * (10**9 - 7)
    # ZeRO-2 steps the whole partition: no cap
    zero2 = training_memory(job(trainable_params=10**9 + 12_345), Launch(world_size=1, zero_stage=2))
    assert zero2.part("fp32_gradients") == 4 * (10**9 + 12_345)
    assert zero2.part("step_temporaries") == 2 * 4 * (10**9 + 12_345)


def test_reference_model_weights_are_sharded_only_under_zero3():
    for stage, size, formula in ((0, 2 * 123_457, "2Ψ (frozen reference model)"),
                                 (1, 2 * 123_457, "2Ψ (frozen reference model)"),
                                 (2, 2 * 123_457, "2Ψ (frozen reference model)"),
                                 (3, math.ceil(2 * 123_457 / 3), "2Ψ/N (frozen reference model)")):
        est = training_memory(job(reference_model=True), Launch(world_size=3, zero_stage=stage))
        without = training_memory(job(), Launch(world_size=3, zero_stage=stage))
        names = [p.name for p in est.parts]
        at = names.index("optimizer_states") + 1  # right after the optimizer states
        assert est.parts[at] == Part("reference_weights", size, formula)
        assert est.parts[:at] + est.parts[at + 1:] == without.parts
        assert est.total == without.total + size


def test_offloading_the_optimizer_removes_master_weights_states_and_the_step():
    est = training_memory(job(), Launch(world_size=3, zero_stage=2, offload_optimizer=True))
    assert est.parts == [
        Part("weights", 2 * 123_457, "2Ψ"),
        Part("gradients", math.ceil(2 * 123_457 / 3), "2Ψt/N"),
        Part("master_weights", 0, "0 (offloaded)"),
        Part("optimizer_states", 0, "0 (offloaded)"),
        ACTIVATIONS,
        TRANSIENT_TILED,
    ]
    assert est.phase_bytes("step") == 0 and est.peak_phase == "backward"
    assert est.total == 2 * 123_457 + 82_305 + ACTIVATIONS.bytes + TRANSIENT_TILED.bytes


def test_offloading_the_optimizer_of_fp32_weights():
    est = training_memory(job(weight_bytes=4), Launch(world_size=3, zero_stage=1, offload_optimizer=True))
    assert [p.name for p in est.parts] == ["weights", "gradients", "optimizer_states", "activations", "transient"]
    assert est.parts[2] == Part("optimizer_states", 0, "0 (offloaded)")


def test_offloading_parameters_counts_only_under_zero3():
    est = training_memory(job(), Launch(world_size=3, zero_stage=3, offload_params=True))
    zero3 = training_memory(job(), Launch(world_size=3, zero_stage=3))
    assert est.parts[0] == Part("weights", 0, "0 (parameters offloaded to CPU)")
    assert est.parts[1:] == zero3.parts[1:]
    for stage in (1, 2):  # DeepSpeed offloads parameters at ZeRO-3 only
        assert (training_memory(job(), Launch(world_size=3, zero_stage=stage, offload_params=True)).parts
                == training_memory(job(), Launch(world_size=3, zero_stage=stage)).parts)


def test_zero3_offloading_both():
    est = training_memory(job(reference_model=True), Launch(world_size=3, zero_stage=3, offload_optimizer=True,
                                                            offload_params=True))
    assert est.parts == [
        Part("weights", 0, "0 (parameters offloaded to CPU)"),
        Part("gradients", math.ceil(2 * 123_457 / 3), "2Ψt/N"),
        Part("master_weights", 0, "0 (offloaded)"),
        Part("optimizer_states", 0, "0 (offloaded)"),
        Part("reference_weights", math.ceil(2 * 123_457 / 3), "2Ψ/N (frozen reference model)"),
        Part("gathered_layer", 2 * 2 * 5003, GATHERED, "backward"),
        ACTIVATIONS,
        TRANSIENT_MODEL,
    ]
    assert est.total == 82_305 + 82_305 + 2 * 2 * 5003 + ACTIVATIONS.bytes + TRANSIENT_MODEL.bytes


def test_checkpointing_keeps_layer_inputs_and_recomputes_a_layer():
    est = training_memory(job(checkpointing=True), Launch(world_size=1))
    assert est.parts[-2:] == [
        Part("activations", 14 * 2 * (3 * 48 + 4 * 48), "T·a·(L·h + 4h) (checkpointing: each layer's input)",
             "backward"),
        Part("transient", 14 * 2 * (1289 + 256), transient_text(TILED_TRAINING, LAYER_SG, "one layer's backward"),
             "backward"),
    ]


def test_fused_head_stays_fused_under_zero3():
    for stage in (0, 3):
        est = training_memory(job(head="fused"), Launch(world_size=3, zero_stage=stage))
        fused = (4 + 2) * 101 * 48 + 4 * 14 * 48 + 14 * 101 * 2  # (4 + a)·V·h + 4·T·h + buffer = 34,604
        assert est.parts[-1] == Part("transient", fused, transient_text(FUSED_TRAINING, LAYER_G, "LM head"),
                                     "backward")
        assert est.notes == [] and est.extra == {"tokens": 14, "head": "fused"}


def test_score_head_training():
    reward = make_shape(head="score", num_labels=1)
    est = training_memory(job(shape=reward, head="score"), Launch(world_size=3, zero_stage=3))
    # T·labels·a = 28 < T·a·g = 7,168: the layer
    assert est.parts[-1] == Part("transient", 14 * 2 * 256, transient_text(SCORE, LAYER_G, "one layer's backward"),
                                 "backward")
    assert est.notes == [] and est.extra == {"tokens": 14, "head": "score"}


# --------------------------------------------------------------------------- model states, Estimate, Launch


def test_model_states_are_what_deepspeed_counts():
    est = training_memory(job(reference_model=True), Launch(world_size=3, zero_stage=3))
    # weights + gradients + master weights + optimizer states + fp32 gradients + gathered layer;
    # not the reference model, the update's temporaries, activations or the transient
    expected = 82_305 + 82_305 + 164_610 + 329_227 + 4 * 41_153 + 2 * 2 * 5003
    assert model_states(est) == expected == 843_071
    ddp = training_memory(job(), Launch(world_size=1))
    assert model_states(ddp) == 2 * 123_457 + 2 * 123_457 + (2 * 2 * 123_457 + 4 * 29)


def test_estimate_sums_by_phase_and_by_name():
    parts = [Part("a", 5, "x"), Part("a", 7, "y", "step"), Part("b", 11, "z", "backward"),
             Part("c", 13, "w", "step")]
    est = Estimate("k", parts, 2)
    assert (est.notes, est.extra) == ([], {})
    assert (est.phase_bytes("always"), est.phase_bytes("backward"), est.phase_bytes("step")) == (5, 11, 20)
    assert est.part("a") == 12 and est.part("b") == 11 and est.part("none") == 0
    assert est.total == 5 + max(11, 20) and est.peak_phase == "step"
    # a tie is the backward's; an empty step phase too
    tie = Estimate("k", [Part("a", 5, "x"), Part("b", 9, "y", "backward"), Part("c", 9, "z", "step")], 1)
    assert tie.total == 14 and tie.peak_phase == "backward"
    one_more = Estimate("k", [Part("b", 9, "y", "backward"), Part("c", 10, "z", "step")], 1)
    assert one_more.total == 10 and one_more.peak_phase == "step"
    only = Estimate("k", [Part("a", 3, "x"), Part("b", 4, "y", "backward")], 1)
    assert only.total == 7 and only.peak_phase == "backward"
    assert Part("n", 1, "f").phase == "always"


@pytest.mark.parametrize(("launch", "text"), [
    (Launch(world_size=1), "one process over 1 rank"),
    (Launch(world_size=2), "DDP over 2 ranks"),
    # an offload DeepSpeed does not do at that stage is not named (the figures do not count it)
    (Launch(world_size=3, zero_stage=0, offload_optimizer=True), "DDP over 3 ranks"),
    (Launch(world_size=8, zero_stage=2, offload_params=True), "DeepSpeed ZeRO-2 over 8 ranks"),
    (Launch(world_size=4, zero_stage=1, offload_optimizer=True), "DeepSpeed ZeRO-1 over 4 ranks, optimizer offloaded to CPU"),
    (Launch(world_size=0), "one process over 1 rank"),
    (Launch(world_size=1, zero_stage=3), "DeepSpeed ZeRO-3 over 1 rank"),
    (Launch(world_size=2, zero_stage=1), "DeepSpeed ZeRO-1 over 2 ranks"),
    (Launch(world_size=8, zero_stage=2, offload_optimizer=True), "DeepSpeed ZeRO-2 over 8 ranks, optimizer offloaded to CPU"),
    (Launch(world_size=8, zero_stage=3, offload_params=True), "DeepSpeed ZeRO-3 over 8 ranks, parameters offloaded to CPU"),
    (Launch(world_size=16, zero_stage=3, offload_optimizer=True, offload_params=True),
     "DeepSpeed ZeRO-3 over 16 ranks, optimizer and parameters offloaded to CPU"),
])
def test_launch_describe(launch, text):
    assert launch.describe() == text


def test_launch_defaults():
    launch = Launch(4)
    assert (launch.zero_stage, launch.offload_optimizer, launch.offload_params) == (0, False, False)


# --------------------------------------------------------------------------- forward only


def forward(**changes) -> ForwardJob:
    base = {"shape": SHAPE, "tokens": 14, "weight_bytes": 2, "head": "tiled"}
    return ForwardJob(**{**base, **changes})


FORWARD_ACTIVATIONS = Part("activations", 14 * 48 * 2, "T·h·a (the last hidden states the head reads)", "backward")


def test_forward_replicated():
    # one layer T·a·live = 12,992 > the head's 2.0 tiles = 11,312
    assert 14 * 2 * 464 == 12_992 > int(2.0 * 5656) == 11_312
    for launch in (Launch(world_size=3), Launch(world_size=3, zero_stage=2), Launch(world_size=1, zero_stage=1)):
        est = forward_memory(forward(), launch)
        assert est.parts == [
            Part("weights", 2 * 123_457, "2Ψ"),
            FORWARD_ACTIVATIONS,
            Part("transient", 14 * 2 * 464, transient_text(TILED_FORWARD, "T·a·464", "one layer"), "backward"),
        ]
        assert (est.kind, est.gpus, est.notes, est.extra) == ("forward", 1, [], {"tokens": 14, "head": "tiled"})
        assert est.total == 2 * 123_457 + 14 * 48 * 2 + 14 * 2 * 464


def test_forward_zero3_sharded():
    est = forward_memory(forward(), Launch(world_size=3, zero_stage=3))
    head = 1 * 14 * 101 * 2 + int(2.0 * 5656)  # the model's head: K·V·a + 2.0 tiles = 14,140 ≥ 12,992
    assert est.parts == [
        Part("weights", math.ceil(2 * 123_457 / 3), "2Ψ/N"),
        Part("gathered_layer", 2 * 2 * 5003, GATHERED, "backward"),
        FORWARD_ACTIVATIONS,
        Part("transient", head, transient_text(MODEL_FORWARD, "T·a·464", "LM head"), "backward"),
    ]
    assert (est.kind, est.gpus, est.notes, est.extra) == ("forward", 3, [], {"tokens": 14, "head": "model"})
    assert est.total == 82_305 + 2 * 2 * 5003 + 14 * 48 * 2 + 14_140


def test_forward_zero3_on_world_size_zero_is_one_gpu():
    est = forward_memory(forward(), Launch(world_size=0, zero_stage=3))
    assert est.parts[0] == Part("weights", 2 * 123_457, "2Ψ/N") and est.gpus == 1


def test_forward_heads():
    # the model's own head when replicated: K·V·a + 2.0 tiles = 14,140 > 12,992
    est = forward_memory(forward(head="model"), Launch(world_size=1))
    assert est.parts[-1] == Part("transient", 14 * 101 * 2 + int(2.0 * 5656),
                                 transient_text(MODEL_FORWARD, "T·a·464", "LM head"), "backward")
    assert est.extra == {"tokens": 14, "head": "model"}
    # a reward model with as many labels as live elements: a tie goes to the head
    tie = make_shape(head="score", num_labels=464)
    est = forward_memory(forward(shape=tie, head="score"), Launch(world_size=3, zero_stage=3))
    assert est.parts[-1] == Part("transient", 14 * 464 * 2, transient_text(SCORE, "T·a·464", "LM head"), "backward")
    assert est.extra == {"tokens": 14, "head": "score"}
    # fused (forward): the buffer only, min(T,4096)·min(V,32768)·a = 2,828 < 12,992
    est = forward_memory(forward(head="fused"), Launch(world_size=1))
    assert est.parts[-1] == Part("transient", 14 * 2 * 464, transient_text(FUSED_FORWARD, "T·a·464", "one layer"),
                                 "backward")


def test_forward_layer_of_a_plain_xielu_model():
    xielu = make_shape(qk_norm=False, gated_mlp=False, hidden_act="xielu", intermediate_size=81)
    # live = h + 2h + 5.5f = 589.5 (shown 590); 1 byte, 3 tokens: the head's 2.0·(3·101·4) = 2,424 > ⌊1,768.5⌋
    est = forward_memory(forward(shape=xielu, tokens=3, weight_bytes=1), Launch(world_size=1))
    assert int(3 * 1 * 589.5) == 1768 < int(2.0 * 3 * 101 * 4) == 2424
    assert est.parts == [
        Part("weights", 1 * 123_457, "1Ψ"),
        Part("activations", 3 * 48 * 1, "T·h·a (the last hidden states the head reads)", "backward"),
        Part("transient", 2424, transient_text(TILED_FORWARD, "T·a·590", "LM head"), "backward"),
    ]
    # a vocabulary of 11: the layer, rounded down: ⌊3 · 1 · 589.5⌋ = 1,768 > 2.0·(3·11·4) = 264
    small = make_shape(qk_norm=False, gated_mlp=False, hidden_act="xielu", intermediate_size=81, vocab_size=11)
    est = forward_memory(forward(shape=small, tokens=3, weight_bytes=1), Launch(world_size=1))
    assert est.parts[-1] == Part("transient", 1768, transient_text(TILED_FORWARD, "T·a·590", "one layer"),
                                 "backward")


# --------------------------------------------------------------------------- vLLM


@pytest.mark.parametrize(("kv_bytes", "tp", "expected"), [
    (2, 1, 2 * 3 * 3 * 13 * 2),  # K and V · layers · 3 KV heads · d_head · bytes
    (2, 2, 2 * 3 * 2 * 13 * 2),  # ⌈3/2⌉ = 2 KV heads on each GPU
    (2, 3, 2 * 3 * 1 * 13 * 2),
    (1, 4, 2 * 3 * 1 * 13 * 1),  # ⌈3/4⌉ = 1: at least one head per GPU
    (4, 7, 2 * 3 * 1 * 13 * 4),
])
def test_kv_bytes_per_token(kv_bytes, tp, expected):
    assert kv_bytes_per_token(SHAPE, kv_bytes, tp) == expected


BUDGET = (3 * GIB + 12_345) // 2  # u = 0.5 of a GPU of 3 GiB + 12,345 B: exactly half
RUNTIME_TEXT = "2·max_num_seqs·V·4 (sampler logits) + 1 GiB (CUDA graphs, NCCL)"
ACTIVATIONS_TEXT = "max_num_batched_tokens·a·(2h + max(2h + (2q + 2kv)/tp, 2h + g·f/tp)), g = 3 gated or 2; 8,192 tokens"


def test_vllm_on_two_gpus():
    vjob = VllmJob(shape=SHAPE, weight_bytes=2, tensor_parallel=2, gpu_memory_utilization=0.5, max_model_len=1000)
    est = vllm_memory(vjob, 3 * GIB + 12_345)
    weights = math.ceil(2 * 123_457 / 2)  # bΨ/tp
    # 2h + max(h + (q + 2kv + q)/tp + h = 200, h + 3f/tp + h = 216)
    per_token = 2 * 48 + max(48 + (65 + 2 * 39 + 65) // 2 + 48, 48 + 3 * 80 // 2 + 48)
    activations = 8192 * 2 * per_token
    runtime = 2 * 256 * 101 * 4 + GIB
    per_kv = 2 * 3 * 2 * 13 * 2  # ⌈3 KV heads / 2⌉ = 2
    kv_cache = BUDGET - weights - activations - runtime
    assert (per_token, per_kv, kv_cache) == (312, 312, 531_434_971)
    assert est.parts == [
        Part("weights", weights, "2Ψ/tp (tp = 2)"),
        Part("activations", activations, ACTIVATIONS_TEXT),
        Part("runtime", runtime, RUNTIME_TEXT),
        Part("kv_cache", kv_cache, "u·M − the rest; 312 B per token (2·L·⌈kv/tp⌉·d·a)"),
    ]
    tokens = kv_cache // per_kv
    assert (est.kind, est.gpus, est.notes) == ("vllm", 2, [])
    assert est.extra == {"kv_tokens": tokens, "kv_bytes_per_token": per_kv, "budget": BUDGET,
                         "sequences_at_max_len": tokens // 1000, "max_model_len": 1000,
                         "needed": weights + activations + runtime + 1000 * per_kv}
    assert est.total == BUDGET  # weights + the rest + the KV cache fill u·M exactly


def test_vllm_on_three_gpus_with_its_own_kv_dtype_and_limits():
    vjob = VllmJob(shape=SHAPE, weight_bytes=2, tensor_parallel=3, gpu_memory_utilization=0.5, max_model_len=333,
                   max_num_batched_tokens=1000, max_num_seqs=7, kv_bytes=1)
    est = vllm_memory(vjob, 3 * GIB + 12_345)
    weights = math.ceil(2 * 123_457 / 3)  # 82,305: rounded up
    # 2h + max(h + ⌊208/3⌋ + h = 165, h + ⌊240/3⌋ + h = 176)
    per_token = 2 * 48 + max(48 + (65 + 2 * 39 + 65) // 3 + 48, 48 + 3 * 80 // 3 + 48)
    activations = 1000 * 2 * per_token
    runtime = 2 * 7 * 101 * 4 + GIB
    per_kv = 2 * 3 * 1 * 13 * 1  # kv_bytes 1, ⌈3/3⌉ = 1 head
    kv_cache = BUDGET - weights - activations - runtime
    assert (weights, per_token, per_kv) == (82_305, 272, 78)
    assert est.parts == [
        Part("weights", weights, "2Ψ/tp (tp = 3)"),
        Part("activations", activations, "max_num_batched_tokens·a·(2h + max(2h + (2q + 2kv)/tp, 2h + g·f/tp)), g = 3 gated or 2; 1,000 tokens"),
        Part("runtime", runtime, RUNTIME_TEXT),
        Part("kv_cache", kv_cache, "u·M − the rest; 78 B per token (2·L·⌈kv/tp⌉·d·a)"),
    ]
    tokens = kv_cache // 78
    assert est.gpus == 3
    assert est.extra == {"kv_tokens": tokens, "kv_bytes_per_token": 78, "budget": BUDGET,
                         "sequences_at_max_len": tokens // 333, "max_model_len": 333,
                         "needed": weights + activations + runtime + 333 * 78}


@pytest.mark.parametrize(("changes", "tp", "per_token"), [
    ({}, 4, 2 * 48 + max(48 + 208 // 4 + 48, 48 + 3 * 80 // 4 + 48)),  # MLP: 96 + 208
    ({"intermediate_size": 20}, 3, 2 * 48 + max(48 + 208 // 3 + 48, 48 + 3 * 20 // 3 + 48)),  # attention: 96 + 165
    ({"gated_mlp": False, "intermediate_size": 200}, 3,  # plain MLP: 2f/tp, 96 + (48 + ⌊400/3⌋ + 48)
     2 * 48 + max(48 + 208 // 3 + 48, 48 + 2 * 200 // 3 + 48)),
    ({"gated_mlp": False}, 1, 2 * 48 + max(48 + 208 + 48, 48 + 2 * 80 + 48)),  # one GPU: attention 96 + 304
])
def test_vllm_activations_per_token(changes, tp, per_token):
    vjob = VllmJob(shape=make_shape(**changes), weight_bytes=2, tensor_parallel=tp, gpu_memory_utilization=0.9,
                   max_model_len=100)
    assert vllm_memory(vjob, 80 * GIB).part("activations") == 8192 * 2 * per_token


def test_vllm_with_tp_four_holds_one_kv_head_per_gpu():
    vjob = VllmJob(shape=SHAPE, weight_bytes=2, tensor_parallel=4, gpu_memory_utilization=0.5, max_model_len=1000)
    est = vllm_memory(vjob, 3 * GIB + 12_345)
    assert est.extra["kv_bytes_per_token"] == 2 * 3 * 1 * 13 * 2  # ⌈3/4⌉ = 1 head
    assert est.part("weights") == math.ceil(2 * 123_457 / 4)  # 61,728.5 rounded up


def test_vllm_when_weights_and_overhead_exceed_the_budget_the_kv_cache_is_zero():
    vjob = VllmJob(shape=SHAPE, weight_bytes=2, tensor_parallel=0, gpu_memory_utilization=0.5, max_model_len=64)
    est = vllm_memory(vjob, GIB + 1)  # budget ⌊0.5·(2^30 + 1)⌋ = 2^29 < the 1 GiB runtime allowance alone
    weights = 2 * 123_457  # tp 0 counts as one GPU
    activations = 8192 * 2 * (2 * 48 + max(48 + 208 + 48, 48 + 3 * 80 + 48))
    runtime = 2 * 256 * 101 * 4 + GIB
    per_kv = 2 * 3 * 3 * 13 * 2
    assert est.parts == [
        Part("weights", weights, "2Ψ/tp (tp = 1)"),
        Part("activations", activations, ACTIVATIONS_TEXT),
        Part("runtime", runtime, RUNTIME_TEXT),
        Part("kv_cache", 0, "u·M − the rest; 468 B per token (2·L·⌈kv/tp⌉·d·a)"),
    ]
    assert est.gpus == 1
    assert est.extra == {"kv_tokens": 0, "kv_bytes_per_token": per_kv, "budget": 2**29, "sequences_at_max_len": 0,
                         "max_model_len": 64, "needed": weights + activations + runtime + 64 * per_kv}
    assert est.total == weights + activations + runtime > 2**29


def test_vllm_kv_cache_exactly_at_the_budget_is_zero_and_one_byte_more_is_one():
    weights, runtime = 2 * 123_457, 2 * 256 * 101 * 4 + GIB
    activations = 8192 * 2 * (2 * 48 + max(48 + 208 + 48, 48 + 3 * 80 + 48))
    rest = weights + activations + runtime
    vjob = VllmJob(shape=SHAPE, weight_bytes=2, tensor_parallel=1, gpu_memory_utilization=1.0, max_model_len=10)
    assert vllm_memory(vjob, rest).part("kv_cache") == 0
    assert vllm_memory(vjob, rest + 1).part("kv_cache") == 1
    # one token's KV cache more than the rest: one token, no full sequence
    est = vllm_memory(vjob, rest + 468)
    assert (est.part("kv_cache"), est.extra["kv_tokens"], est.extra["sequences_at_max_len"]) == (468, 1, 0)
    # max_model_len 0 counts as 1 for the sequences that fit
    zero = VllmJob(shape=SHAPE, weight_bytes=2, tensor_parallel=1, gpu_memory_utilization=1.0, max_model_len=0)
    est = vllm_memory(zero, rest + 3 * 468 + 5)
    assert (est.extra["kv_tokens"], est.extra["sequences_at_max_len"], est.extra["needed"]) == (3, 3, rest)


def test_vllm_kv_bytes_none_takes_the_weights_dtype():
    for weight_bytes, kv_bytes, per_kv in ((2, None, 2 * 3 * 3 * 13 * 2), (2, 1, 2 * 3 * 3 * 13 * 1),
                                           (4, None, 2 * 3 * 3 * 13 * 4), (1, 4, 2 * 3 * 3 * 13 * 4)):
        vjob = VllmJob(shape=SHAPE, weight_bytes=weight_bytes, tensor_parallel=1, gpu_memory_utilization=0.9,
                       max_model_len=10, kv_bytes=kv_bytes)
        assert vllm_memory(vjob, 80 * GIB).extra["kv_bytes_per_token"] == per_kv


def test_vllm_defaults():
    vjob = VllmJob(shape=SHAPE, weight_bytes=2, tensor_parallel=1, gpu_memory_utilization=0.9, max_model_len=10)
    assert (vjob.max_num_batched_tokens, vjob.max_num_seqs, vjob.kv_bytes) == (8192, 256, None)


# --------------------------------------------------------------------------- transformers generate


def test_generate_memory():
    est = generate_memory(GenerateJob(shape=SHAPE, weight_bytes=2, rows=3, context=11))
    tokens = 3 * 11
    assert est.parts == [
        Part("weights", 2 * 123_457, "2Ψ"),
        # rows·context · 2 (K and V) · L · all 3 KV heads · d_head · a
        Part("kv_cache", tokens * (2 * 3 * 3 * 13 * 2), "rows·context·2·L·kv·d·a"),
        # the prefill T·a·live + the last logits 2·rows·V·4
        Part("transient", tokens * 2 * 464 + 2 * 3 * 101 * 4,
             "rows·context·a·(h + max(attention, MLP)) (prefill) + 2·rows·V·4 (last logits)", "backward"),
    ]
    assert (est.kind, est.gpus, est.notes, est.extra) == ("generate", 1, [], {"tokens": 33})
    assert est.total == 2 * 123_457 + 33 * 468 + 33 * 2 * 464 + 2424 and est.peak_phase == "backward"


def test_generate_memory_rounds_the_prefill_down():
    xielu = make_shape(qk_norm=False, gated_mlp=False, hidden_act="xielu", intermediate_size=81, num_kv_heads=2)
    est = generate_memory(GenerateJob(shape=xielu, weight_bytes=1, rows=3, context=11))
    # live 589.5: ⌊33 · 1 · 589.5⌋ = ⌊19,453.5⌋
    assert est.parts[1:] == [
        Part("kv_cache", 33 * (2 * 3 * 2 * 13 * 1), "rows·context·2·L·kv·d·a"),
        Part("transient", 19_453 + 2 * 3 * 101 * 4,
             "rows·context·a·(h + max(attention, MLP)) (prefill) + 2·rows·V·4 (last logits)", "backward"),
    ]
    assert est.parts[0] == Part("weights", 123_457, "1Ψ")


# --------------------------------------------------------------------------- the table a user reads


def _plan(estimate: Estimate, setting: str) -> JobPlan:
    return JobPlan(stage="train", job="training step", model="m", model_source="here", shape=SHAPE,
                   setting=setting, estimate=estimate, verdict=Verdict(True, "fits"), gpu_memory=80 * GIB,
                   headroom=5 * GIB)


def test_the_table_of_a_zero3_training_step_word_for_word():
    launch = Launch(world_size=3, zero_stage=3)
    # a big micro-batch so that the GiB columns show: T = 64 · 16,384 = 2^20 tokens
    est = training_memory(job(sequences=64, max_length=16_384), launch)
    activations = 2**20 * 2 * (3 * 1289 + 4 * 48)  # 8,512,339,968 B = 7.93 GiB
    head = 2 * 2**20 * 101 * 2 + int(4.3 * 2**20 * 101 * 4)  # 2,245,210,931 B = 2.09 GiB
    assert (activations, head) == (8_512_339_968, 2_245_210_931)
    text = render([_plan(est, launch.describe())], "Plan")
    assert text == "\n".join([
        "Plan",
        "",
        "[train] training step: fits",
        "  model: m (0.00B parameters, 3 layers, h 48, config: here)",
        "  setting: DeepSpeed ZeRO-3 over 3 ranks",
        "    part               phase      GiB/GPU   formula",
        "    weights            always        0.00   2Ψ/N",
        "    gradients          always        0.00   2Ψt/N",
        "    master_weights     always        0.00   4Ψt/N (fp32)",
        "    optimizer_states   always        0.00   2·4Ψt/N + 4 B × 2 tensors (adamw: 2 state tensors per parameter)",
        "    fp32_gradients     step          0.00   4·min(Ψt/N, 1e9) (fp32 gradients being stepped)",
        "    step_temporaries   step          0.00   2·4·min(Ψt/N, 1e9) (the update's temporaries)",
        f"    gathered_layer     backward      0.00   {GATHERED}",
        "    activations        backward      7.93   T·a·(L·s + 4h), s = 1,289 elements per token per layer",
        "    transient          backward      2.09   "
        + transient_text(MODEL_TRAINING, LAYER_G, "LM head", "2.09", "0.50"),
        "    peak               backward     10.02   always + max(backward 10.02, step 0.00)",
        "  fits",
        f"  note: {ZERO3_NOTE}",
        "",
        "1 of 1 jobs fit.",
    ])


def test_the_table_of_a_forward_pass_has_no_phase_comparison():
    est = forward_memory(forward(tokens=2**20), Launch(world_size=1))
    # weights 0.00; T·h·a = 2^20·96 B = 0.09 GiB; layer T·a·464 = 0.91 GiB > head 2.0 tiles 0.79 GiB
    assert (2**20 * 48 * 2, 2**20 * 2 * 464, int(2.0 * 2**20 * 101 * 4)) == (100_663_296, 973_078_528, 847_249_408)
    text = render([_plan(est, "")], "Plan")
    lines = text.splitlines()
    assert lines[4:9] == [
        "    part               phase      GiB/GPU   formula",
        "    weights            always        0.00   2Ψ",
        "    activations        backward      0.09   T·h·a (the last hidden states the head reads)",
        "    transient          backward      0.91   " + transient_text(TILED_FORWARD, "T·a·464", "one layer", "0.79",
                                                                       "0.91"),
        "    peak                             1.00",
    ]
