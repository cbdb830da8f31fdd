"""recipes/slurm/annotate_array.sbatch submitted as a real job array, and a cancelled task resubmitted.

The array's task ids must reach the shard index (task i writes exactly the records whose id
hashes to shard i), and a task cancelled mid-shard must be resumable by `align submit`, which
submits that one task: SLURM tells a one-task array SLURM_ARRAY_TASK_COUNT=1, so the shard
count travels in the job's command (num_shards=N). Either way the
output equals one process's annotation of the same records, no row lost or doubled.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from slurm_helpers import (
    NO_GPU,
    SLURM_SCRIPTS,
    assert_states,
    run,
    sbatch,
    wait_for,
    wait_for_file,
)

from align.io import STAGE_COMPLETE_MARKER, read_records
from align.jobs import shard_of

pytestmark = pytest.mark.slurm

ARRAY = SLURM_SCRIPTS / "annotate_array.sbatch"
SHARDS = 4
BATCH = 2  # records per written batch: shard 2 takes several


@pytest.fixture(scope="module")
def completions(tmp_path_factory) -> Path:
    """Records with completions, as the sample stage writes them: 40 parity prompts, 4 answers each."""
    rows = []
    for n in range(100, 140):
        answer = "yes" if n % 2 == 0 else "no"
        texts = ["yes", "no", "Yes.", f"{answer}!"]
        rows.append({"id": f"even-{n}", "answer": answer,
                     "messages": [{"role": "user", "content": f"Is {n} an even number? Answer yes or no."}],
                     "completions": [{"text": t, "num_tokens": 2, "finish_reason": "stop", "is_reference": True,
                                      "source": "test"} for t in texts]})
    assert sum(shard_of(r["id"], SHARDS) == 2 for r in rows) > BATCH  # shard 2 is more than one batch
    path = tmp_path_factory.mktemp("completions") / "completions.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def recipe(directory: Path, completions: Path) -> Path:
    """A pipeline recipe of one stage, annotate (the verifiable reward), writing under ``directory``."""
    path = directory / "recipe.yaml"
    path.write_text(yaml.safe_dump({"annotate": {
        "input": str(completions), "output_dir": str(directory / "annotate"), "provider": "verifiable",
        "answer_field": "answer", "batch_size": BATCH}}))
    return path


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, completions) -> dict[str, dict]:
    """The same annotation by one process, no SLURM: the rows every array run must equal."""
    from align.cli import main

    directory = tmp_path_factory.mktemp("one_process")
    assert main(["annotate", str(recipe(directory, completions))]) == 0
    rows = read_records(directory / "annotate")
    assert len(rows) == 40
    return {r["id"]: r for r in rows}


def shard_ids(out: Path, index: int) -> list[str]:
    return [json.loads(line)["id"] for line in (out / f"shard-{index:05d}-of-{SHARDS:05d}.jsonl").read_text().splitlines()]


def test_array_task_ids_reach_the_shard_index(tmp_path, job_env, completions, one_process):
    path, out, logs = recipe(tmp_path, completions), tmp_path / "annotate", tmp_path / "logs"
    logs.mkdir()  # SLURM writes the logs there, it does not make the directory
    job = sbatch([f"--array=0-{SHARDS - 1}", *NO_GPU, f"--chdir={tmp_path}", f"--output={logs}/%A_%a.out",
                  ARRAY, path], job_env)
    wait_for([job], job_env, logs=logs)

    assert_states(job, {str(i): "COMPLETED" for i in range(SHARDS)}, job_env, logs)
    for i in range(SHARDS):
        log = (logs / f"{job}_{i}.out").read_text()
        assert f"task {i} (min 0) of {SHARDS}, shards from the array" in log
        # task i wrote shard i: exactly the ids that hash to i, each once
        ids = shard_ids(out, i)
        assert len(ids) == len(set(ids)) and set(ids) == {rid for rid in one_process if shard_of(rid, SHARDS) == i}
        assert (out / f"shard-{i:05d}-of-{SHARDS:05d}.done.json").exists()
    assert (out / STAGE_COMPLETE_MARKER).exists()
    assert {r["id"]: r for r in read_records(out)} == one_process


def test_a_task_cancelled_mid_shard_is_resubmitted_from_status(tmp_path, job_env, completions, one_process):
    path, out, logs, marker = recipe(tmp_path, completions), tmp_path / "annotate", tmp_path / "logs", tmp_path / "held"
    logs.mkdir()
    held = tmp_path / "held_python"  # PYTHON for the script: align, with task 2 held after its first batch
    held.write_text(f"#!/bin/sh\nexec {sys.executable} {Path(__file__).parent / 'hold_mid_shard.py'} \"$@\"\n")
    held.chmod(0o755)
    env = {**job_env, "PYTHON": str(held), "HOLD_TASK": "2", "HOLD_MARKER": str(marker)}
    job = sbatch([f"--array=0-{SHARDS - 1}", *NO_GPU, f"--chdir={tmp_path}", f"--output={logs}/%A_%a.out",
                  ARRAY, path], env)
    wait_for_file(marker)
    run(["scancel", f"{job}_2"], job_env)  # mid-shard: its first batch is written, the rest is not
    wait_for([job], job_env, logs=logs)

    assert_states(job, {"0": "COMPLETED", "1": "COMPLETED", "2": "CANCELLED", "3": "COMPLETED"}, job_env, logs)
    assert len(shard_ids(out, 2)) == BATCH and not (out / f"shard-00002-of-{SHARDS:05d}.done.json").exists()
    assert not (out / STAGE_COMPLETE_MARKER).exists()

    status = run([sys.executable, "-m", "align", "status", path], job_env, cwd=tmp_path).stdout
    assert "annotate       partial" in status and f"3 of {SHARDS} shards done; shards 2 are missing" in status
    assert "align submit" in status  # one route: align submit resubmits what is missing
    # align submit plans an array of the missing shard, of the output's shard count, and submits it
    cluster = ["slurm.gpus_per_task=0", "slurm.cpus_per_task=1", "slurm.mem=500M", f"slurm.log_dir={logs}",
               f"slurm.scripts_dir={SLURM_SCRIPTS}"]
    printed = run([sys.executable, "-m", "align", "submit", path, "dry_run=true", *cluster], job_env,
                  cwd=tmp_path).stdout
    assert f"annotate (partial: shards 2 of {SHARDS} missing)" in printed
    planned = (logs / "1-annotate.sbatch").read_text()
    assert "#SBATCH --array=2\n" in planned and f" annotate num_shards={SHARDS} &\n" in planned
    printed = run([sys.executable, "-m", "align", "submit", path, *cluster], job_env, cwd=tmp_path).stdout
    again = json.loads((logs / "jobs.json").read_text())["annotate"]["job_id"]
    assert f"annotate: job {again}, array 2 of {SHARDS} shards" in printed
    wait_for([again], job_env, logs=logs)
    assert_states(again, {"2": "COMPLETED"}, job_env, logs)
    log = (logs / f"annotate-{again}_2.out").read_text()
    assert f"task 2 of {SHARDS} shards" in log and f"[align annotate] wrote {out}" in log

    ids = shard_ids(out, 2)  # resumed: the held batch kept, the rest appended, nothing twice
    assert len(ids) == len(set(ids)) and set(ids) == {rid for rid in one_process if shard_of(rid, SHARDS) == 2}
    assert (out / STAGE_COMPLETE_MARKER).exists()
    assert {r["id"]: r for r in read_records(out)} == one_process
