"""What an OpenAI-compatible sampler keeps of its settings before it asks the server anything.

The chat format it is given is the one its prompts are rendered in (a server serving a ChatML
model gets ChatML prompts, not the Apertus default), and the base URL it prints and asks loses a
trailing slash and nothing more.
"""

from __future__ import annotations

import pytest

from align.chat import install_format, render
from align.sampling.openai_backend import OpenAISampler
from align.testing.tiny import build_tokenizer

CONVERSATION = [{"role": "user", "content": "Is 4 even?"}]


@pytest.fixture(scope="module")
def chatml_tokenizer():
    tokenizer = build_tokenizer()
    install_format(tokenizer, chat_format="chatml")
    return tokenizer


def test_prompts_are_rendered_in_the_chat_format_given(chatml_tokenizer):
    sampler = OpenAISampler("http://node17:8000/v1", "m", chatml_tokenizer, chat_format="chatml", api_key="k")
    prompt = sampler.encoder.render(CONVERSATION)
    assert prompt == render(CONVERSATION, chat_format="chatml", add_generation_prompt=True)
    assert prompt.startswith("<|im_start|>") and prompt.endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("given, kept", [
    ("http://node17:8000/v1/", "http://node17:8000/v1"),
    ("http://node17:8000/v1", "http://node17:8000/v1"),
    ("http://serverX:8000/apiX/", "http://serverx:8000/apiX"),  # the path's last character stays (the host is lower case)
])
def test_the_base_url_loses_a_trailing_slash_only(chatml_tokenizer, given, kept):
    sampler = OpenAISampler(given, "m", chatml_tokenizer, chat_format="chatml", api_key="k")
    assert sampler.base_url == kept
