"""Packed and prefix-shared batches on torch's FlexAttention: block masks instead of dense 4D masks.

FlashAttention's varlen kernels take sequence boundaries and cannot express "the prompt,
then only myself", so with ``flash_attention_2`` the trainers and the pass turn prefix
sharing off. FlexAttention (part of torch, no extra package) takes a ``mask_mod``: a
function of (row, query, key) that it evaluates per 128 × 128 tile to skip tiles no query
sees, and per element inside the tiles it computes. The collators describe a batch's
layout with two (rows, L) integer tensors instead of an (L × L) mask:

- ``block_ids``: the sequence (padding-free) or the prompt group (prefix-shared) each token
  belongs to; trailing padding is block -1 (its own causal block, so no query is empty);
- ``block_parts``: 0 for a prompt (and everything in the padding-free layout), j for
  completion j of its group.

Token q sees token k iff ``k <= q``, both are in the same block, and k is in the prompt
or in q's own part: the same rule as the dense masks of ``align.scoring.collators``.
``model_inputs`` turns the pair into a ``BlockMask`` on the batch's device, and
transformers' ``flex_attention`` takes it as the attention mask unchanged.

Platform limits (torch 2.13): on CPU FlexAttention runs forward only (its backward raises
``NotImplementedError``), and its compiled forward is slower than the masked grid; use it on
GPUs. ``attn_implementation: auto`` (``resolve_attn_implementation``) picks
``flash_attention_2`` where flash-attn is installed and a GPU is present,
``flex_attention`` on a GPU without it, and ``sdpa`` on CPU.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

FLEX_ATTENTION = "flex_attention"
AUTO = "auto"


def flex_attention_available() -> bool:
    """Whether this torch has FlexAttention (torch >= 2.5)."""
    return importlib.util.find_spec("torch.nn.attention.flex_attention") is not None


def flash_attention_installed() -> bool:
    """Whether the flash-attn package (FlashAttention-2 kernels) can be imported."""
    return importlib.util.find_spec("flash_attn") is not None


def resolve_attn_implementation(setting: str | None, *, cuda: bool | None = None) -> str | None:
    """``auto``: flash-attn on a GPU where installed, else FlexAttention on a GPU, else ``sdpa``.

    Any other setting is returned as given (None keeps transformers' choice). ``cuda``
    None: whether this process sees a GPU.
    """
    if setting != AUTO:
        return setting
    on_gpu = torch.cuda.is_available() if cuda is None else cuda
    if on_gpu and flash_attention_installed():
        return "flash_attention_2"
    if on_gpu and flex_attention_available():
        return FLEX_ATTENTION
    return "sdpa"


def layout_mask_mod(block_ids: torch.Tensor, block_parts: torch.Tensor):
    """The ``mask_mod`` of a batch's layout: same block, causal, and the prompt or the query's own part."""
    def mask_mod(row: Any, head: Any, query: Any, key: Any) -> Any:
        same_block = block_ids[row, query] == block_ids[row, key]
        key_part = block_parts[row, key]
        visible = (key_part == 0) | (key_part == block_parts[row, query])
        return same_block & visible & (key <= query)
    return mask_mod


def layout_block_mask(block_ids: torch.Tensor, block_parts: torch.Tensor) -> Any:
    """A ``BlockMask`` for (rows, L) ``block_ids`` / ``block_parts`` on their device (heads broadcast)."""
    from torch.nn.attention.flex_attention import create_block_mask

    if block_ids.shape != block_parts.shape or block_ids.dim() != 2:
        raise ValueError(f"block_ids {tuple(block_ids.shape)} and block_parts {tuple(block_parts.shape)} "
                         "must be the same (rows, L) shape")
    rows, width = block_ids.shape
    return create_block_mask(layout_mask_mod(block_ids, block_parts), rows, None, width, width,
                             device=block_ids.device)


def dense_layout_mask(block_ids: torch.Tensor, block_parts: torch.Tensor) -> torch.Tensor:
    """The boolean (rows, 1, L, L) mask the same rule gives: the prefix-shared layout's for sdpa and eager."""
    width = block_ids.shape[1]
    same = block_ids[:, :, None] == block_ids[:, None, :]
    visible = (block_parts[:, None, :] == 0) | (block_parts[:, :, None] == block_parts[:, None, :])
    causal = torch.ones(width, width, dtype=torch.bool, device=block_ids.device).tril()
    return (same & visible & causal)[:, None]
