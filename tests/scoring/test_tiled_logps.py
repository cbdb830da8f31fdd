"""The tiled LM-head path of align.scoring.logps: what it holds in memory, and that tiling never changes results."""

from __future__ import annotations

import copy
import functools
import gc
import random
import warnings

import pytest
import torch

from align.scoring import SequenceCollator, completion_logps, encode_record, tiled_head, tiled_token_logps
from align.scoring import logps as logps_module
from align.testing.tiny import build_causal_lm, corpus_text

DATE = "2025-09-01"
LAYERS = 4


def make_batch(tokenizer, count: int = 4, seed: int = 0):
    rng = random.Random(seed)
    words = corpus_text().split()

    def text(lo: int, hi: int) -> str:
        return " ".join(rng.choice(words) for _ in range(rng.randint(lo, hi)))

    rows = [{"id": f"r{i}", "messages": [{"role": "user", "content": text(2, 10)}],
             "chosen": text(5, 30), "rejected": text(5, 30)} for i in range(count)]
    encoded = [encode_record(tokenizer, row, max_length=256, chat_date=DATE) for row in rows]
    return SequenceCollator(tokenizer.pad_token_id, padding_free=False).collate(
        [(e["prompt_ids"], e[name]) for e in encoded for name in ("chosen_ids", "rejected_ids")])


@pytest.fixture(scope="module")
def deep_model(tiny_tokenizer):
    return build_causal_lm(tiny_tokenizer, num_hidden_layers=LAYERS)


def live_hidden_state_bytes(shape: torch.Size, hidden_size: int) -> tuple[int, int]:
    """(count, bytes) of the live tensors shaped like one layer's hidden states for ``shape`` (rows, L)."""
    count = size = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # isinstance on deprecated module attributes
        objects = gc.get_objects()
        # type(), not isinstance(): a weak proxy whose object is gone (torch.compile leaves some) raises on
        # isinstance, and is no tensor anyway
        tensors = [o for o in objects if issubclass(type(o), torch.Tensor)]
    for obj in tensors:
        if not isinstance(obj, torch.nn.Parameter) and tuple(obj.shape) == (*shape, hidden_size):
            count += 1
            size += obj.numel() * obj.element_size()
    return count, size


def held_while_projecting(model, batch, monkeypatch) -> list[tuple[int, int]]:
    """Hidden-state tensors alive while the tiled head runs, for each tile (the reference pass's setting)."""
    seen = []
    project = logps_module._head_logps

    def measuring(*args):
        seen.append(live_hidden_state_bytes(batch["input_ids"].shape, model.config.hidden_size))
        return project(*args)

    monkeypatch.setattr(logps_module, "_head_logps", measuring)
    with torch.inference_mode():
        completion_logps(model, batch, tiled=True)
    return seen


def test_the_tiled_path_holds_one_layers_hidden_states_not_every_layers(deep_model, tiny_tokenizer, monkeypatch):
    batch = make_batch(tiny_tokenizer)
    rows, length = batch["input_ids"].shape
    one_layer = rows * length * deep_model.config.hidden_size * 4
    seen = held_while_projecting(deep_model, batch, monkeypatch)
    assert seen, "the tiled head did not run"
    for count, size in seen:
        assert count <= 1 and size <= one_layer, (
            f"{count} hidden-state tensors ({size} bytes) alive while projecting; one layer is {one_layer} bytes")


def test_the_model_is_not_asked_for_every_layers_hidden_states(deep_model, tiny_tokenizer):
    model = copy.deepcopy(deep_model)
    calls = []
    forward = model.forward

    @functools.wraps(forward)
    def recording(*args, **kwargs):
        calls.append(kwargs)
        output = forward(*args, **kwargs)
        assert getattr(output, "hidden_states", None) is None
        return output

    model.forward = recording
    completion_logps(model, make_batch(tiny_tokenizer), tiled=True)
    assert len(calls) == 1 and not calls[0].get("output_hidden_states")


def values_and_grads(model, batch, tiled):
    model.zero_grad()
    logps = completion_logps(model, batch, tiled=tiled)
    (logps * torch.linspace(-1, 1, logps.numel(), dtype=logps.dtype)).sum().backward()
    return logps.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same(a, b):
    (values_a, grads_a), (values_b, grads_b) = a, b
    torch.testing.assert_close(values_a, values_b, rtol=0, atol=1e-5)
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=1e-4, atol=1e-6)


def test_tiled_values_and_gradients_equal_the_models_own_head(deep_model, tiny_tokenizer):
    model = copy.deepcopy(deep_model).train()
    batch = make_batch(tiny_tokenizer)
    assert tiled_head(model) is model.lm_head
    assert_same(values_and_grads(model, batch, True), values_and_grads(model, batch, False))


def test_a_peft_wrapped_model_is_tiled_through_its_base_model(deep_model, tiny_tokenizer):
    import peft

    model = peft.get_peft_model(copy.deepcopy(deep_model),
                                peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    batch = make_batch(tiny_tokenizer)
    assert tiled_head(model) is model.get_base_model().lm_head
    tiled, plain = values_and_grads(model, batch, True), values_and_grads(model, batch, False)
    assert any("lora" in name for name in tiled[1])
    assert_same(tiled, plain)


def test_a_model_without_a_separate_backbone_uses_its_own_head(deep_model, tiny_tokenizer, monkeypatch):
    """Tiling needs the module whose last hidden state the head reads; without one the model's head is used."""
    model = copy.deepcopy(deep_model)
    monkeypatch.setattr(type(model), "get_decoder", lambda self: self)
    monkeypatch.setattr(model, "base_model_prefix", "no_such_module")
    assert tiled_head(model) is None
    with pytest.raises(ValueError, match="cannot be tiled"):
        completion_logps(model, make_batch(tiny_tokenizer), tiled=True)
    torch.testing.assert_close(completion_logps(model, make_batch(tiny_tokenizer)),
                               completion_logps(deep_model, make_batch(tiny_tokenizer), tiled=False))


# --------------------------------------------------------------------------- tile size


def test_the_default_tile_is_a_float32_byte_budget_of_at_least_1024_rows_at_128k_vocabulary():
    vocab = 128256
    rows = logps_module.tile_rows(vocab)
    assert rows * vocab * 4 <= logps_module.HEAD_TILE_BYTES
    assert rows >= 1024
    assert logps_module.tile_rows(vocab, tile_bytes=1) == 1


@pytest.mark.parametrize("tile_rows", [1, 7, 64, None])
def test_values_and_gradients_do_not_depend_on_the_tile_size(deep_model, tile_rows):
    head = copy.deepcopy(deep_model.lm_head)
    torch.manual_seed(0)
    hidden = torch.randn(50, head.in_features, requires_grad=True)
    targets = torch.randint(0, head.out_features, (50,))

    def run(**kwargs):
        head.zero_grad()
        out = tiled_token_logps(hidden, head, targets, **kwargs)
        (grad_hidden,) = torch.autograd.grad((out * torch.linspace(-1, 1, 50)).sum(), hidden, retain_graph=True)
        (out * torch.linspace(-1, 1, 50)).sum().backward()
        return out.detach(), grad_hidden, head.weight.grad.clone()

    whole = run(tile_bytes=50 * head.out_features * 4)
    tiles = run() if tile_rows is None else run(tile_bytes=tile_rows * head.out_features * 4)
    for a, b in zip(whole, tiles):
        torch.testing.assert_close(a, b)


def _float64_reference(hidden, weight, bias, targets, upstream):
    """log softmax(h Wᵀ + b)[target] and its gradients, in float64 through autograd (no tiles)."""
    h, w = hidden.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
    b = None if bias is None else bias.detach().double().requires_grad_()
    logits = h @ w.T + (0 if b is None else b)
    logps = torch.log_softmax(logits, -1).gather(-1, targets[:, None]).squeeze(-1)
    (logps * upstream.double()).sum().backward()
    return logps.detach(), h.grad, w.grad, None if b is None else b.grad


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("needs", ["both", "hidden only", "weight only"])
def test_the_hand_written_backward_equals_float64_autograd(bias, needs):
    torch.manual_seed(1)
    head = torch.nn.Linear(24, 300, bias=bias)
    hidden = torch.randn(50, 24) * 3
    targets = torch.randint(0, 300, (50,))
    upstream = torch.randn(50)
    hidden.requires_grad_(needs != "weight only")
    head.requires_grad_(needs != "hidden only")
    out = tiled_token_logps(hidden, head, targets, tile_bytes=7 * 300 * 4)  # 8 tiles, the last of 1 row
    (out * upstream).sum().backward()
    logps, grad_hidden, grad_weight, grad_bias = _float64_reference(hidden, head.weight, head.bias, targets, upstream)
    torch.testing.assert_close(out.double(), logps, rtol=1e-5, atol=1e-5)
    if needs != "weight only":
        torch.testing.assert_close(hidden.grad.double(), grad_hidden, rtol=1e-5, atol=1e-5)
    else:
        assert hidden.grad is None
    if needs != "hidden only":
        torch.testing.assert_close(head.weight.grad.double(), grad_weight, rtol=1e-5, atol=1e-5)
        if bias:
            torch.testing.assert_close(head.bias.grad.double(), grad_bias, rtol=1e-5, atol=1e-5)
    else:
        assert head.weight.grad is None


def test_a_bf16_head_reads_float32_hidden_states_and_returns_their_gradient_in_float32():
    torch.manual_seed(2)
    head = torch.nn.Linear(32, 200, bias=False).to(torch.bfloat16)
    hidden = torch.randn(20, 32, requires_grad=True)
    targets = torch.randint(0, 200, (20,))
    out = tiled_token_logps(hidden, head, targets, tile_bytes=6 * 200 * 4)
    out.sum().backward()
    assert out.dtype == torch.float32 and hidden.grad.dtype == torch.float32
    assert head.weight.grad.dtype == torch.bfloat16
    logps, grad_hidden, grad_weight, _ = _float64_reference(hidden.to(torch.bfloat16).float(), head.weight, None,
                                                            targets, torch.ones(20))
    torch.testing.assert_close(out.double(), logps, rtol=1e-2, atol=1e-2)  # logits rounded to bf16
    torch.testing.assert_close(hidden.grad.double(), grad_hidden, rtol=2e-2, atol=2e-2)  # bf16 products
    torch.testing.assert_close(head.weight.grad.double(), grad_weight, rtol=2e-2, atol=2e-2)


def test_a_tied_head_adds_its_gradient_to_the_embeddings():
    torch.manual_seed(3)
    embedding = torch.nn.Embedding(100, 16)
    head = torch.nn.Linear(16, 100, bias=False)
    head.weight = embedding.weight  # tied, as in Llama with tie_word_embeddings
    ids = torch.randint(0, 100, (12,))
    targets = torch.randint(0, 100, (12,))
    hidden = torch.tanh(embedding(ids))
    tiled_token_logps(hidden, head, targets, tile_bytes=5 * 100 * 4).sum().backward()
    tiled = embedding.weight.grad.clone()
    embedding.zero_grad()
    logits = torch.tanh(embedding(ids)).double() @ embedding.weight.double().T
    torch.log_softmax(logits, -1).gather(-1, targets[:, None]).sum().backward()
    torch.testing.assert_close(tiled, embedding.weight.grad, rtol=1e-5, atol=1e-6)
