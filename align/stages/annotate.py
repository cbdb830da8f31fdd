"""Score completions (or classify prompts) with one reward provider, as a resumable job.

Providers (docs/method.md, Reward providers):
- ``reward_model``: any one-label sequence classifier (Skywork-Reward-V2 family): the raw
  logit as the reward, the reward model's own chat template, length-sorted batches.
- ``judge``: the constitutional LLM judge: pointwise 1-9 probability-weighted scores
  against the charter, then the top 5 ranked pairwise in both orders. Backends:
  ``transformers`` (full logits; charter prefix computed once), ``vllm`` (top-20
  logprobs, prefix caching), ``openai`` (any OpenAI-compatible endpoint, e.g. vllm serve).
- ``verifiable``: exact / normalised answer match against the record's ``answer``.
- ``classifier``: the controversy classifier on the first user turn (JSON output,
  retries, failures recorded); writes ``controversial`` for offline sampling.

Output: the input records with ``rewards`` and ``reward_skips`` (or the classifier's
fields), as job shards. Empty completions get a defined reward (reward model: the lowest
of the prompt's other scores, or ``empty_score``; judge: the scale minimum; verifiable:
0), with the rule in ``reward_details``. Reward-model inputs over ``max_length`` are
skipped with the reason (``on_truncation=skip``) or scored truncated (``score``), and
counted in the summary (``truncated_inputs``). As a SLURM array each task takes its shard.

Example: ``align annotate recipes/apertus-8b/annotate_rm.yaml`` or
``sbatch --array=0-15 recipes/slurm/annotate_array.sbatch recipes/apertus-8b/annotate_judge.yaml``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from align.io.http import check_api_key_env
from align.stages.common import check_model_path, check_output_dir, finish, read_input
from align.stages.manifest import begin, start


@dataclass
class Config:
    input: str = field(default="", metadata={"help": "records with completions (file or stage dir)"})
    output_dir: str = field(default="runs/annotate", metadata={"help": "job output directory (shards)"})
    provider: Literal["reward_model", "judge", "verifiable", "classifier"] = field(
        default="reward_model", metadata={"help": "reward_model | judge | verifiable | classifier"}
    )
    model: str = field(default="", metadata={"help": "reward model / judge / classifier model path or name"})
    backend: Literal["transformers", "vllm", "openai"] = field(
        default="transformers", metadata={"help": "judge/classifier backend: transformers | vllm | openai"}
    )
    base_url: str | None = field(default=None, metadata={"help": "openai backend: the endpoint (http://host:8000/v1)"})
    tokenizer: str | None = field(default=None, metadata={"help": "openai backend: tokenizer of the served model"})
    api_key_env: str | None = field(default=None, metadata={
        "help": "openai backend: environment variable holding the API key (default: $OPENAI_API_KEY when set); "
                "the key itself never goes in a recipe"})
    charter: str | None = field(default=None, metadata={"help": "judge: charter file (default: the project's charter)"})
    scale: list[int] = field(default_factory=lambda: [1, 9], metadata={"help": "judge: rating scale (paper: 1-9)"})
    top_k_pairwise: int = field(default=5, metadata={"help": "judge: top-k re-ranked pairwise (0: off)"})
    single_order: Literal["score", "skip"] = field(default="score", metadata={
        "help": "judge: a pairwise comparison with only one readable order is scored from it or skipped"})
    answer_field: str = field(default="answer", metadata={"help": "verifiable: field with the reference answer"})
    threshold: int = field(default=2, metadata={"help": "classifier: label >= threshold is controversial"})
    max_attempts: int = field(default=3, metadata={"help": "classifier: tries before recording a failure"})
    temperature: float = field(
        default=0.0, metadata={"help": "classifier: sampling temperature (0: greedy; retries only help when > 0)"}
    )
    max_new_tokens: int = field(default=256, metadata={"help": "classifier: answer length budget in tokens"})
    batch_size: int = field(default=16, metadata={"help": "prompt records per job batch"})
    model_batch_size: int = field(default=8, metadata={"help": "sequences per forward"})
    max_length: int = field(default=16384, metadata={"help": "reward model: max tokens per input (Skywork-Reward-V2: 16,384)"})
    on_truncation: Literal["skip", "score"] = field(
        default="skip", metadata={"help": "reward model: an input over max_length gets no reward (skip) or "
                                  "is scored on its first max_length tokens (score); counted either way"})
    empty_score: float | None = field(
        default=None, metadata={"help": "reward model: reward of an empty completion (None: the lowest score "
                                "of the prompt's other completions)"})
    dtype: str | None = field(default=None, metadata={"help": "weights dtype (default: bf16 on GPU, fp32 on CPU)"})
    device: str | None = field(default=None, metadata={"help": "cuda / cpu (default: cuda when available)"})
    engine_kwargs: dict = field(default_factory=dict, metadata={"help": "vllm: extra vllm.LLM arguments"})
    shard_index: int | None = field(default=None, metadata={"help": "this shard (default: from SLURM/RANK env)"})
    num_shards: int | None = field(default=None, metadata={"help": "number of shards (default: from env)"})
    overwrite: bool = field(default=False, metadata={"help": "redo a finished or partial output made from other settings or inputs (removes only what this stage wrote there)"})

    def __post_init__(self) -> None:
        if self.provider in ("reward_model", "judge", "classifier") and not self.model:
            raise ValueError(f"model: provider {self.provider!r} needs a model path or name")
        if self.backend == "openai" and not self.base_url:
            raise ValueError("base_url: the openai backend needs the endpoint URL")
        check_api_key_env(self.api_key_env)
        if len(self.scale) != 2:
            raise ValueError(f"scale: expected [low, high], got {self.scale}")
        if self.temperature < 0:
            raise ValueError(f"temperature: must be >= 0, got {self.temperature}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: must be >= 1, got {self.max_new_tokens}")


def build_provider(config: Config) -> Any:
    """The reward provider (or classifier) a recipe describes."""
    import rewards

    if config.provider == "verifiable":
        return rewards.VerifiableReward(config.answer_field)
    if config.provider == "reward_model":
        return rewards.RewardModel(config.model, batch_size=config.model_batch_size, max_length=config.max_length,
                                   device=config.device, dtype=config.dtype, on_truncation=config.on_truncation,
                                   empty_score=config.empty_score)
    if config.provider == "judge":
        return rewards.ConstitutionalJudge(_judge_backend(config), config.charter, scale=tuple(config.scale),
                                           top_k_pairwise=config.top_k_pairwise, single_order=config.single_order)
    return rewards.ControversyClassifier(_generate(config), threshold=config.threshold,
                                         max_attempts=config.max_attempts)


def _judge_backend(config: Config) -> Any:
    import rewards

    if config.backend == "vllm":
        return rewards.VLLMJudgeBackend(config.model, **config.engine_kwargs)
    if config.backend == "openai":
        return rewards.OpenAIJudgeBackend(config.base_url, config.model, config.tokenizer or config.model,
                                          api_key_env=config.api_key_env, batch_size=config.model_batch_size)
    return rewards.TransformersJudgeBackend(config.model, batch_size=config.model_batch_size,
                                            device=config.device, dtype=config.dtype)


def _generate(config: Config) -> Any:
    import rewards

    if config.backend == "vllm":
        from vllm import LLM

        return rewards.vllm_generate(LLM(config.model, **config.engine_kwargs), max_tokens=config.max_new_tokens,
                                     temperature=config.temperature)
    if config.backend == "openai":
        raise ValueError("backend: the classifier runs on transformers or vllm")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rewards.reward_model import resolve_device, resolve_dtype

    device = resolve_device(config.device)
    model = AutoModelForCausalLM.from_pretrained(config.model, dtype=resolve_dtype(config.dtype, device))
    return rewards.transformers_generate(model.to(device).eval(), AutoTokenizer.from_pretrained(config.model),
                                         batch_size=config.model_batch_size, max_new_tokens=config.max_new_tokens,
                                         temperature=config.temperature)


def run(config: Config) -> dict:
    """Annotate this shard; mark the output complete once every record is in."""
    # Not `rewards.annotate(...)`: once the submodule rewards.annotate is imported, that
    # attribute of the package is the module, not the function.
    from align.io import job_is_complete, read_output
    from align.jobs import resolve_shard
    from rewards.annotate import annotate
    from rewards.classifier import classify_records

    if not config.input:
        raise ValueError("annotate: set input (records with completions, e.g. the sample stage's output)")
    check_output_dir(config.output_dir, "annotate")
    begun = begin("annotate", config, config.output_dir, overwrite=config.overwrite)
    if begun.skip:
        return {}
    records = read_input(config.input, "annotate", "input")
    if config.provider != "verifiable" and config.backend != "openai":
        check_model_path(config.model, "annotate", "model")
    start(begun, {"input": records})
    index, count = resolve_shard(config.shard_index, config.num_shards)
    provider = build_provider(config)
    common = {"shard_index": index, "num_shards": count, "batch_size": config.batch_size}
    if config.provider == "classifier":
        classify_records(records, provider, config.output_dir, **common)
    else:
        annotate(records, provider, config.output_dir, **common)
    if not job_is_complete(config.output_dir, records, count):
        print(f"[align annotate] shard {index} of {count} written to {config.output_dir}; other shards still to run")
        return {"shard": index}
    rows = read_output(config.output_dir)
    summary: dict[str, Any] = {"records": len(rows), "provider": config.provider}
    if config.provider == "classifier":
        summary["controversial"] = sum(r.get("controversial") is True for r in rows)
        summary["failed"] = sum(r.get("controversy_label") is None for r in rows)
    else:
        values = [r for row in rows for r in row.get("rewards", [])]
        details = [d for row in rows for d in row.get("reward_details") or [] if isinstance(d, dict)]
        summary["scored"] = sum(v is not None for v in values)
        summary["skipped"] = sum(v is None for v in values)
        summary["empty_completions"] = sum("empty_completion" in d for d in details)
        if config.provider == "reward_model":
            summary["truncated_inputs"] = sum(d.get("truncated") is True for d in details)
    return finish("annotate", config, config.output_dir, summary, begun)
