"""rewards.config: one config and one builder per part (reward provider, judge, generator),
composed by the stages that use them: annotate (flat keys), evaluate (``reward.``) and
judge-validate (the judge's keys flat, the LLM degrader's under ``generator.``)."""

from __future__ import annotations

import dataclasses

import pytest

from align.config import ConfigError, field_docs, load_config
from rewards.config import (
    GeneratorConfig,
    JudgeModelConfig,
    RewardProviderConfig,
    build_generator,
    build_judge,
    build_judge_backend,
    build_reward_provider,
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny causal LM with the Apertus chat template, saved: judge, generator and RM stand-in."""
    from align.chat import install_format
    from align.testing.tiny import build_causal_lm, build_reward_model, build_tokenizer

    tok = build_tokenizer()
    install_format(tok, chat_format="apertus")
    path = tmp_path_factory.mktemp("models")
    build_causal_lm(tok, seed=3).save_pretrained(path / "lm")
    tok.save_pretrained(path / "lm")
    build_reward_model(tok, seed=4).save_pretrained(path / "rm")
    tok.save_pretrained(path / "rm")
    return path


def _keys(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls) if f.init}


def test_each_provider_is_built_with_every_setting(model_dir):
    from rewards.classifier import ControversyClassifier
    from rewards.judge import ConstitutionalJudge
    from rewards.judge_backends.hf import TransformersJudgeBackend
    from rewards.reward_model import RewardModel
    from rewards.verifiable import VerifiableReward

    verifiable = build_reward_provider(RewardProviderConfig(provider="verifiable", answer_field="solution"))
    assert isinstance(verifiable, VerifiableReward) and verifiable.reference_field == "solution"

    rm = build_reward_provider(RewardProviderConfig(
        provider="reward_model", model=str(model_dir / "rm"), model_batch_size=3, max_length=77,
        on_truncation="score", empty_score=-4.0, device="cpu", dtype="float32"))
    assert isinstance(rm, RewardModel)
    assert (rm.config.batch_size, rm.config.max_length, rm.config.on_truncation, rm.config.empty_score) == (
        3, 77, "score", -4.0)

    judge = build_reward_provider(RewardProviderConfig(
        provider="judge", model=str(model_dir / "lm"), scale=[1, 5], top_k_pairwise=2, single_order="skip",
        model_batch_size=4, device="cpu", charter="example_de.md"))
    assert isinstance(judge, ConstitutionalJudge) and isinstance(judge.backend, TransformersJudgeBackend)
    assert (judge.config.scale, judge.config.top_k_pairwise, judge.config.single_order) == ((1, 5), 2, "skip")
    assert judge.backend.batch_size == 4 and "example_de" in judge.charter.source

    classifier = build_reward_provider(RewardProviderConfig(
        provider="classifier", model=str(model_dir / "lm"), threshold=3, max_attempts=5, max_tokens=4,
        device="cpu"))
    assert isinstance(classifier, ControversyClassifier)
    assert (classifier.config.threshold, classifier.config.max_attempts) == (3, 5)


def test_judge_and_generator_builders(model_dir, monkeypatch):
    from rewards.judge_backends.openai import OpenAIJudgeBackend

    monkeypatch.setenv("MY_JUDGE_KEY", "judge-key")

    served = JudgeModelConfig(model="served", backend="openai", base_url="http://node:8000/v1/",
                              tokenizer=str(model_dir / "lm"), model_batch_size=6, api_key_env="MY_JUDGE_KEY")
    backend = build_judge_backend(served)
    assert isinstance(backend, OpenAIJudgeBackend)
    assert (backend.url, backend.model, backend.batch_size, backend.api_key) == (
        "http://node:8000/v1/completions", "served", 6, "judge-key")
    judge = build_judge(JudgeModelConfig(model=str(model_dir / "lm"), device="cpu"))
    assert judge.config.top_k_pairwise == 5  # the judge's own default, as ConstitutionalJudge has it
    generate = build_generator(GeneratorConfig(model=str(model_dir / "lm"), max_tokens=3, device="cpu"))
    texts = generate([[{"role": "user", "content": "Hi"}], [{"role": "user", "content": "Hello there"}]])
    assert len(texts) == 2 and all(isinstance(t, str) for t in texts)


def test_config_checks():
    with pytest.raises(ValueError, match="model: provider 'judge' needs a model"):
        RewardProviderConfig(provider="judge")
    with pytest.raises(ValueError, match="base_url: the openai backend needs the endpoint URL"):
        JudgeModelConfig(model="m", backend="openai")
    with pytest.raises(ValueError, match=r"scale: expected \[low, high\]"):
        RewardProviderConfig(provider="verifiable", scale=[1, 5, 9])
    with pytest.raises(ValueError, match="api_key_env: must be the name of an environment variable"):
        JudgeModelConfig(model="m", api_key_env="sk-not a name")
    with pytest.raises(ValueError, match="temperature: must be >= 0"):
        GeneratorConfig(model="m", temperature=-1.0)
    RewardProviderConfig(provider="classifier", model="m", backend="openai", base_url="http://x/v1")  # vllm serve
    RewardProviderConfig(provider="judge", model="m", backend="openai", base_url="http://x/v1")
    with pytest.raises(ConfigError, match=r"backend: 'openai' is not one of \['transformers', 'vllm'\]"):
        load_config(GeneratorConfig, None, ["model=m", "backend=openai"])


def test_annotate_takes_the_provider_keys_flat():
    """Every RewardProviderConfig key is an annotate key under the same name, with the same
    default; the stage adds only its own input/output and job keys."""
    from align.stages.annotate import Config

    assert issubclass(Config, RewardProviderConfig)
    assert _keys(Config) - _keys(RewardProviderConfig) == {
        "input", "output_dir", "where", "where_rest", "batch_size", "shard_index", "num_shards", "overwrite"}
    config = load_config(Config, None, ["input=x.jsonl", "provider=judge", "model=served", "backend=openai",
                                        "base_url=http://node:8000/v1", "single_order=skip", "top_k_pairwise=3"])
    assert (config.provider, config.backend, config.single_order, config.top_k_pairwise) == (
        "judge", "openai", "skip", 3)
    defaults = {key: default for key, _, default, _ in field_docs(Config)}
    assert defaults["provider"] == "'reward_model'" and defaults["top_k_pairwise"] == "5"
    assert defaults["max_tokens"] == "256" and defaults["max_length"] == "16384"


def test_evaluate_reward_section_is_the_provider_config():
    from align.stages.evaluate import Config

    config = load_config(Config, None, ["prompts=p.jsonl"])
    assert isinstance(config.reward, RewardProviderConfig)
    assert (config.reward.provider, config.reward.top_k_pairwise) == ("verifiable", 0)  # pointwise, as before
    config = load_config(Config, None, [
        "prompts=p.jsonl", "reward.provider=reward_model", "reward.model=rm", "reward.on_truncation=score",
        "reward.empty_score=-2", "reward.single_order=skip"])
    assert (config.reward.on_truncation, config.reward.empty_score, config.reward.single_order) == ("score", -2.0, "skip")
    assert config.reward.top_k_pairwise == 0  # one nested key changes one key
    with pytest.raises(ConfigError, match="reward.provider: evaluate scores with reward_model, judge or verifiable"):
        load_config(Config, None, ["prompts=p.jsonl", "reward.provider=classifier", "reward.model=m"])
    with pytest.raises(ConfigError, match="model: provider 'judge' needs a model"):
        load_config(Config, None, ["prompts=p.jsonl", "reward.provider=judge"])
    help_rows = {key: default for key, _, default, _ in field_docs(Config)}
    assert help_rows["reward.provider"] == "'verifiable'" and help_rows["reward.top_k_pairwise"] == "0"


def test_evaluate_settings_are_eval_settings():
    """Every EvalSettings field is an evaluate key (kl_batch_size included) and reaches the library."""
    from align.eval.evaluate import EvalSettings
    from align.stages.evaluate import Config

    assert issubclass(Config, EvalSettings) and _keys(EvalSettings) <= _keys(Config)
    config = load_config(Config, None, ["prompts=p.jsonl", "kl_batch_size=5", "n=2", "tie_margin=0.1"])
    settings = config.eval_settings(1, 3)
    assert type(settings) is EvalSettings
    assert (settings.kl_batch_size, settings.n, settings.tie_margin, settings.shard_index, settings.num_shards) == (
        5, 2, 0.1, 1, 3)
    assert config.shard_index is None  # the stage resolves its shard from the environment when unset
    with pytest.raises(ConfigError, match="n: at least one completion per prompt"):
        load_config(Config, None, ["prompts=p.jsonl", "n=0", "greedy=false"])


def test_judge_validate_composes_the_judge_and_a_generator():
    from align.stages.judge_validate import Config

    assert issubclass(Config, JudgeModelConfig)
    config = load_config(Config, None, ["model=judge", "backend=openai", "base_url=http://node:8000/v1",
                                        "api_key_env=JUDGE_KEY", "degrader=llm", "generator.model=writer",
                                        "generator.backend=vllm", "generator.temperature=0.7"])
    assert isinstance(config.generator, GeneratorConfig) and config.api_key_env == "JUDGE_KEY"
    assert (config.generator.model, config.generator.backend, config.generator.temperature) == ("writer", "vllm", 0.7)
    assert config.generator.max_tokens == 1024  # a whole rewritten response, as before
    with pytest.raises(ConfigError, match="generator.model: the llm degrader needs a generation model"):
        load_config(Config, None, ["model=judge", "degrader=llm"])
    with pytest.raises(ConfigError, match=r"generator.backend: 'openai' is not one of"):
        load_config(Config, None, ["model=judge", "generator.backend=openai"])
    assert {key: default for key, _, default, _ in field_docs(Config)}["generator.max_tokens"] == "1024"
