"""Make a tokenizer (and model) speak a chat format: tokens, template, EOS and padding."""

from __future__ import annotations

from typing import Any

from align.chat.formats import ChatFormat, get_format
from align.chat.template import TOKENIZER_FORMAT
from align.chat.templates import chat_template
from align.errors import InputError

PAD_TOKEN = "<pad>"


def _add_special(tokenizer: Any, tokens: list[str]) -> None:
    """Register tokens as special (kept whole, skippable in decode); existing ones keep ids."""
    if tokens:
        tokenizer.add_special_tokens({"additional_special_tokens": tokens},
                                     replace_extra_special_tokens=False)


def install_format(tokenizer: Any, model: Any = None, chat_format: str = "apertus") -> ChatFormat | None:
    """Prepare ``tokenizer`` (and ``model``) for a chat format, in place; returns the format.

    - adds the format's special tokens that are missing, as special tokens;
    - sets the chat template (``chat_template(chat_format)``);
    - sets EOS to the format's end-of-turn token (``<|assistant_end|>``, ``<|eot_id|>``,
      ``<|im_end|>``), since that is what generation must stop at;
    - ensures a pad token different from EOS (``<pad>``, added if needed), so padding is
      never confused with the end of a turn;
    - with a model: grows the embeddings to the tokenizer's size when it has more tokens
      than they have rows (counted by ``embedding_rows``, right under ZeRO-3 too), and sets
      ``config`` and ``generation_config`` BOS/EOS/pad ids.

    A tokenizer whose BOS differs from the format's (``<s>`` for apertus and llama3)
    raises: the rendered text starts with the format's BOS, and silently training on
    another one would teach the wrong sequence start.
    """
    if chat_format == TOKENIZER_FORMAT:
        return _keep_own_template(tokenizer, model)
    fmt = get_format(chat_format)
    if fmt.bos and tokenizer.bos_token not in (None, fmt.bos):
        raise InputError(f"format {fmt.name!r} starts with BOS {fmt.bos!r} but the tokenizer's "
                         f"BOS is {tokenizer.bos_token!r}")
    added = tokenizer.get_added_vocab()
    wanted = list(fmt.special_tokens) + ([fmt.bos] if fmt.bos else [])
    _add_special(tokenizer, [t for t in wanted if t not in added])
    if fmt.bos and tokenizer.bos_token is None:
        tokenizer.bos_token = fmt.bos
    tokenizer.eos_token = fmt.eos
    _pad_apart_from_eos(tokenizer)
    tokenizer.chat_template = chat_template(fmt.name)
    if model is not None:
        _update_model(model, tokenizer, with_bos=bool(fmt.bos))
    return fmt


def _pad_apart_from_eos(tokenizer: Any) -> None:
    """A pad token of its own (``<pad>``, added if needed) where there is none or it is EOS:
    padding must never read as the end of a turn."""
    if tokenizer.pad_token is None or tokenizer.pad_token == tokenizer.eos_token:
        if PAD_TOKEN not in tokenizer.get_added_vocab():
            _add_special(tokenizer, [PAD_TOKEN])
        tokenizer.pad_token = PAD_TOKEN


def _keep_own_template(tokenizer: Any, model: Any = None) -> None:
    """``chat_format='tokenizer'``: the model keeps its template and tokens. Generation must
    stop at the template's end of turn, so a one-token end of turn (``<|im_end|>``,
    ``<|eot_id|>``) becomes EOS; padding gets a token of its own when it has none or shares
    EOS's."""
    from align.chat.template import check_own_template, turn_end

    check_own_template(tokenizer)
    end = turn_end(tokenizer)
    if end in tokenizer.get_added_vocab():
        tokenizer.eos_token = end
    _pad_apart_from_eos(tokenizer)
    if model is not None:
        _update_model(model, tokenizer, with_bos=False)


def embedding_rows(model: Any) -> int:
    """How many token rows the model's input embedding has.

    Read from the module (``num_embeddings``) or the text config's ``vocab_size``, never from
    the weight's shape: under ZeRO-3 init each rank holds an empty placeholder (shape [0]) for
    the sharded weight, and sizing on it would resize (gather and rebuild the whole
    embedding and head on every rank) each time a format is installed.
    """
    rows = getattr(model.get_input_embeddings(), "num_embeddings", None)
    if isinstance(rows, int):
        return rows
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    rows = getattr(config, "vocab_size", None)
    if not isinstance(rows, int):
        raise InputError(f"cannot tell how many token rows {type(model).__name__} has: its input embedding has no "
                         "num_embeddings and its config no vocab_size")
    return rows


def _update_model(model: Any, tokenizer: Any, *, with_bos: bool) -> None:
    """Resize embeddings only when the tokenizer has more tokens than they have rows, and
    point the model's special ids at the tokenizer."""
    if len(tokenizer) > embedding_rows(model):
        model.resize_token_embeddings(len(tokenizer))
    ids = {"eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    if with_bos:
        ids["bos_token_id"] = tokenizer.bos_token_id
    for config in (model.config, getattr(model, "generation_config", None)):
        if config is not None:
            for key, value in ids.items():
                setattr(config, key, value)
