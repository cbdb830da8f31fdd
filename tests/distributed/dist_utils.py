"""Launching the scripts of tests/distributed with 2 CPU processes, and reading what they saw.

docs/environment.md, "DeepSpeed ZeRO-2/3 on CPU (2 processes, gloo)": real ZeRO-2/3 on CPU takes `DS_ACCELERATOR=cpu
accelerate launch` with a DEEPSPEED config that has `use_cpu: true` and `num_processes: 2`,
while the trainer config has `use_cpu=False`, `ddp_backend="gloo"` and `bf16=False`.
Plain DDP on CPU takes `torchrun --nproc_per_node 2` (`accelerate launch` silently runs one
process there). The CPU configs are derived from the shipped recipes, so the tests also
check that those parse and work.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
import yaml
from ports import accelerate_launch, torchrun

HERE = Path(__file__).resolve().parent
RECIPES = HERE.parents[1] / "recipes" / "accelerate"
NUM_PROCESSES = 2
TIMEOUT_S = 900  # the first DeepSpeed run compiles its CPU comm op (~45 s)


def cpu_accelerate_config(stage: int, directory: Path) -> Path:
    """recipes/accelerate/zero{stage}.yaml, switched to 2 CPU processes without bf16."""
    config = yaml.safe_load((RECIPES / f"zero{stage}.yaml").read_text())
    config.update(
        num_processes=NUM_PROCESSES, use_cpu=True, mixed_precision="no", downcast_bf16="no"
    )
    path = directory / f"cpu_zero{stage}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ACCELERATE_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_"))
    }
    env.update(
        DS_ACCELERATOR="cpu",
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS="1",
        TRANSFORMERS_VERBOSITY="error",
        HF_HUB_DISABLE_TELEMETRY="1",
    )
    return env


def run(command: list[str], log: Path) -> None:
    """Run a command, keeping its output in ``log``; fail with the output's tail."""
    result = subprocess.run(
        command,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    log.write_text(result.stdout)
    if result.returncode != 0:
        raise AssertionError(
            f"{' '.join(command)} exited {result.returncode}:\n{result.stdout[-6000:]}"
        )


def deepspeed_command(stage: int, script: str, args: list[str], directory: Path) -> list[str]:
    config = cpu_accelerate_config(stage, directory)
    return [
        *accelerate_launch(config),
        str(HERE / script),
        *args,
        "--mode",
        "deepspeed",
    ]


def ddp_command(script: str, args: list[str]) -> list[str]:
    return [
        *torchrun(NUM_PROCESSES),
        str(HERE / script),
        *args,
        "--mode",
        "ddp",
    ]


def single_command(script: str, args: list[str]) -> list[str]:
    return [sys.executable, str(HERE / script), *args, "--mode", "single"]


def read_facts(out: Path, ranks: int) -> list[dict[str, Any]]:
    """Each rank's facts; a missing file means that rank never finished (or never ran)."""
    files = sorted(out.glob("facts_rank*.json"))
    found = [json.loads(f.read_text()) for f in files]
    assert sorted(f["rank"] for f in found) == list(range(ranks)), f"ranks that reported: {files}"
    return sorted(found, key=lambda f: f["rank"])


def assert_synchronised(facts: list[dict[str, Any]]) -> None:
    """Two processes that trained one model together: world size 2 everywhere, same result."""
    for f in facts:
        assert (
            f["env_world_size"] == f["trainer_world_size"] == f["num_processes"] == NUM_PROCESSES
        ), f
        assert f["torch_distributed"] and f["backend"] == "gloo", f
    first = facts[0]
    for f in facts[1:]:
        assert f["weights_sha256"] == first["weights_sha256"], "ranks ended with different weights"
        assert f["losses"] == first["losses"] and f["global_step"] == first["global_step"]


def assert_deepspeed(facts: list[dict[str, Any]], stage: int) -> None:
    """DeepSpeed really ran the step: engine, ZeRO stage and ZeRO optimizer on every rank."""
    zero_optimizer = {2: "DeepSpeedZeroOptimizer", 3: "DeepSpeedZeroOptimizer_Stage3"}[stage]
    for f in facts:
        assert f["distributed_type"] == "DistributedType.DEEPSPEED" and f["deepspeed_enabled"], f
        assert f["engine"] == "DeepSpeedEngine" and f["zero_stage"] == stage, f
        assert zero_optimizer in f["optimizer_chain"], f["optimizer_chain"]


def assert_ddp(facts: list[dict[str, Any]]) -> None:
    """Plain DDP really wrapped the model (not one process per rank training alone)."""
    for f in facts:
        assert f["ddp_wrapped"] and f["distributed_type"] == "DistributedType.MULTI_CPU", f
        assert not f["deepspeed_enabled"], f


def load_weights(path: Path) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path)
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def assert_weights_close(got: dict[str, Any], want: dict[str, Any], atol: float) -> None:
    import torch

    assert set(got) == set(want)
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=0, atol=atol, msg=name)


def run_cli(args: list) -> str:
    """`align ARGS` in this process, one torch thread; what it printed (a failure raises)."""
    from align.cli import main

    buffer, threads = io.StringIO(), torch.get_num_threads()
    os.environ["ALIGN_TRACEBACK"] = "1"
    torch.set_num_threads(1)
    try:
        with contextlib.redirect_stdout(buffer):
            rc = main([str(a) for a in args])
    finally:
        torch.set_num_threads(threads)
        os.environ.pop("ALIGN_TRACEBACK", None)
    assert rc == 0, f"align {' '.join(map(str, args))} exited {rc}:\n{buffer.getvalue()}"
    return buffer.getvalue()
