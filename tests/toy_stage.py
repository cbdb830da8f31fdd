"""A stage that exists only in tests/test_stage_table.py: each prompt row's words counted.

It shows what a new stage takes: this module (a ``Config`` and ``run``, the work inside
``run_stage``) and one entry in ``align.stage_table.STAGES``; nothing else of align changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from align.io import write_jsonl
from align.manifests import StageRun
from align.manifests.lifecycle import run_stage


@dataclass
class Config:
    input: str = field(default="", metadata={"help": "prompt rows"})
    output_dir: str = field(default="runs/toy", metadata={"help": "where words.jsonl goes"})
    overwrite: bool = field(default=False, metadata={"help": "redo an output made from other settings"})


def run(config: Config) -> dict[str, Any]:
    return run_stage("toy", config, _count)


def _count(run: StageRun) -> dict[str, Any]:
    rows = [{**row, "words": len(str(row["messages"][-1]["content"]).split())} for row in run.rows["input"]]
    write_jsonl(Path(run.config.output_dir) / "words.jsonl", rows)
    return {"rows": len(rows)}
