"""The recipes' architectures on the main paths: tiny Apertus (xIELU with trainable scalars per
layer, QK-norm, untied head) and Qwen3 (QK-norm, grouped-query attention, tied head), built
through transformers' own classes. Every layout of the reference pass gives the definition's
log-probs; padding-free and prefix-shared training batches give the padded loss and gradients
(the xIELU scalars included); two QRPO steps move the weights, the saved model reloads in the
transformers sampler and generates; the memory plan counts what transformers allocates."""

from __future__ import annotations

import copy

import pytest
import torch

from align.logprobs import compute_ref_logprobs, load_ref_logprobs
from align.scoring import encode_record
from align.testing.tiny import ARCHITECTURES, quantile_pair_rows
from align.trainers import PreferenceConfig, PreferenceTrainer, train

MAX_LENGTH = 128
DATE = "2025-09-01"
NEW = ("apertus", "qwen3")


@pytest.fixture(scope="module", params=NEW)
def arch(request, tiny_tokenizer):
    """(name, model): a tiny model of the architecture, with its weights moved off their init."""
    model = ARCHITECTURES[request.param](tiny_tokenizer)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.02)
    return request.param, model


def _pass(rows, model, tokenizer, directory, **kwargs) -> dict[str, dict]:
    settings = {"chat_format": "apertus", "batch_size": 4, "max_length": MAX_LENGTH, "chat_date": DATE}
    compute_ref_logprobs(rows, model, tokenizer, output_dir=directory, **{**settings, **kwargs})
    return {r["id"]: r for r in load_ref_logprobs(directory, rows)}


def _definition(model, tokenizer, row, name) -> float:
    encoded = encode_record(tokenizer, row, max_length=MAX_LENGTH, chat_date=DATE)
    prompt, completion = encoded["prompt_ids"], encoded[f"{name}_ids"]
    with torch.no_grad():
        logps = torch.log_softmax(model(torch.tensor([prompt + completion])).logits[0].double(), -1)
    return sum(logps[len(prompt) - 1 + t, tok].item() for t, tok in enumerate(completion))


def test_the_architectures_are_what_the_recipes_train(arch):
    name, model = arch
    if name == "apertus":
        scalars = [n for n, _ in model.named_parameters() if "alpha" in n]
        assert len(scalars) == 2 * model.config.num_hidden_layers, scalars  # α_p and α_n per layer
        assert model.get_output_embeddings().weight is not model.get_input_embeddings().weight
    assert any("q_norm" in n for n, _ in model.named_parameters())
    assert model.config.num_key_value_heads < model.config.num_attention_heads


def test_every_layout_of_the_pass_gives_the_definition(arch, tiny_tokenizer, tmp_path):
    _, model = arch
    rows = quantile_pair_rows(8)
    padded = _pass(rows, model, tiny_tokenizer, tmp_path / "padded", batch_size=1)
    for row in rows[:3]:
        for side in ("chosen", "rejected"):
            assert padded[row["id"]][f"ref_{side}_logps"] == pytest.approx(
                _definition(model, tiny_tokenizer, row, side), abs=1e-4)
    for layout, kwargs in {"padded_batches": {"batch_size": 5},
                           "padding_free": {"batch_size": 8, "padding_free": True},
                           "rows_of_64": {"batch_size": 8, "padding_free": True, "max_row_tokens": 64}}.items():
        other = _pass(rows, model, tiny_tokenizer, tmp_path / layout, **kwargs)
        for rid, row in padded.items():
            for column in ("ref_chosen_logps", "ref_rejected_logps"):
                assert abs(other[rid][column] - row[column]) <= 1e-5, (layout, rid, column)


def _config(tmp_path, **overrides) -> PreferenceConfig:
    settings = {"output_dir": str(tmp_path / "run"), "per_device_train_batch_size": 8, "max_steps": 2,
                "learning_rate": 1e-3, "report_to": "none", "logging_steps": 1, "use_cpu": True,
                "max_length": MAX_LENGTH, "chat_date": DATE, "save_strategy": "no", "disable_tqdm": True,
                "seed": 0, "optimizer": "adamw"}
    return PreferenceConfig(**{**settings, **overrides})


@pytest.mark.parametrize("loss_type", ["qrpo", "dpo"])
def test_padding_free_and_prefix_shared_batches_give_the_padded_loss_and_gradients(arch, tiny_tokenizer, tmp_path,
                                                                                   loss_type):
    _, model = arch
    rows = list(_pass(quantile_pair_rows(8), model, tiny_tokenizer, tmp_path / "ref").values())
    policy = copy.deepcopy(model)
    with torch.no_grad():
        for p in policy.parameters():
            p.mul_(1.01)
    results = {}
    for layout, settings in {"padded": {"padding_free": False, "prefix_sharing": False},
                             "padding_free": {"padding_free": True, "prefix_sharing": False},
                             "prefix_shared": {"padding_free": True, "prefix_sharing": True}}.items():
        trainer = PreferenceTrainer(policy, _config(tmp_path / layout, loss_type=loss_type, **settings),
                                    train_dataset=rows, processing_class=tiny_tokenizer)
        batch = trainer._prepare_inputs(trainer.data_collator([trainer.train_dataset[i] for i in range(8)]))
        policy.train()
        policy.zero_grad()
        loss = trainer.compute_loss(policy, batch)
        loss.backward()
        results[layout] = (loss.detach(), {n: p.grad.clone() for n, p in policy.named_parameters()
                                           if p.grad is not None})
        policy.zero_grad()
    loss, grads = results["padded"]
    assert any("alpha" in n for n in grads) or "q_norm" in " ".join(grads)
    for layout in ("padding_free", "prefix_shared"):
        other_loss, other_grads = results[layout]
        torch.testing.assert_close(other_loss, loss, rtol=1e-5, atol=1e-6)
        assert other_grads.keys() == grads.keys()
        for key in grads:
            torch.testing.assert_close(other_grads[key], grads[key], rtol=1e-4, atol=1e-6, msg=f"{layout}: {key}")


def test_two_qrpo_steps_then_the_saved_model_samples(arch, tiny_tokenizer, tmp_path):
    from align.sampling.hf import TransformersSampler

    _, model = arch
    rows = list(_pass(quantile_pair_rows(8), model, tiny_tokenizer, tmp_path / "ref").values())
    policy = copy.deepcopy(model)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    trainer = train(_config(tmp_path, per_device_train_batch_size=4), rows, policy, tokenizer=tiny_tokenizer)
    assert trainer.state.global_step == 2
    moved = [n for n, p in policy.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert len(moved) == len(before), sorted(set(before) - set(moved))  # xIELU scalars and norms included
    sampler = TransformersSampler(str(tmp_path / "run"), chat_format="apertus", chat_date=DATE, device="cpu")
    (completions,) = sampler.sample([[{"role": "user", "content": "hello"}]], n=2, max_tokens=6, seed=0)
    assert len(completions) == 2 and all(isinstance(c.text, str) for c in completions)


def test_the_memory_plan_counts_what_transformers_allocates(arch):
    from align.plan.shapes import count_params

    _, model = arch
    counted = count_params(model.config)
    assert counted["num_params"] == sum(p.numel() for p in model.parameters())


def test_sft_trains_every_weight_and_the_loss_falls(arch, tiny_tokenizer, tmp_path):
    """SFT (on TRL's SFTTrainer, the Apertus chat format installed) on the architecture: three
    steps on one repeated conversation lower its loss and move every weight, xIELU scalars and
    QK-norms included."""
    from align.trainers.sft_config import SFTConfig
    from align.trainers.sft_trainer import train_sft

    _, model = arch
    policy = copy.deepcopy(model)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    rows = [{"id": f"c{i}", "messages": [{"role": "user", "content": "sort 3 1 2"},
                                         {"role": "assistant", "content": "1 2 3"}]} for i in range(4)]
    config = SFTConfig(output_dir=str(tmp_path / "sft"), use_cpu=True, bf16=False, report_to=[], seed=0,
                       per_device_train_batch_size=4, max_steps=3, learning_rate=3e-3, logging_steps=1,
                       save_strategy="no", chat_date=DATE, max_length=MAX_LENGTH, disable_tqdm=True)
    trainer = train_sft(config, rows, policy, copy.deepcopy(tiny_tokenizer))
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 3 and losses[-1] < losses[0]
    moved = [n for n, p in trainer.model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert sorted(moved) == sorted(before)
