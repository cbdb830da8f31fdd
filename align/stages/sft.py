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

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from align.errors import ConfigError, InputError, loading
from align.io import write_jsonl
from align.manifests import StageRun
from align.manifests.lifecycle import Unfinished, run_stage
from align.ranks import is_writer
from align.trainers.common import device_note, keep_hub_token_out_of_outputs, last_loss
from align.trainers.sft_config import SFTConfig

# what `align sft --help` lists first: the keys no default can stand for
REQUIRED_KEYS = {
    "input": "SFT conversations (file, stage output or dataset name)",
    "model_name_or_path": "the base model to fine-tune",
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
    """The model's own template probed first (``chat_format: tokenizer``), then the input read once, by
    the main process; the other ranks map its file."""
    tokenizer = _own_template(run.config)
    run.held["rows"] = _normalized(run, run.config, str(run.config.input), tokenizer)


def _own_template(config: Config) -> Any:
    """``chat_format: tokenizer``: the tokenizer of ``model_name_or_path``, its template probed
    (``align.chat.template.check_own_template``) before the input is read and the model loads; else None."""
    from align.chat.template import TOKENIZER_FORMAT, check_own_template

    if config.chat_format != TOKENIZER_FORMAT:
        return None
    from transformers import AutoTokenizer


    with loading("model_name_or_path", config.model_name_or_path):
        tokenizer = AutoTokenizer.from_pretrained(config.model_name_or_path)
    check_own_template(tokenizer)
    return tokenizer


def _reasoning_check(config: Config, tokenizer: Any) -> Callable[[Any, Mapping[str, Any], list], None]:
    """``check(rid, row, messages)`` for ``normalize_sft_input``: reasoning a model's own template
    would leave out of training is refused, never lost silently. A row with no reasoning costs a scan of
    its fields; one with reasoning in its last assistant turn, one probe per template and field (remembered);
    only a row with reasoning in an earlier turn is rendered (``align.chat.template.dropped_reasoning``),
    and none with ``thinking_turns: last_turn``."""
    from align.data.records import list_field

    def check(rid: Any, row: Mapping[str, Any], messages: list) -> None:
        thinking = row.get("enable_thinking") is True
        _check_last_reasoning(tokenizer, rid, messages, thinking)
        if config.thinking_turns == "all":
            _check_earlier_reasoning(tokenizer, rid, messages, list_field(row, "tools", rid), thinking)
    return check


def _check_last_reasoning(tokenizer: Any, rid: Any, messages: list, thinking: bool) -> None:
    """The last assistant turn's reasoning: a template that renders none of that field loses it."""
    from align.chat.template import reasoning_fields, renders_last_reasoning, template_name

    turns = [i for i, m in enumerate(messages) if isinstance(m, Mapping) and m.get("role") == "assistant"]
    for name in reasoning_fields(messages[turns[-1]]) if turns else []:
        if not renders_last_reasoning(tokenizer, name, enable_thinking=thinking):
            raise ConfigError(f"record {rid!r}: assistant message {turns[-1]} has reasoning in {name!r}, which the "
                              f"chat template of {template_name(tokenizer)!r} does not render in any assistant turn, "
                              "so it would be left out of training; use a template that renders it, or leave the "
                              "field out")


def _check_earlier_reasoning(tokenizer: Any, rid: Any, messages: list, tools: Any, thinking: bool) -> None:
    """``thinking_turns: all``: reasoning of turns before the last must be in the template's render."""
    from align.chat.template import dropped_reasoning, template_name

    lost = dropped_reasoning(tokenizer, messages, tools=tools, enable_thinking=thinking)
    if lost:
        index, name = lost[0]
        raise ConfigError(f"record {rid!r}: the chat template of {template_name(tokenizer)!r} leaves out the "
                          f"reasoning ({name!r}) of assistant message {index}, a turn before the last, so it would "
                          "not be trained: set thinking_turns=last_turn to train only the last turn's reasoning, or "
                          "use a template that renders every turn's")


def _train(run: StageRun) -> dict | Unfinished:
    from align.trainers.guards import resumable_checkpoint
    from align.trainers.sft_data import load_sft_dataset
    from align.trainers.sft_trainer import train_sft

    note = device_note(run.config)  # a run that does work says where it trains (a skip says nothing more)
    if note and is_writer():
        print(f"[align sft] {note}")
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
    summary = {"steps": trainer.state.global_step, "train_loss": last_loss(trainer),
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


def _normalized(run: StageRun, config: Config, source: str, tokenizer: Any = None):
    """The input read once, by the main process, into the JSON-encoded rows SFT trains on; the other ranks
    (and a requeued job) find the file made. A conversation whose text holds a token the chat format reads
    as structure (``<s>`` in HTML, a turn delimiter) is left out with its reason: it would teach the model a
    turn boundary that is not one (a recorded skip, ``skipped_rows.jsonl``, as in every stage). With a model's
    own template (``tokenizer``) each row's reasoning is checked as it passes (``_reasoning_check``), so the
    file's name also covers the template and ``thinking_turns``."""
    from align.chat import structure_text_problem
    from align.io.fingerprint import json_digest
    from align.trainers.sft_data import normalize_sft_input
    from align.trainers.sft_trainer import sft_rows_cache_dir

    own = [config.thinking_turns, str(tokenizer.chat_template)] if tokenizer is not None else []
    key = json_digest([run.input_fingerprint("input"), config.chat_format, NORMALIZED_VERSION, *own])
    with config.main_process_first(desc="SFT input read once"):
        rows = normalize_sft_input(source, sft_rows_cache_dir(), chat_format=config.chat_format, key=key,
                                   check=_reasoning_check(config, tokenizer) if tokenizer is not None else None,
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
