"""Every recipe, script, charter and example path that the README, docs/ and `--help` show exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from align.cli import stage_help
from align.stage_table import summaries

STAGES = summaries()  # every command: the stages, the drivers and the tools

ROOT = Path(__file__).resolve().parents[1]
PATH = re.compile(r"(?<![\w/.-])((?:recipes|charter|examples|bench|docs)/[\w./-]*[\w-]\.(?:yaml|sbatch|sh|md|py|ipynb|txt))")


def _texts() -> dict[str, str]:
    texts = {str(p.relative_to(ROOT)): p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]}
    texts.update({f"align {name} --help": stage_help(name) for name in STAGES})
    return texts


@pytest.mark.parametrize("where", sorted(_texts()))
def test_every_path_shown_exists(where):
    shown = set(PATH.findall(_texts()[where]))
    missing = sorted(p for p in shown if not (ROOT / p).exists() and "my_" not in p and "your" not in p)
    assert not missing, f"{where} shows paths that do not exist: {missing}"


def test_the_pattern_finds_paths():
    assert PATH.findall("run `align sft recipes/apertus-8b/sft.yaml` and see docs/method.md.") == \
        ["recipes/apertus-8b/sft.yaml", "docs/method.md"]
