"""Batches of (prompt, completion) token sequences for preference training and log-prob passes.

Two layouts carry the same information; the model must give every sequence the same
log-probs in both (the test "padding-free equals padded" pins this):

* **padded** — one sequence per row, right-padded to the longest row, 2D attention mask;
* **padding-free** — sequences concatenated into as few rows as possible, ``position_ids``
  restarting at 0 for each sequence, and an attention pattern that keeps them apart. Which
  pattern depends on the attention implementation (docs/environment.md, "Padding-free
  batches: CPU against GPU": ``position_ids`` alone are NOT always enough on
  ``sdpa``/``eager``; with a KV cache the second sequence attends to the first):

  - ``sdpa``: 4D block-diagonal causal mask ``(rows, 1, L, L)``, boolean (True = attend)
    or additive float (the trainers and the pass use additive masks, ``mask_dtype_for``);
  - ``eager``: 4D additive float mask only (0 / dtype-min); a boolean mask is wrong there;
  - ``flash_attention_*``: one row, no mask, ``position_ids`` plus the varlen kwargs
    ``cu_seq_lens_q/k`` and ``max_length_q/k``;
  - ``flex_attention``: no mask in the batch; ``block_ids`` / ``block_parts`` describe the
    layout, and ``model_inputs`` makes the block mask from them (``align.scoring.flex``).

Worked example (padding-free, ``sdpa``, boolean mask, ``max_row_tokens=10``). Two sequences::

    seq 0: prompt [1, 5]     completion [7, 8, 2]
    seq 1: prompt [1, 6, 9]  completion [4, 2]

    input_ids      [[1, 5, 7, 8, 2, 1, 6, 9, 4, 2]]
    position_ids   [[0, 1, 2, 3, 4, 0, 1, 2, 3, 4]]
    labels         [[-100, -100, 7, 8, 2, -100, -100, -100, 4, 2]]   # completion tokens only
    sequence_index [[0, 0, 0, 0, 0, 1, 1, 1, 1, 1]]
    attention_mask [[[ causal 5x5 block | False        ],
                      [ False           | causal 5x5 block ]]]          # shape (1, 1, 10, 10)
    lengths        [3, 2]                                             # |y| incl. end-of-turn

The padded layout of the same batch::

    input_ids      [[1, 5, 7, 8, 2, 0], [1, 6, 9, 4, 2, 0]]   # pad id 0 here
    attention_mask [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0]]
    labels         [[-100, -100, 7, 8, 2, -100], [-100, -100, -100, 4, 2, -100]]
    sequence_index [[0, 0, 0, 0, 0, -1], [1, 1, 1, 1, 1, -1]]

``PreferenceCollator`` turns pair rows into such batches with the chosen completions first
and the rejected ones after them (sequence ``i`` is pair ``i``'s chosen, ``B + i`` its
rejected), so one forward scores both and ``chunk(2)`` splits them again.

* **prefix-shared** (``collate_prefix_shared``) — the completions of one prompt (a pair's
  chosen and rejected) follow a single copy of the prompt: ``prompt | c_1 | c_2``. Each
  completion attends to the prompt and to itself, never to another completion, and its
  ``position_ids`` start at ``len(prompt)``, so every completion sees exactly what it sees
  in its own sequence and gets the same log-probs, while the prompt's layers run once
  (Wang et al. 2024, "Accelerating Direct Preference Optimization with Prefix Sharing",
  §3). The mask is 4D (boolean for ``sdpa``, additive float for ``eager``; FlexAttention gets
the same rule as a block mask), in
  padded rows (one prompt per row) or packed ones (``padding_free``); FlashAttention's
  varlen kernels cannot express "the prompt, then only myself", so it gets no prefix
  sharing (``resolve_prefix_sharing``). The first token of every completion is predicted
  by the LAST PROMPT token's logits, also for ``c_2``, which does not follow the prompt in
  the row: ``predicted_from`` names, for each labelled position, the column whose logits
  predict it (``align.scoring.logps`` reads it; the other layouts predict from the column
  before).

Worked example (prefix-shared, padding-free, ``sdpa``). One pair, prompt ``[1, 5]``,
chosen ``[7, 8, 2]`` (sequence 0), rejected ``[4, 2]`` (sequence 1)::

    input_ids      [[1, 5, 7, 8, 2, 4, 2]]
    position_ids   [[0, 1, 2, 3, 4, 2, 3]]          # rejected restarts at len(prompt) = 2
    labels         [[-100, -100, 7, 8, 2, 4, 2]]
    predicted_from [[-1, -1, 1, 2, 3, 1, 5]]        # rejected's first token from column 1
    sequence_index [[-1, -1, 0, 0, 0, 1, 1]]        # completion tokens only; prompt -1
    attention_mask (1, 1, 7, 7), row q lists the columns it sees:
        q=0: 0      q=1: 0 1      q=2: 0 1 2      q=3: 0 1 2 3      q=4: 0 1 2 3 4
        q=5: 0 1 5  q=6: 0 1 5 6                   # rejected: the prompt and itself
    lengths        [3, 2]

Two prompts and ``padding_free=False`` give two rows, each ``prompt | chosen | rejected``
right-padded, the padding a causal block of its own (no query row is all-masked).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from align.chat.encode import IGNORE_INDEX
from align.errors import ConfigError, InputError
from align.scoring.block_attention import BLOCK_ATTENTION, row_blocks
from align.scoring.flex import FLEX_ATTENTION, dense_layout_mask, layout_block_mask

FLASH_IMPLEMENTATIONS = ("flash_attention_2", "flash_attention_3", "kernels-community/flash-attn")

# Per-sequence number fields: output name -> (chosen column, rejected column).
PAIR_SEQUENCE_FIELDS: dict[str, tuple[str, str]] = {
    "ref_logps": ("ref_chosen_logps", "ref_rejected_logps"),
    "quantiles": ("chosen_quantile", "rejected_quantile"),
}

Sequences = Sequence[tuple[Sequence[int], Sequence[int]]]


def takes_4d_mask(attn_implementation: str | None) -> bool:
    """Attention implementations that take the 4D masks of the packed and prefix-shared layouts."""
    return attn_implementation in ("sdpa", "eager", BLOCK_ATTENTION)


def takes_layout(attn_implementation: str | None) -> bool:
    """Attention implementations that keep the packed and prefix-shared layouts' blocks apart.

    The 4D-mask ones, and FlexAttention, which gets the layout as ``block_ids`` /
    ``block_parts`` and builds a block mask from them (``align.scoring.flex``).
    """
    return takes_4d_mask(attn_implementation) or attn_implementation == FLEX_ATTENTION


def mask_dtype_for(attn_implementation: str | None, compute_dtype: torch.dtype) -> torch.dtype | None:
    """The dtype the trainers and the log-prob pass give 4D masks: the compute dtype (an additive mask).

    ``sdpa`` turns a boolean mask into an additive one of the query's dtype inside every
    layer, and keeps each layer's copy for backward: measured on a 6-layer model, 8 rows of
    1,244 tokens, 283 MiB of saved masks in one training step against 47 MiB for one
    additive mask made here and shared by every layer (and no per-layer conversion).
    """
    return compute_dtype if takes_4d_mask(attn_implementation) else None


def is_flash_attention(attn_implementation: str | None) -> bool:
    """FlashAttention kernels take sequence boundaries as varlen kwargs, not as a mask."""
    return bool(attn_implementation) and "flash" in attn_implementation


def _check_sequences(sequences: Sequences) -> None:
    """Each sequence needs a prompt token (to predict the first completion token) and a completion."""
    if not sequences:
        raise ValueError("cannot collate an empty batch")
    for i, (prompt, completion) in enumerate(sequences):
        if len(prompt) == 0:
            raise ValueError(f"sequence {i}: empty prompt (at least BOS is needed to score the completion)")
        if len(completion) == 0:
            raise ValueError(f"sequence {i}: empty completion (|y| = 0 makes β/|y| infinite)")


def _round_up(value: int, multiple: int | None) -> int:
    return value if not multiple else -(-value // multiple) * multiple


BUCKET_BLOCK = 128  # FlexAttention's tile: a bucket is a whole number of tiles


def bucket_width(tokens: int) -> int:
    """The length bucket of a batch ``tokens`` wide: the next multiple of 128 whose count of 128-token tiles
    has at most three significant bits (128, 256, 384, 512, 640, 768, 896, 1024, 1280, ...): four buckets
    per doubling, at most a quarter of padding, about 30 shapes up to 32k tokens. A compiled kernel that
    specializes on the shape (FlexAttention under transformers) compiles once per bucket, not per batch."""
    tiles = max(1, -(-tokens // BUCKET_BLOCK))
    shift = max(0, tiles.bit_length() - 3)
    return -(-tiles // (1 << shift)) * (1 << shift) * BUCKET_BLOCK  # the tiles rounded up to three bits


def padded_width(tokens: int, multiple: int | None, buckets: bool) -> int:
    """A batch's padded width: its length bucket (``buckets``), rounded up to ``multiple``."""
    return _round_up(bucket_width(tokens), multiple) if buckets else _round_up(tokens, multiple)


def collate_padded(
    sequences: Sequences, *, pad_token_id: int, pad_to_multiple_of: int | None = None, length_buckets: bool = False
) -> dict[str, torch.Tensor]:
    """One right-padded row per sequence with a 2D attention mask (see the module example); ``length_buckets``:
    the width is a length bucket (``bucket_width``)."""
    _check_sequences(sequences)
    width = padded_width(max(len(p) + len(c) for p, c in sequences), pad_to_multiple_of, length_buckets)
    rows = len(sequences)
    input_ids = torch.full((rows, width), pad_token_id, dtype=torch.long)
    labels = torch.full((rows, width), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((rows, width), dtype=torch.long)
    sequence_index = torch.full((rows, width), -1, dtype=torch.long)
    for row, (prompt, completion) in enumerate(sequences):
        n_prompt, n = len(prompt), len(prompt) + len(completion)
        input_ids[row, :n] = torch.tensor(list(prompt) + list(completion), dtype=torch.long)
        labels[row, n_prompt:n] = input_ids[row, n_prompt:n]
        attention_mask[row, :n] = 1
        sequence_index[row, :n] = row
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "labels": labels,
        "sequence_index": sequence_index,
        "lengths": torch.tensor([len(c) for _, c in sequences], dtype=torch.long),
    }


def pack_rows(sizes: Sequence[int], max_row_tokens: int | None) -> list[list[int]]:
    """Group sequence indices into rows of at most ``max_row_tokens`` tokens (first-fit decreasing).

    ``None`` puts everything in one row. A sequence longer than the budget gets a row of its
    own. Rows come out in a deterministic order (by their first sequence index).
    """
    if max_row_tokens is None:
        return [list(range(len(sizes)))]
    rows: list[list[int]] = []
    used: list[int] = []
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        for r, total in enumerate(used):
            if total + sizes[index] <= max_row_tokens:
                rows[r].append(index)
                used[r] += sizes[index]
                break
        else:
            rows.append([index])
            used.append(sizes[index])
    for row in rows:
        row.sort()
    return sorted(rows, key=lambda row: row[0])


def block_causal_mask(segments: torch.Tensor) -> torch.Tensor:
    """Boolean (rows, 1, L, L) mask: token q sees token k iff same segment and k <= q."""
    width = segments.shape[1]
    same = segments[:, :, None] == segments[:, None, :]
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    return (same & causal)[:, None, :, :]


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where attending, the dtype's minimum elsewhere (what ``eager`` attention adds to scores)."""
    return torch.zeros(mask.shape, dtype=dtype).masked_fill_(~mask, torch.finfo(dtype).min)


def collate_padding_free(
    sequences: Sequences,
    *,
    pad_token_id: int,
    attn_implementation: str = "sdpa",
    mask_dtype: torch.dtype | None = None,
    max_row_tokens: int | None = None,
    pad_to_multiple_of: int | None = None,
    length_buckets: bool = False,
) -> dict[str, Any]:
    """Concatenate sequences into rows with restarting ``position_ids`` (see the module example).

    ``mask_dtype`` None gives a boolean mask (``sdpa`` only); a float dtype gives the
    additive mask (required by ``eager``; use the model's dtype). FlashAttention gets one
    row and ``cu_seq_lens``/``max_length`` kwargs instead of a mask. ``max_row_tokens``
    bounds a row's length for mask-based attention, whose cost grows with the row length
    squared: None sizes rows to the batch's longest sequence, so attention never costs
    more than in the padded layout while the short sequences fill the rows' padding (a
    sequence longer than the budget gets a row of its own). Tail padding of a row forms
    its own causal block, so no query row of the mask is empty (an all-masked row gives
    NaN in ``sdpa``). ``length_buckets``: the rows' width is a length bucket (``bucket_width``;
    not for FlashAttention, whose one row is never padded).
    """
    _check_sequences(sequences)
    flash = is_flash_attention(attn_implementation)
    if attn_implementation == "eager" and (mask_dtype is None or not mask_dtype.is_floating_point):
        raise ValueError("eager attention needs an additive float mask: pass mask_dtype=<the model's dtype>")
    if not flash and not takes_layout(attn_implementation):
        raise ConfigError(
            f"padding-free batches support sdpa, eager, flex and flash attention, not {attn_implementation!r}; "
            "set padding_free=False or load the model with attn_implementation='sdpa'"
        )
    sizes = [len(p) + len(c) for p, c in sequences]
    budget = max(sizes) if max_row_tokens is None else max_row_tokens
    rows = pack_rows(sizes, None if flash else budget)
    # varlen kernels need no padding (a pad tail would be one more "sequence" to them)
    width = sum(sizes) if flash else padded_width(max(sum(sizes[i] for i in row) for row in rows), pad_to_multiple_of,
                                            length_buckets)
    shape = (len(rows), width)
    input_ids = torch.full(shape, pad_token_id, dtype=torch.long)
    labels = torch.full(shape, IGNORE_INDEX, dtype=torch.long)
    position_ids = torch.zeros(shape, dtype=torch.long)
    sequence_index = torch.full(shape, -1, dtype=torch.long)
    for r, row in enumerate(rows):
        start = 0
        for index in row:
            prompt, completion = sequences[index]
            end = start + sizes[index]
            input_ids[r, start:end] = torch.tensor(list(prompt) + list(completion), dtype=torch.long)
            labels[r, start + len(prompt) : end] = input_ids[r, start + len(prompt) : end]
            position_ids[r, start:end] = torch.arange(sizes[index])
            sequence_index[r, start:end] = index
            start = end
        position_ids[r, start:] = torch.arange(width - start)
    batch: dict[str, Any] = {
        "input_ids": input_ids,
        "position_ids": position_ids,
        "labels": labels,
        "sequence_index": sequence_index,
        "lengths": torch.tensor([len(c) for _, c in sequences], dtype=torch.long),
    }
    if flash:
        bounds = torch.tensor([0] + sizes, dtype=torch.int32).cumsum(0, dtype=torch.int32)
        batch.update(cu_seq_lens_q=bounds, cu_seq_lens_k=bounds.clone(),
                     max_length_q=max(sizes), max_length_k=max(sizes))
        return batch
    if attn_implementation == FLEX_ATTENTION:
        batch.update(block_ids=sequence_index.clone(), block_parts=torch.zeros_like(sequence_index))
        return batch
    mask = block_causal_mask(sequence_index)
    batch["attention_mask"] = mask if mask_dtype is None or mask_dtype == torch.bool else additive_mask(mask, mask_dtype)
    return batch


PREFIX_SHARING_SETTINGS = ("auto", True, False)

Groups = Sequence[tuple[Sequence[int], Sequence[Sequence[int]]]]


def resolve_prefix_sharing(setting: bool | str, attn_implementation: str | None) -> bool:
    """Whether batches share each prompt: ``"auto"`` wherever the attention takes a 4D mask.

    FlashAttention's varlen path takes sequence boundaries, not a mask, and cannot keep two
    completions that follow one prompt apart: ``"auto"`` turns sharing off there and ``True``
    is an error naming the fix.
    """
    if setting not in PREFIX_SHARING_SETTINGS:
        raise ConfigError(f"prefix_sharing={setting!r}: choose auto, true or false")
    supported = takes_layout(attn_implementation)
    if setting is True and not supported:
        raise ConfigError(f"prefix_sharing=true needs sdpa, eager or flex_attention, the model uses "
                          f"{attn_implementation!r}: set prefix_sharing=auto or false")
    return supported if setting == "auto" else bool(setting)


def _group_layout(prompt: Sequence[int], completions: Sequence[Sequence[int]], ids: Sequence[int]):
    """One group's tokens: ids, positions, labels, predicting columns, owners and parts (0 = prompt)."""
    n_prompt = len(prompt)
    tokens, positions, labels = list(prompt), list(range(n_prompt)), [IGNORE_INDEX] * n_prompt
    sources, owners, parts = [-1] * n_prompt, [-1] * n_prompt, [0] * n_prompt
    for part, (completion, index) in enumerate(zip(completions, ids), start=1):
        start = len(tokens)
        tokens += completion
        positions += range(n_prompt, n_prompt + len(completion))
        labels += completion
        sources += [n_prompt - 1] + list(range(start, start + len(completion) - 1))
        owners += [index] * len(completion)
        parts += [part] * len(completion)
    return tokens, positions, labels, sources, owners, parts


def collate_prefix_shared(
    groups: Groups,
    *,
    pad_token_id: int,
    sequence_ids: Sequence[Sequence[int]] | None = None,
    attn_implementation: str = "sdpa",
    mask_dtype: torch.dtype | None = None,
    padding_free: bool = True,
    max_row_tokens: int | None = None,
    pad_to_multiple_of: int | None = None,
    length_buckets: bool = False,
) -> dict[str, Any]:
    """Each prompt once, its completions after it (see the module's prefix-shared example).

    ``groups`` are (prompt, completions); ``sequence_ids`` give each completion's sequence
    index (default: numbered in order), which orders ``lengths`` and the scores of
    ``completion_logps``. ``padding_free`` packs groups into rows of ``max_row_tokens``
    (None: the longest group's tokens) as ``collate_padding_free`` packs sequences; else one
    group per row. ``mask_dtype`` and ``length_buckets`` as in ``collate_padding_free``.
    """
    if sequence_ids is None:
        counts = [len(completions) for _, completions in groups]
        starts = [sum(counts[:g]) for g in range(len(groups))]
        sequence_ids = [list(range(start, start + n)) for start, n in zip(starts, counts)]
    flat = {index: (prompt, completion) for (prompt, completions), ids in zip(groups, sequence_ids)
            for completion, index in zip(completions, ids)}
    _check_sequences([flat[i] for i in sorted(flat)] if flat else [])
    if sorted(flat) != list(range(sum(len(ids) for ids in sequence_ids))):
        raise RuntimeError(f"sequence_ids {sequence_ids} do not number the completions 0, 1, ... once each")
    if not takes_layout(attn_implementation):
        raise ConfigError(f"prefix-shared batches need sdpa, eager or flex_attention, not "
                          f"{attn_implementation!r}: set prefix_sharing=false")
    if attn_implementation == "eager" and (mask_dtype is None or not mask_dtype.is_floating_point):
        raise RuntimeError("eager attention needs an additive float mask: pass mask_dtype=<the model's dtype>")
    layouts = [_group_layout(prompt, completions, ids) for (prompt, completions), ids in zip(groups, sequence_ids)]
    sizes = [len(layout[0]) for layout in layouts]
    if padding_free:
        rows = pack_rows(sizes, max(sizes) if max_row_tokens is None else max_row_tokens)
    else:
        rows = [[g] for g in range(len(groups))]
    width = padded_width(max(sum(sizes[g] for g in row) for row in rows), pad_to_multiple_of, length_buckets)
    shape = (len(rows), width)
    input_ids = torch.full(shape, pad_token_id, dtype=torch.long)
    position_ids = torch.zeros(shape, dtype=torch.long)
    labels = torch.full(shape, IGNORE_INDEX, dtype=torch.long)
    predicted_from = torch.full(shape, -1, dtype=torch.long)
    sequence_index = torch.full(shape, -1, dtype=torch.long)
    block = torch.full(shape, -1, dtype=torch.long)  # the group a token belongs to (padding: -1)
    part = torch.zeros(shape, dtype=torch.long)      # 0: prompt (or padding), j: completion j
    pieces: list[list[tuple[int, int, tuple[tuple[int, int], ...]]]] = []
    for r, row in enumerate(rows):
        start = 0
        pieces.append([])
        for g in row:
            tokens, positions, group_labels, sources, owners, parts = layouts[g]
            pieces[r] += _group_pieces(start, [len(groups[g][0])] + [len(c) for c in groups[g][1]])
            end = start + sizes[g]
            input_ids[r, start:end] = torch.tensor(tokens)
            position_ids[r, start:end] = torch.tensor(positions)
            labels[r, start:end] = torch.tensor(group_labels)
            predicted_from[r, start:end] = torch.tensor([s + start if s >= 0 else -1 for s in sources])
            sequence_index[r, start:end] = torch.tensor(owners)
            block[r, start:end] = g
            part[r, start:end] = torch.tensor(parts)
            start = end
        position_ids[r, start:] = torch.arange(width - start)
        if start < width:
            pieces[r].append((start, width, ((start, width),)))
    lengths = torch.zeros(len(flat), dtype=torch.long)
    for index, (_, completion) in flat.items():
        lengths[index] = len(completion)
    batch: dict[str, Any] = {
        "input_ids": input_ids,
        "position_ids": position_ids,
        "labels": labels,
        "predicted_from": predicted_from,
        "sequence_index": sequence_index,
        "lengths": lengths,
        "attention_pieces": pieces,
    }
    if attn_implementation == FLEX_ATTENTION:
        batch.update(block_ids=block, block_parts=part)
        return batch
    mask = dense_layout_mask(block, part)
    batch["attention_mask"] = mask if mask_dtype is None or mask_dtype == torch.bool else additive_mask(mask, mask_dtype)
    return batch


def _group_pieces(start: int, sizes: Sequence[int]) -> list[tuple[int, int, tuple[tuple[int, int], ...]]]:
    """A group's attention pieces from ``start``: the prompt sees itself, each completion the prompt and itself."""
    prompt = (start, start + sizes[0])
    pieces = [(prompt[0], prompt[1], (prompt,))]
    begin = prompt[1]
    for size in sizes[1:]:
        span = (begin, begin + size)
        keys = ((prompt[0], span[1]),) if begin == prompt[1] else (prompt, span)  # contiguous: one span
        pieces.append((span[0], span[1], keys))
        begin = span[1]
    return pieces


def model_inputs(batch: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of a collated batch that go to the model's forward (not labels: we score ourselves).

    A FlexAttention batch's layout becomes its block mask here, on the batch's device.
    """
    keys = ("input_ids", "attention_mask", "position_ids", "attention_blocks",
            "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
    inputs = {k: batch[k] for k in keys if k in batch}
    if "block_ids" in batch:
        inputs["attention_mask"] = layout_block_mask(batch["block_ids"], batch["block_parts"])
    return inputs


@dataclass
class SequenceCollator:
    """Collates (prompt_ids, completion_ids) sequences in the padded or padding-free layout.

    Args:
        pad_token_id: id used to fill padded positions (never scored).
        padding_free: pack sequences into rows instead of padding one per row.
        attn_implementation: the model's ``config._attn_implementation``; picks the mask.
        mask_dtype: for padding-free with ``sdpa``: None for a boolean mask, or a float
            dtype for an additive one; ``eager`` needs the model's float dtype.
        max_row_tokens: padding-free row budget for mask-based attention (None: the batch's
            longest sequence; FlashAttention always gets one row).
        pad_to_multiple_of: round the padded width up (tensor-core friendly shapes).
        prefix_sharing: ``collate_groups`` puts each prompt once before its completions
            (the prefix-shared layout; needs ``sdpa`` or ``eager``, see
            ``resolve_prefix_sharing``); ``collate`` is unchanged by it.
        attention_blocks: batches with a 4D mask also carry ``attention_blocks``, each row's
            independent column spans, for ``sdpa_blocks`` attention
            (``align.scoring.block_attention``).
        length_buckets: pad each batch's width up to its length bucket (``bucket_width``), so
            a kernel compiled per shape compiles per bucket; None: on for FlexAttention (which
            transformers compiles for static shapes), off elsewhere (padding would only cost).
    """

    pad_token_id: int
    padding_free: bool = False
    attn_implementation: str = "sdpa"
    mask_dtype: torch.dtype | None = None
    max_row_tokens: int | None = None
    pad_to_multiple_of: int | None = None
    prefix_sharing: bool = False
    attention_blocks: bool = False
    length_buckets: bool | None = None

    def __post_init__(self) -> None:
        if self.length_buckets is None:
            self.length_buckets = self.attn_implementation == FLEX_ATTENTION
        if (self.padding_free or self.prefix_sharing) and self.attn_implementation == "eager" \
                and self.mask_dtype is None:
            self.mask_dtype = torch.float32

    def collate(self, sequences: Sequences) -> dict[str, Any]:
        """The batch for ``sequences`` in this collator's layout."""
        return self._with_blocks(self._collate(sequences))

    def _with_blocks(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Add ``attention_blocks`` (the prefix-shared layout's pieces, else per sequence) where asked for."""
        pieces = batch.pop("attention_pieces", None)
        mask = batch.get("attention_mask")
        if self.attention_blocks and mask is not None and mask.dim() == 4:
            batch["attention_blocks"] = row_blocks(batch["sequence_index"]) if pieces is None else pieces
        return batch

    def _collate(self, sequences: Sequences) -> dict[str, Any]:
        if not self.padding_free:
            return collate_padded(sequences, pad_token_id=self.pad_token_id,
                                  pad_to_multiple_of=self.pad_to_multiple_of, length_buckets=self.length_buckets)
        return collate_padding_free(
            sequences,
            pad_token_id=self.pad_token_id,
            attn_implementation=self.attn_implementation,
            mask_dtype=self.mask_dtype,
            max_row_tokens=self.max_row_tokens,
            pad_to_multiple_of=self.pad_to_multiple_of,
            length_buckets=self.length_buckets,
        )

    def collate_groups(self, groups: Groups, sequence_ids: Sequence[Sequence[int]] | None = None) -> dict[str, Any]:
        """Prompts with their completions: prefix-shared, or each (prompt, completion) on its own.

        Sequence indices number the completions group by group (or as ``sequence_ids`` say).
        """
        if self.prefix_sharing:
            return self._with_blocks(collate_prefix_shared(
                groups, pad_token_id=self.pad_token_id, sequence_ids=sequence_ids,
                attn_implementation=self.attn_implementation, mask_dtype=self.mask_dtype,
                padding_free=self.padding_free, max_row_tokens=self.max_row_tokens,
                pad_to_multiple_of=self.pad_to_multiple_of, length_buckets=self.length_buckets))
        flat = [((prompt, completion), index) for (prompt, completions), ids
                in zip(groups, sequence_ids or [[None] * len(c) for _, c in groups])
                for completion, index in zip(completions, ids)]
        if sequence_ids is not None:
            flat.sort(key=lambda item: item[1])
        return self.collate([sequence for sequence, _ in flat])


@dataclass
class PreferenceCollator(SequenceCollator):
    """Pair rows (``prompt_ids``, ``chosen_ids``, ``rejected_ids`` + numbers) → one batch.

    Sequences are ordered [chosen_0 … chosen_{B−1}, rejected_0 … rejected_{B−1}]. The
    per-sequence number fields in ``sequence_fields`` (output name → chosen/rejected
    columns) become float tensors of shape (2B,) in the same order, when the rows have them;
    a column present in some rows and missing in others is an error naming the row. With
    ``prefix_sharing`` a pair's prompt is there once, before its chosen and its rejected
    completion (the same sequence indices: ``i`` and ``B + i``).
    """

    sequence_fields: dict[str, tuple[str, str]] = field(default_factory=lambda: dict(PAIR_SEQUENCE_FIELDS))

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        size = len(features)
        batch = self.collate_groups([(f["prompt_ids"], (f["chosen_ids"], f["rejected_ids"])) for f in features],
                                    [(i, size + i) for i in range(size)])
        for name, (chosen_key, rejected_key) in self.sequence_fields.items():
            present = [chosen_key in f and f[chosen_key] is not None for f in features]
            if not any(present):
                continue
            if not all(present):
                row = present.index(False)
                raise InputError(f"batch row {row} (id {features[row].get('id')!r}) lacks {chosen_key!r}, "
                                 "which other rows have")
            values = [f[chosen_key] for f in features] + [f[rejected_key] for f in features]
            batch[name] = torch.tensor(values, dtype=torch.float64)
        return batch
