"""Scoring: (prompt, completion) token sequences, their batches, and their log-probs.

Layer 2 (docs/architecture.md): used by the reference log-prob pass (`align.logprobs`),
the preference trainer and the KL estimator (`align.eval.kl`), and imports none of them.

- `align.scoring.encoding`: a pair row (or single-completion row) as prompt and
  completion token ids, ``encode_record``: THE tokenization of preference training.
- `align.scoring.collators`: padded, padding-free and prefix-shared batches of such
  sequences (``SequenceCollator``, ``PreferenceCollator``).
- `align.scoring.block_attention`: ``sdpa_blocks``, attention over each block of a packed
  row alone (CPU; the same numbers as the masked grid).
- `align.scoring.flex`: the same layouts on torch's FlexAttention (block masks; GPUs), and
  ``attn_implementation: auto``.
- `align.scoring.logps`: ``completion_logps`` (Σ log π over each completion, float64) and
  the token-level kernels under it (tiled LM head).
"""

from align.scoring.collators import (
    IGNORE_INDEX,
    PreferenceCollator,
    SequenceCollator,
    collate_padded,
    collate_padding_free,
    collate_prefix_shared,
    is_flash_attention,
    mask_dtype_for,
    model_inputs,
    resolve_prefix_sharing,
    takes_4d_mask,
    takes_layout,
)
from align.scoring.encoding import (
    OVER_MAX_LENGTH_POLICIES,
    PAIR_NAMES,
    SINGLE_NAMES,
    TRUNCATED_POLICIES,
    OverMaxLengthError,
    check_over_max_length_policy,
    check_truncated_policy,
    completion_names,
    count_truncated,
    encode_record,
    fit_to_max_length,
    is_over_max_length,
    is_truncated_completion,
)
from align.scoring.logps import (
    completion_logps,
    model_logits,
    tiled_head,
    tiled_token_logps,
    token_logps_at,
    unwrap_model,
)

__all__ = [
    "IGNORE_INDEX",
    "OVER_MAX_LENGTH_POLICIES",
    "PAIR_NAMES",
    "SINGLE_NAMES",
    "TRUNCATED_POLICIES",
    "OverMaxLengthError",
    "PreferenceCollator",
    "SequenceCollator",
    "check_over_max_length_policy",
    "check_truncated_policy",
    "collate_padded",
    "collate_padding_free",
    "collate_prefix_shared",
    "completion_logps",
    "completion_names",
    "count_truncated",
    "encode_record",
    "fit_to_max_length",
    "is_flash_attention",
    "is_over_max_length",
    "is_truncated_completion",
    "mask_dtype_for",
    "model_inputs",
    "model_logits",
    "resolve_prefix_sharing",
    "takes_4d_mask",
    "takes_layout",
    "tiled_head",
    "tiled_token_logps",
    "token_logps_at",
    "unwrap_model",
]
