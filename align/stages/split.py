"""One part of a prompt file: the prompts of one round of ``align pipeline`` with ``round_prompts: split``.

Row i of ``input`` (counted from 0, in the order it is read) goes to part ``i mod parts + 1``:
the parts differ in size by at most one, no prompt is in two parts, together they hold every
prompt, and a file sorted by source, language or length gives each part its share of every
kind. The rows are copied unchanged to ``output_dir/prompts.jsonl``. docs/rounds.md has
how the rounds use it.

Example: ``align split input=recipes/tiny/data/prompts.jsonl part=1 parts=2 output_dir=runs/prompts-1``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from align.errors import ConfigError, InputError
from align.io import write_jsonl
from align.manifests import StageRun
from align.manifests.lifecycle import run_stage

# what `align split --help` lists first: the keys no default can stand for
REQUIRED_KEYS = {
    "input": "prompt records",
    "parts": "how many parts",
}


T = TypeVar("T")

OUTPUT_FILE = "prompts.jsonl"


@dataclass
class Config:
    input: str = field(default="", metadata={"help": "prompt records (file, stage output directory or dataset name)"})
    output_dir: str = field(default="runs/split", metadata={"help": "where prompts.jsonl goes"})
    part: int = field(default=1, metadata={"help": "which part to write, 1 to parts"})
    parts: int = field(default=1, metadata={"help": "how many parts the prompts are split into (row i goes to "
                                            "part i mod parts + 1)"})
    overwrite: bool = field(default=False, metadata={"help": "redo a finished or partial output made from other "
                                                     "settings or inputs (removes only what this stage wrote there)"})

    def __post_init__(self) -> None:
        if self.parts < 1:
            raise ConfigError(f"parts={self.parts}: must be at least 1")
        if not 1 <= self.part <= self.parts:
            raise ConfigError(f"part={self.part}: must be between 1 and parts={self.parts}")


def part_of(rows: Sequence[T], part: int, parts: int) -> list[T]:
    """The rows of part ``part`` (1-based) of ``parts``: every ``parts``-th row, from row ``part - 1``."""
    return [row for i, row in enumerate(rows) if i % parts == part - 1]


def run(config: Config) -> dict[str, Any]:
    """Write this part of the prompts; mark the output complete."""
    return run_stage("split", config, _split)


def _split(run: StageRun) -> dict[str, Any]:
    config, rows = run.config, run.rows["input"]
    chosen = part_of(rows, config.part, config.parts)
    if not chosen:
        raise InputError(f"split: input={config.input!r} holds {len(rows)} rows, so part {config.part} of "
                         f"{config.parts} is empty: use fewer parts")
    run.check_owner()
    write_jsonl(Path(config.output_dir) / OUTPUT_FILE, chosen)
    summary = {"rows": len(rows), "part": config.part, "parts": config.parts, "prompts": len(chosen)}
    return summary
