"""install_format on the tiny tokenizer and model, for every format."""

from __future__ import annotations

import copy

import pytest
import torch

from align.chat import FORMATS, chat_template, encode, install_format
from align.testing.tiny import build_tokenizer

MESSAGES = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_install_format_sets_tokens_template_eos_pad_and_resizes(fmt, tokenizer, tiny_model):
    model = copy.deepcopy(tiny_model)
    rows_before = model.get_input_embeddings().weight.shape[0]
    spec = install_format(tokenizer, model, chat_format=fmt)

    assert spec is FORMATS[fmt]
    for token in spec.special_tokens:
        assert tokenizer(token, add_special_tokens=False)["input_ids"] == [
            tokenizer.convert_tokens_to_ids(token)]
    assert tokenizer.eos_token == spec.eos
    assert tokenizer.pad_token is not None and tokenizer.pad_token_id != tokenizer.eos_token_id
    assert tokenizer.chat_template == chat_template(fmt)

    rows = model.get_input_embeddings().weight.shape[0]
    assert rows == max(rows_before, len(tokenizer))
    if fmt != "apertus":  # the tiny tokenizer ships the Apertus tokens only
        assert rows > rows_before
    assert model.get_output_embeddings().weight.shape[0] == rows
    for config in (model.config, model.generation_config):
        assert config.eos_token_id == tokenizer.eos_token_id
        assert config.pad_token_id == tokenizer.pad_token_id
        assert config.pad_token_id != config.eos_token_id

    ids = encode(tokenizer, MESSAGES, chat_format=fmt, chat_date="2025-09-21").input_ids
    assert max(ids) < rows
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), rows)


def test_install_format_is_idempotent(tokenizer):
    install_format(tokenizer, chat_format="llama3")
    size = len(tokenizer)
    install_format(tokenizer, chat_format="llama3")
    assert len(tokenizer) == size


def test_pad_equal_to_the_new_eos_is_replaced(tokenizer):
    tokenizer.pad_token = "<|assistant_end|>"
    install_format(tokenizer, chat_format="apertus")
    assert tokenizer.pad_token == "<pad>"


def test_missing_pad_is_added():
    tokenizer = build_tokenizer()
    tokenizer.pad_token = None
    install_format(tokenizer, chat_format="chatml")
    assert tokenizer.pad_token == "<pad>"
    assert tokenizer.pad_token_id != tokenizer.eos_token_id


def test_a_different_bos_is_refused(tokenizer):
    tokenizer.bos_token = "</s>"
    with pytest.raises(ValueError, match="starts with BOS '<s>' but the tokenizer's BOS is "
                       "'</s>'"):
        install_format(tokenizer, chat_format="apertus")
