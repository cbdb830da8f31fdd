"""Completion log-prob kernels: Σ_t log π(y_t | x, y_<t) per sequence of a collated batch.

``completion_logps`` is the one function training, the reference log-prob pass and the KL
estimator use to score completions: float32 token log-probs, float64 sums. Where the
model allows it the LM head is applied in tiles (``tiled_head``, ``tiled_token_logps``),
so the (tokens × vocabulary) logits never exist at once.

The tiled path reads the final hidden state only, as the backbone's (``get_decoder()``)
``last_hidden_state``, caught by a forward hook while the whole model (and whatever wraps
it: DDP, DeepSpeed, PEFT, accelerate's autocast) runs its own forward; it never asks for
``output_hidden_states``, which would keep every layer's hidden states (at 8B, 16 pairs of
4k tokens: 33 hidden states × 128k positions × 4096 × 2 bytes = 33 GiB under inference mode).
Measured on an H100 (a random-weight Llama-3-8B shape in bf16, 32 × 4,096 tokens, inference
mode): 34.0 GiB held after the forward and a 44.5 GiB peak above the weights with
``output_hidden_states``, 1.0 GiB and 14.5 GiB with the hook; the hidden states are equal.

A tile is ``HEAD_TILE_BYTES`` of float32 logits (1 GiB: 2,092 rows at Llama 3's 128,256-token
vocabulary, 8,192 at 32k). The head weight is read once per tile, so small tiles make the
projection memory-bound: at a 128k vocabulary and d = 4096 each tile reads 1 GiB of bf16
weight for 2·rows·d·V FLOPs, about ``rows`` FLOPs per byte, and an H100 needs ~300 FLOPs
per byte to be compute-bound; a tile of ≥ 1,024 rows is. One tile's transient memory (the
bf16 logits, their float32 copy, and in backward the recomputed tile and its gradient) is a
few GiB, small next to the activations of such a batch. Measured on an H100 (bf16 head
128,256 × 4,096, 32,768 positions): the old tile of 2^24 logits (130 rows) took 165 ms
without autograd and 1,005 ms forward and backward; 1 GiB tiles (2,092 rows) take 95 ms
and 367 ms, with peaks of 2.0 and 4.3 GiB above the inputs (2 GiB tiles gain 1 to 3% more
for twice the memory).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from align.scoring.collators import IGNORE_INDEX, model_inputs


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model under DDP / DeepSpeed / PEFT wrappers (for introspection only)."""
    while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
        model = model.module
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    return model


def _keeps_logits_by_mask(model: torch.nn.Module) -> bool:
    """Whether forward takes a 2D boolean ``logits_to_keep`` (transformers >= 5: lm_head on kept positions)."""
    import inspect

    from transformers import modeling_utils

    if not hasattr(modeling_utils, "slice_logits_to_keep"):
        return False
    return "logits_to_keep" in inspect.signature(unwrap_model(model).forward).parameters


_SCALED_HEAD_SETTINGS = ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier",
                         "logits_scaling")


def backbone(model: torch.nn.Module) -> torch.nn.Module | None:
    """The module whose output's ``last_hidden_state`` the LM head projects, or None.

    ``get_decoder()`` (the text decoder of a multimodal model), else the module under
    ``base_model_prefix`` (``model`` for Llama); None when that is the model itself.
    """
    base = unwrap_model(model)
    found = None
    if hasattr(base, "get_decoder"):
        try:
            found = base.get_decoder()
        except (AttributeError, NotImplementedError, ValueError):
            found = None
    if not isinstance(found, torch.nn.Module) or found is base:
        found = getattr(base, getattr(base, "base_model_prefix", "") or "", None)
    if not isinstance(found, torch.nn.Module) or found is base:
        return None
    return found


def tiled_head(model: torch.nn.Module) -> torch.nn.Linear | None:
    """The plain linear LM head to project in tiles ourselves, or None to let the model do it.

    Tiling needs the head's full weight outside its own forward, so not under ZeRO-3 (sharded
    weights), nor with heads that scale or cap logits, nor with an adapter on the head; and
    a backbone module (``backbone``) whose last hidden state is what the head reads.
    """
    base = unwrap_model(model)
    if not _keeps_logits_by_mask(model) or not hasattr(base, "get_output_embeddings"):
        return None
    if backbone(model) is None:
        return None
    head = base.get_output_embeddings()
    if type(head) is not torch.nn.Linear or hasattr(head.weight, "ds_id"):
        return None
    config = base.config.get_text_config() if hasattr(base.config, "get_text_config") else base.config
    if any(getattr(config, name, None) not in (None, 1.0) for name in _SCALED_HEAD_SETTINGS):
        return None
    return head


def _logps_from_logits(logits: Tensor, targets: Tensor) -> Tensor:
    """log softmax(logits)[target] in float32."""
    logits = logits.float()
    return logits.gather(-1, targets[:, None]).squeeze(-1) - logits.logsumexp(-1)


def _head_logps(hidden: Tensor, targets: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """Target log-probs of one tile of positions, through the LM head.

    The hidden states are cast to the head's dtype, as the model's own head sees them:
    under mixed precision accelerate returns a bf16 model's outputs in float32, and this
    projection runs outside the model's forward (and its autocast).
    """
    return _logps_from_logits(torch.nn.functional.linear(hidden.to(weight.dtype), weight, bias), targets)


def _map_tiles(fn, sliced: tuple[Tensor, ...], shared: tuple, rows: int, recompute: bool) -> Tensor:
    """``fn`` over tiles of ``rows`` positions of ``sliced`` (plus ``shared``), concatenated.

    With ``recompute`` each tile is checkpointed: its logits are rebuilt in backward, not stored.
    """
    from torch.utils.checkpoint import checkpoint

    parts = []
    for start in range(0, max(1, sliced[0].shape[0]), rows):
        args = tuple(t[start : start + rows] for t in sliced) + shared
        parts.append(checkpoint(fn, *args, use_reentrant=False) if recompute else fn(*args))
    return torch.cat(parts)


HEAD_TILE_BYTES = 1 << 30
"""Float32 logits per tile of the LM head (1 GiB; the module docstring says why)."""

CPU_HEAD_TILE_BYTES = 16 << 20
"""On CPU: 16 MiB tiles (131 rows at a 32k vocabulary) stay in cache. Measured on 2 cores (a
5.4M Llama, vocab 32,000, 8 prefix-shared pairs, 5,967 tokens, forward and backward): 2.0 s
and 1.6 GiB peak growth, against 2.35 s and 3.2 GiB with 1 GiB tiles (one tile there, kept
for backward, not recomputed)."""


def head_tile_bytes(device: torch.device) -> int:
    """The tile size for logits on ``device``."""
    return CPU_HEAD_TILE_BYTES if device.type == "cpu" else HEAD_TILE_BYTES


def tile_rows(vocab_size: int, tile_bytes: int = HEAD_TILE_BYTES) -> int:
    """Positions per tile: as many as fit ``tile_bytes`` of float32 logits, at least one."""
    return max(1, tile_bytes // (4 * max(1, vocab_size)))


class _TiledHeadLogps(torch.autograd.Function):
    """Target log-probs through the LM head in tiles, with a backward written out by hand.

    Forward keeps, per position, only the log-sum-exp of its logits. Backward rebuilds one
    tile of logits at a time and turns it in place into the gradient of the log-probs with
    respect to the logits, g · (onehot(target) − softmax), then projects it: the hidden
    states' gradient (tile @ W) and the head's, accumulated into one buffer (addmm_).
    Autograd through a checkpointed tile did the same products with several more passes
    over each (rows × V) tile (log-softmax's backward, the gather's zero-filled gradient,
    their sum) and a fresh (V × d) weight gradient per tile. Measured on 2 cores (4,800
    positions, d 128, V 32,000, fp32): forward and backward 0.61 s against 1.05 s; the
    results are identical, the weight gradient to float32 rounding (tests/test_logprobs.py).
    """

    @staticmethod
    def forward(ctx: Any, hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, rows: int) -> Tensor:
        inputs = hidden.to(weight.dtype)
        out = torch.empty(inputs.shape[0], dtype=torch.float32, device=inputs.device)
        lse = torch.empty_like(out)
        for start in range(0, inputs.shape[0], rows):
            end = start + rows
            logits = torch.nn.functional.linear(inputs[start:end], weight, bias).float()
            lse[start:end] = logits.logsumexp(-1)
            out[start:end] = logits.gather(-1, targets[start:end, None]).squeeze(-1) - lse[start:end]
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.rows = rows
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        inputs, grad_out = hidden.to(weight.dtype), grad_out.float()
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = torch.zeros_like(weight) if need_weight else None
        grad_bias = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if need_bias else None
        for start in range(0, inputs.shape[0], ctx.rows):
            end = start + ctx.rows
            g = grad_out[start:end]
            tile = torch.nn.functional.linear(inputs[start:end], weight, bias).float()
            tile.sub_(lse[start:end, None]).exp_().mul_(-g[:, None])  # -g · softmax
            tile[torch.arange(tile.shape[0], device=tile.device), targets[start:end]] += g
            projected = tile.to(weight.dtype)
            if need_hidden:
                grad_hidden[start:end] = projected @ weight
            if need_weight:
                grad_weight.addmm_(projected.T, inputs[start:end])
            if need_bias:
                grad_bias += tile.sum(0)
        return grad_hidden, grad_weight, None if grad_bias is None else grad_bias.to(bias.dtype), None, None


def tiled_token_logps(hidden: Tensor, head: torch.nn.Linear, targets: Tensor,
                      tile_bytes: int | None = None) -> Tensor:
    """Target log-probs (K,) from final hidden states (K, d), never holding all (K, V) logits.

    The head is applied to tiles of ``tile_rows(V, tile_bytes)`` positions; under autograd
    each tile is rebuilt in backward instead of stored (``_TiledHeadLogps``), so memory is
    one tile, not K × V. ``tile_bytes`` None: ``head_tile_bytes`` of the hidden states' device.
    """
    rows = tile_rows(head.out_features, tile_bytes or head_tile_bytes(hidden.device))
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (hidden, head.weight, head.bias)):
        return _TiledHeadLogps.apply(hidden, head.weight, head.bias, targets, rows)
    return _map_tiles(_head_logps, (hidden, targets), (head.weight, head.bias), rows, recompute=False)


def model_logits(model: torch.nn.Module, inputs: Mapping[str, Any], keep: Tensor) -> Tensor:
    """Logits at the positions in ``keep`` (rows, L), flattened row-major to (K, V), from the model's own head.

    Where the model supports it, the vocabulary projection runs on those positions only,
    which saves the (rows × L × V) logits of prompt and padding tokens.
    """
    if _keeps_logits_by_mask(model):
        logits = model(**inputs, logits_to_keep=keep, use_cache=False).logits
    else:
        logits = model(**inputs, use_cache=False).logits
    if logits.dim() == 3:
        logits = logits[keep]
    if logits.shape[0] != int(keep.sum()):
        raise RuntimeError(f"model returned logits for {logits.shape[0]} positions, expected {int(keep.sum())}")
    return logits


def token_logps_at(model: torch.nn.Module, batch: Mapping[str, Any], keep: Tensor, targets: Tensor,
                   *, tiled: bool | None = None, sources: Tensor | None = None) -> Tensor:
    """log π(target | prefix) at the ``keep`` positions, float32, shape (T,).

    ``sources`` (T,) names, for each target, the kept position (an index into the K kept
    positions, row-major) whose logits predict it; None: one target per kept position, in
    order (T = K). A position may predict several targets: in the prefix-shared layout the
    last prompt token predicts the first token of every completion of its prompt.

    ``tiled`` (None: wherever ``tiled_head`` allows) projects the final hidden states through
    the LM head in tiles, so the (T, V) logits never exist at once; else the model's head
    computes the kept positions' logits.
    """
    inputs = model_inputs(batch)
    head = tiled_head(model) if tiled in (None, True) else None
    if tiled and head is None:
        raise ValueError("this model's LM head cannot be tiled (ZeRO-3, scaled logits, an adapter on the head, "
                         "or no backbone module whose last hidden state it reads)")
    if head is None:
        return _logits_token_logps(model_logits(model, inputs, keep), targets, sources=sources)
    hidden = last_hidden_state(model, inputs, keep)
    if sources is not None and not _is_identity(sources, hidden.shape[0]):
        hidden = hidden.index_select(0, sources)  # (T, d): a shared position's row repeated, not its logits
    return tiled_token_logps(hidden, head, targets)


def _is_identity(sources: Tensor, size: int) -> bool:
    """Whether ``sources`` is 0, 1, ..., size - 1 (each kept position predicts one target, in order)."""
    return sources.numel() == size and bool(torch.equal(sources, torch.arange(size, device=sources.device)))


class _LastHidden:
    """Forward hook keeping the backbone's ``last_hidden_state`` (the only hidden state kept)."""

    def __init__(self) -> None:
        self.value: Tensor | None = None
        self.calls = 0

    def __call__(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self.calls += 1
        self.value = output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0]


def last_hidden_state(model: torch.nn.Module, inputs: Mapping[str, Any], keep: Tensor) -> Tensor:
    """The final hidden states (K, d) at the ``keep`` positions, from one forward of ``model``.

    The whole model runs (its wrappers included), with no logits kept and no per-layer
    hidden states asked for; a hook on the backbone takes its last hidden state, the
    tensor the LM head would project.
    """
    module = backbone(model)
    if module is None:
        raise ValueError("this model has no backbone module whose last hidden state the head reads")
    capture = _LastHidden()
    handle = module.register_forward_hook(capture)
    try:
        model(**inputs, logits_to_keep=torch.zeros_like(keep), output_hidden_states=False, use_cache=False)
    finally:
        handle.remove()
    if capture.calls != 1 or capture.value is None:
        raise RuntimeError(f"the backbone {type(module).__name__} ran {capture.calls} times in one forward, expected once")
    hidden = capture.value
    if hidden.shape[:-1] != keep.shape:
        raise RuntimeError(f"backbone hidden states of shape {tuple(hidden.shape)} for inputs of shape {tuple(keep.shape)}")
    return hidden[keep]


def _logits_token_logps(logits: Tensor, targets: Tensor, tile_bytes: int | None = None,
                        sources: Tensor | None = None) -> Tensor:
    """Target log-probs from the model's logits, upcast to float32 one tile at a time.

    With ``sources`` target i is scored on logits row ``sources[i]``; the rows are picked a
    tile at a time, so no (T, V) copy of the logits is made.
    """
    rows = tile_rows(logits.shape[-1], tile_bytes or head_tile_bytes(logits.device))
    if sources is None or _is_identity(sources, logits.shape[0]):
        recompute = logits.shape[0] > rows and torch.is_grad_enabled() and logits.requires_grad
        return _map_tiles(_logps_from_logits, (logits, targets), (), rows, recompute)
    recompute = targets.shape[0] > rows and torch.is_grad_enabled() and logits.requires_grad
    return _map_tiles(_picked_logps, (sources, targets), (logits,), rows, recompute)


def _picked_logps(sources: Tensor, targets: Tensor, logits: Tensor) -> Tensor:
    """log softmax of the logits rows ``sources`` at ``targets`` (one tile)."""
    return _logps_from_logits(logits.index_select(0, sources), targets)


def completion_logps(model: torch.nn.Module, batch: Mapping[str, Any], *, tiled: bool | None = None) -> Tensor:
    """Σ_t log π(y_t | x, y_<t) over each sequence's completion tokens: shape (S,), float64.

    ``batch`` is a collated batch (``align.scoring.collators``) of S sequences. Token
    log-probs are float32; the sums are float64 so that they do not depend on how many
    tokens share a batch (fp32 sums of ~10³ tokens would differ in the 5th digit).

    The token at column t is predicted by the logits at column t − 1, or, where the batch
    has ``predicted_from`` (the prefix-shared layout), at the column it names.
    """
    labels, owners = batch["labels"], batch["sequence_index"]
    targets_at = labels != IGNORE_INDEX
    row, column = targets_at.nonzero(as_tuple=True)  # row-major, the order of the kept positions
    source = batch["predicted_from"][targets_at] if "predicted_from" in batch else column - 1
    keep = torch.zeros_like(labels, dtype=torch.bool)
    keep[row, source] = True
    kept_rank = keep.flatten().cumsum(0) - 1  # position (flattened) -> its index among the kept ones
    sources = kept_rank[row * labels.shape[1] + source]
    logps = token_logps_at(model, batch, keep, labels[targets_at], tiled=tiled, sources=sources)
    num_sequences = batch["lengths"].numel()
    sums_dtype = torch.float32 if logps.device.type == "mps" else torch.float64
    sums = torch.zeros(num_sequences, dtype=sums_dtype, device=logps.device)
    return sums.index_add(0, owners[targets_at], logps.to(sums_dtype))
