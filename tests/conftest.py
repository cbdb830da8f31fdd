"""Session-wide tiny fixtures: built once per test session, offline, in a temp dir."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    """Saved tiny policy and reward model dirs (each with the tokenizer)."""
    from align.testing.tiny import save_tiny_models

    return save_tiny_models(tmp_path_factory.mktemp("tiny_models"))


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from align.testing.tiny import build_tokenizer

    return build_tokenizer()


@pytest.fixture()
def tokenizer(tiny_tokenizer):
    """A fresh copy per test, so tests may add tokens or templates freely."""
    import copy

    return copy.deepcopy(tiny_tokenizer)


@pytest.fixture(scope="session")
def tiny_model(tiny_tokenizer):
    from align.testing.tiny import build_causal_lm

    return build_causal_lm(tiny_tokenizer)
