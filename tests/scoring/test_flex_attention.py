"""FlexAttention batches: the packed and prefix-shared layouts as block masks, equal to masked sdpa.

The block mask must keep exactly what the dense 4D masks keep (checked element by element
for packed, prefix-shared, padded-tail and multi-row batches), and a model on
``flex_attention`` must give the log-probs of the same model on ``sdpa`` with the padded
layout, for Llama and Apertus. torch 2.13 has FlexAttention's forward on CPU but not its
backward: the gradient test runs where the platform has it and otherwise skips with the
error torch raises (tests/conftest.py allows exactly that skip).
"""

from __future__ import annotations

import pytest
import torch

from align.errors import ConfigError
from align.scoring import (
    SequenceCollator,
    completion_logps,
    flex,
    model_inputs,
    resolve_prefix_sharing,
)
from align.scoring.flex import (
    FLEX_ATTENTION,
    dense_layout_mask,
    layout_mask_mod,
    resolve_attn_implementation,
)
from align.testing.tiny import ARCHITECTURES

GROUPS = [
    ([1, 5, 7, 9], ([3, 4, 5], [6, 7])),
    ([2, 8], ([9, 9, 9, 9], [4])),
    ([5, 6, 7, 8, 9, 10], ([3],)),
    ([11, 12, 13], ([14, 15], [16], [17, 18, 19])),
]
# the same groups as a model's token ids: past the special tokens (pad is 3)
MODEL_GROUPS = [([t + 3 for t in prompt], tuple([t + 3 for t in c] for c in completions)) for prompt, completions in GROUPS]


def collate(attn: str, *, padding_free: bool, prefix_sharing: bool, max_row_tokens: int | None = None):
    """The groups in a layout at their own width (no length buckets: sdpa's and flex's batches compare)."""
    return SequenceCollator(0, padding_free=padding_free, attn_implementation=attn, prefix_sharing=prefix_sharing,
                            max_row_tokens=max_row_tokens, length_buckets=False).collate_groups(GROUPS)


LAYOUTS = [
    pytest.param(dict(padding_free=True, prefix_sharing=False), id="packed"),
    pytest.param(dict(padding_free=True, prefix_sharing=False, max_row_tokens=12), id="packed-rows"),
    pytest.param(dict(padding_free=True, prefix_sharing=True), id="prefix-shared-packed"),
    pytest.param(dict(padding_free=False, prefix_sharing=True), id="prefix-shared-padded"),
]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_block_mask_keeps_exactly_what_the_dense_mask_keeps(layout):
    from torch.nn.attention.flex_attention import create_mask

    dense = collate("sdpa", **layout)
    found = collate(FLEX_ATTENTION, **layout)
    assert "attention_mask" not in found
    for key in ("input_ids", "position_ids", "labels", "sequence_index", "lengths"):
        torch.testing.assert_close(found[key], dense[key], rtol=0, atol=0)
    rows, width = found["block_ids"].shape
    mask = create_mask(layout_mask_mod(found["block_ids"], found["block_parts"]), rows, 1, width, width, device="cpu")
    assert torch.equal(mask, dense["attention_mask"])
    assert torch.equal(dense_layout_mask(found["block_ids"], found["block_parts"]), dense["attention_mask"])
    block_mask = model_inputs(found)["attention_mask"]
    assert tuple(block_mask.shape) == (rows, 1, width, width)


def test_a_prefix_shared_completion_sees_its_prompt_and_itself_only():
    batch = collate(FLEX_ATTENTION, padding_free=True, prefix_sharing=True, max_row_tokens=16)
    mask = dense_layout_mask(batch["block_ids"], batch["block_parts"])[0, 0]
    # the first group: prompt 0..3, chosen 4..6, rejected 7..8
    assert mask[6].nonzero().flatten().tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert mask[8].nonzero().flatten().tolist() == [0, 1, 2, 3, 7, 8]
    assert mask[3].nonzero().flatten().tolist() == [0, 1, 2, 3]
    assert mask[9].nonzero().flatten().tolist() == [9]  # the next group's prompt: nothing of the first
    assert mask[15].nonzero().flatten().tolist() == [9, 10, 15]


def test_prefix_sharing_stays_on_with_flex_attention_and_auto_resolves_by_device(monkeypatch):
    assert resolve_prefix_sharing("auto", FLEX_ATTENTION) is True
    assert resolve_prefix_sharing(True, FLEX_ATTENTION) is True
    assert resolve_prefix_sharing("auto", "flash_attention_2") is False
    with pytest.raises(ConfigError, match="flex_attention"):
        resolve_prefix_sharing(True, "flash_attention_2")
    assert resolve_attn_implementation("auto", cuda=False) == "sdpa"
    monkeypatch.setattr(flex, "flash_attention_installed", lambda: False)
    assert resolve_attn_implementation("auto", cuda=True) == FLEX_ATTENTION
    monkeypatch.setattr(flex, "flash_attention_installed", lambda: True)
    assert resolve_attn_implementation("auto", cuda=True) == "flash_attention_2"
    assert resolve_attn_implementation("auto", cuda=False) == "sdpa"
    for given in ("sdpa", "eager", FLEX_ATTENTION, "flash_attention_2", None):
        assert resolve_attn_implementation(given, cuda=True) == given


@pytest.fixture(autouse=True)
def static_flex_compiles():
    """Each batch shape compiled on its own: torch 2.13's CPU code for dynamic-shape FlexAttention
    does not compile (inductor emits an undeclared ``cur_kvSplitSize``); GPUs use Triton's."""
    import torch._dynamo.config as dynamo_config

    with dynamo_config.patch(automatic_dynamic_shapes=False):
        yield


def flex_pair(tokenizer, architecture: str):
    """The same random weights on sdpa and on flex_attention."""
    build = ARCHITECTURES[architecture]
    sdpa = build(tokenizer, attn_implementation="sdpa").eval()
    on_flex = build(tokenizer, attn_implementation=FLEX_ATTENTION).eval()
    on_flex.load_state_dict(sdpa.state_dict())
    assert on_flex.config._attn_implementation == FLEX_ATTENTION
    return sdpa, on_flex


def flex_forward(model, batch, **options):
    """``completion_logps`` on flex; a torch build without FlexAttention's forward here skips, naming it."""
    try:
        return completion_logps(model, batch, **options)
    except NotImplementedError as exc:  # pragma: no cover - torch 2.13 has the CPU forward
        pytest.skip(f"FlexAttention forward is not available on this platform: {exc}")


@pytest.mark.parametrize("architecture", ["llama", "apertus"])
def test_flex_log_probs_equal_masked_sdpa_in_every_layout(tiny_tokenizer, architecture):
    sdpa, on_flex = flex_pair(tiny_tokenizer, architecture)
    groups = MODEL_GROUPS
    padded = SequenceCollator(tiny_tokenizer.pad_token_id).collate_groups(groups)
    with torch.no_grad():
        expected = completion_logps(sdpa, padded)
        for padding_free, prefix_sharing in ((True, False), (True, True), (False, True)):
            collator = SequenceCollator(tiny_tokenizer.pad_token_id, padding_free=padding_free,
                                        attn_implementation=FLEX_ATTENTION, prefix_sharing=prefix_sharing)
            batch = collator.collate_groups(groups)
            for tiled in (True, False):
                found = flex_forward(on_flex, batch, tiled=tiled)
                torch.testing.assert_close(found, expected, rtol=0, atol=1e-4)
        # the mask matters: completions that see each other give other numbers
        leaky = SequenceCollator(tiny_tokenizer.pad_token_id, padding_free=True, attn_implementation=FLEX_ATTENTION,
                                 prefix_sharing=True).collate_groups(groups)
        leaky["block_parts"] = torch.zeros_like(leaky["block_parts"])
        assert (flex_forward(on_flex, leaky) - expected).abs().max() > 1e-3


def test_packed_sft_rows_on_flex_see_only_their_own_sequence(tiny_tokenizer):
    """SFT's padding-free rows carry no mask: transformers builds flex's block mask from the restarting
    position_ids (as for sdpa), so each sequence gets its own logits."""
    _, on_flex = flex_pair(tiny_tokenizer, "llama")
    first, second = torch.tensor([[5, 6, 7, 8, 9]]), torch.tensor([[10, 11, 12]])
    with torch.no_grad():
        packed = on_flex(input_ids=torch.cat([first, second], 1), position_ids=torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2]]),
                         use_cache=False).logits
        alone = torch.cat([on_flex(input_ids=first, use_cache=False).logits,
                           on_flex(input_ids=second, use_cache=False).logits], 1)
    torch.testing.assert_close(packed, alone, rtol=0, atol=1e-5)


def test_flex_gradients_equal_masked_sdpa_where_torch_has_the_backward(tiny_tokenizer):
    sdpa, on_flex = flex_pair(tiny_tokenizer, "llama")
    groups = MODEL_GROUPS
    padded = SequenceCollator(tiny_tokenizer.pad_token_id).collate_groups(groups)
    batch = SequenceCollator(tiny_tokenizer.pad_token_id, padding_free=True, attn_implementation=FLEX_ATTENTION,
                             prefix_sharing=True).collate_groups(groups)
    weights = torch.linspace(0.5, 1.5, len(padded["lengths"]))
    (completion_logps(sdpa, padded) * weights).sum().backward()
    try:
        (completion_logps(on_flex, batch) * weights).sum().backward()
    except NotImplementedError as exc:
        assert "backward" in str(exc) and next(on_flex.parameters()).device.type == "cpu"
        pytest.skip(f"FlexAttention backward is not implemented on CPU in torch {torch.__version__}: {exc}")
    for (name, a), (_, b) in zip(sdpa.named_parameters(), on_flex.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-5, msg=name)
