"""One offline pass of reference log-probs for the pairs (docs/method.md, QRPO).

For each pair row it adds ``ref_chosen_logps``, ``ref_rejected_logps`` (sums of
completion-token log-probs under the reference policy) and ``chosen_length``,
``rejected_length`` (completion tokens, end-of-turn included), with the tokenization the
trainer uses. Batches are sorted by length; the pass resumes after a kill; under
``accelerate launch`` each process takes a shard of the rows.

Where the model fits one device, each process holds a whole copy (``sharding: replicate``)::

    accelerate launch --num_processes 8 -m align logprobs recipes/apertus-8b/logprobs.yaml

Where it does not (70B: 140 GB of bf16 weights), the ranks hold it partitioned under
DeepSpeed ZeRO-3 and still score their own rows (``sharding: zero3``; docs/sharded-passes.md)::

    accelerate launch --config_file recipes/accelerate/zero3.yaml -m align logprobs recipes/apertus-70b/logprobs.yaml
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from align.errors import ConfigError, loading
from align.io import job_is_complete, read_records
from align.jobs import shard_from_env
from align.logprobs import (
    cache_fields_for,
    compute_ref_logprobs,
    missing_ids,
    ref_cache_key,
    weights_fingerprint,
)
from align.manifests import StageRun
from align.manifests.lifecycle import Unfinished, check_input_exists, check_stage_input, run_stage
from align.ranks import on_rank_zero, start_process_group
from align.scoring import check_over_max_length_policy, check_truncated_policy
from align.scoring.sharded import (
    all_ranks_agree,
    check_sharding,
    init_distributed,
    load_scoring_model,
    release_model,
)

# what `align logprobs --help` lists first: the keys no default can stand for
REQUIRED_KEYS = {
    "input": "pair rows (an `align pairs` output)",
    "model_name_or_path": "the reference policy (π_ref, the SFT output)",
}


__all__ = ["Config", "LogprobsConfig", "resolved_output_dir", "run", "run_pass"]

logger = logging.getLogger(__name__)


@dataclass
class LogprobsConfig:
    """Settings of ``align logprobs`` (the field names match ``PreferenceConfig``'s data fields).

    model_name_or_path: the reference policy π_ref (the SFT checkpoint).
    input: pair rows (JSONL/JSON/Parquet file, or a job output directory).
    output_dir: where the rows with reference columns go; ``None``: under ``cache_dir``,
        named by the cache key, so a second run with the same inputs reuses it.
    cache_dir: root of keyed outputs when ``output_dir`` is None.
    chat_format, max_length, enable_thinking, chat_date: as in ``PreferenceConfig``; they
        must match the trainer's. ``chat_date`` None means today's date: pin it.
    batch_size: rows per forward (each row is 2 sequences for pairs); does not change results.
    max_batch_tokens: with it, a forward also holds at most this many tokens (rows × its longest
        row's prompt and completions; rows go longest first), so short rows are scored many at a
        time and long ones few, at an even memory; ``batch_size`` is then the most rows. None:
        ``batch_size`` rows whatever their length. Does not change results.
    dtype: weights dtype (``float32``, ``bfloat16``); part of the cache key.
    attn_implementation: ``sdpa`` / ``eager`` / ``flash_attention_2`` / ``flex_attention``; ``auto``:
        flash-attn on a GPU where installed, FlexAttention on a GPU without it, ``sdpa`` on CPU;
        None: transformers' choice.
    padding_free / max_row_tokens: batch layout (does not change results).
    sharding: how the model is held; neither the results, the cache key nor the manifest
        depends on it. ``replicate`` (default): each process loads the whole model on its
        device and scores its shard alone (fastest where it fits). ``zero3``: the model is
        built partitioned over the ranks of a distributed launch (DeepSpeed ZeRO-3 inference:
        each of N ranks holds 1/N of the weights, layers are gathered as they run) and each
        rank scores its own rows, forwards in step with the others; needs ``accelerate
        launch`` (e.g. ``--config_file recipes/accelerate/zero3.yaml``) or torchrun, and
        ``device`` unset.
    device: ``cuda``, ``cpu``...; None: this process's accelerator (``LOCAL_RANK``) or CPU.
    truncated: ``exclude`` (default): a row whose chosen/rejected was cut at the token budget
        (``*_finish_reason`` "length") is an error; ``train_without_end``: score it without
        an end-of-turn token. Must match the trainer's ``truncated``.
    over_max_length: ``exclude`` (default): a row whose prompt + completion exceeds
        ``max_length`` is not scored; it is written with ``ref_skip`` (the reason) and counted
        in the stage summary (``over_max_length_skipped``), and the trainer excludes it too.
        ``cut``: score the completion's first tokens, without its end-of-turn token (R_q and
        β/|y| still describe the whole text). Must match the trainer's ``over_max_length``.
    overwrite: redo a finished or partial ``output_dir`` made from other settings or inputs
        (removes only what this stage wrote there). Keyed outputs under ``cache_dir`` are
        named by their cache key, so they never need it.
    """

    model_name_or_path: str
    input: str
    output_dir: str | None = None
    cache_dir: str | None = None
    chat_format: str = "apertus"
    max_length: int | None = 4096
    enable_thinking: bool = False
    chat_date: str | None = None
    batch_size: int = 16
    max_batch_tokens: int | None = None
    dtype: str = "float32"
    attn_implementation: str | None = None
    padding_free: bool = False
    max_row_tokens: int | None = None
    sharding: str = "replicate"
    device: str | None = None
    truncated: str = "exclude"
    over_max_length: str = "exclude"
    overwrite: bool = False

    def __post_init__(self) -> None:
        check_truncated_policy(self.truncated)
        check_over_max_length_policy(self.over_max_length)
        if self.output_dir is None and self.cache_dir is None:
            raise ConfigError("set output_dir, or cache_dir to keep outputs under their cache key")
        if self.batch_size < 1:
            raise ConfigError(f"batch_size={self.batch_size}: must be >= 1")
        if self.max_batch_tokens is not None and self.max_batch_tokens < 1:
            raise ConfigError(f"max_batch_tokens={self.max_batch_tokens}: must be >= 1, or None (batch_size rows a "
                              "forward)")
        if self.max_length is not None and self.max_length < 2:
            raise ConfigError(f"max_length={self.max_length}: must be >= 2, or None")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ConfigError(f"dtype={self.dtype!r}: choose float32, bfloat16 or float16")
        check_sharding(self.sharding)
        if self.sharding == "zero3" and self.device is not None:
            raise ConfigError(f"device={self.device!r}: with sharding=zero3 each rank uses its own accelerator "
                              "(LOCAL_RANK); leave device unset")


Config = LogprobsConfig


def run(config: Config) -> dict:
    """Compute (or reuse) reference log-probs; mark the output complete when all rows are in."""
    check_input_exists(config.input, "logprobs", "input")
    check_stage_input(config.input, "logprobs", "input")
    # the lifecycle decides on rank 0 of a launch (the others follow); without output_dir the output is kept
    # under its cache key, which decides whether it is made
    return run_stage("logprobs", config, _score)


def _score(run: StageRun) -> dict | Unfinished:
    config, records = run.config, run.rows["input"]
    output_dir = run_pass(config)
    missing = missing_ids(output_dir, records)
    if missing:  # another shard (SLURM array task) has not finished yet
        print(f"[align logprobs] this shard is done; {len(missing)} rows wait for other shards in {output_dir}")
        return Unfinished({"missing": len(missing)})
    skipped = over_max_length_skips(output_dir, records)
    if skipped:
        print(f"[align logprobs] {len(skipped)} of {len(records)} rows exceed max_length={config.max_length} and "
              f"are not scored (over_max_length=exclude; column ref_skip), e.g. {skipped[:5]}; the trainer "
              "excludes them too")
    return {"rows": len(records), "over_max_length_skipped": len(skipped)}


def over_max_length_skips(output_dir: str | Path, records) -> list[str]:
    """Ids of the rows the pass wrote unscored (``ref_skip``), in input order."""
    from align.io import read_output

    wanted = {r["id"] for r in records}
    return [row["id"] for row in read_output(output_dir) if row.get("ref_skip") and row.get("id") in wanted]


# --------------------------------------------------------------------------- the pass over a dataset


def _device(config: LogprobsConfig) -> torch.device:
    if config.device:
        return torch.device(config.device)
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def resolved_output_dir(config: LogprobsConfig, key: str) -> Path:
    """``output_dir``, or the keyed directory under ``cache_dir``."""
    if config.output_dir is not None:
        return Path(config.output_dir)
    return Path(config.cache_dir) / f"ref_logps-{key[:16]}"


def run_pass(config: LogprobsConfig) -> Path:
    """Run this process's shard; under a distributed launch, wait for all and check the merge.

    Returns the output directory. A finished output for the same cache key is reused
    without loading the model.
    """
    from transformers import AutoTokenizer

    shard_index, num_shards = _shard(config)
    records = read_records(config.input)
    with loading("model_name_or_path", config.model_name_or_path):
        tokenizer = AutoTokenizer.from_pretrained(config.model_name_or_path)
    if config.chat_date is None:
        logger.warning("chat_date is None (today's date): pin it so the trainer renders the same prompts")
    fields = cache_fields_for(
        records, config.model_name_or_path, tokenizer, chat_format=config.chat_format, max_length=config.max_length,
        enable_thinking=config.enable_thinking, chat_date=config.chat_date, dtype=config.dtype,
        model_fingerprint=on_rank_zero(lambda: weights_fingerprint(config.model_name_or_path)),
        over_max_length=config.over_max_length)
    key = ref_cache_key(fields)
    output_dir = resolved_output_dir(config, key)
    if all_ranks_agree(job_is_complete(output_dir, records, num_shards)):  # loading is collective under zero3
        logger.info("reference log-probs for key %s already complete in %s", key[:16], output_dir)
    else:
        model = load_scoring_model(config.model_name_or_path, dtype=config.dtype,
                                   attn_implementation=config.attn_implementation, sharding=config.sharding,
                                   device=_device(config) if config.sharding == "replicate" else None)
        compute_ref_logprobs(
            records, model, tokenizer, chat_format=config.chat_format, batch_size=config.batch_size,
            max_batch_tokens=config.max_batch_tokens, max_length=config.max_length, output_dir=output_dir,
            enable_thinking=config.enable_thinking,
            chat_date=config.chat_date, shard_index=shard_index, num_shards=num_shards,
            padding_free=config.padding_free, max_row_tokens=config.max_row_tokens, cache_fields=fields,
            truncated=config.truncated, over_max_length=config.over_max_length)
        release_model(model)
        del model
    _wait_for_other_shards()
    if shard_index == 0 or num_shards == 1:
        missing = missing_ids(output_dir, records)
        if missing and _distributed():
            raise RuntimeError(f"after all shards finished, {len(missing)} rows are missing in {output_dir}: "
                               f"{missing[:10]}")
        if missing:
            logger.info("%d rows not written yet (other shards still running?): %s", len(missing), missing[:10])
    return output_dir


def _shard(config: LogprobsConfig) -> tuple[int, int]:
    """This process's shard of the rows: from the environment, or under zero3 the rank in its launch."""
    if config.sharding != "zero3":
        return shard_from_env()
    if "SLURM_ARRAY_TASK_ID" in os.environ:
        raise ConfigError("sharding=zero3 shards the rows over the ranks of one launch; a SLURM job array of "
                          "launches would score the same rows in every task: run one launch (over several nodes "
                          "if needed), or sharding=replicate in array tasks")
    init_distributed()  # the ranks load the partitioned model together, or none of them does
    return torch.distributed.get_rank(), torch.distributed.get_world_size()


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _wait_for_other_shards() -> None:
    """Barrier when launched with accelerate/torchrun (a SLURM array has none: check later)."""
    start_process_group()
    if _distributed():
        torch.distributed.barrier()

