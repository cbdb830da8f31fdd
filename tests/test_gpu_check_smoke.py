"""The GPU check's CPU smoke mode (``ALIGN_GPU_CHECK_SMOKE=1 bench/gpu_check.sh OUT``): every part runs,
every contender of the GPU run is tried, and a contender that cannot run on a CPU says why in the
report, so a GPU's minutes are not spent finding a broken script.

It runs the script as a user would (about two minutes on 2 cores). What a contender may fail with
here is fixed: FlexAttention's backward (torch has none on CPU), Liger and flash-attn (GPU packages,
not installed); any other failure is a broken contender.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CPU_REASONS = ("FlexAttention does not support backward on CPU", "No module named 'liger_kernel'",
               "the package for FlashAttention2 doesn't seem to be installed")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gpu_check")
    env = {**os.environ, "ALIGN_GPU_CHECK_SMOKE": "1", "PYTHON": sys.executable, "ALIGN_WHEELS": str(out / "none")}
    run = subprocess.run(["bash", "bench/gpu_check.sh", str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return out


def test_every_part_runs_within_its_limit(smoke):
    parts = [json.loads(line) for line in (smoke / "parts.jsonl").read_text().splitlines()]
    assert [(p["part"], p["rc"]) for p in parts] == [("env", 0), ("preference", 0), ("tiny_apertus", 0),
                                                    ("sharded_pass", 0)]
    assert all(p["seconds"] <= p["limit"] for p in parts)


def test_every_gpu_contender_runs_or_says_why_it_cannot_here(smoke):
    spec = importlib.util.spec_from_file_location("preference_throughput", ROOT / "bench" / "preference_throughput.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    GPU_CONTENDERS = bench.GPU_CONTENDERS  # noqa: N806
    results = json.loads((smoke / "preference.json").read_text())["results"]
    assert list(results) == [key for key, _, _ in GPU_CONTENDERS]
    for key, result in results.items():
        if "error" in result:
            assert any(reason in result["error"] for reason in CPU_REASONS), (key, result["error"])
        else:
            assert result["tokens_per_s"] > 0, key
    ran = {key for key, result in results.items() if "error" not in result}
    # the comparisons the GPU run exists for, each measured here: TRL's pass and trainer, align's
    assert {"logps_trl", "logps_align", "logps_align_tokens", "train_trl", "train_trl_precomputed",
            "train_align", "train_align_ckpt", "train_align_ckpt_mlp"} <= ran


def test_the_report_holds_the_table_and_the_goals(smoke):
    report = (smoke / "gpu_check.md").read_text()
    assert "| contender | tokens/s | MFU" in report and "## Goals" in report
    assert "align log-prob pass (prefix-shared), 32,768 tokens a batch" in report
    assert "checkpointing (mlp only)" in report
    assembled = json.loads((smoke / "gpu_check.json").read_text())
    assert set(assembled) >= {"environment", "parts", "preference", "tiny_apertus", "sharded_pass"}
