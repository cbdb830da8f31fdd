"""Length buckets: a batch's width padded up to one of a few sizes, so that FlexAttention, which
transformers compiles for static shapes, compiles once per bucket rather than once per batch.

The buckets are checked by hand and by their bounds (padding at most a quarter, or under one
128-token tile), the collators use them where asked (by default only on FlexAttention), the
log-probs do not change, and a pass over batches of different lengths on FlexAttention
compiles one graph where it compiled one per width. On CPU, torch 2.13 compiles
FlexAttention for static shapes only (tests/scoring/test_flex_attention.py), as transformers
asks for in training on GPUs, so the count here is the count a training run would see.
"""

from __future__ import annotations

import pytest
import torch

from align.scoring import SequenceCollator, completion_logps
from align.scoring.collators import bucket_width
from align.scoring.flex import FLEX_ATTENTION
from align.testing.tiny import ARCHITECTURES


@pytest.mark.parametrize("tokens, bucket", [
    (1, 128), (128, 128), (129, 256), (300, 384), (512, 512), (513, 640), (641, 768), (897, 1024),
    (1025, 1280), (1500, 1536), (1537, 1792), (2049, 2560), (4096, 4096), (4097, 5120), (30000, 32768),
])
def test_buckets_by_hand(tokens, bucket):
    assert bucket_width(tokens) == bucket


def test_a_bucket_holds_the_batch_with_at_most_a_quarter_or_one_tile_of_padding():
    buckets = set()
    for tokens in range(1, 40_000):
        bucket = bucket_width(tokens)
        assert bucket >= tokens and bucket % 128 == 0
        assert bucket - tokens < max(tokens / 4, 128), tokens
        buckets.add(bucket)
    assert len({b for b in buckets if b <= 32_768}) == 28  # four per doubling past 512


GROUPS = [([5, 6, 7, 8], ([9, 10, 11], [12])), ([13] * 20, ([14] * 7, [15] * 30))]


@pytest.mark.parametrize("layout", [dict(), dict(padding_free=True), dict(prefix_sharing=True),
                                    dict(prefix_sharing=True, padding_free=True)])
def test_flex_batches_are_bucketed_by_default_and_sdpa_batches_are_not(layout):
    natural = SequenceCollator(0, attn_implementation="sdpa", **layout).collate_groups(GROUPS)
    flex = SequenceCollator(0, attn_implementation=FLEX_ATTENTION, **layout).collate_groups(GROUPS)
    asked = SequenceCollator(0, attn_implementation="sdpa", length_buckets=True, **layout).collate_groups(GROUPS)
    width = natural["input_ids"].shape[1]
    assert width < 128
    assert flex["input_ids"].shape == asked["input_ids"].shape == (natural["input_ids"].shape[0], 128)
    off = SequenceCollator(0, attn_implementation=FLEX_ATTENTION, length_buckets=False, **layout)
    assert off.collate_groups(GROUPS)["input_ids"].shape[1] == width
    for key in ("input_ids", "labels", "sequence_index"):  # the batch itself, then padding
        torch.testing.assert_close(asked[key][:, :width], natural[key], rtol=0, atol=0)
    assert (asked["labels"][:, width:] == -100).all() and (asked["sequence_index"][:, width:] == -1).all()


@pytest.mark.parametrize("layout", [dict(), dict(padding_free=True), dict(prefix_sharing=True, padding_free=True)])
def test_the_log_probs_do_not_change(tiny_tokenizer, layout):
    model = ARCHITECTURES["llama"](tiny_tokenizer, attn_implementation="sdpa").eval()
    groups = [([t + 3 for t in prompt], tuple([t + 3 for t in c] for c in completions)) for prompt, completions in GROUPS]
    with torch.no_grad():
        natural = completion_logps(model, SequenceCollator(tiny_tokenizer.pad_token_id, **layout).collate_groups(groups))
        bucketed = completion_logps(model, SequenceCollator(tiny_tokenizer.pad_token_id, length_buckets=True,
                                                            **layout).collate_groups(groups))
    torch.testing.assert_close(bucketed, natural, rtol=0, atol=1e-5)


@pytest.fixture
def static_shapes():
    """FlexAttention compiled per shape, as transformers compiles it for training (and as torch 2.13 must on CPU)."""
    import torch._dynamo
    import torch._dynamo.config as dynamo_config

    torch._dynamo.reset()
    with dynamo_config.patch(automatic_dynamic_shapes=False):
        yield
    torch._dynamo.reset()


def graphs_compiled(model, tokenizer, length_buckets: bool) -> int:
    from torch._dynamo.utils import counters

    collator = SequenceCollator(tokenizer.pad_token_id, attn_implementation=FLEX_ATTENTION, padding_free=True,
                                prefix_sharing=True, length_buckets=length_buckets)
    before = counters["stats"]["unique_graphs"]
    for prompt_tokens in (5, 9):  # two batches of two natural widths, both in the 128 bucket
        with torch.no_grad():
            completion_logps(model, collator.collate_groups([([5] * prompt_tokens, ([6] * 3, [7] * 2))]))
    return counters["stats"]["unique_graphs"] - before


def test_flex_compiles_once_per_bucket_not_once_per_batch(tiny_tokenizer, static_shapes):
    model = ARCHITECTURES["llama"](tiny_tokenizer, attn_implementation=FLEX_ATTENTION).eval()
    try:
        assert graphs_compiled(model, tiny_tokenizer, length_buckets=True) == 1
    except NotImplementedError as exc:  # pragma: no cover - torch 2.13 has the CPU forward
        pytest.skip(f"FlexAttention forward is not available on this platform: {exc}")
    assert graphs_compiled(model, tiny_tokenizer, length_buckets=False) == 2


def test_the_trainer_and_the_pass_bucket_on_flex(tiny_tokenizer):
    from align.trainers.preference_config import PreferenceConfig
    from align.trainers.preference_trainer import PreferenceTrainer

    model = ARCHITECTURES["llama"](tiny_tokenizer, attn_implementation=FLEX_ATTENTION)
    args = PreferenceConfig(output_dir="unused", use_cpu=True, report_to="none")
    assert PreferenceTrainer._build_collator(model, tiny_tokenizer, args).length_buckets is True
    model = ARCHITECTURES["llama"](tiny_tokenizer, attn_implementation="sdpa")
    assert PreferenceTrainer._build_collator(model, tiny_tokenizer, args).length_buckets is False


# --------------------------------------------------------------------------- SFT (TRL's collator)


SFT_EXAMPLES = [{"input_ids": [5, 6, 7, 8, 9, 10], "labels": [-100, -100, -100, 8, 9, 10]},
                {"input_ids": [11, 12, 13, 14], "labels": [-100, -100, 13, 14]}]


def sft_collator(tokenizer, padding_free: bool, pad_to_multiple_of: int | None = None):
    """TRL's SFT collator, padding-free or padded."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    return DataCollatorForLanguageModeling(pad_token_id=tokenizer.pad_token_id, padding_free=padding_free,
                                           pad_to_multiple_of=pad_to_multiple_of)


@pytest.mark.parametrize("padding_free", [True, False])
def test_an_sft_batch_padded_to_its_bucket_is_the_batch_trl_pads_to_that_width(tiny_tokenizer, padding_free):
    from align.trainers.sft_trainer import BucketedBatches

    collator = sft_collator(tiny_tokenizer, padding_free)
    batch = collator(SFT_EXAMPLES)
    padded = BucketedBatches(collator)(SFT_EXAMPLES)
    expected = sft_collator(tiny_tokenizer, padding_free, pad_to_multiple_of=128)(SFT_EXAMPLES)  # TRL's, to 128
    assert padded.keys() == expected.keys()
    for key, value in expected.items():
        if isinstance(value, torch.Tensor):
            torch.testing.assert_close(padded[key], value, rtol=0, atol=0, msg=key)
        else:
            assert padded[key] == value, key
    assert collator.pad_to_multiple_of is None  # the collator it wraps is left as it was
    model = ARCHITECTURES["llama"](tiny_tokenizer, attn_implementation="sdpa").eval()
    with torch.no_grad():
        torch.testing.assert_close(model(**padded).loss, model(**batch).loss, rtol=0, atol=1e-6)


@pytest.mark.parametrize("attn, bucketed", [(FLEX_ATTENTION, True), ("sdpa", False)])
def test_the_sft_trainer_buckets_on_flex(tokenizer, tmp_path, attn, bucketed):
    from datasets import Dataset

    from align.chat import install_format
    from align.trainers.sft_config import SFTConfig
    from align.trainers.sft_trainer import BucketedBatches, SFTTrainer

    install_format(tokenizer)
    rows = Dataset.from_list([{"id": f"r{i}", "messages": [{"role": "user", "content": f"Say {i}."},
                                                           {"role": "assistant", "content": f"{i}."}]}
                              for i in range(4)])
    args = SFTConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[], max_steps=1,
                     per_device_train_batch_size=2, chat_date="2025-09-01", max_length=512, packing=True,
                     packing_strategy="bfd")
    trainer = SFTTrainer(model=ARCHITECTURES["llama"](tokenizer, attn_implementation=attn), args=args,
                         train_dataset=rows, processing_class=tokenizer)
    assert isinstance(trainer.data_collator, BucketedBatches) is bucketed
    features = [trainer.train_dataset[i] for i in range(min(2, len(trainer.train_dataset)))]
    natural = getattr(trainer.data_collator, "collator", trainer.data_collator)(features)["input_ids"].shape[1]
    width = trainer.data_collator(features)["input_ids"].shape[1]
    assert width == (bucket_width(natural) if bucketed else natural) and natural % 128 != 0
