"""The CLI front door: help for every stage, recipe errors name the key."""

from __future__ import annotations

import os
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


def test_a_reader_that_stops_early_gets_no_traceback():
    """`align demo --help | head -2`: the pipe closes before align has written; that is
    the reader's choice, not an error (no BrokenPipeError traceback, exit status 0)."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first write
    done = subprocess.run([sys.executable, "-m", "align", "demo", "--help"], stdout=write_end,
                          stderr=subprocess.PIPE, text=True, check=False)
    os.close(write_end)
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr
    assert done.returncode == 0
