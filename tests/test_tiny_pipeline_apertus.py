"""The tiny pipeline recipe end to end on the Apertus architecture (xIELU, QK-norm, untied head).

`align tiny-models architecture=apertus` writes a tiny Apertus policy where the recipe reads
its model; `align pipeline recipes/tiny/pipeline.yaml` then runs every stage on it, unchanged:
SFT, sampling, annotation, pairs, the reference log-prob pass, QRPO and the evaluation (with
KL). The 8B and 70B recipes train this architecture; here it runs through the same stages at
toy size. Nothing is asserted about learning (the model learns nothing in 40 steps).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STAGES = ("sft", "sample", "annotate", "pairs", "logprobs", "qrpo", "evaluate")


def test_the_tiny_pipeline_runs_every_stage_on_an_apertus_policy(tmp_path, say):
    from align.io import stage_completion_info

    (tmp_path / "recipes").symlink_to(REPO / "recipes", target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE"))}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    for command in (["tiny-models", "architecture=apertus"], ["pipeline", "recipes/tiny/pipeline.yaml"]):
        say("align " + " ".join(command))
        done = subprocess.run([sys.executable, "-m", "align", *command], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=900, check=False)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    runs = tmp_path / "runs" / "tiny"
    for stage in STAGES:
        assert stage_completion_info(runs / stage) is not None, stage
    for trained in ("sft", "qrpo"):  # the policy stays an Apertus model through SFT and QRPO
        config = json.loads((runs / trained / "config.json").read_text())
        assert config["model_type"] == "apertus" and config["architectures"] == ["ApertusForCausalLM"]
    report = json.loads((runs / "evaluate" / "report.json").read_text())
    qrpo = report["overall"]["policies"]["qrpo"]
    assert qrpo["reward_sampled"]["n"] == 16 and qrpo["kl"] is not None  # every held-out prompt, and the KL step ran
    rows = [json.loads(line) for line in (runs / "logprobs").glob("*.jsonl").__next__().read_text().splitlines()]
    assert rows and all(r["ref_chosen_logps"] < 0 and r["ref_rejected_logps"] < 0 for r in rows)
    _check_card(tmp_path, runs, env)


def _check_card(cwd: Path, runs: Path, env: dict) -> None:
    """`align card` on the QRPO output: each stage's fingerprint and output id, each count of its summary and
    each figure of the evaluation report appear in the card as the markers and the report hold them."""
    done = subprocess.run([sys.executable, "-m", "align", "card", "runs/tiny/qrpo"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    card = (runs / "qrpo" / "README.md").read_text()
    for stage in ("sft", "sample", "annotate", "pairs", "logprobs", "qrpo"):
        marker = json.loads((runs / stage / "_COMPLETE.json").read_text())
        assert f"`{marker['manifest']['fingerprint'][:16]}` | `{marker['output_id']}` |" in card, stage
        for key in ("rows", "records", "pairs", "steps"):
            if key in marker["summary"]:
                assert f"{key} {marker['summary'][key]}" in card, (stage, key)
    sft_input = json.loads((runs / "sft" / "_manifest.json").read_text())["inputs"]["input"]
    assert f"| sft | input | `{sft_input['path']}` | file | `{sft_input['fingerprint']}` |" in card
    report = json.loads((runs / "evaluate" / "report.json").read_text())
    mine = report["overall"]["policies"]["qrpo"]
    for label, key in (("mean reward (sampled)", "reward_sampled"), ("KL to the reference", "kl")):
        value = mine[key]
        assert (f"| {label} | {value['estimate']:.4g} | {value['low']:.4g} to {value['high']:.4g} | "
                f"{value['n']} |") in card, label
    assert "policy `qrpo` against baseline `sft`" in card
