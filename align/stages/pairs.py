"""Quantile rewards against the n reference rewards, then chosen/rejected pairs (docs/method.md, Quantile rewards and Pair selection).

Reads annotated prompt records (``completions`` + ``rewards``) and writes
``pairs.jsonl`` (the columns the preference trainer reads) and ``skipped.jsonl`` (every
prompt that gave no pair, with the reason; and every completion left out because its text
holds a structure token of ``chat_format``: the prompt's row lists them under ``left_out``
with ``special_token_text``, and is marked ``paired`` when the prompt still gave a pair).

Example: ``align pairs recipes/tiny/pipeline.yaml`` or
``align pairs input=runs/annotate output_dir=runs/pairs seed=0``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from align.errors import ConfigError
from align.io import write_jsonl
from align.manifests import StageRun
from align.manifests.lifecycle import run_stage


@dataclass
class Config:
    input: str | list[str] = field(default="runs/annotate", metadata={
        "help": "annotated records (file or stage dir; a list: several outputs read as one, e.g. the reward model's "
                "and the judge's)"})
    output_dir: str = field(default="runs/pairs", metadata={"help": "where pairs.jsonl and skipped.jsonl go"})
    seed: int = field(default=0, metadata={"help": "seed of the random choice inside each bucket"})
    low_threshold: float = field(
        default=0.2,
        metadata={
            "help": "rejected pool: R_q <= max(low_threshold, 1/n) (docs/method.md, Pair selection)"
        },
    )
    num_ref_rewards: int | None = field(
        default=None,
        metadata={"help": "n references drawn per prompt (None: no check); a row expects n - its num_ref_dropped"},
    )
    truncated: Literal["exclude", "train_without_end"] = field(
        default="exclude",
        metadata={"help": "completions cut at the token budget: exclude (never chosen/rejected, still "
                  "references) | train_without_end (pairable; train with truncated=train_without_end)"},
    )
    num_pairs_per_prompt: int = field(
        default=1, metadata={"help": "up to this many pairs per prompt, no completion reused within a prompt"}
    )
    rejected_pick: Literal["uniform", "highest"] = field(
        default="uniform",
        metadata={"help": "the rejected answer: uniform (a draw from the low bucket, as the Apertus report says) | "
                  "highest (the low bucket's highest quantile, as the published code does; docs/method.md §14)"},
    )
    chat_format: Literal["apertus", "llama3", "chatml", "tokenizer"] = field(
        default="apertus",
        metadata={"help": "the format logprobs and train encode the pairs in: a completion holding one of its "
                  "structure tokens (e.g. <|system_end|>) is never paired (skipped.jsonl: special_token_text); "
                  "tokenizer (the model's own template): checked by logprobs and train, which hold the tokenizer"},
    )
    overwrite: bool = field(default=False, metadata={"help": "redo a finished or partial output made from other settings or inputs (removes only what this stage wrote there)"})

    def __post_init__(self) -> None:
        if self.num_ref_rewards is not None and self.num_ref_rewards < 1:
            raise ConfigError(f"num_ref_rewards={self.num_ref_rewards}: the number of reference completions drawn "
                              "per prompt, at least 1 (or null: not checked)")
        if not 0 <= self.low_threshold < 1:
            raise ConfigError(f"low_threshold={self.low_threshold}: must be in [0, 1)")
        if self.num_pairs_per_prompt < 1:
            raise ConfigError(f"num_pairs_per_prompt={self.num_pairs_per_prompt}: must be at least 1")


def run(config: Config) -> dict:
    """Select pairs for every annotated prompt; record why a prompt gave none."""
    return run_stage("pairs", config, _pairs)


def _pairs(run: StageRun) -> dict[str, Any]:
    from align.data.pairs import is_truncated, make_pairs

    config, records = run.config, run.rows["input"]
    pairs, skips = make_pairs(
        records, seed=config.seed, low_threshold=config.low_threshold, num_ref_rewards=config.num_ref_rewards,
        truncated=config.truncated, num_pairs_per_prompt=config.num_pairs_per_prompt,
        chat_format=config.chat_format, rejected_pick=config.rejected_pick,
    )
    out = Path(config.output_dir)
    run.check_owner()
    write_jsonl(out / "pairs.jsonl", pairs)
    write_jsonl(out / "skipped.jsonl", skips)
    fallbacks = sum(1 for p in pairs if p.get("pair_fallback"))
    truncated = sum(is_truncated(c) for r in records for c in r.get("completions") or [])
    paired_truncated = sum((p["chosen_finish_reason"] == "length") + (p["rejected_finish_reason"] == "length")
                           for p in pairs)
    left_out = sum(len(s.get("left_out") or []) for s in skips)  # completions never paired for their text
    summary = {"prompts": len(records), "pairs": len(pairs), "skipped": sum(not s.get("paired") for s in skips),
               "upstream_skipped": sum(bool(s.get("upstream")) for s in skips),
               "fallbacks": fallbacks, "truncated_completions": truncated, "truncated_in_pairs": paired_truncated,
               "special_token_text": left_out}
    kinds = Counter(p["pair_fallback"] for p in pairs if p.get("pair_fallback"))
    for line in summary_notes(summary, config.chat_format, kinds):
        print(f"[align pairs] {line}")
    return summary


def summary_notes(summary: dict[str, Any], chat_format: str, kinds: Mapping[str, int]) -> list[str]:
    """What the summary's counts mean, for the counts a user may take for a fault."""
    from align.data.pairs import fallback_note

    notes = []
    if summary["fallbacks"]:
        notes.append(fallback_note(summary["fallbacks"], summary["pairs"], kinds))
    if summary["special_token_text"]:
        notes.append(f"{summary['special_token_text']} completions were never paired because their text holds a "
                     f"token the {chat_format} format reads as structure (a turn delimiter or BOS): trained as "
                     "text, it would teach a turn boundary that is not one (skipped.jsonl, left_out; "
                     "docs/your-data.md)")
    if summary["skipped"]:
        upstream = summary.get("upstream_skipped") or 0
        notes.append(f"{summary['skipped']} prompts gave no pair (all rewards equal, or too few scored "
                     "completions" + (f"; {upstream} of them skipped by a stage before, with its reason" if upstream
                                      else "") + "): skipped.jsonl says why for each")
    return notes
