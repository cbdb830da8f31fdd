"""`align train` reports QRPO's target tracking: a run whose log-ratios ran off their regression
targets says so in one line and in its summary (the completion marker), one that did not says nothing."""

from __future__ import annotations

from stage_helpers import TINY_RECIPE, run_cli

from align.io import stage_completion_info


def test_a_collapsing_run_says_so_and_a_healthy_one_does_not(stage_root, sft_run, logprobs_run):
    common = ["train", TINY_RECIPE, f"model_name_or_path={sft_run[0]}", f"input={logprobs_run[0]}",
              "max_steps=12", "optimizer=adamw", "lr_scheduler_type=constant"]
    collapsing = stage_root / "qrpo_small_beta"
    printed = run_cli([*common, f"output_dir={collapsing}", "beta=0.01", "learning_rate=1e-2"])
    tracking = stage_completion_info(collapsing)["summary"]["target_tracking"]
    assert tracking["margin"] == 0.15 and tracking["logs_past_margin"] >= 1 and tracking["first_step"] >= 3
    assert "[align train] warning: QRPO log-ratios ran off their regression targets at " in printed
    assert "raise beta (docs/method.md, The safe beta range)" in printed

    healthy = stage_root / "qrpo_healthy"
    printed = run_cli([*common, f"output_dir={healthy}", "learning_rate=1e-4"])
    tracking = stage_completion_info(healthy)["summary"]["target_tracking"]
    assert tracking == {"margin": 0.15, "logs_past_margin": 0, "first_step": None, "worst": None}
    assert "ran off their regression targets" not in printed

    off = stage_root / "qrpo_unwatched"
    run_cli([*common, f"output_dir={off}", "beta=0.01", "learning_rate=1e-2", "target_margin=null"])
    assert "target_tracking" not in stage_completion_info(off)["summary"]
