"""Quantile rewards against the n reference rewards, then chosen/rejected pairs (SPEC §6-7).

Reads annotated prompt records (``completions`` + ``rewards``) and writes
``pairs.jsonl`` (the columns the preference trainer reads) and ``skipped.jsonl`` (every
prompt that gave no pair, with the reason).

Example: ``align pairs recipes/tiny/pipeline.yaml`` or
``align pairs input=runs/annotate output_dir=runs/pairs seed=0``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from align.io import read_records, write_jsonl
from align.stages.common import already_done, check_stage_input, finish


@dataclass
class Config:
    input: str = field(default="runs/annotate", metadata={"help": "annotated records (file or stage dir)"})
    output_dir: str = field(default="runs/pairs", metadata={"help": "where pairs.jsonl and skipped.jsonl go"})
    seed: int = field(default=0, metadata={"help": "seed of the random choice inside each bucket"})
    low_threshold: float = field(
        default=0.2, metadata={"help": "rejected pool: R_q <= max(low_threshold, 1/n) (SPEC §7)"}
    )
    num_ref_rewards: int | None = field(
        default=None, metadata={"help": "expected n reference rewards per prompt (None: no check)"}
    )
    overwrite: bool = field(default=False, metadata={"help": "redo even if the output is complete"})


def run(config: Config) -> dict:
    """Select pairs for every annotated prompt; record why a prompt gave none."""
    from align.data.pairs import make_pairs

    if already_done(config.output_dir, "pairs", overwrite=config.overwrite):
        return {}
    check_stage_input(config.input, "pairs", "input")
    records = read_records(config.input)
    pairs, skips = make_pairs(
        records, seed=config.seed, low_threshold=config.low_threshold, n_ref=config.num_ref_rewards
    )
    out = Path(config.output_dir)
    write_jsonl(out / "pairs.jsonl", pairs)
    write_jsonl(out / "skipped.jsonl", skips)
    fallbacks = sum(1 for p in pairs if p.get("pair_fallback"))
    summary = {"prompts": len(records), "pairs": len(pairs), "skipped": len(skips), "fallbacks": fallbacks}
    return finish("pairs", config, out, summary)
