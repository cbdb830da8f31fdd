"""Supervised fine-tuning on chat data, with loss masks from ``align.chat`` (docs/method.md, Supervised fine-tuning).

Reads conversation rows (``messages``, optional ``tools``) and trains on the assistant
tokens only (or with ``prompt_loss_weight`` on the rest), on TRL's SFTTrainer. With
``identity_filter`` / ``strip_boxed`` the rows are cleaned first (Apertus report E.1.1);
the summary records ``identity_dropped`` and ``boxed_stripped``. Saves the
model and tokenizer (with the chat template installed) to ``output_dir``. Resumes from
the last checkpoint in ``output_dir`` when one exists.

Single process: ``align sft recipes/tiny/pipeline.yaml``. On a cluster:
``accelerate launch --config_file recipes/accelerate/zero2.yaml -m align sft recipes/apertus-8b/sft.yaml``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from align.errors import InputError
from align.io import write_jsonl
from align.manifests import StageRun
from align.manifests.lifecycle import Unfinished, run_stage
from align.trainers.common import keep_hub_token_out_of_outputs
from align.trainers.sft_config import SFTConfig

# what `align sft --help` lists first: the keys no default can stand for
REQUIRED_KEYS = {
    "input": "SFT conversations (file, stage output or dataset name)",
    "model_name_or_path": "the base model to fine-tune",
    "use_cpu": "true on a machine without a GPU (bf16 needs one)",
}


@dataclass
class Config(SFTConfig):
    """`align.trainers.sft_config.SFTConfig` (TRL's SFTConfig + align's fields) plus the data.

    input (str): conversation rows: a JSONL/Parquet file, a stage output directory, or
        a ``datasets.load_dataset`` name.
    """

    input: str = field(default="", metadata={"help": "conversation rows (file, directory or dataset name)"})
    overwrite: bool = field(default=False, metadata={"help": "redo a finished or partial output made from other settings or inputs (removes only what this stage wrote there)"})


def run(config: Config) -> dict:
    """Fine-tune ``model_name_or_path`` on ``input``; save to ``output_dir``."""
    keep_hub_token_out_of_outputs(config)
    return run_stage("sft", config, _train, prepare=_read_once)


def _read_once(run: StageRun) -> None:
    """The input read once, by the main process; the other ranks map its file."""
    run.held["rows"] = _normalized(run, run.config, str(run.config.input))


def _train(run: StageRun) -> dict | Unfinished:
    from align.trainers.guards import resumable_checkpoint
    from align.trainers.sft_data import load_sft_dataset
    from align.trainers.sft_trainer import train_sft

    config, rows = run.config, run.held["rows"]
    if rows.skipped and run.begun is not None and run.begun.manifest is not None:
        write_jsonl(Path(config.output_dir) / "skipped_rows.jsonl", rows.skipped)
    last = resumable_checkpoint(config.output_dir, world_size=config.world_size)
    if last and config.resume_from_checkpoint is None:
        print(f"[align sft] resuming from {last}")
        config.resume_from_checkpoint = last
    with config.main_process_first(desc="SFT rows from their file"):
        dataset = load_sft_dataset(rows.path)
    trainer = train_sft(config, dataset)
    if not trainer.is_world_process_zero():
        return Unfinished()
    left_out = rows.skipped
    records = range(rows.kept)  # the rows trained on, for the counts below
    summary = {"steps": trainer.state.global_step, "train_loss": _last_loss(trainer),
               **({"special_token_text": len(left_out), "skipped_rows": "skipped_rows.jsonl"} if left_out else {})}
    hygiene = dict(getattr(trainer, "data_summary", {}) or {})
    summary.update(hygiene)  # identity_dropped, boxed_stripped: what identity_filter / strip_boxed did
    if hygiene.get("identity_dropped"):
        print(f"[align sft] identity filter: dropped {hygiene['identity_dropped']} of {len(records)} rows whose "
              "assistant text names another model or its maker")
    if "boxed_stripped" in hygiene:
        print(f"[align sft] stripped \\boxed{{}} from the answers of {hygiene['boxed_stripped']} rows")
    used = _rows_used(trainer, config)
    if used is not None:
        cleaned = len(records) - hygiene.get("identity_dropped", 0)
        summary.update(rows=len(records), rows_dropped=cleaned - used)
        if used < cleaned:  # said here, not only in a log line a CLI user never sees
            print(f"[align sft] dropped {cleaned - used} of {cleaned} rows: no assistant token "
                  f"within max_length={config.max_length} (raise max_length, or shorten those conversations)")
    return summary


NORMALIZED_VERSION = 1  # what the normalized rows file holds; a change here makes every one anew


def _normalized(run: StageRun, config: Config, source: str):
    """The input read once, by the main process, into the JSON-encoded rows SFT trains on; the other ranks
    (and a requeued job) find the file made. A conversation whose text holds a token the chat format reads
    as structure (``<s>`` in HTML, a turn delimiter) is left out with its reason: it would teach the model a
    turn boundary that is not one (a recorded skip, ``skipped_rows.jsonl``, as in every stage)."""
    from align.chat import structure_text_problem
    from align.io.fingerprint import json_digest
    from align.trainers.sft_data import normalize_sft_input
    from align.trainers.sft_trainer import sft_rows_cache_dir

    key = json_digest([run.input_fingerprint("input"), config.chat_format, NORMALIZED_VERSION])
    with config.main_process_first(desc="SFT input read once"):
        rows = normalize_sft_input(source, sft_rows_cache_dir(), chat_format=config.chat_format, key=key,
                                   skip=lambda messages, tools: structure_text_problem([messages, tools],
                                                                                       config.chat_format))
    if rows.skipped:
        first = rows.skipped[0]
        print(f"[align sft] {len(rows.skipped)} of {rows.rows} conversations left out: {first['reason']} (row "
              f"{first['row']}; all in skipped_rows.jsonl)")
    if rows.kept == 0:
        raise InputError("sft: no conversation left to train on (every row holds text the chat format reads as "
                         "structure)")
    return rows


def _rows_used(trainer, config: Config) -> int | None:
    """How many rows the trainer kept after tokenizing and truncating (None when packed)."""
    dataset = getattr(trainer, "train_dataset", None)
    if getattr(config, "packing", False) or dataset is None or not hasattr(dataset, "__len__"):
        return None
    return len(dataset)


def _last_loss(trainer) -> float | None:
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    return losses[-1] if losses else None
