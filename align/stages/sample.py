"""Sample completions per prompt: n references from the policy, or offline completions.

``mode: reference`` (default) draws ``n`` completions at T = 1 from the SFT policy
(``is_reference=True``; docs/method.md, Reference completions). ``mode: offline`` draws from another model, steered by
the system-prompt families (truthful / helpful / honest, persona prompts for prompts
flagged controversial). Output: prompt records with ``completions``, as append-only job
shards that a killed run resumes; as a SLURM array, each task takes its shard
(``SLURM_ARRAY_TASK_ID`` / ``SLURM_ARRAY_TASK_COUNT``).

Example: ``align sample recipes/apertus-8b/sample.yaml`` (vLLM on a GPU node), or
``align sample recipes/tiny/pipeline.yaml`` (transformers on CPU).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from align.manifests import StageRun
from align.manifests.lifecycle import Unfinished, check_model_path, run_stage
from align.sampling.config import SamplerConfig

# what `align sample --help` lists first: the keys no default can stand for
REQUIRED_KEYS = {
    "prompts": "prompt records",
    "sampler.model": "the policy to sample from (an SFT output)",
}


@dataclass
class Config:
    prompts: str = field(default="", metadata={"help": "prompt records (file, directory or dataset name)"})
    output_dir: str = field(default="runs/sample", metadata={"help": "job output directory (shards)"})
    sampler: SamplerConfig = field(default_factory=SamplerConfig, metadata={"help": "backend, model and engine settings"})
    mode: Literal["reference", "offline"] = field(default="reference", metadata={"help": "reference | offline"})
    n: int = field(
        default=10, metadata={"help": "completions per prompt (Apertus report E.4: 10 references)"}
    )
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling"})
    max_tokens: int = field(default=4096, metadata={"help": "completion length budget"})
    seed: int = field(default=0, metadata={"help": "seed; each prompt's draws derive from it and its id"})
    overlong: Literal["flag", "drop"] = field(default="flag", metadata={"help": "completions over budget: flag | drop"})
    batch_size: int = field(default=64, metadata={"help": "prompts per job batch (written together)"})
    shard_index: int | None = field(default=None, metadata={"help": "this shard (default: from SLURM/RANK env)"})
    num_shards: int | None = field(default=None, metadata={"help": "number of shards (default: from env)"})
    controversial_field: str = field(default="controversial", metadata={"help": "offline: flag that selects persona prompts"})
    on_unclassified: Literal["error", "persona", "attribute"] = field(
        default="error", metadata={"help": "offline: a null flag (classifier failed): error | persona | attribute"}
    )
    default_prompt: bool = field(default=True, metadata={"help": "offline: also sample the prompt without a family prompt"})
    charter_persona: bool = field(default=False, metadata={"help": "offline: also sample with the charter persona"})
    personas_file: str | None = field(default=None, metadata={"help": "offline: persona list (JSONL/text); default: built-in pool"})
    overwrite: bool = field(default=False, metadata={"help": "redo a finished or partial output made from other settings or inputs (removes only what this stage wrote there)"})


def run(config: Config) -> dict:
    """Sample this shard's prompts; mark the output complete once every prompt is in."""
    return run_stage("sample", config, _sample, prepare=_prepare)


def _prepare(run: StageRun) -> None:
    """The policy is a saved model (or a hub name), unless a server holds it; the personas file is read
    (and checked: UTF-8, one persona a line) before anything is written."""
    if run.config.sampler.backend != "openai":
        check_model_path(run.config.sampler.model, "sample", "sampler.model")
    if run.config.mode == "offline" and run.config.personas_file:
        from align.sampling.system_prompts import load_personas

        run.held["personas"] = load_personas(run.config.personas_file)


def _sample(run: StageRun) -> dict | Unfinished:
    from align.io import job_is_complete
    from align.jobs import resolve_shard
    from align.sampling.config import build_sampler
    from align.sampling.stages import sample_offline, sample_references

    config, records = run.config, run.rows["prompts"]
    index, count = resolve_shard(config.shard_index, config.num_shards)
    sampler = build_sampler(config.sampler)
    common = {"output_dir": config.output_dir, "n": config.n, "temperature": config.temperature,
              "top_p": config.top_p, "max_tokens": config.max_tokens, "seed": config.seed,
              "overlong": config.overlong, "shard_index": index, "num_shards": count,
              "batch_size": config.batch_size}
    if config.mode == "reference":
        summary = sample_references(records, sampler, **common)
    else:
        from align.sampling.system_prompts import DEFAULT_PERSONAS

        personas = run.held.get("personas") or DEFAULT_PERSONAS
        summary = sample_offline(
            records, sampler, controversial_field=config.controversial_field, on_unclassified=config.on_unclassified,
            default_prompt=config.default_prompt, charter_persona=config.charter_persona, personas=personas, **common,
        )
    if not job_is_complete(config.output_dir, records, count):
        print(f"[align sample] shard {index} of {count} written to {config.output_dir}; other shards still to run")
        return Unfinished(summary)
    return summary
