"""SFT on the tiny model: exact masks and labels, loss values worked by hand, invariants.

Invariants pinned here: labels are -100 exactly off the align.chat mask (in the dataset and
in the collated batch); the loss equals a hand computation from the logits, with and
without a prompt-loss weight; batch 8 × accumulation 1 == batch 1 × accumulation 8;
resumed == uninterrupted; padding-free == padded for every attention implementation the
trainer allows; LoRA leaves base weights untouched.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from datasets import Dataset

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from align.chat import chat_template, encode, install_format
from align.data.records import RecordError
from align.testing.tiny import build_causal_lm
from align.trainers.sft_config import SFTConfig, apertus_sft_defaults, checkpointing_field
from align.trainers.sft_data import prepare_sft_dataset, truncate_sft_dataset
from align.trainers.sft_trainer import SFTTrainer, check_padding_free, token_weights, train_sft

DATE = "2025-01-01"
ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two numbers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        },
    },
}


def conversation(i: int) -> dict:
    """Row i: the shapes SFT data takes, cycling: plain, with system, multi-turn, tool use."""
    kind = i % 4
    if kind == 0:
        messages = [
            {"role": "user", "content": f"What is {i} plus one?"},
            {"role": "assistant", "content": f"It is {i + 1}." + " Indeed." * (i % 3)},
        ]
    elif kind == 1:
        messages = [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": f"Name the number after {i}."},
            {"role": "assistant", "content": f"{i + 1}."},
        ]
    elif kind == 2:
        messages = [
            {"role": "user", "content": "Say hello."},
            {"role": "assistant", "content": "Hello there."},
            {"role": "user", "content": f"Now count to {i % 5 + 1}."},
            {"role": "assistant", "content": " ".join(str(k) for k in range(1, i % 5 + 2))},
        ]
    else:
        messages = [
            {"role": "user", "content": f"Add {i} and 3."},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "type": "function",
                        "function": {"name": "add", "arguments": json.dumps({"a": i, "b": 3})},
                    }
                ],
            },
            {"role": "tool", "content": str(i + 3)},
            {"role": "assistant", "content": f"The sum is {i + 3}."},
        ]
    row = {
        "id": f"conv-{i}",
        "messages": json.dumps(messages),
        "tools": json.dumps([ADD_TOOL] if kind == 3 else []),
    }
    return row


def rows(n: int) -> Dataset:
    return Dataset.from_list([conversation(i) for i in range(n)])


@pytest.fixture()
def chat_tok(tokenizer):
    install_format(tokenizer)
    return tokenizer


def make_config(tmp_path, **overrides) -> SFTConfig:
    base = {
        "output_dir": str(tmp_path / "out"),
        "use_cpu": True,
        "bf16": False,
        "report_to": [],
        "seed": 0,
        "per_device_train_batch_size": 4,
        "max_steps": 3,
        "learning_rate": 1e-3,
        "logging_steps": 1,
        "save_strategy": "no",
        "chat_date": DATE,
        "max_length": 512,
        "disable_tqdm": True,
    }
    base.update(overrides)
    return SFTConfig(**base)


def make_trainer(tmp_path, tok, n_rows=24, model=None, **overrides) -> SFTTrainer:
    model = model if model is not None else build_causal_lm(tok)
    return SFTTrainer(
        model=model,
        args=make_config(tmp_path, **overrides),
        train_dataset=rows(n_rows),
        processing_class=tok,
    )


def hand_loss(model, batch, prompt_loss_weight: float) -> torch.Tensor:
    """Σ w·nll / Σ w from the full logits: w = 1 on trained labels, w_p on other real targets."""
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    targets = batch["input_ids"][:, 1:]
    nll = -logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    trained = batch["labels"][:, 1:] != -100
    real = batch["attention_mask"][:, 1:].bool()
    weights = torch.where(trained, 1.0, torch.where(real, prompt_loss_weight, 0.0))
    return (weights * nll).sum() / weights.sum()


# ---- masks and labels ------------------------------------------------------------------


def test_dataset_labels_are_ignored_exactly_where_the_chat_mask_is_zero(chat_tok):
    data = rows(8)
    prepared = prepare_sft_dataset(data, chat_tok, chat_date=DATE)
    assert prepared.column_names == ["input_ids", "labels"]
    for row, out in zip(data, prepared):
        tools = json.loads(row["tools"]) or None
        enc = encode(chat_tok, json.loads(row["messages"]), tools=tools, chat_date=DATE)
        assert out["input_ids"] == enc.input_ids
        assert [label == -100 for label in out["labels"]] == [m == 0 for m in enc.loss_mask]
        assert [label for label in out["labels"] if label != -100] == [
            t for t, m in zip(enc.input_ids, enc.loss_mask) if m
        ]


def test_trained_tokens_are_assistant_text_and_end_of_turn_only(chat_tok):
    prepared = prepare_sft_dataset(Dataset.from_list([conversation(3)]), chat_tok, chat_date=DATE)
    trained = [t for t in prepared[0]["labels"] if t != -100]
    text = chat_tok.decode(trained)
    assert (
        text == '<|tools_prefix|>[{"add": {"a": 3, "b": 3}}]<|tools_suffix|>'
        "The sum is 6.<|assistant_end|>"
    )
    assert "[6]" not in text  # the tool output comes from the environment


def test_collated_batch_carries_the_same_labels(tmp_path, chat_tok):
    trainer = make_trainer(tmp_path, chat_tok, n_rows=8)
    examples = [trainer.train_dataset[i] for i in range(4)]
    batch = trainer.data_collator(examples)
    for k, ex in enumerate(examples):
        n = len(ex["input_ids"])
        assert batch["labels"][k, :n].tolist() == ex["labels"]
        assert (batch["labels"][k, n:] == -100).all() and (
            batch["attention_mask"][k, n:] == 0
        ).all()


def test_assistant_only_loss_equals_hand_computation(tmp_path, chat_tok):
    trainer = make_trainer(tmp_path, chat_tok, n_rows=8)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
    loss = trainer.compute_loss(trainer.model, dict(batch))
    torch.testing.assert_close(loss, hand_loss(trainer.model, batch, 0.0), rtol=1e-5, atol=1e-6)


def test_prompt_loss_weight_equals_hand_computation(tmp_path, chat_tok):
    trainer = make_trainer(tmp_path, chat_tok, n_rows=8, prompt_loss_weight=0.3)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
    loss = trainer.compute_loss(trainer.model, dict(batch))
    expected = hand_loss(trainer.model, batch, 0.3)
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    assert not torch.isclose(expected, hand_loss(trainer.model, batch, 0.0))


def test_prompt_loss_weight_normaliser_spans_the_accumulation_window(tmp_path, chat_tok):
    """Two micro-batches scaled by the window's Σw add up to the loss of the whole window."""
    trainer = make_trainer(tmp_path, chat_tok, n_rows=8, prompt_loss_weight=0.3)
    examples = [trainer.train_dataset[i] for i in range(4)]
    halves = [trainer.data_collator(examples[:2]), trainer.data_collator(examples[2:])]
    batches, total = trainer.get_batch_samples(iter(halves), 2, torch.device("cpu"))
    assert total == pytest.approx(sum(token_weights(b, 0.3)[:, 1:].sum().item() for b in halves))
    summed = sum(
        trainer.compute_loss(trainer.model, dict(b), num_items_in_batch=total) for b in batches
    )
    whole = trainer.data_collator(examples)
    torch.testing.assert_close(summed, hand_loss(trainer.model, whole, 0.3), rtol=1e-5, atol=1e-6)


def test_evaluation_reports_the_weighted_loss(tmp_path, chat_tok):
    args = make_config(tmp_path, prompt_loss_weight=0.3, per_device_eval_batch_size=8)
    trainer = SFTTrainer(
        build_causal_lm(chat_tok),
        args,
        train_dataset=rows(8),
        eval_dataset=rows(4),
        processing_class=chat_tok,
    )
    metrics = trainer.evaluate()
    whole = trainer.data_collator([trainer.eval_dataset[i] for i in range(4)])
    assert metrics["eval_loss"] == pytest.approx(
        hand_loss(trainer.model, whole, 0.3).item(), rel=1e-5
    )


def test_token_weights_from_position_ids_skip_sequence_starts():
    batch = {
        "labels": torch.tensor([[-100, -100, 7, 8, -100, -100, 4, -100]]),
        "position_ids": torch.tensor([[0, 1, 2, 3, 0, 1, 2, 0]]),
    }  # last: padding
    assert token_weights(batch, 0.5).tolist() == [[0.0, 0.5, 1.0, 1.0, 0.0, 0.5, 1.0, 0.0]]


# ---- training invariants ---------------------------------------------------------------


def _params(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _losses_by_step(trainer) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in trainer.state.log_history if "loss" in e}


def _losses(trainer) -> list[float]:
    return [e["loss"] for e in trainer.state.log_history if "loss" in e]


def test_every_weight_moves(tmp_path, chat_tok):
    trainer = make_trainer(tmp_path, chat_tok, optimizer="ademamix")
    before = _params(trainer.model)
    trainer.train()
    after = _params(trainer.model)
    unchanged = [n for n in before if torch.equal(before[n], after[n])]
    assert not unchanged, f"weights that did not move: {unchanged}"
    assert _losses(trainer)[-1] < _losses(trainer)[0]


def test_a_copy_of_the_trained_model_runs_its_own_weights(tmp_path, chat_tok):
    """TRL patches ``forward`` with a closure over the model it trained; a deepcopy of that
    model (the demo hands one to each preference run) must still run the copy's weights."""
    import copy

    trainer = make_trainer(tmp_path, chat_tok)
    trainer.train()
    original = trainer.model.eval()
    clone = copy.deepcopy(original)
    with torch.no_grad():
        for p in clone.parameters():
            p.add_(0.05 * torch.randn_like(p))
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        plain = type(clone).forward(clone, input_ids=ids).logits
        assert torch.equal(clone(input_ids=ids).logits, plain)
        assert not torch.allclose(original(input_ids=ids).logits, plain)
        generated = clone.generate(input_ids=ids, max_new_tokens=1, do_sample=False, output_logits=True,
                                   return_dict_in_generate=True, pad_token_id=chat_tok.pad_token_id)
    assert torch.allclose(generated.logits[0][0], plain[0, -1], atol=1e-5)
    # the fused path (training) still works on the copy
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    assert clone(**batch, fused_lm_head=True).log_probs.shape == (1, 4)


def test_ademamix_is_built_by_name_with_total_steps(tmp_path, chat_tok):
    from align.optim import AdEMAMix

    trainer = make_trainer(
        tmp_path,
        chat_tok,
        optimizer="ademamix",
        ademamix_beta3=0.99,
        adam_beta1=0.9,
        adam_beta2=0.999,
        ademamix_alpha=8.0,
    )
    trainer.train()
    inner = trainer.optimizer.optimizer
    assert isinstance(inner, AdEMAMix)
    group = inner.param_groups[0]
    assert group["betas"] == (0.9, 0.999, 0.99) and group["alpha"] == 8.0
    assert group["t_alpha"] == group["t_beta3"] == trainer.state.max_steps == 3


@pytest.mark.parametrize("prompt_loss_weight", [0.0, 0.3])
def test_batch_8_equals_batch_1_times_accumulation_8(tmp_path, chat_tok, prompt_loss_weight):
    runs = {}
    for per_device, accum in ((8, 1), (1, 8)):
        trainer = make_trainer(
            tmp_path / f"b{per_device}",
            chat_tok,
            optimizer="ademamix",
            per_device_train_batch_size=per_device,
            gradient_accumulation_steps=accum,
            prompt_loss_weight=prompt_loss_weight,
        )
        trainer.train()
        runs[per_device] = (_losses(trainer), _params(trainer.model))
    (loss_a, params_a), (loss_b, params_b) = runs[8], runs[1]
    assert len(loss_a) == 3
    assert loss_a == pytest.approx(loss_b, rel=1e-5)
    for name in params_a:
        # Adam-type updates turn fp32 noise in near-zero gradients into up to ~1e-5 (1% of one
        # lr=1e-3 step); AdEMAMix with β3 = 0.99 (the default) adds α·m2 of that noise: ~1.05e-5.
        torch.testing.assert_close(params_a[name], params_b[name], rtol=0, atol=2e-5, msg=name)


def test_resume_from_checkpoint_matches_uninterrupted_run(tmp_path, chat_tok):
    common = {"optimizer": "ademamix", "max_steps": 4, "save_strategy": "steps", "save_steps": 2}
    full = make_trainer(tmp_path / "full", chat_tok, **common)
    full.train()
    resumed = make_trainer(tmp_path / "resumed", chat_tok, **common)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "out" / "checkpoint-2"))
    full_steps, resumed_steps = _losses_by_step(full), _losses_by_step(resumed)
    assert resumed.state.global_step == 4
    for step in (3, 4):
        assert resumed_steps[step] == pytest.approx(full_steps[step], rel=1e-6)
    for name, value in _params(full.model).items():
        torch.testing.assert_close(_params(resumed.model)[name], value, rtol=0, atol=1e-7, msg=name)


def test_train_sft_saves_a_model_and_tokenizer_that_load_back(tmp_path, tokenizer):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = make_config(tmp_path, max_steps=2)
    trainer = train_sft(
        config,
        [conversation(i) for i in range(8)],
        model=build_causal_lm(tokenizer),
        tokenizer=tokenizer,
    )
    loaded = AutoModelForCausalLM.from_pretrained(config.output_dir)
    for name, value in trainer.model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], value, rtol=0, atol=0, msg=name)
    tok = AutoTokenizer.from_pretrained(config.output_dir)
    assert tok.eos_token == "<|assistant_end|>" and tok.pad_token == "<pad>"
    assert tok.chat_template == chat_template("apertus")
    assert loaded.config.eos_token_id == tok.eos_token_id


def test_lora_trains_the_adapter_and_freezes_the_base(tmp_path, tokenizer):
    config = make_config(tmp_path, lora_r=4, lora_alpha=8, learning_rate=1e-2)
    model = build_causal_lm(tokenizer)
    base_before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = train_sft(
        config, [conversation(i) for i in range(24)], model=model, tokenizer=tokenizer
    )
    params = dict(trainer.model.named_parameters())
    lora = {n: p for n, p in params.items() if "lora_" in n}
    assert lora and all(p.requires_grad for p in lora.values())
    assert all(
        torch.count_nonzero(p) > 0 for n, p in lora.items() if "lora_B" in n
    )  # B starts at zero
    base = {
        n.replace("base_model.model.", "").replace(".base_layer", ""): p
        for n, p in params.items()
        if "lora_" not in n
    }
    assert set(base) == set(base_before)
    for name, value in base.items():
        assert not value.requires_grad, name
        assert torch.equal(value.detach(), base_before[name]), name


# ---- padding-free / packing ------------------------------------------------------------


def _loss_and_grads(trainer, batch):
    trainer.model.zero_grad()
    loss = trainer.compute_loss(trainer.model, dict(batch))
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in trainer.model.named_parameters()}


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("prompt_loss_weight", [0.0, 0.3])
def test_padding_free_equals_padded(tmp_path, chat_tok, attn, prompt_loss_weight):
    common = {"max_length": None, "prompt_loss_weight": prompt_loss_weight}
    results = {}
    for padding_free in (False, True):
        model = build_causal_lm(chat_tok, attn_implementation=attn)
        trainer = make_trainer(
            tmp_path / str(padding_free),
            chat_tok,
            n_rows=8,
            model=model,
            padding_free=padding_free,
            **common,
        )
        assert trainer.model.config._attn_implementation == attn
        batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
        assert ("position_ids" in batch and "attention_mask" not in batch) == padding_free
        results[padding_free] = _loss_and_grads(trainer, batch)
    (loss_p, grads_p), (loss_f, grads_f) = results[False], results[True]
    torch.testing.assert_close(loss_f, loss_p, rtol=1e-5, atol=1e-6)
    for name in grads_p:
        torch.testing.assert_close(grads_f[name], grads_p[name], rtol=1e-4, atol=1e-6, msg=name)


def test_packed_rows_equal_their_sequences_padded(tmp_path, chat_tok):
    """BFD packing: a packed row scores each conversation as if it were alone."""
    packed = make_trainer(tmp_path / "packed", chat_tok, n_rows=8, packing=True, max_length=512)
    row = packed.train_dataset[0]
    assert len(row["seq_lengths"]) > 1
    loss_packed, grads_packed = _loss_and_grads(packed, packed.data_collator([row]))
    cuts = torch.tensor(row["seq_lengths"]).cumsum(0).tolist()
    pieces = [
        {"input_ids": row["input_ids"][a:b], "labels": row["labels"][a:b]}
        for a, b in zip([0] + cuts[:-1], cuts)
    ]
    padded = make_trainer(tmp_path / "padded", chat_tok, n_rows=8)
    loss_padded, grads_padded = _loss_and_grads(padded, padded.data_collator(pieces))
    torch.testing.assert_close(loss_packed, loss_padded, rtol=1e-5, atol=1e-6)
    for name in grads_padded:
        torch.testing.assert_close(
            grads_packed[name], grads_padded[name], rtol=1e-4, atol=1e-6, msg=name
        )


def test_packed_sequences_attend_to_each_other_once_a_cache_exists(chat_tok):
    """Why the trainer relies on use_cache=False.

    transformers masks packed rows from their position ids only when no cache is built.
    """
    model = build_causal_lm(chat_tok, attn_implementation="sdpa")
    first, second = torch.tensor([[5, 6, 7, 8, 9]]), torch.tensor([[10, 11, 12]])
    alone = model(second).logits[0]
    packed, positions = torch.cat([first, second], 1), torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2]])
    no_cache = model(packed, position_ids=positions, use_cache=False).logits[0, 5:]
    with_cache = model(packed, position_ids=positions, use_cache=True).logits[0, 5:]
    torch.testing.assert_close(no_cache, alone, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(with_cache, alone, atol=1e-3)


def test_padding_free_is_refused_where_sequences_would_leak(tmp_path):
    args = make_config(tmp_path, padding_free=True, max_length=None)
    with pytest.raises(ValueError, match="sdpa_paged"):
        check_padding_free(args, "sdpa_paged")
    for allowed in ("sdpa", "eager", "flash_attention_2", "flex_attention"):
        check_padding_free(args, allowed)
    with pytest.raises(ValueError, match="wrapped"):
        check_padding_free(make_config(tmp_path, packing=True, packing_strategy="wrapped"), "sdpa")


# ---- configuration ---------------------------------------------------------------------


def test_global_batch_size_sets_gradient_accumulation(tmp_path, chat_tok):
    trainer = make_trainer(tmp_path, chat_tok, per_device_train_batch_size=2, global_batch_size=8)
    assert trainer.args.gradient_accumulation_steps == 4
    with pytest.raises(ValueError, match="global_batch_size=7"):
        make_trainer(tmp_path, chat_tok, per_device_train_batch_size=2, global_batch_size=7)
    with pytest.raises(ValueError, match="contradicts"):
        make_trainer(
            tmp_path,
            chat_tok,
            per_device_train_batch_size=2,
            global_batch_size=8,
            gradient_accumulation_steps=2,
        )


def test_apertus_presets_follow_the_report(tmp_path):
    eight, seventy = apertus_sft_defaults("8b"), apertus_sft_defaults("70B")
    assert (eight["global_batch_size"], eight["learning_rate"]) == (512, 5e-6)
    assert (seventy["global_batch_size"], seventy["learning_rate"]) == (1024, 2e-6)
    config = SFTConfig.apertus("8b", output_dir=str(tmp_path), use_cpu=True, report_to=[])
    assert config.optimizer == "ademamix" and config.lr_scheduler_type == "linear"
    assert (config.adam_beta1, config.adam_beta2, config.ademamix_beta3, config.ademamix_alpha) == (
        0.9,
        0.999,
        0.99,
        8.0,
    )
    assert config.ademamix_t_alpha is None and config.ademamix_t_beta3 is None  # = total steps
    assert (config.max_length, config.num_train_epochs, config.max_grad_norm) == (4096, 1.0, 1.0)
    assert config.prompt_loss_weight == 0.0 and getattr(config, checkpointing_field()) is True
    with pytest.raises(ValueError, match="size"):
        apertus_sft_defaults("13b")


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"assistant_only_loss": True}, "prompt_loss_weight"),
        ({"prompt_loss_weight": 1.5}, "prompt_loss_weight"),
        ({"optimizer": "sgd"}, "optimizer"),
        ({"lora_r": 0}, "lora_r"),
    ],
)
def test_config_rejects_values_it_cannot_honour(tmp_path, bad, match):
    with pytest.raises(ValueError, match=match):
        make_config(tmp_path, **bad)


# ---- bad input -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "row, field",
    [
        ({"id": "r1", "prompt": "hi"}, None),
        ({"id": "r2", "messages": [{"role": "user", "content": "hi"}]}, "messages"),
        (
            {
                "id": "r3",
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "robot", "content": "x"},
                    {"role": "assistant", "content": "ok"},
                ],
            },
            "messages",
        ),
        (
            {
                "id": "r4",
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "ok"},
                ],
                "tools": "{not json",
            },
            "tools",
        ),
        ({"id": "r5", "messages": "[{broken"}, "messages"),
    ],
)
def test_bad_rows_are_rejected_naming_row_and_field(chat_tok, row, field):
    good = {
        "id": "ok",
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}],
    }
    data = [good, row] if field else [row]
    if field is None:
        with pytest.raises(ValueError, match="needs a 'messages' column"):
            prepare_sft_dataset(Dataset.from_list(data), chat_tok, chat_date=DATE)
        return
    from align.trainers.sft_data import encode_sft_row

    with pytest.raises(RecordError) as info:
        encode_sft_row(row, chat_tok, index=1, chat_date=DATE)
    assert info.value.record_id == row["id"] and info.value.field == field
    assert row["id"] in str(info.value)


def test_row_without_id_is_named_by_index(chat_tok):
    data = Dataset.from_list(
        [
            {
                "messages": json.dumps(
                    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
                )
            },
            {"messages": json.dumps([{"role": "user", "content": "only a question"}])},
        ]
    )
    with pytest.raises(RecordError, match=r"<row 1>.*'messages'.*no assistant"):
        prepare_sft_dataset(data, chat_tok, chat_date=DATE)


def test_pretokenized_rows_without_labels_are_refused(chat_tok):
    with pytest.raises(ValueError, match="no 'labels'"):
        prepare_sft_dataset(Dataset.from_list([{"input_ids": [1, 2, 3]}]), chat_tok)


def test_truncation_cuts_rows_and_drops_those_left_without_trained_tokens():
    data = Dataset.from_list(
        [
            {
                "input_ids": list(range(10)),
                "labels": [-100] * 6 + [6, 7, 8, 9],
            },  # answer past 5: dropped
            {"input_ids": list(range(10)), "labels": [-100] * 2 + list(range(2, 10))},
        ]
    )
    out = truncate_sft_dataset(data, 5)
    assert len(out) == 1
    assert out[0] == {"input_ids": [0, 1, 2, 3, 4], "labels": [-100, -100, 2, 3, 4]}
