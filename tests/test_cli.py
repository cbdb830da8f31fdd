"""The CLI front door: help for every stage, recipe errors name the key."""

from __future__ import annotations

import subprocess
import sys

import pytest

from align.cli import main
from align.stages import STAGES


def test_top_level_help_lists_every_stage(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in STAGES:
        assert name in out


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_every_stage_has_help_listing_its_keys(stage, capsys):
    assert main([stage, "--help"]) == 0
    out = capsys.readouterr().out
    if stage == "step":  # one step of a pipeline: its keys are its stage's
        assert "usage: align step RECIPE.yaml NAME [key=value ...]" in out and "`align STAGE --help`" in out
        return
    assert f"usage: align {stage}" in out and "Recipe keys:" in out and "output_dir" in out


def test_unknown_stage_and_unknown_key_are_errors(capsys):
    assert main(["nope"]) == 2
    assert "unknown stage 'nope'" in capsys.readouterr().err
    assert main(["pairs", "sed=1"]) == 2
    assert "unknown key 'sed'" in capsys.readouterr().err


def test_python_dash_m_align_runs():
    out = subprocess.run([sys.executable, "-m", "align", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "Stages:" in out.stdout
