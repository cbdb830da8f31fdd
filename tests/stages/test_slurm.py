"""The SLURM scripts: syntax, the job array's sharding for real, the multi-node launch line.

No SLURM here: the array script runs as SLURM would run each task (plain bash with the
SLURM_ARRAY_* variables set), and the multi-node script runs against stand-ins for
`srun`, `scontrol` and `accelerate` that record what they were asked to do.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from stage_helpers import RECIPES, TINY_RECIPE, run_cli, subprocess_env

from align.io import STAGE_COMPLETE_MARKER, stage_completion_info, read_records

SCRIPTS = sorted((RECIPES / "slurm").glob("*.sbatch"))
ARRAY = RECIPES / "slurm" / "annotate_array.sbatch"
MULTINODE = RECIPES / "slurm" / "train_multinode.sbatch"


def test_there_are_sbatch_scripts():
    assert {p.name for p in SCRIPTS} >= {"annotate_array.sbatch", "train_multinode.sbatch"}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_sbatch_script_parses_and_says_how_to_submit(script):
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    head = script.read_text().splitlines()[:6]
    assert head[0] == "#!/bin/bash" and any(line.startswith("#   sbatch ") for line in head)


def _array_task(task: int, count: int, *args: str) -> subprocess.CompletedProcess:
    env = subprocess_env()
    env.update(SLURM_ARRAY_TASK_ID=str(task), SLURM_ARRAY_TASK_COUNT=str(count), SLURM_ARRAY_TASK_MIN="0",
               PYTHON=sys.executable)
    return subprocess.run(["bash", str(ARRAY), str(TINY_RECIPE), *args], capture_output=True, text=True, env=env,
                          timeout=300, check=False)


def test_array_tasks_each_take_their_shard_and_the_last_marks_complete(tmp_path, sample_run, annotate_run):
    out = tmp_path / "annotate"
    args = (f"input={sample_run[0]}", f"output_dir={out}")

    first = _array_task(0, 2, *args)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "task 0 (min 0) of 2" in first.stdout
    assert f"[align annotate] shard 0 of 2 written to {out}; other shards still to run" in first.stdout
    assert sorted(p.name for p in out.glob("shard-*.json*")) == ["shard-00000-of-00002.done.json",
                                                                 "shard-00000-of-00002.jsonl"]
    assert not (out / STAGE_COMPLETE_MARKER).exists()
    half = read_records(out / "shard-00000-of-00002.jsonl")
    assert 0 < len(half) < 24
    with pytest.raises(ValueError, match="unfinished stage output"):  # the next stage waits for all shards
        run_cli(["pairs", TINY_RECIPE, f"input={out}", f"output_dir={tmp_path / 'pairs'}"])

    second = _array_task(1, 2, *args)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"[align annotate] wrote {out}" in second.stdout
    info = stage_completion_info(out)
    assert info["stage"] == "annotate" and info["summary"]["records"] == 24
    rows = read_records(out)
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)) == 24
    assert {r["id"] for r in read_records(out / "shard-00001-of-00002.jsonl")} == set(ids) - {r["id"] for r in half}
    # the union equals the one-process annotation, record by record
    single = {r["id"]: r for r in read_records(annotate_run[0])}
    assert {r["id"]: r for r in rows} == single

    again = _array_task(0, 2, *args)  # a resubmitted task finds the output complete
    assert again.returncode == 0 and "already complete; skipping" in again.stdout


def test_array_script_refuses_to_run_outside_an_array(tmp_path):
    env = {k: v for k, v in subprocess_env().items() if not k.startswith("SLURM_")}
    done = subprocess.run(["bash", str(ARRAY), str(TINY_RECIPE)], capture_output=True, text=True, env=env,
                          check=False)
    assert done.returncode != 0 and "not a job array task" in done.stderr
    env.update(SLURM_ARRAY_TASK_ID="0", SLURM_ARRAY_TASK_COUNT="2", STAGE="train")
    done = subprocess.run(["bash", str(ARRAY), str(TINY_RECIPE)], capture_output=True, text=True, env=env,
                          check=False)
    assert done.returncode == 2 and "STAGE must be annotate, sample or evaluate" in done.stderr


def _stub(path: Path, body: str) -> None:
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_multinode_script_launches_one_accelerate_per_node_with_its_rank(tmp_path):
    bin_dir, record = tmp_path / "bin", tmp_path / "launches.txt"
    bin_dir.mkdir()
    # srun: drop its options, then run the command once per node, as SLURM would
    _stub(bin_dir / "srun", 'while [[ "$1" == --* ]]; do shift; done\n'
                            'for node in $(seq 0 $((SLURM_JOB_NUM_NODES - 1))); do SLURM_NODEID=$node "$@" || exit; done\n')
    _stub(bin_dir / "scontrol", '[[ "$1 $2" == "show hostnames" ]] && printf "gpu-a17\\ngpu-b03\\n"\n')
    _stub(bin_dir / "accelerate", f'printf "%s\\n" "$@" >> {record}; echo ---- >> {record}\n')
    env = subprocess_env()
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", SLURM_JOB_NUM_NODES="2", SLURM_JOB_NODELIST="gpu-[a17,b03]",
               SLURM_GPUS_ON_NODE="4", MAIN_PROCESS_PORT="29511")
    done = subprocess.run(["bash", str(MULTINODE), "recipes/apertus-70b/qrpo.yaml", "learning_rate=1e-7",
                           "run_name=a b"], capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr
    assert "2 nodes x 4 GPUs = 8 ranks; main gpu-a17:29511" in done.stdout
    launches = [block.strip().split("\n") for block in record.read_text().split("----") if block.strip()]
    assert len(launches) == 2
    for rank, argv in enumerate(launches):
        assert argv[0] == "launch"
        pairs = argv[1:-7]
        options = dict(zip(pairs[::2], pairs[1::2]))
        assert options == {"--config_file": "recipes/accelerate/zero3.yaml", "--num_machines": "2",
                           "--num_processes": "8", "--machine_rank": str(rank), "--main_process_ip": "gpu-a17",
                           "--main_process_port": "29511", "--rdzv_backend": "static"}
        assert argv[-7:] == ["--same_network", "-m", "align", "train", "recipes/apertus-70b/qrpo.yaml",
                             "learning_rate=1e-7", "run_name=a b"]
