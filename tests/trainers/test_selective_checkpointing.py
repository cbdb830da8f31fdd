"""Selective activation checkpointing (``checkpoint_modules``): the same gradients, the part chosen
recomputed in the layers chosen, and fewer activations kept than without it.

Memory is counted, not timed: the bytes autograd keeps for backward (a saved-tensors hook),
the figure that activation checkpointing changes.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from align.config import ConfigError
from align.trainers.checkpointing import SelectiveCheckpointing, checkpoint_parts, decoder_part
from align.trainers.preference_config import PreferenceConfig

LAYERS = 4


@pytest.fixture(scope="module")
def llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=128, num_hidden_layers=LAYERS,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    config._attn_implementation = "sdpa"
    return LlamaForCausalLM(config).double()


def prepared(llama, part: str | None, every: int = 1) -> LlamaForCausalLM:
    """A copy with no checkpointing (None), whole layers (``layer``), or one part of every ``every``-th layer."""
    model = copy.deepcopy(llama).train()
    if part is not None:
        model.activation_checkpointing_enable(every_n_layers=every)
        if part != "layer":
            assert checkpoint_parts(model, part) == len(range(0, LAYERS, every))
    return model


def batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(3, 97, (2, 24), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "labels": ids}


def grads(model) -> dict[str, torch.Tensor]:
    model.zero_grad()
    model(**batch()).loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("part", ["attention", "mlp", "layer"])
@pytest.mark.parametrize("every", [1, 2])
def test_gradients_are_those_of_no_checkpointing(llama, part, every):
    expected = grads(prepared(llama, None))
    got = grads(prepared(llama, part, every))
    assert got.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-12, msg=name)


def forward_calls(model, every_layer: str) -> list[int]:
    """How many times each layer's ``every_layer`` projection ran in one forward and backward."""
    counts = [0] * LAYERS
    hooks = [getattr_path(layer, every_layer).register_forward_hook(
        lambda *_, i=i: counts.__setitem__(i, counts[i] + 1)) for i, layer in enumerate(model.model.layers)]
    grads(model)
    for hook in hooks:
        hook.remove()
    return counts


def getattr_path(module, path: str):
    for name in path.split("."):
        module = getattr(module, name)
    return module


@pytest.mark.parametrize("part, attention, mlp", [
    ("attention", [2, 1, 2, 1], [1, 1, 1, 1]),
    ("mlp", [1, 1, 1, 1], [2, 1, 2, 1]),
    ("layer", [2, 1, 2, 1], [2, 1, 2, 1]),
    (None, [1, 1, 1, 1], [1, 1, 1, 1]),
])
def test_only_the_part_chosen_is_recomputed_in_the_layers_chosen(llama, part, attention, mlp):
    model = prepared(llama, part, every=2)  # layers 0 and 2
    assert forward_calls(model, "self_attn.q_proj") == attention
    model = prepared(llama, part, every=2)
    assert forward_calls(model, "mlp.gate_proj") == mlp


def saved_bytes(model) -> int:
    """Bytes of activations autograd keeps for backward over one forward (each storage once, weights not)."""
    storages: dict[int, int] = {}
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = model(**batch()).loss
    loss.backward()
    return sum(storages.values())


def test_each_choice_keeps_fewer_activations_than_none(llama):
    kept = {part: saved_bytes(prepared(llama, part)) for part in (None, "attention", "mlp", "layer")}
    # the MLP's activations (intermediate width 4x hidden) outweigh attention's at this shape, as at Llama's
    assert kept[None] > kept["attention"] > kept["mlp"] > kept["layer"], kept


def test_a_part_is_found_by_the_names_models_use(llama):
    layer = llama.model.layers[0]
    assert decoder_part(layer, "attention") is layer.self_attn
    assert decoder_part(layer, "mlp") is layer.mlp
    with pytest.raises(ConfigError, match=r"checkpoint_modules='mlp': Linear has no mlp submodule"):
        decoder_part(torch.nn.Linear(2, 2), "mlp")


def test_a_second_call_wraps_nothing_twice(llama):
    model = prepared(llama, "mlp")
    model.activation_checkpointing_enable()  # a resumed train() marks the layers again
    assert checkpoint_parts(model, "mlp") == LAYERS
    assert forward_calls(model, "mlp.gate_proj") == [2] * LAYERS


def test_evaluation_runs_each_part_once(llama):
    model = prepared(llama, "mlp").eval()
    counts = [0]
    model.model.layers[0].mlp.gate_proj.register_forward_hook(lambda *_: counts.__setitem__(0, counts[0] + 1))
    with torch.no_grad():
        model(**batch())
    assert counts == [1]


@pytest.mark.parametrize("value, message", [
    ("mpl", r"checkpoint_modules='mpl': choose one of \['layer', 'attention', 'mlp'\]"),
    ("attention", r"checkpoint_modules='attention' with use_reentrant=true"),
])
def test_the_config_refuses_what_it_cannot_do(tmp_path, value, message):
    with pytest.raises(ConfigError, match=message):
        PreferenceConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", checkpoint_modules=value,
                         activation_checkpointing_kwargs={"use_reentrant": True})


def test_the_trainer_checkpoints_the_part_when_training_starts(tiny_model, tiny_tokenizer, tmp_path):
    from align.trainers.preference_trainer import PreferenceTrainer

    rows = [{"id": f"r{i}", "messages": [{"role": "user", "content": f"Q{i}?"}], "chosen": "yes", "rejected": "no",
             "chosen_quantile": 1.0, "rejected_quantile": 0.0} for i in range(2)]
    losses, models = {}, {}
    for part in ("layer", "mlp"):
        args = PreferenceConfig(output_dir=str(tmp_path / part), use_cpu=True, report_to="none",
                                chat_date="2025-09-01", reference="model", per_device_train_batch_size=2,
                                max_steps=1, activation_checkpointing=True, checkpoint_modules=part,
                                learning_rate=1e-3, save_strategy="no")
        trainer = PreferenceTrainer(copy.deepcopy(tiny_model), args, train_dataset=rows,
                                    processing_class=tiny_tokenizer, ref_model=copy.deepcopy(tiny_model))
        assert any(isinstance(c, SelectiveCheckpointing) for c in trainer.callback_handler.callbacks) == \
            (part == "mlp")
        losses[part] = trainer.train().training_loss
        models[part] = trainer.model
    layers = list(models["mlp"].model.layers)
    assert not any(layer.gradient_checkpointing for layer in layers)
    assert all(getattr(layer.mlp, "_align_checkpointed", False) for layer in layers)
    assert losses["mlp"] == pytest.approx(losses["layer"], rel=1e-6)
    for (name, a), (_, b) in zip(models["layer"].named_parameters(), models["mlp"].named_parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
