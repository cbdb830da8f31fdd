"""Evaluate policies on held-out prompts: rewards, win rates against a baseline, KL, with CIs.

Typical use after a run: the SFT model as the baseline, the QRPO (or DPO) policy against
it, on prompts never trained on. Each policy generates a greedy completion and ``n``
samples per prompt (or brings completions it generated before: a ``sample`` stage
output); one reward provider scores them all; the constitutional judge also compares each
policy with the baseline head to head, in both orders. Outputs ``eval.jsonl``,
``report.json``, ``report.md`` (a table for a model card) and plots in ``output_dir``.
Every step is a resumable job: rerun the same command after a kill.

Example::

    align evaluate recipes/tiny/pipeline.yaml      # its evaluate section: SFT against QRPO
    align evaluate recipe.yaml policies='[{name: sft, model: runs/sft}, {name: qrpo, model: runs/qrpo}]'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from align.sampling.config import SamplerConfig
from align.stages.common import (
    check_output_dir,
    check_stage_input,
    finish,
    read_input,
)
from align.stages.manifest import begin, start


@dataclass
class PolicyConfig:
    name: str = field(default="", metadata={"help": "the policy's label in the report (unique)"})
    model: str | None = field(default=None, metadata={"help": "model directory or name to generate with"})
    completions: str | None = field(
        default=None, metadata={"help": "completions generated before (a sample stage output), instead of a model"}
    )

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("policies: every policy needs a name")
        if (self.model is None) == (self.completions is None):
            raise ValueError(f"policy {self.name!r}: set exactly one of model and completions")


@dataclass
class RewardConfig:
    provider: Literal["reward_model", "judge", "verifiable"] = field(
        default="verifiable", metadata={"help": "reward_model | judge | verifiable"}
    )
    model: str = field(default="", metadata={"help": "reward model / judge model path or name"})
    backend: Literal["transformers", "vllm", "openai"] = field(
        default="transformers", metadata={"help": "judge backend: transformers | vllm | openai"}
    )
    base_url: str | None = field(default=None, metadata={"help": "openai backend: the endpoint (http://host:8000/v1)"})
    tokenizer: str | None = field(default=None, metadata={"help": "openai backend: tokenizer of the served model"})
    charter: str | None = field(default=None, metadata={"help": "judge: charter file (default: the project's charter)"})
    scale: list[int] = field(default_factory=lambda: [1, 9], metadata={"help": "judge: rating scale"})
    answer_field: str = field(default="answer", metadata={"help": "verifiable: field with the reference answer"})
    model_batch_size: int = field(default=8, metadata={"help": "sequences per reward-model / judge forward"})
    max_length: int = field(default=16384, metadata={"help": "reward model: max tokens"})
    dtype: str | None = field(default=None, metadata={"help": "weights dtype (default: bf16 on GPU, fp32 on CPU)"})
    device: str | None = field(default=None, metadata={"help": "cuda / cpu (default: cuda when available)"})
    engine_kwargs: dict = field(default_factory=dict, metadata={"help": "vllm: extra vllm.LLM arguments"})


@dataclass
class Config:
    prompts: str = field(default="", metadata={"help": "held-out prompt records: id, messages (+ answer, language, "
                                               "category)"})
    output_dir: str = field(default="runs/evaluate", metadata={"help": "where eval.jsonl, the report and plots go"})
    policies: list[PolicyConfig] = field(default_factory=list, metadata={"help": "the policies: name + model or "
                                                                         "completions"})
    baseline: str = field(default="", metadata={"help": "the policy the others are compared with (e.g. sft)"})
    sampler: SamplerConfig = field(
        default_factory=lambda: SamplerConfig(backend="transformers"),
        metadata={"help": "backend and engine settings shared by the policies (sampler.model is set per policy)"},
    )
    reward: RewardConfig = field(default_factory=RewardConfig, metadata={"help": "the reward provider"})
    greedy: bool = field(default=True, metadata={"help": "generate one greedy completion per prompt"})
    n: int = field(default=4, metadata={"help": "samples per prompt (0: greedy only)"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature (KL needs 1)"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling (KL needs 1)"})
    max_tokens: int = field(default=512, metadata={"help": "completion length budget"})
    seed: int = field(default=0, metadata={"help": "each prompt's draws are seeded by (seed, id), the same for "
                                           "every policy"})
    judge_pairwise: bool = field(default=True, metadata={"help": "judge: also compare with the baseline head to head, "
                                                         "both orders"})
    pairwise_samples: int = field(default=1, metadata={"help": "judge: sampled pairs per prompt compared (besides "
                                                       "the greedy pair)"})
    kl: bool = field(default=True, metadata={"help": "estimate KL(π‖π_ref) from each policy's samples"})
    kl_reference: str | None = field(default=None, metadata={"help": "the π_ref policy (default: the baseline)"})
    tie_margin: float = field(default=0.0, metadata={"help": "judge preferences within this of 0.5 are ties"})
    resamples: int = field(default=2000, metadata={"help": "bootstrap resamples"})
    confidence: float = field(default=0.95, metadata={"help": "confidence level of every interval"})
    batch_size: int = field(default=16, metadata={"help": "prompts per job batch"})
    plots: bool = field(default=True, metadata={"help": "write the PNG plots"})
    shard_index: int | None = field(default=None, metadata={"help": "this shard (default: from SLURM/RANK env)"})
    num_shards: int | None = field(default=None, metadata={"help": "number of shards (default: from env)"})
    overwrite: bool = field(default=False, metadata={"help": "redo a finished or partial output made from other settings or inputs (removes only what this stage wrote there)"})


def build_policies(config: Config) -> list[Any]:
    """An `EvalPolicy` per recipe entry; a model path that does not exist is an error naming it."""
    from dataclasses import replace

    from align.eval.evaluate import EvalPolicy
    from align.sampling.config import build_sampler

    policies = []
    for i, spec in enumerate(config.policies):
        if spec.completions is not None:
            if not Path(spec.completions).exists():
                raise FileNotFoundError(f"policies[{i}] ({spec.name!r}): completions={spec.completions!r} does not exist")
            check_stage_input(spec.completions, "evaluate", f"policies[{i}].completions")
            policies.append(EvalPolicy(spec.name, completions=spec.completions))
            continue
        if not _model_exists(spec.model):
            raise FileNotFoundError(f"policies[{i}] ({spec.name!r}): model={spec.model!r} does not exist "
                                    "(a directory with config.json, or a model name)")
        sampler_config = replace(config.sampler, model=spec.model)
        policies.append(EvalPolicy(spec.name, sampler=lambda c=sampler_config: build_sampler(c)))
    return policies


def _model_exists(model: str | None) -> bool:
    """A local model directory with a config, or a name that is not a local path."""
    if not model:
        return False
    path = Path(model)
    if path.exists():
        return (path / "config.json").exists()
    return not (model.startswith((".", "/", "~")) or model.count("/") > 1)


def build_provider(reward: RewardConfig) -> Any:
    """The reward provider; the judge scores pointwise here (head-to-head is asked separately)."""
    from dataclasses import asdict

    from align.stages import annotate

    return annotate.build_provider(annotate.Config(input="-", output_dir="-", top_k_pairwise=0, **asdict(reward)))


def run(config: Config) -> dict:
    """Evaluate this shard; the task that completes the last shard writes the report."""
    from align.eval.evaluate import EvalSettings, check_policies, evaluate
    from align.jobs import resolve_shard

    if not config.prompts:
        raise ValueError("evaluate: set prompts (the held-out prompt records)")
    if not Path(config.prompts).exists():
        raise FileNotFoundError(f"evaluate: prompts={config.prompts!r} does not exist")
    check_policies([p.name for p in config.policies], config.baseline)  # before loading any model
    check_output_dir(config.output_dir, "evaluate")
    begun = begin("evaluate", config, config.output_dir, overwrite=config.overwrite)
    if begun.skip:
        return {}
    prompts = read_input(config.prompts, "evaluate", "prompts")
    start(begun, {"prompts": prompts})
    index, count = resolve_shard(config.shard_index, config.num_shards)
    settings = EvalSettings(
        greedy=config.greedy, n=config.n, temperature=config.temperature, top_p=config.top_p,
        max_tokens=config.max_tokens, seed=config.seed, judge_pairwise=config.judge_pairwise,
        pairwise_samples=config.pairwise_samples, kl=config.kl, kl_reference=config.kl_reference,
        tie_margin=config.tie_margin, resamples=config.resamples, confidence=config.confidence,
        batch_size=config.batch_size, plots=config.plots, shard_index=index, num_shards=count,
    )
    provider = build_provider(config.reward)
    report = evaluate(prompts, build_policies(config), provider, config.output_dir, baseline=config.baseline,
                      settings=settings, source=config.prompts)
    if report.get("complete") is False:
        return report
    summary = {"prompts": report["prompts"], "report": str(Path(config.output_dir) / "report.md"),
               "verdicts": [v for c in report["overall"]["comparisons"].values() for v in c["verdicts"]]}
    for verdict in summary["verdicts"]:
        print(f"[align evaluate] {verdict}")
    return finish("evaluate", config, config.output_dir, summary, begun)
