"""Tiny, offline models and tokenizers for tests, the demo and benchmarks.

No model hub is reachable on CI machines, so everything here is built locally in
seconds: a byte-level BPE tokenizer trained on text the project ships (with the chat
formats' special tokens), a small Llama causal LM whose head_dim (32) vLLM's CPU backend
accepts, and a one-label Llama sequence classifier that stands in for a reward model.
"""

from __future__ import annotations

import copy

import random
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    LlamaForSequenceClassification,
    PreTrainedTokenizerFast,
)

from align.chat.formats import APERTUS
from align.errors import ConfigError

BASE_SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]

# The format registry is the one source of the Apertus special tokens (in the order of
# the Apertus tokenizer, where they are ids 61-72).
APERTUS_SPECIAL_TOKENS = list(APERTUS.special_tokens)


def corpus_text() -> str:
    """The small text the tiny tokenizer is trained on (shipped with the package)."""
    return resources.files("align").joinpath("assets/tiny_corpus.txt").read_text()


def build_tokenizer(
    vocab_size: int = 512,
    *,
    special_tokens: list[str] | None = None,
    extra_text: list[str] | None = None,
    add_bos: bool = True,
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer with the Apertus special tokens.

    Like real Llama-family tokenizers it prepends `<s>` when `add_special_tokens=True`,
    so code that tokenizes an already rendered string (which starts with `<s>`) must
    pass `add_special_tokens=False`; tests catch a doubled BOS this way.
    """
    specials = BASE_SPECIAL_TOKENS + list(special_tokens or APERTUS_SPECIAL_TOKENS)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    text = corpus_text().splitlines() + list(extra_text or [])
    tok.train_from_iterator(text, trainer=trainer)
    if add_bos:
        bos_id = tok.token_to_id("<s>")
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos_id)]
        )
    fast = wrap_tokenizer(tok, specials)
    fast.padding_side = "right"
    return fast


def wrap_tokenizer(tok: Tokenizer, specials: list[str]) -> PreTrainedTokenizerFast:
    """A trained `tokenizers` BPE as a transformers tokenizer with the base special tokens.

    ``specials`` starts with BASE_SPECIAL_TOKENS; the rest become additional special tokens.
    """
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        additional_special_tokens=specials[len(BASE_SPECIAL_TOKENS):],
    )


def _llama_config(tokenizer: PreTrainedTokenizerFast, **overrides) -> LlamaConfig:
    kwargs = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    kwargs.update(overrides)
    return LlamaConfig(**kwargs)


def build_causal_lm(
    tokenizer: PreTrainedTokenizerFast, *, seed: int = 0, **config_overrides
) -> LlamaForCausalLM:
    """A random-weight Llama (hidden 64, 2 heads, so head_dim 32) sized to the tokenizer."""
    torch.manual_seed(seed)
    model = LlamaForCausalLM(_llama_config(tokenizer, **config_overrides))
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval()


def build_reward_model(
    tokenizer: PreTrainedTokenizerFast, *, seed: int = 1, **config_overrides
) -> LlamaForSequenceClassification:
    """A one-label sequence classifier standing in for Skywork-Reward-V2."""
    torch.manual_seed(seed)
    config = _llama_config(tokenizer, num_labels=1, **config_overrides)
    return LlamaForSequenceClassification(config).eval()


def check_architecture(name: str) -> None:
    """A name of ``ARCHITECTURES``, or an error listing them."""
    if name not in ARCHITECTURES:
        raise ConfigError(f"architecture={name!r}: choose one of {', '.join(ARCHITECTURES)}")


def quantile_pair_rows(count: int, seed: int = 0) -> list[dict]:
    """Pair rows of corpus words (prompts 2–8 words, completions 2–12) with the quantile columns
    QRPO reads: chosen beat every reference, rejected 0, 0.1 or 0.2 of them."""
    rng = random.Random(seed)
    words = corpus_text().split()

    def text(lo: int, hi: int) -> str:
        return " ".join(rng.choice(words) for _ in range(rng.randint(lo, hi)))

    return [{"id": f"p{i}", "messages": [{"role": "user", "content": text(2, 8)}], "chosen": text(2, 12),
             "rejected": text(2, 12), "chosen_quantile": 1.0, "rejected_quantile": rng.choice([0.0, 0.1, 0.2]),
             "num_ref_rewards": 10} for i in range(count)]


MODELS = ("policy", "reward_model", "own_template")


def save_tiny_models(root: str | Path, *, seed: int = 0, architecture: str = "llama",
                     which: Sequence[str] = MODELS) -> dict[str, Path]:
    """Build and save tokenizer + causal LM + reward model under `root`; return their dirs.

    The tokenizer is saved next to each model so both load with `from_pretrained(dir)`.
    ``architecture`` picks the policy's (``ARCHITECTURES``); the reward model is a Llama whose
    tokenizer carries a chat template (the Apertus format's), as a real reward model's does;
    ``own_template`` is a Llama whose tokenizer brings Qwen3's template and tokens, for
    ``chat_format: tokenizer``. ``which`` picks the ones built (the tests' shared pair leaves out
    ``own_template``, whose template is read from the installed TRL, which the vLLM environment lacks).
    """
    from align.chat import install_format

    unknown = sorted(set(which) - set(MODELS))
    if unknown:
        raise ConfigError(f"unknown tiny model {unknown[0]!r} (one of {', '.join(MODELS)})")

    check_architecture(architecture)
    root = Path(root)
    tokenizer = build_tokenizer()
    paths = {name: root / name for name in MODELS if name in which}
    if "policy" in paths:
        ARCHITECTURES[architecture](tokenizer, seed=seed).save_pretrained(paths["policy"])
        tokenizer.save_pretrained(paths["policy"])
    if "reward_model" in paths:
        build_reward_model(tokenizer, seed=seed + 1).save_pretrained(paths["reward_model"])
        reward_tokenizer = copy.deepcopy(tokenizer)
        install_format(reward_tokenizer, chat_format="apertus")  # a reward model renders with its own template
        reward_tokenizer.save_pretrained(paths["reward_model"])
    if "own_template" in paths:
        own = build_template_tokenizer("qwen3")  # a model that brings its own chat template (chat_format: tokenizer)
        build_causal_lm(own, seed=seed + 2).save_pretrained(paths["own_template"])
        own.save_pretrained(paths["own_template"])
    return paths


# The chat templates TRL ships with its package (the models' own, kept there to recognise them):
# the tiny tokenizer with one of them installed stands in for a Qwen3 or Llama 3 tokenizer.
TEMPLATE_TOKENS = {
    "qwen3": (["<|im_start|>", "<|im_end|>"], ["<think>", "</think>"]),
    "llama3": (["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"], []),
}


def build_template_tokenizer(name: str) -> PreTrainedTokenizerFast:
    """The tiny tokenizer with a real model's chat template (``qwen3`` or ``llama3``, read from
    the installed TRL) and that template's tokens: special ones as special, the others added."""
    from importlib.resources import files

    special, plain = TEMPLATE_TOKENS[name]
    tokenizer = build_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": special}, replace_extra_special_tokens=False)
    if plain:
        tokenizer.add_tokens(plain)
    tokenizer.chat_template = (files("trl") / "chat_templates" / f"{name}.jinja").read_text()
    return tokenizer


# Tiny models of the architectures the recipes train: Apertus (xIELU activations with trainable
# scalars per layer, QK-norm, an untied head) and Qwen3 (QK-norm, grouped-query attention),
# built through transformers' own classes from their real configs shrunk; Llama above.
def _shrunk(config_class: Any, tokenizer: PreTrainedTokenizerFast, **overrides) -> Any:
    kwargs = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                  bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                  pad_token_id=tokenizer.pad_token_id)
    kwargs.update(overrides)
    return config_class(**kwargs)


def build_apertus_lm(tokenizer: PreTrainedTokenizerFast, *, seed: int = 0, **config_overrides) -> Any:
    """A random-weight Apertus (xIELU, QK-norm, untied head, GQA 4/2 heads) sized to the tokenizer."""
    from transformers import ApertusConfig, ApertusForCausalLM

    torch.manual_seed(seed)
    config = _shrunk(ApertusConfig, tokenizer, tie_word_embeddings=False, **config_overrides)
    model = ApertusForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval()


def build_qwen3_lm(tokenizer: PreTrainedTokenizerFast, *, seed: int = 0, **config_overrides) -> Any:
    """A random-weight Qwen3 (QK-norm, GQA 4/2 heads, head_dim 16, tied head) sized to the tokenizer."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = _shrunk(Qwen3Config, tokenizer, head_dim=16, tie_word_embeddings=True, **config_overrides)
    model = Qwen3ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval()


ARCHITECTURES = {"llama": build_causal_lm, "apertus": build_apertus_lm, "qwen3": build_qwen3_lm}
