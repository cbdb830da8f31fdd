"""The CLI front door: help for every stage, recipe errors name the key."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from align.cli import main
from align.stage_table import summaries

STAGES = summaries()  # every command: the stages, the drivers and the tools


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
    assert f"usage: align {stage}" in out and "Recipe keys (all):" in out and "output_dir" in out


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


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_help_names_the_keys_to_set_first_and_each_is_a_real_key(stage, capsys):
    """`align train --help` is hundreds of lines: the keys no default stands for come first."""
    import dataclasses

    from align.stage_table import command_module as stage_module

    module = stage_module(stage)
    required = getattr(module, "REQUIRED_KEYS", {})
    fields = {f.name for f in dataclasses.fields(module.Config)}
    assert all(key.split(".")[0] in fields for key in required), (stage, required)
    main([stage, "--help"])
    out = capsys.readouterr().out
    if required:
        _, _, rest = out.partition("Keys to set (no default stands for them):\n")
        assert rest, out[:500]
        listed = [line.split(":")[0].strip() for line in rest.split("\n\n")[0].splitlines()]
        assert listed == list(required)


def test_the_training_stages_name_their_keys_to_set():
    from align.stage_table import command_module as stage_module

    for stage in ("sft", "sample", "logprobs", "train", "evaluate", "sweep"):
        assert stage_module(stage).REQUIRED_KEYS, stage


def test_a_trainers_help_puts_the_methods_keys_before_the_inherited_ones(capsys):
    """`align train --help`: QRPO's keys (loss_type, beta, num_ref_rewards, reference) within the first lines,
    transformers' TrainingArguments after, under their own heading."""
    main(["train", "--help"])
    out = capsys.readouterr().out
    heading = out.index("Inherited from transformers")
    for key in ("loss_type", "beta", "num_ref_rewards", "reference", "lora_r"):
        assert out.index(f"\n  {key} (") < heading, key
    for key in ("per_device_train_batch_size", "gradient_accumulation_steps", "report_to"):
        assert out.index(f"\n  {key} (") > heading, key
    assert out[:heading].count("\n  ") < 90  # the method's keys fit a screen or two


def test_a_typo_in_a_large_config_names_the_nearest_keys_only(capsys):
    assert main(["train", "input=x.jsonl", "bta=3"]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'bta' for Config. Did you mean 'beta'? Nearest keys: beta" in err
    assert "keys in all: --help lists each" in err and "per_device_train_batch_size" not in err
    assert main(["pairs", "input=x.jsonl", "sed=1"]) == 2  # a small config still lists all of its keys
    assert "Allowed keys: chat_format, input, low_threshold" in capsys.readouterr().err
