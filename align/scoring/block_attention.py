"""Attention over each block of a row alone: the work a block-diagonal mask keeps, and no more.

A padding-free or prefix-shared row holds several independent blocks (one sequence, or one
prompt with its completions), kept apart by a 4D mask. ``sdpa`` with that mask computes the
whole (L × L) score grid of the row and masks most of it: a row of blocks n_1 … n_k costs
L² = (Σ n_i)², where only Σ n_i² is kept. GPUs avoid it with FlashAttention's varlen path
(which takes the boundaries, not a mask); on CPU nothing does: FlexAttention in torch 2.13
has no backward on CPU, and its compiled forward took 585 ms where the masked grid took
30 ms (one 1,520-token row of 8 blocks, 4 heads of 32, 2 cores).

``block_attention_forward`` runs each piece of a row alone: a span of queries with the key
spans it can see. A packed sequence is one piece (its span, seeing itself); a prefix-shared
group is one piece per part: the prompt sees itself, each completion sees the prompt and
itself, so the (chosen × rejected) quadrant that the masked grid computes and throws away
is never computed (with the grid, sharing the prompt can cost more attention than it
saves: (P + C₁ + C₂)² against 2·(P + C)²). On CPU the pieces run through torch's flash
kernels with no mask (``PieceAttention``: the span a piece sees whole, and its own span
causally, merged by their log-sum-exps); elsewhere through ``sdpa`` on each piece's corner
of the mask. It is registered with transformers as the attention implementation
``sdpa_blocks`` (``register``) and runs where a batch carries ``attention_blocks`` (the
collators add them with ``attention_blocks=True``; the trainer and the log-prob pass do for
a model on ``sdpa_blocks``); a call without them is plain ``sdpa``. The trainer and the
pass switch a model on ``sdpa`` to it when asked (``block_attention``: ``true``, or
``"auto"`` for CPU only; ``wants_block_attention``). Off by default, because it pays only
on long rows. Measured on 2 cores, one 6-layer 5.4M Llama scoring the same 64
prefix-shared pairs (rows of about 1,000 tokens) in batches of 8, forward and backward,
switching between the two paths each round (``bench/block_attention_ab.py``): 1.10× and
1.16× as fast as the masked grid in two runs (between the preference bench's contenders,
which run one after another, the difference is within the drift of the machine's speed).
On the demo's rows (32 pairs of a 15-token prompt and 6-token completions, rows of 27
tokens) forward and backward took 46–52 ms against 10–13 ms on the grid, and on rows of
140 tokens 78 ms against 39–51 ms: one flash call per piece costs more than the small grid
it replaces (the demo's tuning took 2.6× as long with it on). An earlier
version ran ``sdpa`` on each piece's corner of the mask on CPU too, and a step took 1.9× as
long as with the grid: the per-piece masks and gathered keys cost more than the grid they
skipped.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from align.errors import ConfigError

BLOCK_ATTENTION = "sdpa_blocks"

Span = tuple[int, int]
Piece = tuple[int, int, tuple[Span, ...]]
"""Queries ``start:end`` of a row and the key spans they attend to (within the 4D mask)."""
Blocks = Sequence[Sequence[Piece]]


def row_blocks(block_ids: torch.Tensor) -> list[list[Piece]]:
    """Per row, one piece per run of equal consecutive ``block_ids`` (rows, L), seeing itself."""
    out = []
    for row in block_ids.tolist():
        pieces, start = [], 0
        for column in range(1, len(row) + 1):
            if column == len(row) or row[column] != row[start]:
                pieces.append((start, column, ((start, column),)))
                start = column
        out.append(pieces)
    return out


def block_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: torch.Tensor | None, *args: Any,
                            attention_blocks: Blocks | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Attention over each piece of each row alone; (B, L, H, D) out, as transformers' ``sdpa``.

    On CPU the pieces run through ``PieceAttention`` (flash kernels, no mask); elsewhere
    ``sdpa`` runs on each piece with that piece's corner of the 4D mask. Without
    ``attention_blocks`` (or without a 4D mask) this is transformers' ``sdpa``.
    """
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    if attention_blocks is None or attention_mask is None or attention_mask.dim() != 4:
        return sdpa_attention_forward(module, query, key, value, attention_mask, *args, **kwargs)
    if on_cpu_flash_kernels(query, module, kwargs.get("dropout", 0.0)):
        groups = getattr(module, "num_key_value_groups", 1)
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
        scale = kwargs.get("scaling")
        rows = [PieceAttention.apply(q[None], k[None], v[None], [piece_parts(p) for p in pieces], scale)[0]
                for pieces, q, k, v in zip(attention_blocks, query.unbind(0), key.unbind(0), value.unbind(0))]
        return torch.stack(rows).transpose(1, 2).contiguous(), None
    rows = []
    # unbind and split, not slicing: a slice's backward writes a zero tensor of the whole input
    for pieces, q, k, v, m in zip(attention_blocks, query.unbind(0), key.unbind(0), value.unbind(0),
                                  attention_mask.unbind(0)):
        sizes = [end - start for start, end, _ in pieces]
        starts = {start: i for i, (start, _, _) in enumerate(pieces)}
        qs, ks, vs = q.split(sizes, dim=1), k.split(sizes, dim=1), v.split(sizes, dim=1)
        parts = []
        for (start, end, spans), q_piece in zip(pieces, qs):
            chunks = [i for s, e in spans for i in _chunks(starts, sizes, s, e)]
            columns = torch.cat([torch.arange(pieces[i][0], pieces[i][1]) for i in chunks]) if len(chunks) > 1 \
                else slice(pieces[chunks[0]][0], pieces[chunks[0]][1])
            out, _ = sdpa_attention_forward(
                module, q_piece[None], _joined(ks, chunks)[None], _joined(vs, chunks)[None],
                m[None, :, start:end, columns], *args, **kwargs)
            parts.append(out[0])
        rows.append(torch.cat(parts, dim=0))
    return torch.stack(rows), None


def on_cpu_flash_kernels(query: torch.Tensor, module: torch.nn.Module, dropout: float) -> bool:
    """Whether the pieces run through ``PieceAttention``: on CPU, without dropout in training."""
    return query.device.type == "cpu" and not (module.training and dropout)


Part = tuple[int, int, bool]
"""Key columns ``start:end`` of a row and whether the queries see them causally (their own span)."""


def piece_parts(piece: Piece) -> tuple[int, int, list[Part]]:
    """A piece as its queries and key parts: spans before the queries seen whole, the queries' own span causally.

    A completion of a prefix-shared group sees the prompt whole and itself causally; a
    prompt or a packed sequence sees itself causally; the spans follow each other in the row.
    """
    start, end, spans = piece
    parts: list[Part] = []
    for first, last in spans:
        if last <= start:
            parts.append((first, last, False))
            continue
        if last != end or first > start:
            raise RuntimeError(f"key span {first}:{last} of the piece {start}:{end} neither precedes nor ends with "
                               "its queries: attention_blocks do not match the batch")
        if first < start:
            parts.append((first, start, False))
        parts.append((start, end, True))
    return start, end, parts


_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_FLASH_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


class PieceAttention(torch.autograd.Function):
    """One row's attention, piece by piece, on torch's CPU flash kernels: only the kept scores are computed.

    Each piece's queries attend to each of their key parts with one flash call (the part
    they see whole without a mask, their own span with ``is_causal``), and the parts' outputs
    are merged by their log-sum-exps: out = Σ_j exp(lse_j − lse) · out_j with
    lse = log Σ_j exp(lse_j), which is attention over all the parts at once. Backward gives
    each part the merged output and log-sum-exp, with which the flash backward kernel
    computes that part's exact share of the gradients (softmax over all parts), summed.
    q, k, v: (1, H, L, D), the key and value heads already repeated to the query's.
    """

    @staticmethod
    def forward(ctx: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                jobs: Sequence[tuple[int, int, list[Part]]], scale: float | None) -> torch.Tensor:
        out = torch.empty_like(query)
        lse: torch.Tensor | None = None
        for start, end, parts in jobs:
            found = [_FLASH(query[:, :, start:end], key[:, :, a:b], value[:, :, a:b], 0.0, causal, scale=scale)
                     for a, b, causal in parts]
            if lse is None:
                lse = query.new_empty(query.shape[:-1], dtype=found[0][1].dtype)
            if len(found) == 1:
                out[:, :, start:end], lse[:, :, start:end] = found[0]
                continue
            total = torch.stack([part_lse for _, part_lse in found]).logsumexp(0)
            out[:, :, start:end] = sum(part_out * (part_lse - total).exp()[..., None].to(part_out.dtype)
                                       for part_out, part_lse in found)
            lse[:, :, start:end] = total
        ctx.save_for_backward(query, key, value, out, lse)
        ctx.jobs, ctx.scale = jobs, scale
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        query, key, value, out, lse = ctx.saved_tensors
        grad_query, grad_key, grad_value = torch.zeros_like(query), torch.zeros_like(key), torch.zeros_like(value)
        grad_out = grad_out.contiguous()
        for start, end, parts in ctx.jobs:
            rows = slice(start, end)
            for a, b, causal in parts:
                gq, gk, gv = _FLASH_BACKWARD(grad_out[:, :, rows], query[:, :, rows], key[:, :, a:b], value[:, :, a:b],
                                             out[:, :, rows], lse[:, :, rows], 0.0, causal, scale=ctx.scale)
                grad_query[:, :, rows] += gq
                grad_key[:, :, a:b] += gk
                grad_value[:, :, a:b] += gv
        return grad_query, grad_key, grad_value, None, None


def _chunks(starts: dict[int, int], sizes: Sequence[int], start: int, end: int) -> list[int]:
    """The pieces (by index) that make up the key span ``start:end`` (spans follow piece boundaries)."""
    index, found = starts[start], []
    while start < end:
        found.append(index)
        start += sizes[index]
        index += 1
    if start != end:
        raise RuntimeError(f"a key span ends at {end}, inside a piece: attention_blocks do not match the batch")
    return found


def _joined(chunks: Sequence[torch.Tensor], indices: Sequence[int]) -> torch.Tensor:
    return chunks[indices[0]] if len(indices) == 1 else torch.cat([chunks[i] for i in indices], dim=1)


def register() -> str:
    """Make ``sdpa_blocks`` an attention implementation transformers knows (idempotent); its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(BLOCK_ATTENTION, block_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(BLOCK_ATTENTION, sdpa_mask)
    return BLOCK_ATTENTION


BLOCK_ATTENTION_SETTINGS = ("auto", True, False)


def wants_block_attention(setting: bool | str, model: torch.nn.Module, device: torch.device) -> bool:
    """Whether attention runs piece by piece (``sdpa_blocks``) for ``model`` (unwrapped) on ``device``.

    ``"auto"``: on CPU, for a model on ``sdpa`` (where the module's measurements were made;
    on GPUs the per-piece path runs ``sdpa`` on each piece's corner of the mask, not
    measured against the grid there, so ``"auto"`` leaves it off); ``True``: on any device,
    for a model on ``sdpa``; ``False``: never. A model already on ``sdpa_blocks`` keeps it.
    """
    if setting not in BLOCK_ATTENTION_SETTINGS:
        raise ConfigError(f"block_attention={setting!r}: choose auto, true or false")
    implementation = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if implementation == BLOCK_ATTENTION:
        return True
    if setting is True and implementation != "sdpa":
        raise ConfigError(f"block_attention=true needs a model on sdpa, this one uses {implementation!r}: set "
                          "block_attention=auto or false")
    return implementation == "sdpa" and (setting is True or (setting == "auto" and device.type == "cpu"))


@contextlib.contextmanager
def block_attention(model: torch.nn.Module, setting: bool | str, device: torch.device) -> Iterator[bool]:
    """``model`` (unwrapped) on ``sdpa_blocks`` inside the block where ``wants_block_attention``
    says so, back on its own implementation after; yields whether it is on ``sdpa_blocks``."""
    before = getattr(model.config, "_attn_implementation", None)
    switched = wants_block_attention(setting, model, device) and use_block_attention(model)
    try:
        yield switched
    finally:
        if switched and before != BLOCK_ATTENTION:
            model.set_attn_implementation(before)


def use_block_attention(model: torch.nn.Module) -> bool:
    """Switch a model on ``sdpa`` to ``sdpa_blocks`` (same numbers); whether it now uses it."""
    config = getattr(model, "config", None)
    implementation = getattr(config, "_attn_implementation", None)
    if implementation == BLOCK_ATTENTION:
        return True
    if implementation != "sdpa":
        return False
    register()
    model.set_attn_implementation(BLOCK_ATTENTION)
    return True
