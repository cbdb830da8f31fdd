"""`align demo` end to end with the quick CI preset (fewer examples, prompts and steps).

The preset checks that every stage runs and reports; it is too small to show a reliable
QRPO gain, so no test asserts one (nor any timing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def demo_report(tmp_path_factory) -> tuple[Path, dict, str]:
    out = tmp_path_factory.mktemp("demo")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "align", "demo", "preset=ci", f"output_dir={out}"],
        capture_output=True, text=True, env=env, timeout=1500,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, json.loads((out / "report.json").read_text()), proc.stdout


def test_demo_runs_every_stage_and_reports_numbers(demo_report):
    out, report, stdout = demo_report
    for stage in ("SFT", "sample references", "annotate (verifiable reward)", "judge (tiny model, path check)",
                  "pairs", "reference log-probs", "QRPO", "evaluate before QRPO", "evaluate after QRPO"):
        assert stage in report["seconds"], stage
    assert report["pairs"] > 0 and report["qrpo_steps"] > 0 and report["sft_steps"] > 0
    assert report["judge"]["scored"] > 0
    for metric in ("sampled_accuracy", "greedy_accuracy"):
        values = report[metric]
        assert 0.0 <= values["before"] <= 1.0 and 0.0 <= values["after"] <= 1.0
        assert values["change"] == pytest.approx(values["after"] - values["before"])
    assert "held-out sampled accuracy" in stdout and "Report:" in stdout


def test_demo_plots_exist_and_are_png(demo_report):
    out, report, _ = demo_report
    for name in report["plots"]:
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name


def test_report_describes_the_pairs(demo_report):
    _, report, _ = demo_report
    assert report["config"]["preset"] == "ci"
    assert 0 <= report["pair_fallbacks"] <= report["pairs"]
    assert sum(report["pair_fallback_kinds"].values()) == report["pair_fallbacks"]
    assert 0.0 <= report["mean_rejected_quantile"] < report["mean_chosen_quantile"] <= 1.0
    assert report["improved"] == (report["sampled_accuracy"]["after"] > report["sampled_accuracy"]["before"])
