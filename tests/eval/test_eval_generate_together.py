"""The evaluation's generation step sends a job batch's greedy and sampled requests together.

On vLLM that is one ``llm.generate`` call per job batch (the engine schedules both groups
at once), with each conversation's `SamplingParams` exactly as two ``sample`` calls built
them before. No vLLM is needed: a fake ``vllm`` module records the calls and answers with
ids drawn from each request's own seed. On transformers (the default ``sample_many``) the
completions in ``eval.jsonl`` are those of one ``sample`` call for the greedy answers and
one for the samples, per job batch, as before.
"""

from __future__ import annotations

import json
import random
import sys
from dataclasses import dataclass
from types import ModuleType, SimpleNamespace

import pytest

from align.eval.evaluate import EvalPolicy, EvalSettings, evaluate
from align.sampling.base import PromptEncoder, SampleRequest, derive_seed, stream_seed
from align.sampling.vllm_backend import VLLMSampler

DATE = "2026-01-01"
N = 3
MAX_TOKENS = 6


def prompts(count: int = 6) -> list[dict]:
    return [{"id": f"p{i:02d}", "messages": [{"role": "user", "content": f"what is {i} + 1"}]} for i in range(count)]


class ParityReward:
    """A reward that needs no model: 1 for a text of even length."""

    name = "parity"
    reference_field = None

    def score_groups(self, conversations, groups, *, references=None):
        from rewards.base import Score

        return [[Score(float(len(text) % 2 == 0)) for text in group] for group in groups]

    def fingerprint(self):
        return {"provider": self.name}


# --------------------------------------------------------------------------- a fake vLLM


@dataclass(frozen=True)
class FakeSamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 16
    seed: int | None = None
    stop_token_ids: tuple = ()
    skip_special_tokens: bool = True
    detokenize: bool = True

    def __post_init__(self):
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))


class FakeLLM:
    """Records every ``generate`` call; each completion is a function of its prompt and params
    (the seed draws the ids; temperature 0 always gives the same answer), so two calls that
    send the same request get the same completion wherever it sits in the call."""

    def __init__(self, stop_id: int, max_model_len: int = 256):
        self.calls: list[tuple[list[list[int]], list[FakeSamplingParams]]] = []
        self.stop_id = stop_id
        self.model_config = SimpleNamespace(max_model_len=max_model_len)

    def generate(self, prompts, params, use_tqdm=False):
        prompts = [list(p["prompt_token_ids"]) for p in prompts]
        assert isinstance(params, list) and len(params) == len(prompts)
        self.calls.append((prompts, list(params)))
        return [SimpleNamespace(outputs=self._outputs(ids, p)) for ids, p in zip(prompts, params)]

    def _outputs(self, ids, p):
        outs = []
        for j in range(p.n):
            rng = random.Random(0 if p.temperature == 0 else f"{p.seed}:{j}")
            length = rng.randint(1, p.max_tokens)
            body = [rng.choice(ids) for _ in range(length - 1)]
            ended = rng.random() < 0.5 or length < p.max_tokens
            token_ids = body + [self.stop_id] if ended else body + [rng.choice(ids)]
            outs.append(SimpleNamespace(index=p.n - 1 - j, token_ids=token_ids,  # out of order on purpose
                                        finish_reason="stop" if ended else "length"))
        return outs


@pytest.fixture
def fake_vllm(monkeypatch):
    vllm = ModuleType("vllm")
    vllm.SamplingParams = FakeSamplingParams
    inputs = ModuleType("vllm.inputs")
    inputs.TokensPrompt = lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids}
    vllm.inputs = inputs
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    return vllm


def vllm_sampler(name: str = "tiny") -> VLLMSampler:
    from align.chat import install_format
    from align.testing.tiny import build_tokenizer

    tokenizer = build_tokenizer()
    install_format(tokenizer, chat_format="apertus")
    sampler = VLLMSampler.__new__(VLLMSampler)  # the engine is the fake; everything else is the sampler's
    sampler.model_name, sampler.use_tqdm, sampler.tokenizer = name, False, tokenizer
    sampler.encoder = PromptEncoder(tokenizer, "apertus", chat_date=DATE)
    sampler.llm = FakeLLM(sampler.encoder.stop_ids[0])
    return sampler


def texts(groups):
    return [[(c.text, c.num_tokens, c.finish_reason, c.token_ids, dict(c.params)) for c in row] for row in groups]


# --------------------------------------------------------------------------- the tests


def test_sample_many_is_one_generate_call_with_the_params_of_separate_calls(fake_vllm):
    convs = [p["messages"] for p in prompts(4)]
    seeds = [derive_seed(0, i) for i in range(4)]
    greedy = SampleRequest(convs, 1, temperature=0.0, max_tokens=MAX_TOKENS, seed=seeds)
    sampled = SampleRequest(convs, N, temperature=0.7, top_p=0.9, max_tokens=MAX_TOKENS, seed=seeds)

    separate = vllm_sampler()
    one_by_one = [separate.sample(r.conversations, r.n, r.temperature, r.top_p, r.max_tokens, r.seed)
                  for r in (greedy, sampled)]
    together = vllm_sampler()
    both = together.sample_many([greedy, sampled])

    assert len(separate.llm.calls) == 2 and len(together.llm.calls) == 1
    prompts_sent, params_sent = together.llm.calls[0]
    assert prompts_sent == separate.llm.calls[0][0] + separate.llm.calls[1][0]
    assert params_sent == separate.llm.calls[0][1] + separate.llm.calls[1][1]
    assert [texts(g) for g in both] == [texts(g) for g in one_by_one]
    assert [len(row) for row in both[0]] == [1] * 4 and [len(row) for row in both[1]] == [N] * 4
    assert together.sample_many([]) == [] and len(together.llm.calls) == 1


def test_each_job_batch_is_one_generate_call_holding_greedy_and_samples(fake_vllm, tmp_path):
    rows = prompts(6)
    sampler, other = vllm_sampler("sft"), vllm_sampler("qrpo")
    settings = EvalSettings(n=N, max_tokens=MAX_TOKENS, temperature=0.8, top_p=0.95, seed=7, batch_size=4,
                            kl=False, plots=False, resamples=200)
    evaluate(rows, [EvalPolicy("sft", sampler=sampler), EvalPolicy("qrpo", sampler=other)], ParityReward(),
             tmp_path, baseline="sft", settings=settings)

    calls = sampler.llm.calls
    assert len(calls) == 2, "6 prompts in job batches of 4: one generate call per job batch"
    batches = [rows[:4], rows[4:]]
    stops = tuple(sampler.encoder.stop_ids)
    for (sent, params), batch in zip(calls, batches):
        ids = [sampler.encoder.prompt_ids(r["messages"]) for r in batch]
        assert sent == ids + ids, "the greedy requests, then the sampled ones, in one call"
        seeds = [stream_seed(derive_seed(7, r["id"]), p) for r, p in zip(batch, ids)]
        assert params == (
            [FakeSamplingParams(n=1, temperature=0.0, top_p=1.0, max_tokens=MAX_TOKENS, seed=s, stop_token_ids=stops,
                                skip_special_tokens=False, detokenize=False) for s in seeds]
            + [FakeSamplingParams(n=N, temperature=0.8, top_p=0.95, max_tokens=MAX_TOKENS, seed=s,
                                  stop_token_ids=stops, skip_special_tokens=False, detokenize=False) for s in seeds])

    # the completions are those two separate sample calls give, per job batch
    fresh = vllm_sampler("sft")
    eval_rows = [json.loads(line) for line in (tmp_path / "eval.jsonl").read_text().splitlines()]
    for batch in batches:
        convs, seeds = [r["messages"] for r in batch], [derive_seed(7, r["id"]) for r in batch]
        greedy = fresh.sample(convs, 1, temperature=0.0, max_tokens=MAX_TOKENS, seed=seeds)
        samples = fresh.sample(convs, N, temperature=0.8, top_p=0.95, max_tokens=MAX_TOKENS, seed=seeds)
        for r, g, s in zip(batch, greedy, samples):
            got = next(row for row in eval_rows if row["id"] == r["id"])["policies"]["sft"]
            assert got["greedy"]["text"] == g[0].text and got["greedy"]["num_tokens"] == g[0].num_tokens
            assert [c["text"] for c in got["samples"]] == [c.text for c in s]
            assert [c["finish_reason"] for c in got["samples"]] == [c.finish_reason for c in s]


@pytest.mark.usefixtures("one_torch_thread")
def test_transformers_completions_are_those_of_a_greedy_and_a_sampled_call(tmp_path):
    """The default sample_many calls sample per request: eval.jsonl holds, per job batch, the
    completions of one greedy sample call and one sampled call (the generation before)."""
    from align.sampling.hf import TransformersSampler
    from align.testing.tiny import build_causal_lm, build_tokenizer

    tokenizer = build_tokenizer()
    samplers = {name: TransformersSampler(build_causal_lm(tokenizer, seed=seed), tokenizer, chat_date=DATE,
                                          batch_size=3, model_name=name) for name, seed in (("sft", 0), ("qrpo", 1))}
    rows = prompts(6)
    settings = EvalSettings(n=2, max_tokens=MAX_TOKENS, seed=3, batch_size=4, kl=False, plots=False, resamples=200)
    evaluate(rows, [EvalPolicy(name, sampler=s) for name, s in samplers.items()], ParityReward(), tmp_path,
             baseline="sft", settings=settings)
    eval_rows = {row["id"]: row for row in map(json.loads, (tmp_path / "eval.jsonl").read_text().splitlines())}
    for name, sampler in samplers.items():
        for batch in (rows[:4], rows[4:]):
            convs, seeds = [r["messages"] for r in batch], [derive_seed(3, r["id"]) for r in batch]
            greedy = sampler.sample(convs, 1, temperature=0.0, max_tokens=MAX_TOKENS, seed=seeds)
            samples = sampler.sample(convs, 2, temperature=1.0, top_p=1.0, max_tokens=MAX_TOKENS, seed=seeds)
            for r, g, s in zip(batch, greedy, samples):
                got = eval_rows[r["id"]]["policies"][name]
                assert {k: got["greedy"][k] for k in ("text", "num_tokens", "finish_reason")} == \
                    {"text": g[0].text, "num_tokens": g[0].num_tokens, "finish_reason": g[0].finish_reason}
                assert [(c["text"], c["num_tokens"]) for c in got["samples"]] == [(c.text, c.num_tokens) for c in s]
