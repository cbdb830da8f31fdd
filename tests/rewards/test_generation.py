"""The classifier's and the LLM degrader's generator: `rewards.generation.Generator` on a sampler.

Greedy generations are checked against an independent reference: a plain `model.generate`
greedy loop, one prompt at a time (no padding), on the prompt ids of the model's own chat
template with thinking off, decoded without special tokens. The tiny model has untied
output rows (a tied tiny Llama repeats its last prompt token) and a doubled end-of-turn row,
so some answers stop and some run to the budget.
"""

from __future__ import annotations

import pytest
import torch
from reward_cases import prompt

from rewards.classifier import ControversyClassifier
from rewards.config import GeneratorConfig, build_generator, generator_sampler_config
from rewards.degrade import FLAW_KINDS, LLMDegrader

QUESTIONS = ["What is 2+2?", "Is war ever just?", "Should taxes be higher?", "Hi", "Name a colour.",
             "Why is the sky blue?", "Write a haiku about rain.", "List three prime numbers."]
CONVERSATIONS = [prompt(q) for q in QUESTIONS] + [
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": q}] for q in QUESTIONS[:3]]
MAX_TOKENS = 24
pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models; the cores are shared


@pytest.fixture(scope="module")
def writer_dir(tmp_path_factory):
    """A tiny chat model that writes varied text, saved with its tokenizer (Apertus template)."""
    from align.chat import install_format
    from align.testing.tiny import build_causal_lm, build_tokenizer

    tok = build_tokenizer()
    install_format(tok, chat_format="apertus")
    model = build_causal_lm(tok, seed=1, tie_word_embeddings=False)
    with torch.no_grad():
        model.lm_head.weight[tok.eos_token_id] *= 2  # some answers end before the budget
    path = tmp_path_factory.mktemp("writer")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def reference(writer_dir):
    """conversation -> (text, stopped): greedy `model.generate`, one prompt, no padding."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(writer_dir)
    model = AutoModelForCausalLM.from_pretrained(writer_dir, dtype=torch.float32).eval()

    def generate(conversation, max_tokens=MAX_TOKENS):
        text = tok.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True, enable_thinking=False)
        ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                 do_sample=False, pad_token_id=tok.pad_token_id)[0, ids.shape[1]:].tolist()
        return tok.decode(out, skip_special_tokens=True), tok.eos_token_id in out

    return generate


class Recording:
    """A generator that keeps every call's conversations, seeds and texts."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []
        self.prompt_length, self.max_model_len, self.max_tokens = inner.prompt_length, inner.max_model_len, MAX_TOKENS

    def __call__(self, conversations, seed=0):
        texts = self.inner(conversations, seed=seed)
        self.calls.append((conversations, seed, texts))
        return texts


@pytest.fixture(scope="module")
def greedy(writer_dir):
    return build_generator(GeneratorConfig(model=str(writer_dir), max_tokens=MAX_TOKENS, model_batch_size=3,
                                           device="cpu"))


def test_greedy_generations_equal_a_plain_generate_loop(greedy, reference):
    expected = [reference(c) for c in CONVERSATIONS]
    stopped = [s for _, s in expected]
    assert any(stopped) and not all(stopped)  # both endings are exercised
    assert greedy(CONVERSATIONS) == [t for t, _ in expected]
    assert greedy(CONVERSATIONS, seed=[9] * len(CONVERSATIONS)) == [t for t, _ in expected]  # T=0: no draw


def test_the_classifier_and_the_degrader_generate_what_the_reference_does(greedy, reference):
    recording = Recording(greedy)
    verdicts = ControversyClassifier(recording, max_attempts=2).classify(CONVERSATIONS[:4])
    assert [v.raw for v in verdicts] == [[reference(c)[0]] * 2 for c in [
        ControversyClassifier(greedy).conversation(c) for c in CONVERSATIONS[:4]]]  # greedy repeats its answer
    assert [seed for _, seed, _ in recording.calls] == [0, 1]

    recording = Recording(greedy)
    items = [(CONVERSATIONS[k], "Paris is the capital of France.", kind, 10 + k)
             for k, kind in enumerate(list(FLAW_KINDS)[:4])]
    LLMDegrader(recording).degrade(items)
    [(sent, seeds, texts)] = recording.calls
    assert seeds == [10, 11, 12, 13]
    assert texts == [reference(c)[0] for c in sent]


def test_sampled_generations_are_seeded_per_conversation(writer_dir):
    sampled = build_generator(GeneratorConfig(model=str(writer_dir), max_tokens=12, temperature=1.0, device="cpu"))
    convs = CONVERSATIONS[:4]
    first = sampled(convs, seed=[1, 2, 3, 4])
    assert sampled(convs, seed=[1, 2, 3, 4]) == first
    assert [sampled([c], seed=s)[0] for c, s in zip(convs, [1, 2, 3, 4])] == first  # batch does not matter
    assert sampled(convs, seed=[5, 6, 7, 8]) != first
    # the classifier asks attempt k with seed k: a retry of a failed answer draws a new one
    [verdict] = ControversyClassifier(sampled, max_attempts=3).classify([CONVERSATIONS[0]])
    assert verdict.attempts == 3 and len(set(verdict.raw)) == 3


def test_prompt_length_and_context_length_come_from_the_sampler(greedy, writer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(writer_dir)
    conversation = CONVERSATIONS[-1]
    text = tok.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert greedy.prompt_length(conversation) == len(tok(text, add_special_tokens=False)["input_ids"])
    assert greedy.max_model_len == 2048  # the model's max_position_embeddings
    short = build_generator(GeneratorConfig(model=str(writer_dir), max_model_len=64, device="cpu"))
    assert short.max_model_len == 64


def test_the_generator_config_maps_onto_a_sampler_config():
    local = generator_sampler_config(GeneratorConfig(model="m", model_batch_size=5, device="cpu"))
    assert (local.backend, local.chat_format, local.enable_thinking) == ("transformers", "tokenizer", False)
    assert (local.batch_size, local.device, local.dtype) == (5, "cpu", "float32")  # fp32 on CPU, as before
    engine = generator_sampler_config(GeneratorConfig(
        model="m", backend="vllm", dtype="bfloat16", engine_kwargs={
            "tensor_parallel_size": 4, "gpu_memory_utilization": 0.5, "max_model_len": 4096, "enforce_eager": True}))
    assert (engine.backend, engine.chat_format, engine.dtype, engine.max_model_len) == (
        "vllm", "tokenizer", "bfloat16", 4096)
    assert (engine.tensor_parallel_size, engine.gpu_memory_utilization) == (4, 0.5)
    assert engine.engine_kwargs == {"enforce_eager": True}  # the rest goes to vllm.LLM
    assert generator_sampler_config(GeneratorConfig(model="m", backend="vllm")).dtype is None  # vLLM's "auto"
