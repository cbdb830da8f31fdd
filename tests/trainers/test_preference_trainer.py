"""PreferenceTrainer invariants on the tiny model: accumulation, resume, layouts, references, LoRA,
and that QRPO moves log-ratios the way its loss demands."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from align.data.records import RecordError
from align.logprobs import compute_ref_logprobs, load_ref_logprobs
from align.optim import AdEMAMix
from align.scoring import completion_logps, encode_record
from align.testing.tiny import build_causal_lm, corpus_text
from align.trainers import PreferenceConfig, PreferenceTrainer, train

MAX_LENGTH = 128
DATE = "2025-09-01"


def make_rows(count: int, seed: int = 0) -> list[dict]:
    """Pair rows of random corpus words; chosen has R_q = 1, rejected R_q ∈ {0, 0.1, 0.2}."""
    rng = random.Random(seed)
    words = corpus_text().split()

    def text(lo: int, hi: int) -> str:
        return " ".join(rng.choice(words) for _ in range(rng.randint(lo, hi)))

    return [
        {
            "id": f"p{i}",
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text(2, 8)}],
            "chosen": text(2, 12),
            "rejected": text(2, 12),
            "chosen_reward": 1.0,
            "rejected_reward": 0.0,
            "chosen_quantile": 1.0,
            "rejected_quantile": rng.choice([0.0, 0.1, 0.2]),
            "num_ref_rewards": 10,
            "pair_fallback": None,
        }
        for i in range(count)
    ]


def with_ref_logps(rows, model, tokenizer, directory) -> list[dict]:
    compute_ref_logprobs(rows, model, tokenizer, chat_format="apertus", batch_size=8, max_length=MAX_LENGTH,
                         output_dir=directory, chat_date=DATE)
    return load_ref_logprobs(directory, rows)


@pytest.fixture(scope="module")
def base(tiny_tokenizer):
    return build_causal_lm(tiny_tokenizer)


@pytest.fixture(scope="module")
def data(base, tiny_tokenizer, tmp_path_factory):
    """24 pair rows with reference log-probs of ``base`` from the offline pass."""
    return with_ref_logps(make_rows(24), base, tiny_tokenizer, tmp_path_factory.mktemp("ref"))


def config(tmp_path, **overrides) -> PreferenceConfig:
    settings = {"output_dir": str(tmp_path / "run"), "per_device_train_batch_size": 8, "max_steps": 3,
                    "learning_rate": 1e-3, "report_to": "none", "logging_steps": 1, "use_cpu": True, "max_length": MAX_LENGTH,
                    "chat_date": DATE, "save_strategy": "no", "disable_tqdm": True, "seed": 0}
    settings.update(overrides)
    return PreferenceConfig(**settings)


def losses_of(trainer: PreferenceTrainer) -> list[float]:
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def perturbed(model: torch.nn.Module, scale: float = 0.02, seed: int = 1) -> torch.nn.Module:
    """A copy whose weights differ from ``model``: a policy that is not its reference."""
    out = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)
    return out


def one_batch(trainer: PreferenceTrainer, size: int = 8) -> dict:
    features = [trainer.train_dataset[i] for i in range(size)]
    return trainer._prepare_inputs(trainer.data_collator(features))


def loss_and_grads(trainer: PreferenceTrainer, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model = trainer.model
    model.train()
    model.zero_grad()
    loss = trainer.compute_loss(model, batch)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return loss.detach(), grads


# --------------------------------------------------------------------------- invariants


@pytest.mark.parametrize("loss_type", ["qrpo", "dpo"])
def test_batch_8_accum_1_equals_batch_1_accum_8(loss_type, base, data, tiny_tokenizer, tmp_path):
    runs = {}
    for batch, accum in ((8, 1), (1, 8)):
        model = copy.deepcopy(base)
        cfg = config(tmp_path / f"{batch}x{accum}", per_device_train_batch_size=batch,
                     gradient_accumulation_steps=accum, loss_type=loss_type)
        trainer = PreferenceTrainer(model, cfg, train_dataset=data, processing_class=tiny_tokenizer)
        trainer.train()
        runs[batch] = (losses_of(trainer), model)
    (losses_a, model_a), (losses_b, model_b) = runs[8], runs[1]
    assert len(losses_a) == len(losses_b) == 3
    assert losses_a == pytest.approx(losses_b, abs=1e-6)
    moved = max((p - q).abs().max().item() for p, q in zip(model_a.parameters(), base.parameters()))
    differ = max((p - q).abs().max().item() for p, q in zip(model_a.parameters(), model_b.parameters()))
    assert moved > 1e-3
    assert differ < 2e-5  # Adam-type updates amplify fp32 summation-order noise of near-zero gradients


def test_resume_from_checkpoint_gives_the_same_later_losses(base, data, tiny_tokenizer, tmp_path):
    """AdEMAMix (the default optimizer, with step-dependent α and β3) state round-trips too."""
    cfg = config(tmp_path / "full", max_steps=4, save_strategy="steps", save_steps=2, per_device_train_batch_size=4)
    full = PreferenceTrainer(copy.deepcopy(base), cfg, train_dataset=data, processing_class=tiny_tokenizer)
    full.train()
    optimizer = full.optimizer.optimizer if hasattr(full.optimizer, "optimizer") else full.optimizer
    assert isinstance(optimizer, AdEMAMix) and optimizer.defaults["t_alpha"] == 4

    resumed = PreferenceTrainer(copy.deepcopy(base), cfg, train_dataset=data, processing_class=tiny_tokenizer)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "run" / "checkpoint-2"))
    later = losses_of(resumed)[-2:]  # the resumed history starts with the checkpoint's
    assert resumed.state.global_step == 4
    assert later == pytest.approx(losses_of(full)[2:], abs=1e-7)
    for p, q in zip(full.model.parameters(), resumed.model.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-7)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("loss_type", ["qrpo", "dpo"])
def test_padding_free_equals_padded_losses_and_grads(attn, loss_type, data, tiny_tokenizer, tmp_path):
    model = perturbed(build_causal_lm(tiny_tokenizer, attn_implementation=attn))
    results = {}
    for name, settings in {"padded": {"padding_free": False},
                           "rows_of_longest": {"padding_free": True},
                           "one_row": {"padding_free": True, "max_row_tokens": 10**6},
                           "rows_of_150": {"padding_free": True, "max_row_tokens": 150}}.items():
        trainer = PreferenceTrainer(model, config(tmp_path / name, loss_type=loss_type, **settings),
                                    train_dataset=data, processing_class=tiny_tokenizer)
        batch = one_batch(trainer)
        if name == "one_row":
            assert batch["input_ids"].shape[0] == 1
        if name == "rows_of_150":
            assert 1 < batch["input_ids"].shape[0] < 16
        results[name] = loss_and_grads(trainer, batch)
    loss, grads = results["padded"]
    for name in ("rows_of_longest", "one_row", "rows_of_150"):
        other_loss, other_grads = results[name]
        torch.testing.assert_close(other_loss, loss, rtol=1e-5, atol=1e-6)
        assert other_grads.keys() == grads.keys()
        for key in grads:
            torch.testing.assert_close(other_grads[key], grads[key], rtol=1e-4, atol=1e-6)


def test_boolean_mask_on_eager_would_be_caught(data, tiny_tokenizer, tmp_path):
    """The equality above is sensitive: eager with a boolean mask (the known trap) changes the loss."""
    model = perturbed(build_causal_lm(tiny_tokenizer, attn_implementation="eager"))
    padded = PreferenceTrainer(model, config(tmp_path / "a", padding_free=False), train_dataset=data,
                               processing_class=tiny_tokenizer)
    packed = PreferenceTrainer(model, config(tmp_path / "b", padding_free=True), train_dataset=data,
                               processing_class=tiny_tokenizer)
    packed.data_collator.attn_implementation, packed.data_collator.mask_dtype = "sdpa", None  # boolean mask
    good, _ = loss_and_grads(padded, one_batch(padded))
    wrong, _ = loss_and_grads(packed, one_batch(packed))
    assert abs(good.item() - wrong.item()) > 1e-3


@pytest.mark.parametrize("loss_type", ["qrpo", "dpo"])
def test_precomputed_reference_equals_live_reference_model(loss_type, base, data, tiny_tokenizer, tmp_path):
    policy = perturbed(base)
    pre = PreferenceTrainer(policy, config(tmp_path / "pre", loss_type=loss_type), train_dataset=data,
                            processing_class=tiny_tokenizer)
    live = PreferenceTrainer(policy, config(tmp_path / "live", loss_type=loss_type, reference="model"),
                             train_dataset=make_rows(24), processing_class=tiny_tokenizer,
                             ref_model=copy.deepcopy(base))
    loss_pre, grads_pre = loss_and_grads(pre, one_batch(pre))
    loss_live, grads_live = loss_and_grads(live, one_batch(live))
    assert loss_pre.item() > 1e-3
    torch.testing.assert_close(loss_live, loss_pre, rtol=1e-5, atol=1e-6)
    for key in grads_pre:
        torch.testing.assert_close(grads_live[key], grads_pre[key], rtol=1e-4, atol=1e-6)


def lora_policy(base: torch.nn.Module):
    """A LoRA-wrapped copy of ``base`` whose adapter is not zero (so policy ≠ reference)."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(copy.deepcopy(base), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                           task_type="CAUSAL_LM"))
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return model


def test_adapter_reference_equals_precomputed(base, data, tiny_tokenizer, tmp_path):
    policy = lora_policy(base)
    adapter = PreferenceTrainer(policy, config(tmp_path / "adapter", reference="adapter"),
                                train_dataset=make_rows(24), processing_class=tiny_tokenizer)
    pre = PreferenceTrainer(policy, config(tmp_path / "pre"), train_dataset=data, processing_class=tiny_tokenizer)
    loss_adapter, grads_adapter = loss_and_grads(adapter, one_batch(adapter))
    loss_pre, grads_pre = loss_and_grads(pre, one_batch(pre))
    assert grads_pre and all("lora_" in k for k in grads_pre)
    torch.testing.assert_close(loss_adapter, loss_pre, rtol=1e-5, atol=1e-6)
    for key in grads_pre:
        torch.testing.assert_close(grads_adapter[key], grads_pre[key], rtol=1e-4, atol=1e-6)


def test_lora_trainable_weights_moved_frozen_ones_did_not(base, data, tiny_tokenizer, tmp_path):
    policy = lora_policy(base)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    trainer = PreferenceTrainer(policy, config(tmp_path), train_dataset=data, processing_class=tiny_tokenizer)
    trainer.train()
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    for name, param in policy.named_parameters():
        if name in trainable:
            assert not torch.equal(param, before[name]), f"{name} did not move"
        else:
            assert torch.equal(param, before[name]), f"frozen {name} changed"


def test_lora_adapter_init_follows_the_seed_not_the_global_rng_state(base, data, tiny_tokenizer, tmp_path):
    """Else a LoRA run resumed from a checkpoint (or rerun) cannot match an uninterrupted one."""
    from align.trainers.preference_trainer import lora_config

    cfg = config(tmp_path, lora_r=4)
    inits = []
    for draws in (1, 2):
        torch.manual_seed(draws)  # the global RNG in another state each time
        trainer = PreferenceTrainer(copy.deepcopy(base), cfg, train_dataset=data[:4], processing_class=tiny_tokenizer,
                                    peft_config=lora_config(cfg))
        inits.append({n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_A" in n})
    assert inits[0] and all(torch.equal(inits[0][n], inits[1][n]) for n in inits[0])


def test_full_finetune_moves_every_weight(base, data, tiny_tokenizer, tmp_path):
    model = copy.deepcopy(base)
    PreferenceTrainer(model, config(tmp_path), train_dataset=data, processing_class=tiny_tokenizer).train()
    for (name, p), q in zip(model.named_parameters(), base.parameters()):
        assert not torch.equal(p, q), f"{name} did not move"


# --------------------------------------------------------------------------- behaviour


def logratios(trainer: PreferenceTrainer, ref: list[dict]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-pair (chosen, rejected) log π_θ − log π_ref over the whole dataset, and the QRPO losses."""
    trainer.model.eval()
    batch = trainer._prepare_inputs(trainer.data_collator([trainer.train_dataset[i] for i in range(len(ref))]))
    with torch.no_grad():
        losses, _metrics = trainer.batch_losses(trainer.model, batch)
    with torch.no_grad():
        ratio = completion_logps(trainer.model, batch) - batch["ref_logps"]
    chosen, rejected = ratio.chunk(2)
    return chosen, rejected, losses


def test_qrpo_raises_high_quantile_logratios_and_lowers_low_quantile_ones(base, data, tiny_tokenizer, tmp_path):
    """Targets R_q − β_i·log Z_i are > 0 for R_q = 1 and < 0 for R_q ≤ 0.2 at these lengths."""
    model = copy.deepcopy(base)
    cfg = config(tmp_path, max_steps=30, learning_rate=3e-3, optimizer="adamw", lr_scheduler_type="constant")
    trainer = PreferenceTrainer(model, cfg, train_dataset=data, processing_class=tiny_tokenizer)
    chosen0, rejected0, losses0 = logratios(trainer, data)
    assert chosen0.abs().max() < 1e-4 and rejected0.abs().max() < 1e-4  # policy starts at the reference
    trainer.train()
    chosen, rejected, losses = logratios(trainer, data)
    assert (chosen > 0).float().mean() >= 0.9, chosen
    assert (rejected < 0).float().mean() >= 0.9, rejected
    assert losses.mean() < 0.5 * losses0.mean()


def test_dpo_widens_the_reward_margin(base, data, tiny_tokenizer, tmp_path):
    model = copy.deepcopy(base)
    cfg = config(tmp_path, max_steps=15, learning_rate=3e-3, loss_type="dpo", optimizer="adamw")
    trainer = PreferenceTrainer(model, cfg, train_dataset=data, processing_class=tiny_tokenizer)
    trainer.train()
    chosen, rejected, _ = logratios(trainer, data)
    lengths = torch.tensor([len(trainer.train_dataset[i]["chosen_ids"]) for i in range(len(data))])
    lengths_r = torch.tensor([len(trainer.train_dataset[i]["rejected_ids"]) for i in range(len(data))])
    margins = chosen / lengths - rejected / lengths_r
    assert (margins > 0).float().mean() >= 0.9
    history = [h for h in trainer.state.log_history if "rewards/margins" in h]
    assert history[-1]["rewards/margins"] > history[0]["rewards/margins"]


# --------------------------------------------------------------------------- logging, eval, API


def test_logs_the_qrpo_quantities(base, data, tiny_tokenizer, tmp_path):
    trainer = PreferenceTrainer(copy.deepcopy(base), config(tmp_path, max_steps=1), train_dataset=data,
                                eval_dataset=data[:8], processing_class=tiny_tokenizer)
    trainer.train()
    logged = trainer.state.log_history[0]
    for key in ("loss", "qrpo/quantile_reward/chosen", "qrpo/quantile_reward/rejected", "qrpo/target/chosen",
                "qrpo/beta_logratio/rejected", "qrpo/log_z", "qrpo/beta_over_length"):
        assert key in logged, key
    mean_quantile = (logged["qrpo/quantile_reward/chosen"] + logged["qrpo/quantile_reward/rejected"]) / 2
    assert 0 < mean_quantile < 1
    metrics = trainer.evaluate()
    assert "eval_loss" in metrics and "eval_qrpo/target/chosen" in metrics


def test_train_function_loads_saves_and_uses_a_live_reference(tiny_dirs, tmp_path):
    cfg = config(tmp_path, max_steps=2, model_name_or_path=str(tiny_dirs["policy"]), reference="model",
                 loss_type="dpo", per_device_train_batch_size=4)
    trainer = train(cfg, make_rows(8))
    assert trainer.state.global_step == 2
    assert (tmp_path / "run" / "model.safetensors").exists()


# --------------------------------------------------------------------------- bad input


def test_missing_reference_logps_name_the_record_and_the_fix(base, tiny_tokenizer, tmp_path):
    with pytest.raises(RecordError, match=r"record 'p0': field 'ref_chosen_logps'.*align logprobs"):
        PreferenceTrainer(base, config(tmp_path), train_dataset=make_rows(2), processing_class=tiny_tokenizer)


def test_length_disagreement_with_the_pass_is_an_error(base, data, tiny_tokenizer, tmp_path):
    rows = copy.deepcopy(data[:2])
    rows[1]["chosen_length"] += 1
    with pytest.raises(RecordError, match=r"record 'p1': field 'chosen_length'.*rerun `align logprobs`"):
        PreferenceTrainer(base, config(tmp_path), train_dataset=rows, processing_class=tiny_tokenizer)


def test_a_different_max_length_than_the_pass_is_caught(base, data, tiny_tokenizer, tmp_path):
    row = max(data, key=lambda r: r["chosen_length"])
    prompt = encode_record(tiny_tokenizer, row, max_length=None, chat_date=DATE)["prompt_ids"]
    # cut rather than left out (the default), so the trainer trains other token ids than the pass scored
    shorter = config(tmp_path, max_length=len(prompt) + row["chosen_length"] - 1, over_max_length="cut")
    with pytest.raises(RecordError, match=rf"record '{row['id']}': field 'ref_chosen_token_hash'.*"
                                          rf"max_length is {MAX_LENGTH} in the pass, {shorter.max_length} in the"):
        PreferenceTrainer(base, shorter, train_dataset=[row], processing_class=tiny_tokenizer)


# --------------------------------------------------------------------------- reference log-probs bound to content


@pytest.fixture(scope="module")
def dated(base, tiny_tokenizer, tmp_path_factory):
    """3 pair rows without a system message (the Apertus default system text, with the date, is
    rendered), with reference log-probs of ``base`` from the offline pass."""
    rows = make_rows(3, seed=7)
    for row in rows:
        row["messages"] = row["messages"][1:]
    return with_ref_logps(rows, base, tiny_tokenizer, tmp_path_factory.mktemp("ref_dated"))


def _other_system_text(rows, tokenizer):
    rows[0]["messages"].insert(0, {"role": "system", "content": "Be brief."})
    return {}


def _chatml(rows, tokenizer):
    from align.chat import install_format

    tokenizer = copy.deepcopy(tokenizer)
    install_format(tokenizer, chat_format="chatml")  # its tokens added: the tokenizer differs too
    return {"chat_format": "chatml", "tokenizer": tokenizer}


def _other_tokenizer(rows, tokenizer):
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.add_tokens(["harmless"])  # the default system text now tokenizes differently
    return {"tokenizer": tokenizer}


# Each changes ONE thing between the log-prob pass and the trainer; the token ids of the prompt
# change (the completion lengths do not, for the date and the system text), and the error names it.
BINDING_CHANGES = {
    "chat_date": (lambda rows, tokenizer: {"chat_date": "2025-09-02"},
                  r"chat_date is '2025-09-01' in the pass, '2025-09-02' in the trainer"),
    "chat_date_today": (lambda rows, tokenizer: {"chat_date": None},  # the Python API's default: today's date
                        r"chat_date is '2025-09-01' in the pass, '\d{4}-\d\d-\d\d' in the trainer"),
    "system_text": (_other_system_text, r"the system text in the row's messages differs from the pass's"),
    "chat_format": (_chatml, r"chat_format is 'apertus' in the pass, 'chatml'"),
    "tokenizer": (_other_tokenizer, r"the tokenizer differs from the pass's"),
}


@pytest.mark.parametrize("change", sorted(BINDING_CHANGES))
def test_reference_logps_from_other_token_ids_name_the_setting_that_differs(change, base, dated, tiny_tokenizer,
                                                                            tmp_path):
    rows = copy.deepcopy(dated)
    make, culprit = BINDING_CHANGES[change]
    overrides = make(rows, tiny_tokenizer)
    tokenizer = overrides.pop("tokenizer", tiny_tokenizer)
    if change == "chat_date":  # same completion lengths: only the token hash tells
        other = encode_record(tokenizer, rows[0], max_length=MAX_LENGTH, chat_date="2025-09-02")
        assert len(other["chosen_ids"]) == rows[0]["chosen_length"]
    with pytest.raises(RecordError, match=rf"record 'p0': field 'ref_chosen_token_hash': the reference log-prob "
                                          rf"pass scored other token ids.*{culprit}"):
        PreferenceTrainer(base, config(tmp_path, **overrides), train_dataset=rows, processing_class=tokenizer)


def test_rows_carry_the_token_hash_and_settings_of_the_pass(data, tiny_tokenizer):
    from align.logprobs import token_hash

    for row in data[:3]:
        encoded = encode_record(tiny_tokenizer, row, max_length=MAX_LENGTH, chat_date=DATE)
        for name in ("chosen", "rejected"):
            assert row[f"ref_{name}_token_hash"] == token_hash(encoded["prompt_ids"], encoded[f"{name}_ids"])
        assert row["ref_inputs"]["chat_date"] == DATE and row["ref_inputs"]["chat_format"] == "apertus"
        assert row["ref_model_fingerprint"] is None  # `base` is held only in memory: no path to fingerprint


def test_reference_rows_without_a_token_hash_say_to_rerun_the_pass(base, data, tiny_tokenizer, tmp_path):
    rows = copy.deepcopy(data[:2])
    for row in rows:
        del row["ref_chosen_token_hash"], row["ref_rejected_token_hash"]
    with pytest.raises(RecordError, match=r"record 'p0': field 'ref_chosen_token_hash': missing.*rerun `align logprobs`"):
        PreferenceTrainer(base, config(tmp_path), train_dataset=rows, processing_class=tiny_tokenizer)
    trainer = PreferenceTrainer(base, config(tmp_path, reference="model"), train_dataset=rows,  # not precomputed: fine
                                processing_class=tiny_tokenizer, ref_model=base)
    assert len(trainer.train_dataset) == 2


def test_reference_logps_of_another_checkpoint_are_caught_by_its_fingerprint(tiny_dirs, tiny_tokenizer, tmp_path):
    """Detectable when the checkpoints have paths: the pass records the weight files' fingerprint of the
    model it loaded, the trainer fingerprints ``ref_model_name_or_path`` or else the policy's checkpoint."""
    from transformers import AutoModelForCausalLM

    first = AutoModelForCausalLM.from_pretrained(tiny_dirs["policy"])
    rows = with_ref_logps(make_rows(3), first, tiny_tokenizer, tmp_path / "ref")
    assert rows[0]["ref_model_fingerprint"]
    other_dir = tmp_path / "other_checkpoint"
    perturbed(copy.deepcopy(first)).save_pretrained(other_dir)
    other = AutoModelForCausalLM.from_pretrained(other_dir)
    with pytest.raises(RecordError, match=r"record 'p0': field 'ref_model_fingerprint'.*rerun `align logprobs`"):
        PreferenceTrainer(other, config(tmp_path), train_dataset=rows, processing_class=tiny_tokenizer)
    with pytest.raises(RecordError, match=r"field 'ref_model_fingerprint'"):  # named by path in the config
        PreferenceTrainer(first, config(tmp_path, model_name_or_path=str(other_dir)), train_dataset=rows,
                          processing_class=tiny_tokenizer)
    # the policy may start elsewhere when the config names the pass's checkpoint as the reference
    PreferenceTrainer(other, config(tmp_path, ref_model_name_or_path=str(tiny_dirs["policy"])), train_dataset=rows,
                      processing_class=tiny_tokenizer)
    PreferenceTrainer(first, config(tmp_path), train_dataset=rows, processing_class=tiny_tokenizer)


def test_qrpo_needs_quantiles_or_rewards(base, tiny_tokenizer, tmp_path):
    rows = make_rows(2)
    for row in rows:
        row["chosen_quantile"] = row["rejected_quantile"] = None
    with pytest.raises(RecordError, match=r"record 'p0': field 'chosen_quantile'"):
        PreferenceTrainer(base, config(tmp_path, reference="model"), train_dataset=rows,
                          processing_class=tiny_tokenizer, ref_model=base)


def test_quantiles_are_computed_from_rewards_and_ref_rewards(base, tiny_tokenizer, tmp_path):
    rows = make_rows(1)
    rows[0].update(chosen_quantile=None, rejected_quantile=None, chosen_reward=0.7, rejected_reward=0.15,
                   ref_rewards=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0])
    trainer = PreferenceTrainer(base, config(tmp_path, reference="model", num_ref_rewards=10), train_dataset=rows,
                                processing_class=tiny_tokenizer, ref_model=base)
    row = trainer.train_dataset[0]
    assert (row["chosen_quantile"], row["rejected_quantile"]) == (0.7, 0.1)


def test_quantile_off_the_grid_is_an_error(base, tiny_tokenizer, tmp_path):
    rows = make_rows(1)
    rows[0]["rejected_quantile"] = 0.15
    with pytest.raises(RecordError, match=r"rejected_quantile.*multiple of 1/n with n = 10"):
        PreferenceTrainer(base, config(tmp_path, reference="model", num_ref_rewards=10), train_dataset=rows,
                          processing_class=tiny_tokenizer, ref_model=base)


def test_reference_settings_that_cannot_work_name_the_fix(base, data, tiny_tokenizer, tmp_path):
    with pytest.raises(ValueError, match="reference='model' needs ref_model"):
        PreferenceTrainer(base, config(tmp_path, reference="model"), train_dataset=data,
                          processing_class=tiny_tokenizer)
    with pytest.raises(ValueError, match="reference='adapter' needs a PEFT policy"):
        PreferenceTrainer(base, config(tmp_path, reference="adapter"), train_dataset=data,
                          processing_class=tiny_tokenizer)
    with pytest.raises(ValueError, match="set reference='model'"):
        PreferenceTrainer(base, config(tmp_path), train_dataset=data, processing_class=tiny_tokenizer,
                          ref_model=base)


# --------------------------------------------------------------------------- truncated completions, dropped refs


def truncated_rows(count: int = 4) -> list[dict]:
    """Pair rows whose first row's chosen completion was cut at the sampling budget."""
    rows = make_rows(count, seed=5)
    for row in rows:
        row.update(chosen_finish_reason="stop", rejected_finish_reason="stop")
    rows[0]["chosen_finish_reason"] = "length"
    return rows


def test_truncated_completion_is_trained_without_end_of_turn_and_matches_the_pass(base, tiny_tokenizer, tmp_path,
                                                                                   caplog):
    rows = truncated_rows()
    compute_ref_logprobs(rows, base, tiny_tokenizer, chat_format="apertus", batch_size=4, max_length=MAX_LENGTH,
                         output_dir=tmp_path / "ref", chat_date=DATE, truncated="train_without_end")
    scored = load_ref_logprobs(tmp_path / "ref", rows)
    with caplog.at_level("WARNING", logger="align.trainers.preference_data"):
        trainer = PreferenceTrainer(base, config(tmp_path, truncated="train_without_end"), train_dataset=scored,
                                    processing_class=tiny_tokenizer)
    warnings = [r.getMessage() for r in caplog.records
                if r.name == "align.trainers.preference_data" and "without an end-of-turn" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("preference data: 1 truncated")
    end = tiny_tokenizer.convert_tokens_to_ids("<|assistant_end|>")
    prepared = trainer.train_dataset
    assert prepared[0]["chosen_ids"][-1] != end and prepared[0]["rejected_ids"][-1] == end
    assert all(prepared[i]["chosen_ids"][-1] == end for i in range(1, len(rows)))
    assert len(prepared[0]["chosen_ids"]) == scored[0]["chosen_length"]


def test_trainer_refuses_a_truncated_completion_by_default(base, tiny_tokenizer, tmp_path):
    with pytest.raises(RecordError, match=r"record 'p0': field 'chosen_finish_reason'.*train_without_end"):
        PreferenceTrainer(base, config(tmp_path, reference="model"), train_dataset=truncated_rows(),
                          processing_class=tiny_tokenizer, ref_model=base)
    with pytest.raises(ValueError, match="truncated"):
        config(tmp_path, truncated="keep")


def test_rows_with_references_dropped_as_overlong_use_their_own_grid(base, tiny_tokenizer, tmp_path):
    rows = make_rows(1)
    rows[0].update(num_ref_rewards=8, num_ref_dropped=2, rejected_quantile=0.125)  # 1 of 8 references
    trainer = PreferenceTrainer(base, config(tmp_path, reference="model", num_ref_rewards=10), train_dataset=rows,
                                processing_class=tiny_tokenizer, ref_model=base)
    assert trainer.train_dataset[0]["rejected_quantile"] == 0.125
    rows[0].update(num_ref_dropped=1)
    with pytest.raises(RecordError, match=r"num_ref_rewards.*is 8.*num_ref_rewards=10 minus num_ref_dropped=1"):
        PreferenceTrainer(base, config(tmp_path, reference="model", num_ref_rewards=10), train_dataset=rows,
                          processing_class=tiny_tokenizer, ref_model=base)
