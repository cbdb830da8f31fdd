"""`align evaluate` lets one engine hold the GPUs at a time.

A policy's vLLM sampler (gpu_memory_utilization 0.85) and the judge's engine (0.9, tensor
parallel 2) cannot both take their share of the same GPUs. So each policy's sampler is
built, generates and is released before the next, and the reward provider is built only
after the last policy has generated. Fakes stand in for the engines: each registers itself
as alive when built and leaves when it is closed or garbage collected, and every build
records what else was alive at that moment.
"""

from __future__ import annotations

import json
import weakref

import pytest

from align.sampling.base import Completion, Sampler
from align.sampling.config import SamplerConfig
from align.stages import evaluate as evaluate_stage
from rewards.base import Score
from rewards.config import RewardProviderConfig

ALIVE: dict[int, str] = {}
BUILDS: list[tuple[str, list[str]]] = []  # (what was built, what was alive then)
EVENTS: list[str] = []


def register(obj, label: str) -> None:
    BUILDS.append((label, sorted(ALIVE.values())))
    ALIVE[id(obj)] = label
    weakref.finalize(obj, ALIVE.pop, id(obj), None)


class FakeEncoder:
    tokenizer = None

    def prompt_ids(self, messages, tools=None):
        return [1, 2, 3]


class FakeEngineSampler(Sampler):
    backend = "vllm"

    def __init__(self, model: str):
        self.model_name, self.encoder = model, FakeEncoder()
        register(self, f"sampler:{model}")

    @property
    def max_model_len(self) -> int:
        return 1024

    def sample(self, conversations, n, temperature=1.0, top_p=1.0, max_tokens=16, seed=0, tools=None):
        assert id(self) in ALIVE, "sampled with a closed engine"
        EVENTS.append(f"generate:{self.model_name}")
        return [[Completion(f"{self.model_name} answer {k}", 3, "stop", self.model_name, {}, (5, 6, 7))
                 for k in range(n)] for _ in conversations]

    def close(self) -> None:
        ALIVE.pop(id(self), None)


class FakeJudge:
    name = "fake_judge"
    reference_field = None

    def __init__(self):
        register(self, "judge")

    def score_groups(self, conversations, groups, *, references=None):
        assert id(self) in ALIVE
        EVENTS.append("score")
        return [[Score(float(len(text))) for text in group] for group in groups]

    def compare_pairs(self, pairs):
        from rewards.pairwise import Comparison

        EVENTS.append("compare")
        return [Comparison(0.5, 0.5, 0.5, True, None, 2) for _ in pairs]

    def fingerprint(self):
        return {"provider": self.name}

    def close(self) -> None:
        ALIVE.pop(id(self), None)


@pytest.fixture
def fakes(monkeypatch):
    ALIVE.clear(), BUILDS.clear(), EVENTS.clear()
    monkeypatch.setattr("align.sampling.config.build_sampler", lambda config: FakeEngineSampler(config.model))
    monkeypatch.setattr(evaluate_stage, "build_reward_provider", lambda config: FakeJudge())
    yield
    ALIVE.clear()


def test_each_engine_starts_alone(fakes, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": f"q{i}"}]}) + "\n"
                               for i in range(3)))
    config = evaluate_stage.Config(
        prompts=str(prompts), output_dir=str(tmp_path / "eval"), baseline="sft",
        policies=[evaluate_stage.PolicyConfig(name=name, model=f"org/{name}") for name in ("sft", "qrpo", "dpo")],
        sampler=SamplerConfig(backend="vllm", tensor_parallel_size=1, gpu_memory_utilization=0.85),
        reward=RewardProviderConfig(provider="judge", backend="vllm", model="org/judge",
                                    engine_kwargs={"tensor_parallel_size": 2, "gpu_memory_utilization": 0.9}),
        n=2, kl=False, plots=False, resamples=200, batch_size=2,
    )
    evaluate_stage.run(config)

    assert [label for label, _ in BUILDS] == ["sampler:org/sft", "sampler:org/qrpo", "sampler:org/dpo", "judge"]
    shared = [(label, others) for label, others in BUILDS if others]
    assert not shared, f"engines built while others held the GPUs: {shared}"
    # the judge scores only after every policy has generated, and is released at the end
    assert EVENTS.index("score") > max(i for i, e in enumerate(EVENTS) if e.startswith("generate"))
    assert "compare" in EVENTS
    assert not ALIVE, f"still alive after the evaluation: {sorted(ALIVE.values())}"
    assert (tmp_path / "eval" / "report.md").exists()


def test_a_provider_given_ready_is_used_as_is(tmp_path):
    """The Python API still takes a built provider (the caller owns it; it is not closed)."""
    from align.eval.evaluate import EvalPolicy, evaluate

    ALIVE.clear(), BUILDS.clear(), EVENTS.clear()
    judge = FakeJudge()
    prompts = [{"id": f"p{i}", "messages": [{"role": "user", "content": f"q{i}"}]} for i in range(2)]
    policies = [EvalPolicy(name, sampler=lambda m=name: FakeEngineSampler(m)) for name in ("a", "b")]
    report = evaluate(prompts, policies, judge, tmp_path / "eval", baseline="a",
                      settings=evaluate_stage.EvalSettings(n=1, kl=False, plots=False, resamples=200))
    assert report["prompts"] == 2
    assert [label for label, _ in BUILDS] == ["judge", "sampler:a", "sampler:b"]
    assert list(ALIVE.values()) == ["judge"]  # the caller's
    ALIVE.clear()
