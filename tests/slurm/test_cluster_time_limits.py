"""A cluster's own events, for real, on the one-machine cluster: a time limit, a task requeued mid-shard, a
partition's maximum, a failed and a pending job in `align status`, a secret in the jobs' environment.

- SFT with a 2-minute limit: SLURM signals the job (``--signal=B:USR1@80``), the step saves a
  checkpoint and stops, the script requeues the job, and the next attempt resumes and
  finishes; its weights equal those of the same SFT run in one go, and its one log holds
  every attempt.
- `scontrol requeue` of a sampling array task that is mid-shard (a stand-in for a lost node):
  the task saves its last batch, is requeued, resumes, and every prompt id is there once.

SLURM holds a requeued job about two minutes before it may start again (its BeginTime); the
tests let it start at once (``scontrol update StartTime=now``), which changes only when.
- 72 hours on a partition of 24 at most: refused at submit, naming the maximum.
- `align status` names a failed job's exit code and log, and a pending job's reason.
- ``slurm.env: {HF_TOKEN: $HF_TOKEN}``: the job gets the value of the submitting shell's
  variable, and no file align writes, nor anything it prints, holds it.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import yaml
from slurm_helpers import REPO, job_records, log_tails, run, wait_for, wait_for_file

from align.io import read_records, stage_completion_info

pytestmark = pytest.mark.slurm

SECRET = "hf_dummy_value_that_must_not_leak"
TRAINER = {"use_cpu": True, "bf16": False, "report_to": [], "save_strategy": "no", "disable_tqdm": True,
           "optimizer": "adamw", "seed": 0, "max_length": 256, "learning_rate": 3.0e-3,
           "per_device_train_batch_size": 16, "logging_steps": 500}
CPU_JOBS = {"gpus_per_node": 0, "gpus_per_task": 0, "cpus_per_task": 1, "mem": "1G",
            "accelerate_config": "recipes/accelerate/cpu.yaml", "env": {"OMP_NUM_THREADS": "1"}}


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    from align.testing.tiny import save_tiny_models

    root = tmp_path_factory.mktemp("events")
    (root / "recipes").symlink_to(REPO / "recipes", target_is_directory=True)
    save_tiny_models(root / "runs" / "tiny_models")
    return root


def wrapper(ws: Path, name: str, module: str) -> str:
    """An executable that runs ``tests/slurm/MODULE`` with this Python: a recipe's ``slurm.python``."""
    path = ws / name
    path.write_text(f"#!/bin/sh\nexec {sys.executable} {Path(__file__).parent / module} \"$@\"\n")
    path.chmod(0o755)
    return str(path)


def align(args: list[str], env: dict[str, str], cwd: Path, check: bool = True):
    return run([sys.executable, "-m", "align", *args], env, cwd=cwd, timeout=300, check=check)


def write(ws: Path, name: str, recipe: dict) -> str:
    (ws / name).write_text(yaml.safe_dump(recipe, sort_keys=False))
    return name


def wait_releasing_requeued(job: str, env: dict[str, str], logs: Path, timeout_s: float = 600) -> None:
    """Until the job (every task) is over, letting each requeued attempt start as soon as SLURM allows."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = job_records(job, env)
        if all(r["JobState"] not in ACTIVE for r in records):
            return
        for r in records:
            if r["JobState"] == "PENDING" and int(r.get("Restarts", "0")) > 0 and r.get("Reason") == "BeginTime":
                task = f"{r['ArrayJobId']}_{r['ArrayTaskId']}" if r.get("ArrayTaskId") else r["JobId"]
                run(["scontrol", "update", f"JobId={task}", "StartTime=now"], env, check=False)
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job} not over after {timeout_s} s: {records}{log_tails(logs)}")
        time.sleep(1)


ACTIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "SUSPENDED"}


def jobs_of(ws: Path, log_dir: str) -> dict[str, str]:
    return {step: entry["job_id"] for step, entry in json.loads((ws / log_dir / "jobs.json").read_text()).items()}


def sft_recipe(out: str, time_limit: str) -> dict:
    return {"defaults": {"chat_date": "2026-01-01"},
            "sft": {"model_name_or_path": "runs/tiny_models/policy", "input": "recipes/tiny/data/sft.jsonl",
                    "output_dir": f"{out}/sft", "max_steps": 1000, **TRAINER},
            "slurm": {"log_dir": f"{out}/slurm", "time": time_limit, "signal_margin": 80, **CPU_JOBS}}


def test_a_training_step_at_its_time_limit_saves_requeues_and_ends_as_an_unlimited_run(ws, job_env, monkeypatch,
                                                                                    one_torch_thread):
    """About a minute of training under a 2-minute limit that signals 80 s before it: stopped once (or more
    where this machine is slow), it resumes each time, and ends as the same SFT run in one go (in this process, on
    one thread as the job's OMP_NUM_THREADS=1)."""
    import torch
    from safetensors.torch import load_file

    from align.cli import main

    align(["submit", write(ws, "limited.yaml", sft_recipe("runs/limited", "00:02:00"))], job_env, ws)
    limited = jobs_of(ws, "runs/limited/slurm")["sft"]
    logs = ws / "runs" / "limited" / "slurm"
    wait_releasing_requeued(limited, job_env, logs, timeout_s=900)
    monkeypatch.chdir(ws)
    keys = sft_recipe("runs/whole", "")["sft"]
    assert main(["sft", *(f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in keys.items()),
                 "chat_date=2026-01-01", "save_strategy='no'"]) == 0
    record = job_records(limited, job_env)[0]
    assert record["JobState"] == "COMPLETED", log_tails(logs)
    assert int(record["Restarts"]) >= 1, record
    log = (logs / f"sft-{limited}.out").read_text()
    assert "sft: attempt 1 started" in log and "sft: attempt 2 started" in log, log[-3000:]
    assert "USR1 (the time limit is near)" in log and "saved and requeued" in log
    assert "training stopped at step" in log and "resuming from" in log
    assert stage_completion_info(ws / "runs" / "limited" / "sft") is not None
    a = load_file(ws / "runs" / "limited" / "sft" / "model.safetensors")
    b = load_file(ws / "runs" / "whole" / "sft" / "model.safetensors")
    for name, value in b.items():
        torch.testing.assert_close(a[name], value, rtol=0, atol=1e-6, msg=name)


def test_a_sampling_task_requeued_mid_shard_resumes_with_every_id_once(ws, job_env):
    prompts = read_records(REPO / "recipes" / "tiny" / "data" / "prompts.jsonl")
    recipe = yaml.safe_load((REPO / "recipes" / "tiny" / "pipeline.yaml").read_text())
    recipe = {"defaults": recipe["defaults"], "sample": {**recipe["sample"], "output_dir": "runs/requeued/sample",
                                                         "batch_size": 2, "sampler": {**recipe["sample"]["sampler"],
                                                         "model": "runs/tiny_models/policy"}},
              "slurm": {"log_dir": "runs/requeued/slurm", "array": 2, "time": "00:30:00",
                        **CPU_JOBS, "python": wrapper(ws, "hold.sh", "hold_until_stopped.py")}}
    marker = ws / "runs" / "requeued" / "held"
    env = {**job_env, "HOLD_TASK": "1", "HOLD_MARKER": str(marker)}
    align(["submit", write(ws, "requeued.yaml", recipe)], env, ws)
    job = jobs_of(ws, "runs/requeued/slurm")["sample"]
    wait_for_file(marker, timeout_s=240)
    run(["scontrol", "requeue", f"{job}_1"], job_env)
    wait_releasing_requeued(job, job_env, ws / "runs" / "requeued" / "slurm")
    tasks = {r["ArrayTaskId"]: r for r in job_records(job, job_env)}
    assert {t: r["JobState"] for t, r in tasks.items()} == {"0": "COMPLETED", "1": "COMPLETED"}, \
        log_tails(ws / "runs" / "requeued" / "slurm")
    assert int(tasks["1"]["Restarts"]) == 1
    rows = read_records(ws / "runs" / "requeued" / "sample")
    assert sorted(r["id"] for r in rows) == sorted(p["id"] for p in prompts)  # every id, once
    log = next((ws / "runs" / "requeued" / "slurm").glob(f"sample-{job}_1.out")).read_text()
    assert "attempt 1 started" in log and "attempt 2 started" in log and "TERM: saving, then stopping" in log


def test_a_time_over_the_partitions_maximum_is_refused_at_submit(ws, job_env):
    recipe = sft_recipe("runs/long", "72:00:00")
    recipe["slurm"]["partition"] = "short"
    done = align(["submit", write(ws, "long.yaml", recipe)], job_env, ws, check=False)
    assert done.returncode == 2 and "sft: time 72:00:00 is over partition short's maximum 1-00:00:00" in done.stderr
    assert not (ws / "runs" / "long" / "slurm" / "jobs.json").exists()
    recipe["slurm"]["over_time_limit"] = "chain"
    recipe["slurm"]["time"] = "48:00:00"
    out = align(["submit", write(ws, "long.yaml", recipe), "dry_run=true"], job_env, ws).stdout
    assert "asked for the maximum, run as chained attempts" in out
    assert "#SBATCH --time=1-00:00:00" in (ws / "runs" / "long" / "slurm" / "1-sft.sbatch").read_text()


def test_status_names_a_failed_jobs_exit_code_and_log_and_a_pending_jobs_reason(ws, job_env):
    recipe = {"pairs": {"input": str(ws / "missing.jsonl"), "output_dir": "runs/status/pairs"},
              "logprobs": {"input": "runs/status/pairs/pairs.jsonl", "model_name_or_path": "runs/tiny_models/policy",
                           "output_dir": "runs/status/logprobs", "device": "cpu"},
              "slurm": {"log_dir": "runs/status/slurm", "time": "00:10:00", **CPU_JOBS}}
    name = write(ws, "status.yaml", recipe)
    (ws / "missing.jsonl").write_text(json.dumps({"id": "a"}) + "\n")  # there at submit, gone when the job runs
    run(["scontrol", "update", "NodeName=localhost", "State=DRAIN", "Reason=align-test"], job_env)
    try:
        align(["submit", name], job_env, ws)
        (ws / "missing.jsonl").unlink()
        pending = align(["status", name], job_env, ws).stdout
    finally:
        run(["scontrol", "update", "NodeName=localhost", "State=RESUME"], job_env)
    jobs = jobs_of(ws, "runs/status/slurm")
    assert f"job {jobs['pairs']}: PENDING (" in pending, pending
    assert f"job {jobs['logprobs']}: PENDING (Dependency)" in pending, pending
    wait_for(list(jobs.values()), job_env, timeout_s=300, logs=ws / "runs" / "status" / "slurm")
    failed = align(["status", name], job_env, ws).stdout
    log = ws / "runs" / "status" / "slurm" / f"pairs-{jobs['pairs']}.out"
    assert f"job {jobs['pairs']}: FAILED, exit code 2, log {log.resolve()}" in failed, failed
    assert f"job {jobs['logprobs']}: CANCELLED" in failed or f"job {jobs['logprobs']}: PENDING" in failed, failed


def test_a_variable_in_the_jobs_env_reaches_the_job_as_its_value_and_is_never_written(ws, job_env):
    rows = ws / "annotated.jsonl"
    rows.write_text("".join(json.dumps({"id": f"a{i}", "messages": [{"role": "user", "content": "q"}],
                                        "completions": [{"text": t, "is_reference": True} for t in "wxyz"],
                                        "rewards": [0.0, 1.0, 0.5, 0.2], "reward_skips": [None] * 4}) + "\n"
                            for i in range(3)))
    recipe = {"pairs": {"input": str(rows), "output_dir": "runs/env/pairs"},
              "slurm": {"log_dir": "runs/env/slurm", "time": "00:10:00", **CPU_JOBS,
                        "env": {"HF_TOKEN": "$HF_TOKEN", "OMP_NUM_THREADS": "1"},
                        "python": wrapper(ws, "record.sh", "record_env.py")}}
    env = {**job_env, "HF_TOKEN": SECRET, "RECORD_ENV": str(ws / "runs" / "env" / "seen.json")}
    printed = align(["submit", write(ws, "env.yaml", recipe)], env, ws)
    job = jobs_of(ws, "runs/env/slurm")["pairs"]
    wait_for([job], job_env, timeout_s=300, logs=ws / "runs" / "env" / "slurm")
    assert json.loads((ws / "runs" / "env" / "seen.json").read_text())["HF_TOKEN"] == SECRET
    assert SECRET not in printed.stdout + printed.stderr
    for path in (ws / "runs" / "env").rglob("*"):
        if path.is_file() and path.name != "seen.json":
            assert SECRET not in path.read_text(errors="replace"), path
    assert stage_completion_info(ws / "runs" / "env" / "pairs") is not None
