"""How an engine's finish reason meets the sampler's own reading of the ids.

vLLM (and a vLLM server) can answer "length" for a completion whose last allowed token was
the end-of-turn token: it counts the budget first. The turn did end, so the ids decide
("stop"), on every backend, instead of the batch being lost to a mismatch error. No vLLM is
needed: the engines' outputs are faked.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from align.chat import install_format
from align.sampling.base import PromptEncoder, engine_completion
from align.sampling.openai_backend import OpenAISampler
from align.sampling.vllm_backend import VLLMSampler
from align.testing.tiny import build_tokenizer


@pytest.fixture(scope="module")
def encoder():
    tokenizer = build_tokenizer()
    install_format(tokenizer, chat_format="apertus")
    return PromptEncoder(tokenizer, "apertus")


def body_then_end(encoder):
    body = encoder.tokenizer("a short answer", add_special_tokens=False)["input_ids"]
    end = encoder.tokenizer.convert_tokens_to_ids("<|assistant_end|>")
    return body, end


def fake_vllm_sampler(encoder):
    sampler = VLLMSampler.__new__(VLLMSampler)  # no engine: only the output reading is under test
    sampler.encoder, sampler.model_name = encoder, "tiny"
    return sampler


def fake_openai_sampler(encoder):
    sampler = OpenAISampler.__new__(OpenAISampler)
    sampler.encoder, sampler.model_name, sampler.base_url = encoder, "tiny", "http://127.0.0.1:1/v1"
    return sampler


def test_vllm_length_with_the_end_of_turn_as_last_token_is_a_stop(encoder):
    body, end = body_then_end(encoder)
    output = SimpleNamespace(index=0, token_ids=[*body, end], finish_reason="length")  # a vLLM CompletionOutput
    completion = fake_vllm_sampler(encoder)._completion(list(output.token_ids), output.finish_reason, {})
    assert completion.finish_reason == "stop"
    assert completion.text == "a short answer"
    assert completion.num_tokens == len(body) + 1


def test_openai_length_with_the_end_of_turn_as_last_token_is_a_stop(encoder):
    body, end = body_then_end(encoder)
    completion = fake_openai_sampler(encoder)._completion({"token_ids": [*body, end], "finish_reason": "length"}, {})
    assert completion.finish_reason == "stop" and completion.num_tokens == len(body) + 1


def test_the_readings_agree_as_before(encoder):
    body, end = body_then_end(encoder)
    sampler = fake_vllm_sampler(encoder)
    assert sampler._completion([*body, end], "stop", {}).finish_reason == "stop"
    assert sampler._completion(body, "length", {}).finish_reason == "length"


@pytest.mark.parametrize("reason", ["abort", None])
def test_an_aborted_completion_is_still_refused(encoder, reason):
    body, end = body_then_end(encoder)
    with pytest.raises(RuntimeError, match="vLLM finished with"):
        fake_vllm_sampler(encoder)._completion([*body, end], reason, {})


def test_stop_without_a_stop_token_is_still_refused(encoder):
    """The engine stopped at something the encoder does not know: no reading to trust."""
    body, _ = body_then_end(encoder)
    with pytest.raises(RuntimeError, match="finished with 'stop' but the generated ids say 'length'"):
        engine_completion(encoder, body, "stop", "tiny", {}, engine="vLLM")
