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

Models too large for one device (70B) take their KL step in a launch of its own, partitioned
over its ranks (``kl_sharding: zero3``; docs/sharded-passes.md): run the evaluation, then
``accelerate launch --config_file recipes/accelerate/zero3.yaml -m align evaluate RECIPE kl_only=true``,
then the evaluation again, which writes the report.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from align.config import from_dict, merge, to_dict
from align.data.records import skip_reason
from align.errors import ConfigError, InputError, MissingInputError
from align.eval.evaluate import EvalSettings
from align.io import write_jsonl
from align.manifests import StageRun
from align.manifests.lifecycle import Unfinished, check_stage_input, run_stage
from align.sampling.config import SamplerConfig
from rewards.config import RewardProviderConfig, build_reward_provider

# what `align evaluate --help` lists first: the keys no default can stand for
REQUIRED_KEYS = {
    "prompts": "held-out prompt records",
    "policies": "the policies to compare, each {name, model} or {name, completions}",
    "reward": "how answers are scored (provider and its model)",
}


@dataclass
class PolicyConfig:
    name: str = field(default="", metadata={"help": "the policy's label in the report (unique)"})
    model: str | None = field(default=None, metadata={"help": "model directory or name to generate with"})
    completions: str | None = field(
        default=None, metadata={"help": "completions generated before (a sample stage output), instead of a model"}
    )
    sampler: dict | None = field(default=None, metadata={
        "help": "this policy's sampler keys over the shared sampler (e.g. {backend: openai, base_url: ...} for a "
                "policy served by vllm serve)"})

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("policies: every policy needs a name")
        if (self.model is None) == (self.completions is None):
            raise ConfigError(f"policy {self.name!r}: set exactly one of model and completions")
        if self.sampler is not None and self.completions is not None:
            raise ConfigError(f"policy {self.name!r}: sampler keys apply to a policy that generates (model), not to "
                              "completions given")
        if self.sampler and "model" in self.sampler:
            raise ConfigError(f"policy {self.name!r}: sampler.model is the policy's model; set model instead")


def _eval_reward() -> RewardProviderConfig:
    """Evaluate's reward provider by default: answer checking; the judge scores pointwise
    (head-to-head comparisons with the baseline are ``judge_pairwise``)."""
    return RewardProviderConfig(provider="verifiable", top_k_pairwise=0)


@dataclass
class Config(EvalSettings):
    """The evaluation settings (`align.eval.evaluate.EvalSettings`), then the stage's own keys:
    the prompts, the policies, the sampler they share and the reward provider."""

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
    reward: RewardProviderConfig = field(default_factory=_eval_reward, metadata={
        "help": "the reward provider (rewards.config.RewardProviderConfig): reward_model | judge | verifiable"})
    shard_index: int | None = field(default=None, metadata={"help": "this shard (default: from SLURM/RANK env)",
                                                           "min": 0})
    num_shards: int | None = field(default=None, metadata={"help": "number of shards (default: from env)", "min": 1})
    overwrite: bool = field(default=False, metadata={"help": "redo a finished or partial output made from other settings or inputs (removes only what this stage wrote there)"})

    def __post_init__(self) -> None:
        super().__post_init__()
        for policy in self.policies:
            if policy.sampler:
                self.policy_sampler(policy)  # every policy's sampler keys are checked at load
        if self.reward.provider == "classifier":
            raise ConfigError("reward.provider: evaluate scores with reward_model, judge or verifiable "
                              "(the classifier labels prompts; it gives no reward)")

    def policy_sampler(self, policy: PolicyConfig) -> SamplerConfig:
        """The shared sampler with the policy's own keys over it, and its model."""
        values = merge(to_dict(self.sampler), policy.sampler or {})
        values["model"] = policy.model
        return from_dict(SamplerConfig, values, where=f"policies[{policy.name}].sampler.")

    def eval_settings(self, shard_index: int, num_shards: int) -> EvalSettings:
        """The library's settings object: this config's `EvalSettings` fields, with the shard resolved."""
        values = {f.name: getattr(self, f.name) for f in fields(EvalSettings) if f.init}
        return EvalSettings(**{**values, "shard_index": shard_index, "num_shards": num_shards})


def build_policies(config: Config) -> list[Any]:
    """An `EvalPolicy` per recipe entry; a model path that does not exist is an error naming it."""
    from align.eval.evaluate import EvalPolicy
    from align.sampling.config import build_sampler

    policies = []
    for i, spec in enumerate(config.policies):
        if spec.completions is not None:
            if not Path(spec.completions).exists():
                raise MissingInputError(f"policies[{i}] ({spec.name!r}): completions={spec.completions!r} does not exist")
            check_stage_input(spec.completions, "evaluate", f"policies[{i}].completions")
            policies.append(EvalPolicy(spec.name, completions=spec.completions))
            continue
        if not _model_exists(spec.model):
            raise MissingInputError(f"policies[{i}] ({spec.name!r}): model={spec.model!r} does not exist "
                                    "(a directory with config.json, or a model name)")
        sampler_config = config.policy_sampler(spec)
        model, tokenizer = _kl_model_from_path(config, spec.model)
        policies.append(EvalPolicy(spec.name, sampler=lambda c=sampler_config: build_sampler(c), model=model,
                                   tokenizer=tokenizer))
    return policies


def _kl_model_from_path(config: Config, path: str) -> tuple[Any, Any]:
    """(a function loading the KL model from ``path``, its tokenizer) where the KL step loads
    models from paths (``kl_only``, or ``kl_sharding=zero3``: the sampler's model is not used);
    else (None, None): the sampler's own. The model keeps the sampler's dtype."""
    if not config.kl or not (config.kl_only or config.kl_sharding == "zero3"):
        return None, None
    from transformers import AutoTokenizer

    from align.scoring.sharded import load_scoring_model, this_process_device

    def load() -> Any:
        device = None if config.kl_sharding == "zero3" else config.sampler.device or this_process_device()
        return load_scoring_model(path, dtype=config.sampler.dtype, sharding=config.kl_sharding, device=device,
                                  key="kl_sharding")

    return load, AutoTokenizer.from_pretrained(path)


def _kl_launch_shard(config: Config) -> tuple[int, int] | None:
    """A ``kl_only`` launch under ``kl_sharding=zero3``: each rank scores its own prompts."""
    if not (config.kl_only and config.kl_sharding == "zero3"):
        return None
    import torch.distributed as dist

    from align.scoring.sharded import init_distributed

    init_distributed("kl_sharding")
    shard = (dist.get_rank(), dist.get_world_size())
    if (config.shard_index, config.num_shards) not in ((None, None), shard):
        raise ConfigError(f"shard_index={config.shard_index}, num_shards={config.num_shards}: with kl_only and "
                          f"kl_sharding=zero3 the shards are the ranks of the launch ({shard[1]}); leave them unset")
    return shard


def _model_exists(model: str | None) -> bool:
    """A local model directory with a config, or a name that is not a local path."""
    if not model:
        return False
    path = Path(model)
    if path.exists():
        return (path / "config.json").exists()
    return not (model.startswith((".", "/", "~")) or model.count("/") > 1)


def _left_out(prompts: list[dict], config: Config) -> tuple[list[dict], list[dict]]:
    """The prompts every policy can be evaluated on, and {id, reason} for each left out (a recorded skip, as in
    every stage, written to skipped.jsonl): a skip row of a stage before (its reason kept), a prompt whose
    text holds a token the format reads as structure, or one a policy's given completions skipped or hold
    fewer than n of (each policy is compared on the same prompts)."""
    from align.chat import structure_text_problem

    given = _given_rows(config)
    lengths = _prompt_lengths(config)
    kept, left_out = [], []
    for row in prompts:
        reason = skip_reason(row) or structure_text_problem([row.get("messages"), row.get("tools")],
                                                              config.sampler.chat_format)
        for name, rows in given.items():
            if reason is None and row.get("id") in rows:
                reason = _given_problem(rows[row["id"]], name, max(config.n, 1))
        for name, (length_of, limit) in lengths.items():
            if reason is None and (tokens := length_of(row)) >= limit:
                reason = f"policy {name}: prompt has {tokens} tokens; the model's context length is {limit}"
        (left_out.append({"id": row.get("id"), "reason": reason}) if reason else kept.append(row))
    if left_out:
        print(f"[align evaluate] {len(left_out)} of {len(prompts)} prompts left out: {left_out[0]['reason']} "
              f"(e.g. {left_out[0]['id']!r}; all in skipped.jsonl)")
    if not kept:
        raise InputError(f"evaluate: every prompt was left out ({left_out[0]['reason']}, ...); nothing to evaluate")
    return kept, left_out


def _prompt_lengths(config: Config) -> dict[str, tuple[Any, int]]:
    """Each policy with a local model: (a prompt row -> its token count as the sampler renders it, the model's
    context length), so a prompt that leaves a policy no room to generate is left out for every policy
    before any engine starts, as sampling leaves it out (a server's limit is its own: not counted here)."""
    import json

    from transformers import AutoTokenizer

    from align.sampling.base import PromptEncoder

    if config.sampler.backend == "openai":
        return {}
    out = {}
    for spec in config.policies:
        path = Path(spec.model) if spec.model else None
        if path is None or not (path / "config.json").is_file():
            continue
        limit = config.sampler.max_model_len or (config.sampler.engine_kwargs or {}).get("max_model_len") or \
            json.loads((path / "config.json").read_text()).get("max_position_embeddings")
        if not limit:
            continue
        encoder = PromptEncoder(AutoTokenizer.from_pretrained(path), config.sampler.chat_format,
                                chat_date=config.sampler.chat_date, enable_thinking=config.sampler.enable_thinking)
        out[spec.name] = (lambda row, e=encoder: len(e.prompt_ids(row["messages"], row.get("tools"))), int(limit))
    return out


def _given_rows(config: Config) -> dict[str, dict[str, dict]]:
    """Each policy given as completions: its rows by id (read here only to find the skipped prompts)."""
    from align.io import read_records

    out = {}
    for spec in config.policies:
        if spec.completions is not None and Path(spec.completions).exists():
            out[spec.name] = {r["id"]: r for r in read_records(spec.completions)
                              if isinstance(r, dict) and isinstance(r.get("id"), str)}
    return out


def _given_problem(row: dict, name: str, n: int) -> str | None:
    """Why a policy's given completions of a prompt cannot be evaluated (None: they can)."""
    reason = skip_reason(row)
    if reason is not None:
        return f"policy {name}: {reason}"
    completions = row.get("completions")
    if isinstance(completions, list) and len(completions) < n:
        return (f"policy {name}: {len(completions)} completions, n={n} are evaluated (sample at least n per prompt, "
                "or evaluate with a smaller n)")
    return None


def run(config: Config) -> dict:
    """Evaluate this shard; the task that completes the last shard writes the report."""
    from align.eval.evaluate import check_policies

    if not config.prompts:
        raise ConfigError("evaluate: set prompts (the held-out prompt records)")
    if not Path(config.prompts).exists():
        raise MissingInputError(f"evaluate: prompts={config.prompts!r} does not exist")
    check_policies([p.name for p in config.policies], config.baseline)  # before loading any model
    return run_stage("evaluate", config, _evaluate, prepare=_check_policies)


def _check_policies(run: StageRun) -> None:
    """Every policy's model or completions exist and are finished, before an overwrite removes anything; the
    prompts whose text the chat format reads as structure are left out, with their reason."""
    config = run.config
    for i, spec in enumerate(config.policies):  # every input is checked before an overwrite removes anything
        if spec.completions is not None:
            if not Path(spec.completions).exists():
                raise MissingInputError(f"policies[{i}] ({spec.name!r}): completions={spec.completions!r} does not "
                                        "exist")
            check_stage_input(spec.completions, "evaluate", f"policies[{i}].completions")
        elif not _model_exists(spec.model):
            raise MissingInputError(f"policies[{i}] ({spec.name!r}): model={spec.model!r} does not exist (a "
                                    "directory with config.json, or a model name)")
    run.held["prompts"], run.held["left_out"] = _left_out(run.rows["prompts"], config)


def _evaluate(run: StageRun) -> dict[str, Any] | Unfinished:
    from align.eval.evaluate import evaluate
    from align.jobs import resolve_shard

    config, prompts, left_out = run.config, run.held["prompts"], run.held["left_out"]
    index, count = _kl_launch_shard(config) or resolve_shard(config.shard_index, config.num_shards)
    settings = config.eval_settings(index, count)
    # The reward provider is built by evaluate() after every policy has generated and released
    # its sampler, so the judge's engine never shares the GPUs with a policy's (answer checking
    # loads nothing: built now, so that the prompts' answers are checked before generating).
    if config.reward.provider == "verifiable":
        provider = build_reward_provider(config.reward)
    else:
        provider = lambda reward=config.reward: build_reward_provider(reward)
    report = evaluate(prompts, build_policies(config), provider, config.output_dir, baseline=config.baseline,
                      settings=settings, source=config.prompts)
    if report.get("complete") is False:
        return Unfinished(report)
    if left_out:
        run.check_owner()
        write_jsonl(Path(config.output_dir) / "skipped.jsonl", left_out)
    summary = {"prompts": report["prompts"], "report": str(Path(config.output_dir) / "report.md"),
               **({"skipped_prompts": len(left_out), "skipped": "skipped.jsonl"} if left_out else {}),
               "verdicts": [v for c in report["overall"]["comparisons"].values() for v in c["verdicts"]]}
    for verdict in summary["verdicts"]:
        print(f"[align evaluate] {verdict}")
    return summary
