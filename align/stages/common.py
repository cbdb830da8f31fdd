"""What every stage does at its edges: announce its output, record completion."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from align.config import to_dict
from align.io import is_complete, mark_complete


def already_done(output_dir: str | Path, stage: str, *, overwrite: bool = False) -> bool:
    """True (and say so) when a stage's output is complete and not to be overwritten."""
    if is_complete(output_dir) and not overwrite:
        print(f"[align {stage}] {output_dir} is already complete; skipping (overwrite=true redoes it)")
        return True
    return False


def finish(stage: str, config: Any, output_dir: str | Path, summary: dict[str, Any]) -> dict[str, Any]:
    """Mark the output complete with the config and summary, and print where it is."""
    mark_complete(output_dir, stage=stage, config=to_dict(config), summary=summary)
    print(f"[align {stage}] wrote {output_dir}")
    print(f"[align {stage}] " + json.dumps(summary, default=str))
    return summary
