"""`align demo` end to end with the quick CI preset (fewer examples, prompts and steps).

The preset checks that every stage runs and that the report is complete and well formed;
it is too small to show a reliable QRPO gain, so no test asserts one (nor any timing).
The statistics themselves are tested on fixed data in tests/eval/."""

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
        capture_output=True, text=True, env=env, timeout=1500, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, json.loads((out / "report.json").read_text()), proc.stdout


def _interval(value: dict) -> None:
    assert set(value) >= {"estimate", "low", "high", "n"}
    assert value["low"] <= value["estimate"] <= value["high"]


def test_demo_runs_every_stage_and_reports_numbers(demo_report):
    out, report, stdout = demo_report
    for stage in ("SFT", "sample references", "annotate (verifiable reward)", "judge (tiny model, path check)",
                  "pairs", "reference log-probs", "QRPO", "DPO", "evaluate (align.evaluate)"):
        assert stage in report["seconds"], stage
    assert report["pairs"] > 0 and report["sft_steps"] > 0 and report["steps"] == {"qrpo": 32, "dpo": 16}
    assert report["judge"]["scored"] > 0
    assert set(report["accuracy"]) == {"sft", "qrpo", "dpo"} and set(report["gains"]) == {"qrpo", "dpo"}
    for name, values in report["accuracy"].items():
        for kind in ("sampled", "greedy"):
            _interval(values[kind])
            assert 0.0 <= values[kind]["low"] and values[kind]["high"] <= 1.0
            assert values[kind]["n"] == report["held_out_prompts"] == 100
        if name != "sft":
            _interval(values["kl"])
    for name, gain in report["gains"].items():
        _interval(gain["sampled"])
        delta = report["accuracy"][name]["sampled"]["estimate"] - report["accuracy"]["sft"]["sampled"]["estimate"]
        assert gain["sampled"]["estimate"] == pytest.approx(delta)
        assert gain["verdicts"][0].startswith(f"{name} − sft, mean sampled reward")
        assert report["improved"][name] == (gain["sampled"]["low"] > 0)
    assert "sampled accuracy (T=1)" in stdout and "QRPO:" in stdout and "Report:" in stdout


def test_demo_writes_the_evaluation_and_readable_plots(demo_report):
    out, report, _ = demo_report
    for name in ("eval.jsonl", "report.json", "report.md"):
        assert (out / "evaluate" / name).stat().st_size > 0
    rows = [json.loads(line) for line in (out / "evaluate" / "eval.jsonl").read_text().splitlines()]
    assert len(rows) == 100 and set(rows[0]["policies"]) == {"sft", "qrpo", "dpo"}
    for name in report["plots"]:
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name


def test_report_describes_the_pairs_and_the_watch_during_training(demo_report):
    _, report, _ = demo_report
    assert report["config"]["preset"] == "ci"
    assert 0 <= report["pair_fallbacks"] <= report["pairs"]
    assert sum(report["pair_fallback_kinds"].values()) == report["pair_fallbacks"]
    assert 0.0 <= report["mean_rejected_quantile"] < report["mean_chosen_quantile"] <= 1.0
    for name in ("qrpo", "dpo"):
        steps = [entry["step"] for entry in report["during_training"][name]]
        assert steps[0] == 0 and steps[-1] == report["steps"][name]
