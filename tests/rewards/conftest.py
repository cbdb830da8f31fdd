"""Tiny real models for the reward tests: a chat tokenizer, a causal LM judge, a reward model."""

from __future__ import annotations

import copy

import pytest


@pytest.fixture(scope="session")
def chat_tokenizer(tiny_tokenizer):
    """The tiny tokenizer speaking the Apertus chat format (template, EOS, pad != EOS)."""
    from align.chat import install_format

    tok = copy.deepcopy(tiny_tokenizer)
    install_format(tok, chat_format="apertus")
    return tok


@pytest.fixture(scope="session")
def judge_lm(chat_tokenizer):
    from align.testing.tiny import build_causal_lm

    return build_causal_lm(chat_tokenizer, seed=3)


@pytest.fixture(scope="session")
def rm_model(chat_tokenizer):
    from align.testing.tiny import build_reward_model

    return build_reward_model(chat_tokenizer, seed=4)


@pytest.fixture(scope="session")
def short_charter():
    """A short charter in the default's shape, so judge prompts stay small in tests."""
    from rewards.charter import parse_charter

    return parse_charter(
        "# Test charter\n\n## 1. Quality\n[1.1] Answer the question.\n[1.2] Be correct.\n\n"
        "## 2. Care\n[2.1] Do no harm.\n",
        "test-charter",
    )

