"""The documented cluster command, run for real with 2 processes on CPU:
`accelerate launch --config_file ZERO2.yaml -m align train recipes/apertus-8b/qrpo.yaml ...`."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml
from ports import accelerate_launch
from stage_helpers import DATE, RECIPES, REPO, subprocess_env

pytestmark = pytest.mark.distributed


def cpu_accelerate_config(path) -> str:
    """The shipped ZeRO-2 config, made to run 2 CPU processes (gloo) on this machine."""
    config = yaml.safe_load((RECIPES / "accelerate" / "zero2.yaml").read_text())
    config.update(num_processes=2, use_cpu=True, mixed_precision="no")
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_accelerate_launch_of_the_train_stage_runs_two_deepspeed_ranks(tmp_path, sft_run, logprobs_run):
    out = tmp_path / "qrpo"
    command = [
        *accelerate_launch(cpu_accelerate_config(tmp_path / "zero2_cpu.yaml")),
        "-m", "align", "train", str(RECIPES / "apertus-8b" / "qrpo.yaml"),
        f"model_name_or_path={sft_run[0]}", f"input={logprobs_run[0]}", f"output_dir={out}",
        f"chat_date={DATE}", "max_length=256", "bf16=false", "use_cpu=false", "ddp_backend=gloo",
        "activation_checkpointing=false", "per_device_train_batch_size=2", "gradient_accumulation_steps=1",
        "num_ref_rewards=4", "max_steps=2", "logging_steps=1", "save_steps=1000",  # the tiny data has n = 4
        "attn_implementation=sdpa", "global_batch_size=null",  # no FlashAttention on CPU; accumulation set above
    ]
    hashes = tmp_path / "hashed.log"  # every file hashed in full, with the rank that hashed it
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=600,
                          env={**subprocess_env(), "DS_ACCELERATOR": "cpu", "ALIGN_HASH_LOG": str(hashes)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # rank 0 alone fingerprints the inputs, and the weights once: for the manifest, and the trainer's check of
    # the reference the pass scored with reuses that digest; rank 1 receives rank 0's decision and fingerprint
    hashed = [line.split(" ", 1) for line in hashes.read_text().splitlines()]
    assert {rank for rank, _ in hashed} == {"0"}, [h for h in hashed if h[0] != "0"]
    weights = [path for _, path in hashed if path.endswith(".safetensors")]
    assert weights == [str(sft_run[0] / "model.safetensors")], hashed
    assert done.stdout.count(f"[align train] wrote {out}") == 1  # rank 0 alone marks and reports
    summary = json.loads((out / "_COMPLETE.json").read_text())["summary"]
    assert summary["world_size"] == 2 and summary["deepspeed"] is True
    assert summary["loss_type"] == "qrpo" and summary["steps"] == 2

    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(out).num_parameters() > 0
