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

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from align.data.records import same_value, skip_reason
from align.manifests import StageRun
from align.manifests.lifecycle import Unfinished, check_model_path, run_stage
from rewards.config import RewardProviderConfig, build_reward_provider

# what `align annotate --help` lists first: the keys no default can stand for
REQUIRED_KEYS = {
    "input": "sampled records (an `align sample` output)",
    "provider": "reward_model, judge, verifiable or classifier",
    "model": "the reward model or judge (not for provider=verifiable)",
}


@dataclass
class Config(RewardProviderConfig):
    """The reward provider's keys (`rewards.config.RewardProviderConfig`), then the stage's own."""

    input: str = field(default="", metadata={"help": "records with completions (file or stage dir)"})
    output_dir: str = field(default="runs/annotate", metadata={"help": "job output directory (shards)"})
    where: dict = field(default_factory=dict, metadata={
        "help": "annotate only the records whose fields have these values: {FIELD: value or [values]} (e.g. "
                "{controversial: true} for the judge, {controversial: [false, null]} for the reward model); the "
                "others are left out of this output, counted in its summary; a recipe checks the values against the "
                "labels the step before writes"})
    where_rest: Literal["refuse", "drop"] = field(default="refuse", metadata={
        "help": "in a recipe, the rows whose label no annotate step's where selects: refuse (the recipe is refused "
                "when read, naming the labels left out) | drop (left out on purpose); changes no result"})
    batch_size: int = field(default=16, metadata={"help": "prompt records per job batch"})
    shard_index: int | None = field(default=None, metadata={"help": "this shard (default: from SLURM/RANK env)"})
    num_shards: int | None = field(default=None, metadata={"help": "number of shards (default: from env)"})
    overwrite: bool = field(default=False, metadata={"help": "redo a finished or partial output made from other settings or inputs (removes only what this stage wrote there)"})


def selected(records: list[dict[str, Any]], where: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The records whose fields match ``where`` (each value, or one of a list of values)."""
    if not where:
        return records

    def matches(row: Mapping[str, Any]) -> bool:
        for name, wanted in where.items():
            allowed = wanted if isinstance(wanted, list) else [wanted]
            if not any(same_value(row.get(name), value) for value in allowed):
                return False
        return True

    return [row for row in records if matches(row)]


def run(config: Config) -> dict:
    """Annotate this shard; mark the output complete once every record is in."""
    return run_stage("annotate", config, _annotate, prepare=_select)


def _select(run: StageRun) -> None:
    """The records ``where`` selects; the model is a saved model (or a hub name) unless a server holds it."""
    config = run.config
    everything = run.rows["input"]
    run.held["records"] = selected(everything, config.where)
    if config.where:
        print(f"[align annotate] where={config.where}: {len(run.held['records'])} of {len(everything)} records "
              "selected")
    if config.provider != "verifiable" and config.backend != "openai":
        check_model_path(config.model, "annotate", "model")


def _annotate(run: StageRun) -> dict[str, Any] | Unfinished:
    # Not `rewards.annotate(...)`: once the submodule rewards.annotate is imported, that
    # attribute of the package is the module, not the function.
    from align.io import job_is_complete, read_output
    from align.jobs import resolve_shard
    from align.jobs.sharding import shard_of
    from rewards.annotate import annotate
    from rewards.classifier import classify_records

    config, everything, records = run.config, run.rows["input"], run.held["records"]
    index, count = resolve_shard(config.shard_index, config.num_shards)
    provider = build_reward_provider(config)
    common = {"shard_index": index, "num_shards": count, "batch_size": config.batch_size}
    if config.provider == "classifier":
        classify_records(records, provider, config.output_dir, **common)
    else:
        annotate(records, provider, config.output_dir, **common)
    if passed_on := sum(skip_reason(r) is not None for r in records if shard_of(r["id"], count) == index):
        print(f"[align annotate] {passed_on} rows of this shard were skipped by a stage before: passed on with "
              "their reason (skip_reason)")
    if not job_is_complete(config.output_dir, records, count):
        print(f"[align annotate] shard {index} of {count} written to {config.output_dir}; other shards still to run")
        return Unfinished({"shard": index})
    rows = read_output(config.output_dir)
    summary: dict[str, Any] = {"records": len(rows), "provider": config.provider}
    if passed := sum(skip_reason(r) is not None for r in rows):  # skip rows of a stage before, passed on
        summary["upstream_skipped"] = passed
    if config.where:
        summary["not_selected"] = len(everything) - len(records)
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
    return summary
