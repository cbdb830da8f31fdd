"""install_format on a model whose embeddings are sharded as ZeRO-3 leaves them: weight of shape [0].

Under ZeRO-3 init every rank holds an empty placeholder for each parameter, so the embedding's
weight reports shape [0]; the row count is still known (``num_embeddings``, ``config.vocab_size``).
Resizing on the weight's shape would rebuild the whole embedding and head on every rank each time.
"""

from __future__ import annotations

import copy

import pytest
import torch

from align.chat import install_format


def as_zero3_leaves_it(model):
    """Replace the input and output embedding weights with empty placeholders (their row count stays known)."""
    embeddings, head = model.get_input_embeddings(), model.get_output_embeddings()
    rows = embeddings.num_embeddings
    embeddings.weight = torch.nn.Parameter(torch.empty(0))
    head.weight = torch.nn.Parameter(torch.empty(0))
    assert embeddings.weight.shape == (0,) and embeddings.num_embeddings == rows
    return model


def record_resizes(model, monkeypatch) -> list:
    calls = []
    monkeypatch.setattr(model, "resize_token_embeddings", lambda *args, **kwargs: calls.append((args, kwargs)))
    return calls


def test_no_resize_when_the_sharded_embedding_already_has_the_rows(tokenizer, tiny_model, monkeypatch):
    install_format(tokenizer, chat_format="apertus")  # the tokens the tiny model was sized for
    model = as_zero3_leaves_it(copy.deepcopy(tiny_model))
    assert len(tokenizer) <= model.get_input_embeddings().num_embeddings
    calls = record_resizes(model, monkeypatch)
    install_format(tokenizer, model, chat_format="apertus")
    assert calls == []
    assert model.get_input_embeddings().weight.shape == (0,)  # nothing gathered or rebuilt
    assert model.config.eos_token_id == tokenizer.eos_token_id
    assert model.config.pad_token_id == tokenizer.pad_token_id


def test_a_sharded_embedding_is_resized_when_the_tokenizer_needs_more_rows(tokenizer, tiny_model, monkeypatch):
    model = as_zero3_leaves_it(copy.deepcopy(tiny_model))
    rows = model.get_input_embeddings().num_embeddings
    calls = record_resizes(model, monkeypatch)
    install_format(tokenizer, model, chat_format="chatml")  # adds the ChatML tokens
    assert len(tokenizer) > rows
    assert calls == [((len(tokenizer),), {})]


@pytest.mark.parametrize("chat_format", ["apertus", "chatml"])
def test_rows_are_read_from_the_config_when_the_embedding_does_not_say(tokenizer, tiny_model, monkeypatch,
                                                                       chat_format):
    """An embedding module without ``num_embeddings``: the text config's ``vocab_size`` decides."""
    model = copy.deepcopy(tiny_model)

    class Opaque(torch.nn.Module):
        weight = torch.nn.Parameter(torch.empty(0))

    monkeypatch.setattr(model, "get_input_embeddings", lambda: Opaque())
    calls = record_resizes(model, monkeypatch)
    install_format(tokenizer, model, chat_format=chat_format)
    assert calls == ([] if len(tokenizer) <= model.config.vocab_size else [((len(tokenizer),), {})])
    if chat_format == "chatml":
        assert calls
