"""The prefix-shared layout: each prompt once, its completions after it, kept apart by the mask.

Checked against the present padded layout (one right-padded row per prompt + completion),
the definition of what is scored: the collator's worked example tensor by tensor; the
log-probs of the reference pass and of ``completion_logps`` (sdpa and eager, padded and
padding-free rows, tiled head or the model's own, prompts of mixed lengths, groups of 1 to 3
completions); and the trainer's per-sample losses and gradients, QRPO and DPO, full
fine-tuning and LoRA, to fp32 tolerance.
"""

from __future__ import annotations

import copy
import random

import pytest
import torch

from align.errors import ConfigError
from align.logprobs import compute_ref_logprobs, load_ref_logprobs
from align.scoring import (
    SequenceCollator,
    collate_prefix_shared,
    completion_logps,
    encode_record,
    resolve_prefix_sharing,
)
from align.testing.tiny import build_causal_lm, corpus_text
from align.trainers import PreferenceConfig, PreferenceTrainer

DATE = "2025-09-01"
MAX_LENGTH = 256
PAIRS = 6


def make_rows(count: int, seed: int = 0) -> list[dict]:
    """Pairs whose prompts (1 to 40 words) and completions (1 to 30 words) differ in length."""
    rng = random.Random(seed)
    words = corpus_text().split()

    def text(lo: int, hi: int) -> str:
        return " ".join(rng.choice(words) for _ in range(rng.randint(lo, hi)))

    return [{"id": f"p{i}", "messages": [{"role": "user", "content": text(1, 40)}],
             "chosen": text(1, 30), "rejected": text(1, 30), "chosen_quantile": rng.choice([0.7, 1.0]),
             "rejected_quantile": rng.choice([0.0, 0.3])} for i in range(count)]


# --------------------------------------------------------------------------- the layout


def test_layout_matches_the_docstring_example():
    batch = collate_prefix_shared([([1, 5], ([7, 8, 2], [4, 2]))], pad_token_id=0)
    assert batch["input_ids"].tolist() == [[1, 5, 7, 8, 2, 4, 2]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 4, 2, 3]]
    assert batch["labels"].tolist() == [[-100, -100, 7, 8, 2, 4, 2]]
    assert batch["predicted_from"].tolist() == [[-1, -1, 1, 2, 3, 1, 5]]
    assert batch["sequence_index"].tolist() == [[-1, -1, 0, 0, 0, 1, 1]]
    assert batch["lengths"].tolist() == [3, 2]
    mask = batch["attention_mask"]
    assert mask.shape == (1, 1, 7, 7) and mask.dtype == torch.bool
    seen = [[k for k in range(7) if mask[0, 0, q, k]] for q in range(7)]
    assert seen == [[0], [0, 1], [0, 1, 2], [0, 1, 2, 3], [0, 1, 2, 3, 4], [0, 1, 5], [0, 1, 5, 6]]


def test_padded_rows_hold_one_prompt_each_and_the_padding_is_its_own_block():
    groups = [([1, 5], ([7, 8, 2], [4, 2])), ([1, 6, 9], ([3], [4, 4]))]
    batch = collate_prefix_shared(groups, pad_token_id=0, padding_free=False, sequence_ids=[(0, 2), (1, 3)])
    assert batch["input_ids"].tolist() == [[1, 5, 7, 8, 2, 4, 2], [1, 6, 9, 3, 4, 4, 0]]
    assert batch["position_ids"][1].tolist() == [0, 1, 2, 3, 3, 4, 0]
    assert batch["sequence_index"][1].tolist() == [-1, -1, -1, 1, 3, 3, -1]
    assert batch["lengths"].tolist() == [3, 1, 2, 2]  # by sequence index: chosen 0, chosen 1, rejected 0, rejected 1
    mask = batch["attention_mask"][1, 0]
    assert mask[6].tolist() == [False] * 6 + [True]  # the padding sees itself only: no all-masked query row
    assert mask[4].tolist() == [True, True, True, False, True, False, False]  # 2nd completion: prompt + itself


def test_packed_rows_keep_groups_apart_and_eager_gets_an_additive_mask():
    groups = [([1, 5], ([7, 8, 2], [4, 2])), ([1], ([3], [4]))]
    batch = collate_prefix_shared(groups, pad_token_id=0, attn_implementation="eager", mask_dtype=torch.float32,
                                  max_row_tokens=16)
    assert batch["input_ids"].tolist() == [[1, 5, 7, 8, 2, 4, 2, 1, 3, 4]]
    assert batch["predicted_from"][0, 7:].tolist() == [-1, 7, 7]  # the 2nd group's prompt predicts both
    mask = batch["attention_mask"][0, 0]
    assert mask.dtype == torch.float32
    assert mask[9, 7] == 0 and mask[9, 8] == torch.finfo(torch.float32).min and mask[9, 1] < 0


def test_prefix_sharing_setting_follows_the_attention_implementation():
    assert resolve_prefix_sharing("auto", "sdpa") and resolve_prefix_sharing("auto", "eager")
    assert not resolve_prefix_sharing("auto", "flash_attention_2")
    assert not resolve_prefix_sharing(False, "sdpa")
    with pytest.raises(ConfigError, match="prefix_sharing=auto or false"):
        resolve_prefix_sharing(True, "flash_attention_2")
    with pytest.raises(ConfigError, match="choose auto, true or false"):
        resolve_prefix_sharing("yes", "sdpa")
    with pytest.raises(ConfigError, match="prefix_sharing"):
        PreferenceConfig(output_dir="unused", use_cpu=True, prefix_sharing="sometimes")
    assert PreferenceConfig(output_dir="unused", use_cpu=True, prefix_sharing="false").prefix_sharing is False


# --------------------------------------------------------------------------- log-probs


@pytest.fixture(scope="module")
def groups(tiny_tokenizer):
    """Groups of 2 (pairs), 1 and 3 completions over prompts of mixed lengths."""
    encoded = [encode_record(tiny_tokenizer, row, max_length=MAX_LENGTH, chat_date=DATE) for row in make_rows(7)]
    out = [(e["prompt_ids"], (e["chosen_ids"], e["rejected_ids"])) for e in encoded[:5]]
    out.append((encoded[5]["prompt_ids"], (encoded[5]["chosen_ids"],)))
    out.append((encoded[6]["prompt_ids"], (encoded[6]["chosen_ids"], encoded[6]["rejected_ids"],
                                           encoded[0]["chosen_ids"])))
    assert len({len(prompt) for prompt, _ in out}) >= 5
    return out


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_log_probs_equal_the_padded_layout(tiny_tokenizer, groups, attn):
    model = build_causal_lm(tiny_tokenizer, attn_implementation=attn).eval()
    padded = SequenceCollator(tiny_tokenizer.pad_token_id).collate_groups(groups)
    with torch.no_grad():
        expected = completion_logps(model, padded)
        for padding_free in (False, True):
            collator = SequenceCollator(tiny_tokenizer.pad_token_id, padding_free=padding_free,
                                        attn_implementation=attn, prefix_sharing=True, max_row_tokens=400)
            batch = collator.collate_groups(groups)
            assert batch["input_ids"].ne(tiny_tokenizer.pad_token_id).sum() < padded["attention_mask"].sum()
            for tiled in (True, False):
                found = completion_logps(model, batch, tiled=tiled)
                torch.testing.assert_close(found, expected, rtol=0, atol=1e-4)


def test_reference_pass_writes_the_same_log_probs_in_every_layout(tiny_tokenizer, tmp_path):
    model = build_causal_lm(tiny_tokenizer)
    rows = make_rows(PAIRS)
    outputs = {}
    for name, options in {"padded": {"prefix_sharing": False}, "shared": {},
                          "shared_packed": {"padding_free": True}}.items():
        compute_ref_logprobs(rows, model, tiny_tokenizer, batch_size=4, max_length=MAX_LENGTH, chat_date=DATE,
                             output_dir=tmp_path / name, **options)
        outputs[name] = load_ref_logprobs(tmp_path / name, rows)
    for name in ("shared", "shared_packed"):
        for row, expected in zip(outputs[name], outputs["padded"]):
            for column in ("ref_chosen_logps", "ref_rejected_logps"):
                assert row[column] == pytest.approx(expected[column], abs=1e-4)
            assert row["chosen_length"] == expected["chosen_length"]


# --------------------------------------------------------------------------- losses and gradients


@pytest.fixture(scope="module")
def reference(tiny_tokenizer):
    return build_causal_lm(tiny_tokenizer)


@pytest.fixture(scope="module")
def data(reference, tiny_tokenizer, tmp_path_factory):
    rows = make_rows(PAIRS, seed=1)
    out = tmp_path_factory.mktemp("ref")
    compute_ref_logprobs(rows, reference, tiny_tokenizer, batch_size=PAIRS, max_length=MAX_LENGTH,
                         output_dir=out, chat_date=DATE, prefix_sharing=False)
    return load_ref_logprobs(out, rows)


def losses_and_gradients(reference, data, tokenizer, tmp_path, *, lora: bool, **options):
    """Per-sample losses and the gradients of their mean, for one batch of all PAIRS pairs."""
    policy = copy.deepcopy(reference)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM",
                                 init_lora_weights=False)
    config = PreferenceConfig(output_dir=str(tmp_path / "run"), per_device_train_batch_size=PAIRS, max_steps=1,
                              report_to="none", use_cpu=True, max_length=MAX_LENGTH, chat_date=DATE,
                              save_strategy="no", disable_tqdm=True, seed=0, **options)
    trainer = PreferenceTrainer(policy, config, train_dataset=data, processing_class=tokenizer,
                                peft_config=peft_config)
    batch = trainer._prepare_inputs(trainer.data_collator([trainer.train_dataset[i] for i in range(PAIRS)]))
    model = trainer.model
    model.eval()  # no dropout: the layouts must agree exactly
    losses, _ = trainer.batch_losses(model, batch)
    losses.double().mean().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}
    return trainer.data_collator.prefix_sharing, losses.detach(), grads


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("loss_type", ["qrpo", "dpo"])
def test_losses_and_gradients_equal_the_padded_layout(reference, data, tiny_tokenizer, tmp_path, loss_type, lora):
    shared, expected, expected_grads = losses_and_gradients(
        reference, data, tiny_tokenizer, tmp_path, lora=lora, loss_type=loss_type, padding_free=False,
        prefix_sharing=False)
    assert not shared
    for padding_free in (False, True):
        shared, losses, grads = losses_and_gradients(reference, data, tiny_tokenizer, tmp_path, lora=lora,
                                                     loss_type=loss_type, padding_free=padding_free)
        assert shared  # "auto" on sdpa
        torch.testing.assert_close(losses, expected, rtol=1e-5, atol=1e-6)
        assert grads.keys() == expected_grads.keys() and len(grads) > 0
        for name, grad in grads.items():
            assert grad.abs().max() > 0, name
            torch.testing.assert_close(grad, expected_grads[name], rtol=1e-4, atol=1e-6, msg=name)


# --------------------------------------------------------------------------- attention over blocks


def test_block_attention_equals_the_masked_grid(tiny_tokenizer, groups):
    from align.scoring.block_attention import row_blocks, use_block_attention

    assert row_blocks(torch.tensor([[0, 0, 1, 1, 1, -1]])) == [[(0, 2, ((0, 2),)), (2, 5, ((2, 5),)),
                                                                 (5, 6, ((5, 6),))]]
    shared = SequenceCollator(0, prefix_sharing=True, attention_blocks=True).collate_groups(
        [([1, 5], ([7, 8, 2], [4, 2]))])
    # the prompt sees itself; chosen the prompt and itself (one span); rejected the prompt and itself
    assert shared["attention_blocks"] == [[(0, 2, ((0, 2),)), (2, 5, ((0, 5),)), (5, 7, ((0, 2), (5, 7)))]]
    model = build_causal_lm(tiny_tokenizer)
    grid = copy.deepcopy(model)
    assert use_block_attention(model) and model.config._attn_implementation == "sdpa_blocks"
    for prefix_sharing in (False, True):
        collator = SequenceCollator(tiny_tokenizer.pad_token_id, padding_free=True, prefix_sharing=prefix_sharing,
                                    attention_blocks=True, max_row_tokens=400)
        batch = collator.collate_groups(groups)
        assert max(len(spans) for spans in batch["attention_blocks"]) >= 3  # rows hold several blocks
        results = []
        for m in (grid, model):
            m.zero_grad()
            logps = completion_logps(m, batch)
            logps.sum().backward()
            results.append((logps.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}))
        (expected, expected_grads), (found, grads) = results
        torch.testing.assert_close(found, expected, rtol=0, atol=1e-4)
        for name, grad in grads.items():
            torch.testing.assert_close(grad, expected_grads[name], rtol=1e-4, atol=1e-5, msg=name)


def test_piece_attention_equals_the_masked_grid_in_float64():
    """Values and gradients of one flash call per key part, merged by log-sum-exp, against ``sdpa`` on the mask."""
    from align.scoring.block_attention import PieceAttention, piece_parts

    groups = [([1] * 9, ([2] * 13, [3] * 4)), ([1] * 3, ([2] * 7,)), ([1] * 5, ([2] * 2, [3] * 6, [4] * 1))]
    batch = SequenceCollator(0, padding_free=True, prefix_sharing=True, attention_blocks=True,
                             max_row_tokens=40).collate_groups(groups)
    assert any(len(parts) == 2 for row in batch["attention_blocks"] for _, _, parts in map(piece_parts, row))
    torch.manual_seed(0)
    rows, width = batch["input_ids"].shape
    q, k, v = (torch.randn(rows, 3, width, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    upstream = torch.randn(rows, 3, width, 8, dtype=torch.float64)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=batch["attention_mask"], scale=0.3)
    expected_grads = torch.autograd.grad((expected * upstream).sum(), (q, k, v))
    found = torch.cat([PieceAttention.apply(q[r:r + 1], k[r:r + 1], v[r:r + 1],
                                            [piece_parts(p) for p in batch["attention_blocks"][r]], 0.3)
                       for r in range(rows)])
    grads = torch.autograd.grad((found * upstream).sum(), (q, k, v))
    torch.testing.assert_close(found, expected, rtol=0, atol=1e-12)
    for grad, reference in zip(grads, expected_grads):
        torch.testing.assert_close(grad, reference, rtol=0, atol=1e-12)


def test_piece_parts_split_a_span_into_what_it_sees_whole_and_itself():
    from align.scoring.block_attention import piece_parts

    assert piece_parts((0, 4, ((0, 4),))) == (0, 4, [(0, 4, True)])                    # a prompt, itself
    assert piece_parts((4, 9, ((0, 9),))) == (4, 9, [(0, 4, False), (4, 9, True)])     # chosen after its prompt
    assert piece_parts((9, 12, ((0, 4), (9, 12)))) == (9, 12, [(0, 4, False), (9, 12, True)])  # rejected
    with pytest.raises(RuntimeError, match="attention_blocks do not match"):
        piece_parts((4, 9, ((0, 7),)))


def test_block_attention_off_the_cpu_kernels_equals_the_masked_grid(tiny_tokenizer, groups, monkeypatch):
    """The other path (``sdpa`` on each piece's corner of the mask, as on GPUs), forced on CPU."""
    from align.scoring import block_attention
    from align.scoring.block_attention import use_block_attention

    monkeypatch.setattr(block_attention, "on_cpu_flash_kernels", lambda *args: False)
    model = build_causal_lm(tiny_tokenizer)
    grid = copy.deepcopy(model)
    assert use_block_attention(model)
    batch = SequenceCollator(tiny_tokenizer.pad_token_id, padding_free=True, prefix_sharing=True,
                             attention_blocks=True, max_row_tokens=400).collate_groups(groups)
    with torch.no_grad():
        torch.testing.assert_close(completion_logps(model, batch), completion_logps(grid, batch), rtol=0, atol=1e-4)


def test_block_attention_setting_switches_sdpa_models_on_cpu_and_the_pass_restores_them(tiny_tokenizer, tmp_path):
    from align.scoring.block_attention import wants_block_attention

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    model = build_causal_lm(tiny_tokenizer)
    assert wants_block_attention("auto", model, cpu) and not wants_block_attention("auto", model, cuda)
    assert wants_block_attention(True, model, cuda) and not wants_block_attention(False, model, cpu)
    eager = build_causal_lm(tiny_tokenizer, attn_implementation="eager")
    assert not wants_block_attention("auto", eager, cpu)
    with pytest.raises(ConfigError, match="block_attention=true needs a model on sdpa"):
        wants_block_attention(True, eager, cpu)
    with pytest.raises(ConfigError, match="choose auto, true or false"):
        wants_block_attention("sometimes", model, cpu)
    with pytest.raises(ConfigError, match="block_attention"):
        PreferenceConfig(output_dir="unused", use_cpu=True, block_attention="maybe")
    assert PreferenceConfig(output_dir="unused", use_cpu=True, block_attention="false").block_attention is False

    rows = make_rows(6)
    scored = {}
    for setting in ("auto", False):
        compute_ref_logprobs(rows, model, tiny_tokenizer, batch_size=4, max_length=MAX_LENGTH, chat_date=DATE,
                             output_dir=tmp_path / str(setting), block_attention=setting)
        assert model.config._attn_implementation == "sdpa"  # back on its own implementation
        scored[setting] = [r["ref_chosen_logps"] for r in load_ref_logprobs(tmp_path / str(setting), rows)]
    assert scored["auto"] == pytest.approx(scored[False], abs=1e-4)
