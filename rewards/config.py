"""The reward side's recipe sections, and building each part from its section.

One definition, one default and one help text per setting; every stage that needs a part
composes its config (as a base class, so the keys stay flat, or as a nested section) and
builds it with the builder here, as samplers are built by `align.sampling.config`:

* ``GeneratorConfig`` → ``build_generator``: ``generate(conversations, seed=...) -> texts``
  (`rewards.generation.Generator`) on a sampler of `align.sampling` (transformers or vLLM;
  the model's own chat template, thinking off): the controversy classifier, the LLM degrader.
* ``JudgeModelConfig`` → ``build_judge_backend`` (where the judge's next-token
  probabilities come from: transformers, vLLM or an OpenAI-compatible server) and
  ``build_judge`` (the constitutional judge on that backend, with its charter and scale).
* ``RewardProviderConfig`` → ``build_reward_provider``: the reward model, the judge, the
  verifiable reward or the controversy classifier, with every setting of each.

``align annotate`` takes ``RewardProviderConfig``'s keys at the top level, ``align
evaluate`` under ``reward.``, ``align judge-validate`` takes ``JudgeModelConfig``'s at the
top level and the LLM degrader's ``GeneratorConfig`` under ``generator.``.

Heavy libraries (torch, transformers, vLLM) are imported by the builders, only for the
backend a config names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from align.errors import ConfigError
from align.io.http import check_api_key_env, check_base_url, check_connection
from align.sampling.config import SamplerConfig, build_sampler

if TYPE_CHECKING:
    from rewards.generation import Generator

__all__ = [
    "EngineFields",
    "GeneratorConfig",
    "JudgeModelConfig",
    "RewardProviderConfig",
    "build_generator",
    "build_judge",
    "build_judge_backend",
    "build_reward_provider",
    "generator_sampler_config",
]


@dataclass
class EngineFields:
    """The model a part loads, and how (shared by the judge, the reward model and generators)."""

    model: str = field(default="", metadata={
        "help": "model path or name (reward model, judge, or the model that generates)"})
    backend: Literal["transformers", "vllm", "openai"] = field(default="transformers", metadata={
        "help": "transformers | vllm | openai"})
    model_batch_size: int = field(default=8, metadata={"help": "sequences per forward"})
    dtype: str | None = field(default=None, metadata={
        "help": "weights dtype, for every backend that loads the model (default: transformers bf16 on GPU, fp32 on "
                "CPU; vllm its own choice, 'auto')"})
    device: str | None = field(default=None, metadata={"help": "cuda / cpu (default: cuda when available)"})
    engine_kwargs: dict = field(default_factory=dict, metadata={"help": "vllm: extra vllm.LLM arguments"})
    max_model_len: int | None = field(default=None, metadata={
        "help": "judge and generation (classifier, llm degrader): context length, prompt + answer; a longer "
                "judge or classifier prompt is a recorded skip (prompt_too_long), never sent. vllm: the engine's "
                "(this key or engine_kwargs.max_model_len, else the model's); transformers: generation the "
                "model's max_position_embeddings, the judge no limit unless set; openai: no limit unless set"})


def _check_engine(config: Any) -> None:
    if "dtype" in config.engine_kwargs:
        raise ConfigError("engine_kwargs.dtype: set the dtype key instead (one dtype for every backend; "
                          "docs/settings.md)")
    if config.max_model_len is not None:
        if config.max_model_len < 2:
            raise ConfigError(f"max_model_len: must be >= 2, got {config.max_model_len}")
        given = config.engine_kwargs.get("max_model_len")
        if given is not None and given != config.max_model_len:
            raise ConfigError(f"max_model_len={config.max_model_len} and engine_kwargs.max_model_len={given} "
                              "disagree: set one")


def vllm_engine_kwargs(config: EngineFields) -> dict[str, Any]:
    """The ``vllm.LLM`` arguments of a config: ``engine_kwargs`` plus ``dtype`` and
    ``max_model_len`` when set."""
    return {**config.engine_kwargs, **({"dtype": config.dtype} if config.dtype is not None else {}),
            **({"max_model_len": config.max_model_len} if config.max_model_len is not None else {})}


def _check_generation(config: Any) -> None:
    if config.temperature < 0:
        raise ConfigError(f"temperature: must be >= 0, got {config.temperature}")
    if config.max_tokens < 1:
        raise ConfigError(f"max_tokens: must be >= 1, got {config.max_tokens}")


def _check_judge(config: Any) -> None:
    if config.backend == "openai" and not config.base_url:
        raise ConfigError("base_url: the openai backend needs the endpoint URL")
    check_api_key_env(config.api_key_env)
    if config.base_url:
        config.base_url = check_base_url(config.base_url, config.api_key_env)
    check_connection(config.timeout_s, config.max_retries)
    if len(config.scale) != 2:
        raise ConfigError(f"scale: expected [low, high], got {config.scale}")


@dataclass
class GeneratorConfig(EngineFields):
    """A generation model: chat in, text out (the controversy classifier, the LLM degrader)."""

    backend: Literal["transformers", "vllm"] = field(default="transformers", metadata={"help": "transformers | vllm"})
    max_tokens: int = field(default=256, metadata={
        "help": "generation (classifier, llm degrader): answer length budget in tokens"})
    temperature: float = field(default=0.0, metadata={
        "help": "generation (classifier, llm degrader): sampling temperature (0: greedy; the classifier's "
                "retries only help when > 0)"})

    def __post_init__(self) -> None:
        _check_engine(self)
        _check_generation(self)


@dataclass
class JudgeModelConfig(EngineFields):
    """The constitutional judge: its model, the backend that reads its probabilities, the
    charter it judges by and its rating scale."""

    backend: Literal["transformers", "vllm", "openai"] = field(default="transformers", metadata={
        "help": "transformers | vllm | openai (an OpenAI-compatible server at base_url: the judge and the "
                "classifier)"})
    base_url: str | None = field(default=None, metadata={
        "help": "openai backend: the endpoint (http://host:8000/v1; $VAR is the environment's value; credentials "
                "in it are sent as the Authorization header, never shown, and cannot be submitted: use "
                "api_key_env). Changes no result"})
    timeout_s: float = field(default=1800.0, metadata={
        "help": "openai backend: the deadline of each request, whole (at most a week), sized for a server many "
                "array tasks share. Changes no result"})
    max_retries: int = field(default=5, metadata={
        "help": "openai backend: retries of a request (0 to 100; connection errors, requests past the deadline, "
                "answers cut short or aborted, 5xx, 408, 429), with backoff. Changes no result"})
    tokenizer: str | None = field(default=None, metadata={"help": "openai backend: tokenizer of the served model"})
    api_key_env: str | None = field(default=None, metadata={
        "help": "openai backend: environment variable holding the API key (default: $OPENAI_API_KEY when set); "
                "the key itself never goes in a recipe"})
    charter: str | None = field(default=None, metadata={
        "help": "judge: charter file, or a name in charter/ (default: the project's charter, charter/default.md)"})
    scale: list[int] = field(default_factory=lambda: [1, 9], metadata={"help": "judge: rating scale (paper: 1-9)"})
    single_order: Literal["score", "skip"] = field(default="score", metadata={
        "help": "judge: a pairwise comparison with only one readable order is scored from it or skipped"})

    def __post_init__(self) -> None:
        _check_engine(self)
        _check_judge(self)


@dataclass
class RewardProviderConfig(JudgeModelConfig, GeneratorConfig):
    """One reward provider, and every setting of each kind (docs/method.md, Reward providers):

    - ``reward_model``: a one-label sequence classifier (Skywork-Reward-V2 family): the raw
      logit, the reward model's own chat template, length-sorted batches;
    - ``judge``: the constitutional judge (``JudgeModelConfig``), pointwise, then the top
      ``top_k_pairwise`` ranked pairwise in both orders;
    - ``verifiable``: answer matching against the record's ``answer_field``;
    - ``classifier``: the controversy classifier, generating with the ``GeneratorConfig``
      keys (``model``, ``backend``, ``max_tokens``, ``temperature``, ...).
    """

    provider: Literal["reward_model", "judge", "verifiable", "classifier"] = field(
        default="reward_model", metadata={"help": "reward_model | judge | verifiable | classifier"})
    top_k_pairwise: int = field(default=5, metadata={"help": "judge: top-k re-ranked pairwise (0: off)"})
    answer_field: str = field(default="answer", metadata={"help": "verifiable: field with the reference answer"})
    threshold: int = field(default=2, metadata={"help": "classifier: label >= threshold is controversial"})
    max_attempts: int = field(default=3, metadata={"help": "classifier: tries before recording a failure"})
    max_length: int = field(default=16384, metadata={
        "help": "reward model: max tokens per input (Skywork-Reward-V2: 16,384)"})
    on_truncation: Literal["skip", "score"] = field(
        default="skip", metadata={"help": "reward model: an input over max_length gets no reward (skip) or "
                                  "is scored on its first max_length tokens (score); counted either way"})
    empty_score: float | None = field(
        default=None, metadata={"help": "reward model: reward of an empty completion (None: the lowest score "
                                "of the prompt's other completions)"})
    max_batch_tokens: int | None = field(
        default=None, metadata={"help": "reward model: padded tokens per forward (rows x longest row), at most; "
                                "model_batch_size still caps the rows (None: no token budget)"})

    def __post_init__(self) -> None:
        if self.provider in ("reward_model", "judge", "classifier") and not self.model:
            raise ConfigError(f"model: provider {self.provider!r} needs a model path or name")
        if self.provider == "reward_model" and self.max_model_len is not None:
            raise ConfigError("max_model_len: the reward model's input limit is max_length")
        _check_engine(self)
        _check_judge(self)
        _check_generation(self)


# --------------------------------------------------------------------------- builders


def generator_sampler_config(config: GeneratorConfig) -> SamplerConfig:
    """The sampler a generator runs on: the config's model, rendered with its own chat
    template (``chat_format: tokenizer``), thinking off; transformers: on ``device`` (default
    cuda when available) in ``dtype`` (default bf16 on GPU, fp32 on CPU); vllm: ``dtype`` and
    ``max_model_len`` as set, the `SamplerConfig` fields named in ``engine_kwargs`` to their
    keys and the rest to ``vllm.LLM``."""
    engine = dict(config.engine_kwargs)
    engine_max_len = engine.pop("max_model_len", None)  # _check_engine: equal to max_model_len when both set
    sampler_fields = {key: engine.pop(key) for key in ("tensor_parallel_size", "enable_prefix_caching",
                                                       "gpu_memory_utilization") if key in engine}
    dtype, device = config.dtype, config.device
    if config.backend == "transformers":
        from rewards.reward_model import resolve_device, resolve_dtype

        resolved = resolve_device(config.device)
        device, dtype = str(resolved), str(resolve_dtype(config.dtype, resolved)).removeprefix("torch.")
    return SamplerConfig(
        backend=config.backend, model=config.model, chat_format="tokenizer", enable_thinking=False,
        max_model_len=config.max_model_len or engine_max_len, dtype=dtype, device=device,
        batch_size=config.model_batch_size, engine_kwargs=engine, **sampler_fields,
    )


def build_generator(config: GeneratorConfig) -> Generator:
    """``generate(conversations, seed=...) -> texts`` (`rewards.generation.Generator`) on the
    sampler of the config's model and backend (`generator_sampler_config`)."""
    from rewards.generation import Generator

    if config.backend not in ("transformers", "vllm"):
        raise ConfigError(f"backend: generation runs on transformers or vllm, got {config.backend!r}")
    return Generator(build_sampler(generator_sampler_config(config)), max_tokens=config.max_tokens,
                     temperature=config.temperature)


def build_judge_backend(config: JudgeModelConfig) -> Any:
    """Where the judge's next-token probabilities come from (the config's ``backend``)."""
    if config.backend == "vllm":
        from rewards.judge_backends.vllm_backend import VLLMJudgeBackend

        return VLLMJudgeBackend(config.model, **vllm_engine_kwargs(config))
    if config.backend == "openai":
        from rewards.judge_backends.openai import OpenAIJudgeBackend

        return OpenAIJudgeBackend(config.base_url, config.model, config.tokenizer or config.model,
                                  api_key_env=config.api_key_env, batch_size=config.model_batch_size,
                                  max_model_len=config.max_model_len or config.engine_kwargs.get("max_model_len"),
                                  timeout_s=config.timeout_s, max_retries=config.max_retries)
    from rewards.judge_backends.hf import TransformersJudgeBackend

    return TransformersJudgeBackend(config.model, batch_size=config.model_batch_size,
                                    device=config.device, dtype=config.dtype, max_model_len=config.max_model_len)


def build_judge(config: JudgeModelConfig, *, top_k_pairwise: int = 5) -> Any:
    """The constitutional judge on the config's backend, charter and scale; ``top_k_pairwise``:
    how many of a prompt's best completions a group score ranks pairwise (0: none)."""
    from rewards.judge import ConstitutionalJudge

    return ConstitutionalJudge(build_judge_backend(config), config.charter, scale=tuple(config.scale),
                               top_k_pairwise=top_k_pairwise, single_order=config.single_order)


def build_reward_provider(config: RewardProviderConfig) -> Any:
    """The reward provider (or, for ``classifier``, the controversy classifier) a config describes."""
    if config.provider == "verifiable":
        from rewards.verifiable import VerifiableReward

        return VerifiableReward(config.answer_field)
    if config.provider == "reward_model":
        from rewards.reward_model import RewardModel

        return RewardModel(config.model, batch_size=config.model_batch_size, max_length=config.max_length,
                           device=config.device, dtype=config.dtype, on_truncation=config.on_truncation,
                           empty_score=config.empty_score, max_batch_tokens=config.max_batch_tokens)
    if config.provider == "judge":
        return build_judge(config, top_k_pairwise=config.top_k_pairwise)
    from rewards.classifier import ControversyClassifier

    if config.backend == "openai":  # the classifier's model behind vllm serve
        from rewards.generation import Generator

        sampler = build_sampler(SamplerConfig(
            backend="openai", model=config.model, tokenizer=config.tokenizer, base_url=config.base_url,
            api_key_env=config.api_key_env, chat_format="tokenizer", enable_thinking=False,
            max_model_len=config.max_model_len or config.engine_kwargs.get("max_model_len"),
            timeout_s=config.timeout_s, max_retries=config.max_retries))
        generator = Generator(sampler, max_tokens=config.max_tokens, temperature=config.temperature)
    else:
        generator = build_generator(config)
    return ControversyClassifier(generator, threshold=config.threshold, max_attempts=config.max_attempts)
