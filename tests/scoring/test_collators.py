"""Collators: the worked examples of the module docstring, tensor by tensor, and the mask rules."""

from __future__ import annotations

import pytest
import torch

from align.scoring.collators import (
    PreferenceCollator,
    block_causal_mask,
    collate_padded,
    collate_padding_free,
    pack_rows,
)

SEQUENCES = [([1, 5], [7, 8, 2]), ([1, 6, 9], [4, 2])]


def test_padded_layout_matches_the_docstring_example():
    batch = collate_padded(SEQUENCES, pad_token_id=0, pad_to_multiple_of=3)
    assert batch["input_ids"].tolist() == [[1, 5, 7, 8, 2, 0], [1, 6, 9, 4, 2, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0]]
    assert batch["labels"].tolist() == [[-100, -100, 7, 8, 2, -100], [-100, -100, -100, 4, 2, -100]]
    assert batch["sequence_index"].tolist() == [[0, 0, 0, 0, 0, -1], [1, 1, 1, 1, 1, -1]]
    assert batch["lengths"].tolist() == [3, 2]


def test_padding_free_sdpa_layout_matches_the_docstring_example():
    batch = collate_padding_free(SEQUENCES, pad_token_id=0, attn_implementation="sdpa", max_row_tokens=10)
    assert batch["input_ids"].tolist() == [[1, 5, 7, 8, 2, 1, 6, 9, 4, 2]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3, 4]]
    assert batch["labels"].tolist() == [[-100, -100, 7, 8, 2, -100, -100, -100, 4, 2]]
    assert batch["sequence_index"].tolist() == [[0, 0, 0, 0, 0, 1, 1, 1, 1, 1]]
    mask = batch["attention_mask"]
    assert mask.shape == (1, 1, 10, 10) and mask.dtype == torch.bool
    block = torch.ones(5, 5, dtype=torch.bool).tril()
    expected = torch.zeros(10, 10, dtype=torch.bool)
    expected[:5, :5], expected[5:, 5:] = block, block
    assert torch.equal(mask[0, 0], expected)


def test_eager_gets_an_additive_float_mask_and_refuses_a_boolean_one():
    with pytest.raises(ValueError, match="eager attention needs an additive float mask"):
        collate_padding_free(SEQUENCES, pad_token_id=0, attn_implementation="eager")
    batch = collate_padding_free(SEQUENCES, pad_token_id=0, attn_implementation="eager", mask_dtype=torch.float32,
                                 max_row_tokens=10)
    mask = batch["attention_mask"][0, 0]
    assert mask.dtype == torch.float32
    assert mask[6, 5] == 0 and mask[6, 4] == torch.finfo(torch.float32).min  # own block / other block
    assert mask[5, 6] == torch.finfo(torch.float32).min  # causal


def test_flash_attention_gets_varlen_kwargs_and_no_mask():
    batch = collate_padding_free(SEQUENCES, pad_token_id=0, attn_implementation="flash_attention_2",
                                 max_row_tokens=4, pad_to_multiple_of=8)
    assert "attention_mask" not in batch
    assert batch["input_ids"].shape == (1, 10)  # one row, no padding, whatever the budget
    assert batch["cu_seq_lens_q"].tolist() == [0, 5, 10] and batch["cu_seq_lens_q"].dtype == torch.int32
    assert batch["max_length_q"] == batch["max_length_k"] == 5


def test_unsupported_attention_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="padding_free=False"):
        collate_padding_free(SEQUENCES, pad_token_id=0, attn_implementation="sdpa_paged")


def test_rows_respect_the_token_budget_and_hold_every_sequence_once():
    sizes = [7, 3, 5, 9, 2, 4, 12]
    rows = pack_rows(sizes, 10)
    assert sorted(i for row in rows for i in row) == list(range(len(sizes)))
    for row in rows:
        assert sum(sizes[i] for i in row) <= 10 or len(row) == 1  # 12 > budget sits alone
    assert [6] in rows
    assert pack_rows(sizes, None) == [list(range(len(sizes)))]


def test_padded_tail_of_a_packed_row_is_its_own_block_so_no_query_row_is_empty():
    sequences = [([1], [2, 3, 4, 5]), ([1], [2]), ([1], [3])]
    batch = collate_padding_free(sequences, pad_token_id=0, attn_implementation="sdpa", max_row_tokens=5)
    assert batch["input_ids"].shape == (2, 5)
    mask = batch["attention_mask"]
    assert mask.any(dim=-1).all()  # every query attends to at least itself
    assert batch["sequence_index"][1].tolist() == [1, 1, 2, 2, -1]
    assert not mask[1, 0, 4, :4].any()  # the pad token sees no real token


def test_block_causal_mask_separates_segments():
    mask = block_causal_mask(torch.tensor([[0, 0, 1, 1, 1]]))[0, 0]
    assert mask.tolist() == [
        [True, False, False, False, False],
        [True, True, False, False, False],
        [False, False, True, False, False],
        [False, False, True, True, False],
        [False, False, True, True, True],
    ]


def test_preference_collator_puts_chosen_first_then_rejected_with_their_numbers():
    features = [
        {"id": "a", "prompt_ids": [1, 5], "chosen_ids": [7, 2], "rejected_ids": [8, 8, 2],
         "chosen_quantile": 1.0, "rejected_quantile": 0.1, "ref_chosen_logps": -3.0, "ref_rejected_logps": -5.0},
        {"id": "b", "prompt_ids": [1, 6], "chosen_ids": [4, 2], "rejected_ids": [2],
         "chosen_quantile": 0.9, "rejected_quantile": 0.0, "ref_chosen_logps": -2.5, "ref_rejected_logps": -1.0},
    ]
    batch = PreferenceCollator(pad_token_id=0)(features)
    assert batch["input_ids"].tolist() == [[1, 5, 7, 2, 0], [1, 6, 4, 2, 0], [1, 5, 8, 8, 2], [1, 6, 2, 0, 0]]
    assert batch["lengths"].tolist() == [2, 2, 3, 1]
    assert batch["quantiles"].tolist() == [1.0, 0.9, 0.1, 0.0]
    assert batch["ref_logps"].tolist() == [-3.0, -2.5, -5.0, -1.0]
    assert batch["ref_logps"].dtype == torch.float64


def test_preference_collator_names_the_row_missing_a_field():
    features = [
        {"id": "a", "prompt_ids": [1], "chosen_ids": [2], "rejected_ids": [3], "chosen_quantile": 1.0,
         "rejected_quantile": 0.0},
        {"id": "b", "prompt_ids": [1], "chosen_ids": [2], "rejected_ids": [3]},
    ]
    with pytest.raises(ValueError, match=r"row 1 \(id 'b'\) lacks 'chosen_quantile'"):
        PreferenceCollator(pad_token_id=0)(features)


def test_empty_completion_is_refused():
    with pytest.raises(ValueError, match="empty completion"):
        collate_padded([([1, 2], [])], pad_token_id=0)


def test_default_rows_are_as_long_as_the_longest_sequence():
    """Attention then never costs more than padded rows, while short sequences fill the padding."""
    sequences = [([1], [2] * 9), ([1], [3] * 3), ([1], [4] * 5)]
    batch = collate_padding_free(sequences, pad_token_id=0, attn_implementation="sdpa")
    assert batch["input_ids"].shape == (2, 10)  # [10] and [6 + 4], instead of 3 padded rows of 10
    assert batch["sequence_index"].tolist() == [[0] * 10, [1] * 4 + [2] * 6]
