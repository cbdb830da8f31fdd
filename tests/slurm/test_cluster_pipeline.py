"""`align submit` on the tiny recipe, for real: the pipeline as chained SLURM jobs.

One run of the whole pipeline backs these tests. It is submitted with the pairs stage's
output directory blocked by a file, so pairs fails after sft, sampling and annotation
succeeded; every later job must then be cancelled by SLURM, never started. With the file
removed, the same `align submit` must submit only pairs and what follows, and a third
finds nothing to submit. Then `recipes/slurm/train_multinode.sbatch` trains the run's
model again with two launchers (two srun tasks on the one node, ZeRO-2 on CPU), which must
equal the pipeline's one-process training. Each job's start and end come from `scontrol`.
"""

from __future__ import annotations

import json
import re
import sys
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from ports import free_port
from slurm_helpers import (
    REPO,
    SLURM_SCRIPTS,
    assert_states,
    job_records,
    log_tails,
    run,
    sbatch,
    states,
    wait_for,
)

from align.io import STAGE_COMPLETE_MARKER, stage_completion_info

pytestmark = pytest.mark.slurm

RECIPE = "recipes/tiny/pipeline.yaml"
STAGES = ("sft", "sample", "annotate", "pairs", "logprobs", "train", "evaluate")
ARRAYS = {"sample", "annotate", "evaluate"}  # 2 shards each (the tiny recipe's slurm.array)


def workspace(root: Path) -> Path:
    """A directory laid out like the repository root for the tiny recipe's relative paths."""
    from align.testing.tiny import save_tiny_models

    root.mkdir(parents=True, exist_ok=True)
    (root / "recipes").symlink_to(REPO / "recipes", target_is_directory=True)
    save_tiny_models(root / "runs" / "tiny_models")
    return root


def align(args: list[str], env: dict[str, str], cwd: Path) -> str:
    """`align ARGS` as a user types it, in ``cwd``; what it printed."""
    return run([sys.executable, "-m", "align", *args], env, cwd=cwd, timeout=300).stdout


def submitted_jobs(ws: Path) -> dict[str, str]:
    return {stage: entry["job_id"] for stage, entry in json.loads((ws / "runs/tiny/slurm/jobs.json").read_text()).items()}


def wait_all(ids: list[str], env: dict[str, str], ws: Path) -> None:
    wait_for(ids, env, timeout_s=300, logs=ws / "runs" / "tiny" / "slurm")


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, job_env):
    ws = workspace(tmp_path_factory.mktemp("pipeline"))
    blocker = ws / "blocked"  # a file where pairs' output directory has to be made: pairs fails
    blocker.write_text("not a directory\n")
    overrides = [f"pairs.output_dir={blocker / 'pairs'}", f"logprobs.input={blocker / 'pairs' / 'pairs.jsonl'}"]

    first = align(["submit", RECIPE, *overrides], job_env, ws)
    first_ids = submitted_jobs(ws)
    wait_all(list(first_ids.values()), job_env, ws)
    first_jobs = {stage: job_records(job, job_env) for stage, job in first_ids.items()}
    first_outputs = sorted(p.name for p in (ws / "runs" / "tiny").iterdir() if p.name != "slurm")

    blocker.unlink()
    second = align(["submit", RECIPE, *overrides], job_env, ws)
    second_ids = submitted_jobs(ws)
    new = [job for stage, job in second_ids.items() if job != first_ids[stage]]
    wait_all(new, job_env, ws)
    second_jobs = {stage: job_records(job, job_env) for stage, job in second_ids.items()}

    third = align(["submit", RECIPE, *overrides], job_env, ws)
    return SimpleNamespace(ws=ws, first=first, first_ids=first_ids, first_jobs=first_jobs, first_outputs=first_outputs,
                           second=second, second_ids=second_ids, second_jobs=second_jobs, third=third,
                           logs=ws / "runs" / "tiny" / "slurm")


def test_the_generated_scripts_pass_sbatch_test_only(pipeline, job_env):
    """Each script `align submit` wrote is a valid batch script on its own (SLURM checks it, runs nothing)."""
    scripts = sorted(pipeline.logs.glob("*.sbatch"))
    assert sorted(p.name for p in scripts) == sorted(f"{i}-{s}.sbatch" for i, s in enumerate(STAGES, start=1))
    for script in scripts:
        done = run(["sbatch", "--test-only", script], job_env, cwd=pipeline.ws)
        assert re.search(r"Job \d+ to start at \S+ using \d+ processors on nodes localhost", done.stderr), done.stderr
    assert run(["squeue", "--noheader"], job_env).stdout.strip() == ""  # nothing was queued


def test_a_failed_stage_cancels_every_later_one(pipeline, job_env):
    ids, logs = pipeline.first_ids, pipeline.logs
    assert list(ids) == list(STAGES), pipeline.first
    for stage in ("sft", "pairs", "logprobs", "train"):
        assert len(pipeline.first_jobs[stage]) == 1
    assert_states(ids["sft"], {"job": "COMPLETED"}, job_env, logs)
    for stage in ("sample", "annotate"):
        assert_states(ids[stage], {"0": "COMPLETED", "1": "COMPLETED"}, job_env, logs)
    assert_states(ids["pairs"], {"job": "FAILED"}, job_env, logs)
    assert "InputError: pairs: output_dir=" in (logs / f"pairs-{ids['pairs']}.out").read_text()  # one line
    for stage in ("logprobs", "train", "evaluate"):
        for record in pipeline.first_jobs[stage]:
            assert (record["JobState"], record["Reason"]) == ("CANCELLED", "DependencyNeverSatisfied"), record
            assert record["StartTime"] == "Unknown" or record["RunTime"] == "00:00:00", record  # never ran
        assert not list(logs.glob(f"{stage}-{ids[stage]}*.out"))
    assert pipeline.first_outputs == ["annotate", "sample", "sft"]  # nothing of pairs and after


def _times(records: list[dict[str, str]]) -> tuple[datetime, datetime]:
    starts = [datetime.fromisoformat(r["StartTime"]) for r in records]
    ends = [datetime.fromisoformat(r["EndTime"]) for r in records]
    return min(starts), max(ends)


def test_each_stage_starts_only_after_the_one_before_succeeded(pipeline):
    def submitted_after(printed: str, stage: str) -> list[str]:
        line = re.search(rf"^\[align submit\] {stage}: job \d+.*$", printed, re.MULTILINE)
        assert line, printed
        waits = re.search(r", after job\(s\) ([\d, ]+)", line.group(0))
        return [w.strip() for w in waits.group(1).split(",")] if waits else []

    first, second = pipeline.first_ids, pipeline.second_ids
    for earlier, later in pairwise(STAGES):  # as submitted: each held by the step it reads (and sft's model)
        assert first[earlier] in submitted_after(pipeline.first, later)
    assert submitted_after(pipeline.second, "pairs") == []  # annotate was done: nothing to wait for
    for earlier, later in pairwise(STAGES[3:]):
        assert second[earlier] in submitted_after(pipeline.second, later)
    jobs = {**{s: pipeline.first_jobs[s] for s in ("sft", "sample", "annotate")},
            **{s: pipeline.second_jobs[s] for s in ("pairs", "logprobs", "train", "evaluate")}}
    for earlier, later in pairwise(STAGES):
        if earlier == "annotate":
            continue  # pairs (the second submission) waited for nothing: annotate was done by then
        assert all(r["JobState"] == "COMPLETED" for r in jobs[earlier] + jobs[later])
        assert _times(jobs[later])[0] >= _times(jobs[earlier])[1], (earlier, later, jobs[earlier], jobs[later])
    # the arrays ran as arrays: one task per shard, each on its own shard
    for stage in ARRAYS:
        assert sorted(r["ArrayTaskId"] for r in jobs[stage]) == ["0", "1"]


def test_a_rerun_submits_only_what_is_not_done(pipeline, job_env):
    first, second = pipeline.first_ids, pipeline.second_ids
    for stage in ("sft", "sample", "annotate"):
        assert f"[align submit] {stage}: done, not submitted" in pipeline.second
        assert second[stage] == first[stage]
    for stage in ("pairs", "logprobs", "train", "evaluate"):
        assert second[stage] != first[stage] and f"[align submit] {stage}: job {second[stage]}" in pipeline.second
        expected = {"0": "COMPLETED", "1": "COMPLETED"} if stage in ARRAYS else {"job": "COMPLETED"}
        assert_states(second[stage], expected, job_env, pipeline.logs)
    for stage in STAGES:  # every output complete and current, as `align status` reads them
        assert f"[align submit] {stage}: done, not submitted" in pipeline.third
    assert "nothing to submit" in pipeline.third
    ws = pipeline.ws / "runs" / "tiny"
    assert stage_completion_info(ws / "evaluate")["summary"]["prompts"] == 16
    assert (ws / "evaluate" / "report.md").exists()


def cpu_zero2(path: Path) -> Path:
    """recipes/accelerate/zero2.yaml for 2 CPU ranks (docs/environment.md, DeepSpeed on CPU)."""
    config = yaml.safe_load((REPO / "recipes" / "accelerate" / "zero2.yaml").read_text())
    config.update(num_processes=2, use_cpu=True, mixed_precision="no", downcast_bf16="no")
    path.write_text(yaml.safe_dump(config))
    return path


GLOO_ABORT = "terminate called without an active exception"  # docs/environment.md: a rare gloo abort


def train_two_launchers(ws: Path, tmp: Path, env: dict[str, str]) -> tuple[str, Path, Path]:
    """Submit the two-launcher training; (job id, output dir, logs)."""
    logs, out = tmp / "logs", tmp / "qrpo"
    logs.mkdir(parents=True)
    env = {**env, "STAGE": "train", "ACCELERATE_CONFIG": str(cpu_zero2(tmp / "zero2_cpu.yaml")),
           "GPUS_PER_NODE": "1", "MAIN_PROCESS_PORT": str(free_port()), "DS_ACCELERATOR": "cpu"}
    job = sbatch(["--nodes=1", "--ntasks=2", "--ntasks-per-node=2", "--cpus-per-task=1", "--gpus-per-node=0",
                  f"--chdir={ws}", f"--output={logs}/%j.out", SLURM_SCRIPTS / "train_multinode.sbatch", RECIPE,
                  f"output_dir={out}", "per_device_train_batch_size=2",  # 2 ranks x 2 = the recipe's 4 pairs a step
                  "use_cpu=false", "ddp_backend=gloo"], env)
    wait_for([job], env, timeout_s=400, logs=logs)
    return job, out, logs


def test_two_launchers_under_srun_train_like_one_process(pipeline, job_env, tmp_path):
    """recipes/slurm/train_multinode.sbatch with two srun tasks on the one node: a launcher each
    (machine ranks 0 and 1 of 2, one rank each), as two nodes of one rank would run."""
    ws = pipeline.ws
    job, out, logs = train_two_launchers(ws, tmp_path / "first", job_env)
    if states(job, job_env) == {"job": "FAILED"} and GLOO_ABORT in (logs / f"{job}.out").read_text():
        job, out, logs = train_two_launchers(ws, tmp_path / "again", job_env)  # that abort alone is repeated, once
    assert_states(job, {"job": "COMPLETED"}, job_env, logs)
    log = (logs / f"{job}.out").read_text()
    assert "[train_multinode] 2 nodes x 1 GPUs = 2 ranks; main localhost:" in log, log_tails(logs)
    assert "launcher 0 of 2 on" in log and "launcher 1 of 2 on" in log

    two = stage_completion_info(out)["summary"]
    one = stage_completion_info(ws / "runs" / "tiny" / "qrpo")["summary"]
    assert (two["world_size"], two["deepspeed"], one["world_size"], one["deepspeed"]) == (2, True, 1, False)
    assert two["steps"] == one["steps"] == 4
    assert two["train_loss"] == pytest.approx(one["train_loss"], rel=1e-5)

    import torch
    from transformers import AutoModelForCausalLM

    def weights(path: Path) -> dict[str, torch.Tensor]:
        return {k: v.detach() for k, v in AutoModelForCausalLM.from_pretrained(path).named_parameters()}

    got, want, start = weights(out), weights(ws / "runs" / "tiny" / "qrpo"), weights(ws / "runs" / "tiny" / "sft")
    assert set(got) == set(want)
    moved = max((want[k] - start[k]).abs().max().item() for k in want)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=1e-6, msg=name)
    assert moved > 1e-5  # training changed the weights by far more than the two runs differ
    assert (out / STAGE_COMPLETE_MARKER).exists()
