"""TransformersSampler on the real tiny Llama: shapes, finish reasons, token counts with
the end-of-turn token, seeds, batch independence, and no doubled BOS."""

from __future__ import annotations

import pytest
import torch

from align.sampling.base import PromptEncoder, PromptTooLongError
from align.sampling.hf import TransformersSampler, top_p_filter
from align.testing.tiny import build_causal_lm

DATE = "2026-01-01"
CONVS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name three colours."}],
    [{"role": "user", "content": "Hi"}],
]


@pytest.fixture(scope="module")
def sampler(tiny_model, tiny_tokenizer):
    return TransformersSampler(tiny_model, tiny_tokenizer, chat_date=DATE, batch_size=2)


def _texts(completions):
    return [[c.text for c in row] for row in completions]


def test_n_completions_per_conversation_with_valid_fields(sampler):
    out = sampler.sample(CONVS, n=4, max_tokens=12, seed=0)
    assert [len(row) for row in out] == [4, 4, 4]
    for row in out:
        for c in row:
            assert c.finish_reason in ("stop", "length")
            assert 1 <= c.num_tokens <= 12
            if c.finish_reason == "length":
                assert c.num_tokens == 12
            assert "<|assistant_end|>" not in c.text
            assert c.params == {"backend": "transformers", "temperature": 1.0, "top_p": 1.0,
                                "max_tokens": 12, "seed": 0}


def test_same_seed_same_samples_other_seed_other_samples(sampler):
    a = sampler.sample(CONVS, n=3, max_tokens=16, seed=7)
    b = sampler.sample(CONVS, n=3, max_tokens=16, seed=7)
    c = sampler.sample(CONVS, n=3, max_tokens=16, seed=8)
    assert _texts(a) == _texts(b)
    assert _texts(a) != _texts(c)
    assert len(set(_texts(a)[0])) > 1, "the n samples of one prompt must differ"


def test_samples_do_not_depend_on_the_batch(sampler):
    together = sampler.sample(CONVS, n=3, max_tokens=16, seed=[1, 2, 3])
    alone = sampler.sample(CONVS[2:], n=3, max_tokens=16, seed=[3])
    assert _texts(alone)[0] == _texts(together)[2]


def argmax_decode(model, prompt_ids: list[int], stop_ids, max_tokens: int) -> list[int]:
    """Greedy decoding by hand: one full forward per token, no cache, no padding, take the argmax."""
    ids, generated = list(prompt_ids), []
    with torch.no_grad():
        for _ in range(max_tokens):
            token = int(model(torch.tensor([ids])).logits[0, -1].argmax())
            generated.append(token)
            if token in stop_ids:
                break
            ids.append(token)
    return generated


def test_temperature_zero_is_greedy(sampler, tiny_model):
    """Every sample at temperature 0 is the argmax continuation, for each prompt of a padded batch."""
    max_tokens = 10
    out = sampler.sample(CONVS, n=3, temperature=0.0, max_tokens=max_tokens, seed=0)
    for conv, row in zip(CONVS, out):
        expected = argmax_decode(tiny_model, sampler.encoder.prompt_ids(conv), set(sampler.encoder.stop_ids),
                                 max_tokens)
        for completion in row:
            assert list(completion.token_ids) == expected, conv
            assert completion.num_tokens == len(expected)
            assert completion.finish_reason == ("stop" if expected[-1] in sampler.encoder.stop_ids else "length")


def test_prompt_ids_start_with_exactly_one_bos(sampler, tiny_tokenizer):
    bos = tiny_tokenizer.bos_token_id
    for conv in CONVS:
        ids = sampler.encoder.prompt_ids(conv)
        assert ids[0] == bos and ids[1] != bos
        # the trap this guards against: the tiny tokenizer adds BOS like Llama's does
        doubled = tiny_tokenizer(sampler.encoder.render(conv))["input_ids"]
        assert doubled[:2] == [bos, bos]
    assert sampler.encoder.render(CONVS[0]).endswith("<|assistant_start|>")


class _Script:
    """Forward hook on lm_head: step k emits tokens[k] (a huge logit), whatever the model."""

    def __init__(self, tokens: list[int]):
        self.tokens, self.step = tokens, 0

    def __call__(self, module, inputs, output):
        token = self.tokens[min(self.step, len(self.tokens) - 1)]
        self.step += 1
        output = output.clone()
        output[..., token] += 1e4
        return output


def _scripted(tokenizer, tokens: list[str]) -> TransformersSampler:
    model = build_causal_lm(tokenizer)
    model.lm_head.register_forward_hook(_Script(tokenizer.convert_tokens_to_ids(tokens)))
    return TransformersSampler(model, tokenizer, chat_date=DATE)


def test_end_of_turn_counts_in_num_tokens_but_not_in_text(tiny_tokenizer):
    hi = tiny_tokenizer.convert_ids_to_tokens(tiny_tokenizer("hello", add_special_tokens=False)["input_ids"])
    sampler = _scripted(tiny_tokenizer, hi + ["<|assistant_end|>"])
    [[c]] = sampler.sample(CONVS[:1], n=1, max_tokens=20)
    assert (c.text, c.num_tokens, c.finish_reason) == ("hello", len(hi) + 1, "stop")


def test_tool_call_stop_token_is_kept_in_the_text(tiny_tokenizer):
    sampler = _scripted(tiny_tokenizer, ["<|tools_prefix|>", "a", "<|tools_suffix|>"])
    [[c]] = sampler.sample(CONVS[:1], n=1, max_tokens=20)
    assert (c.text, c.num_tokens, c.finish_reason) == ("<|tools_prefix|>a<|tools_suffix|>", 3, "stop")


def test_budget_exhausted_is_length_with_all_tokens_counted(tiny_tokenizer):
    sampler = _scripted(tiny_tokenizer, ["a"])
    [[c]] = sampler.sample(CONVS[:1], n=1, max_tokens=5)
    assert (c.text, c.num_tokens, c.finish_reason) == ("aaaaa", 5, "length")


def test_completion_from_ids_strips_end_and_padding(tiny_tokenizer):
    enc = PromptEncoder(tiny_tokenizer, "apertus")
    a = tiny_tokenizer.convert_tokens_to_ids("a")
    end, pad = tiny_tokenizer.convert_tokens_to_ids("<|assistant_end|>"), tiny_tokenizer.pad_token_id
    c = enc.completion([a, a, end, pad, pad], "m", {})
    assert (c.text, c.num_tokens, c.finish_reason) == ("aa", 3, "stop")
    c = enc.completion([a, tiny_tokenizer.eos_token_id, pad], "m", {})  # the model's own EOS
    assert (c.text, c.num_tokens, c.finish_reason) == ("a", 2, "stop")


def test_context_length_caps_the_budget_and_full_prompts_raise(tiny_model, tiny_tokenizer):
    length = TransformersSampler(tiny_model, tiny_tokenizer, chat_date=DATE).prompt_length(CONVS[0])
    small = TransformersSampler(tiny_model, tiny_tokenizer, chat_date=DATE, max_model_len=length + 3)
    for c in small.sample(CONVS[:1], n=4, max_tokens=50)[0]:
        assert c.num_tokens <= 3
    tiny = TransformersSampler(tiny_model, tiny_tokenizer, chat_date=DATE, max_model_len=length)
    with pytest.raises(PromptTooLongError, match=f"conversation 0: the prompt has {length} tokens"):
        tiny.sample(CONVS[:1], n=1, max_tokens=5)


def test_bad_sampling_arguments_name_the_parameter(sampler):
    for kwargs, name in [({"n": 0}, "n"), ({"n": 1, "top_p": 0.0}, "top_p"),
                         ({"n": 1, "temperature": -1.0}, "temperature"), ({"n": 1, "max_tokens": 0}, "max_tokens")]:
        with pytest.raises(ValueError, match=name):
            sampler.sample(CONVS[:1], **kwargs)
    with pytest.raises(ValueError, match="2 seeds for 3 conversations"):
        sampler.sample(CONVS, n=1, seed=[1, 2])


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([[0.125, 0.5, 0.375]])
    assert top_p_filter(probs, 0.6).tolist() == [[0.0, 0.5, 0.375]]
    assert top_p_filter(probs, 0.5).tolist() == [[0.0, 0.5, 0.0]]
    assert top_p_filter(probs, 1.0).tolist() == probs.tolist()


def test_loads_from_a_saved_dir_and_names_the_model(tiny_dirs):
    sampler = TransformersSampler(str(tiny_dirs["policy"]), chat_date=DATE)
    [[c]] = sampler.sample(CONVS[:1], n=1, max_tokens=4)
    assert sampler.model_name == str(tiny_dirs["policy"])
    assert c.source().startswith(f"model={tiny_dirs['policy']} backend=transformers temperature=1.0")


def test_tokenizer_chat_template_renders_like_the_format(tokenizer, tiny_model):
    from align.chat import install_format

    install_format(tokenizer, chat_format="apertus")
    own = TransformersSampler(tiny_model, tokenizer, chat_format="tokenizer")
    ours = TransformersSampler(tiny_model, tokenizer, chat_format="apertus")
    assert own.encoder.prompt_ids(CONVS[1]) == ours.encoder.prompt_ids(CONVS[1])
