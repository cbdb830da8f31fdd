"""The job scripts `align submit` writes and the settings behind them, word for word.

Each kind of job (an array of shards, a multi-node training launch, one task) is written for
a working directory with a space in its name and compared with the script written out here
by hand; the resource defaults (CPUs per GPU, memory per CPU, whole nodes for launches) and
the ``#SBATCH`` quoting rules are checked case by case.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from align.errors import ConfigError
from align.slurm.config import JobSettings, SlurmConfig
from align.slurm.scripts import StepJob, array_spec, kind_of, sbatch_value

WS = Path("/scratch/my team/ws")
RECIPE = WS / "runs/slurm/recipe-1.yaml"


def job(step: str, stage: str, kind: str, settings: JobSettings, **more) -> StepJob:
    return StepJob(step, stage, kind, settings, RECIPE, WS, WS / "runs/slurm", WS / "recipes/slurm", **more)


ARRAY = """\
#!/bin/bash
# align step annotate_judge (annotate) of recipes/apertus-8b/pipeline.yaml, as an array of 8 shards (tasks 0-2,5). \
Written by `align submit`; `sbatch THIS_FILE` runs it alone.
#SBATCH --job-name=align-annotate_judge
#SBATCH --output="/scratch/my team/ws/runs/slurm/annotate_judge-%A_%a.out"
#SBATCH --open-mode=append
#SBATCH --chdir="/scratch/my team/ws"
#SBATCH --export=ALL
#SBATCH --nodes=1
#SBATCH --cpus-per-task=16
#SBATCH --mem=128G
#SBATCH --partition=gpu
#SBATCH --account=a-12
#SBATCH --time=12:00:00
#SBATCH --signal=B:USR1@600
#SBATCH --requeue
#SBATCH --array=0-2,5%4
#SBATCH --ntasks=1
#SBATCH --gpus-per-task=2
#SBATCH --constraint=h100

set -euo pipefail
export ALIGN_PYTHON='/scratch/my team/ws/.venv-vllm/bin/python'
export PATH='/scratch/my team/ws/.venv-vllm/bin':"$PATH"
export PYTHONPATH='/scratch/my team/ws/runs/slurm/code/0123abcd'"${PYTHONPATH:+:$PYTHONPATH}" PYTHONSAFEPATH=1 \
ALIGN_CODE='/scratch/my team/ws/runs/slurm/code/0123abcd'
export HF_HOME='/scratch/hf cache'
export HF_TOKEN="${HF_TOKEN-}"
export CACHE="${SCRATCH-}/cache ${HOME-} \\$(whoami) \\`id\\` 5\\$"
echo "[align submit] annotate_judge: attempt $(( ${SLURM_RESTART_COUNT:-0} + 1 )) started $(date '+%Y-%m-%d \
%H:%M:%S') on $(hostname), job ${SLURM_JOB_ID}"
export ALIGN_STOP_FILE='/scratch/my team/ws/runs/slurm/.stop-'"${SLURM_JOB_ID}"
rm -f "$ALIGN_STOP_FILE" "$ALIGN_STOP_FILE.stopped"
trap 'echo "[align submit] annotate_judge: USR1 (the time limit is near): saving, then stopping"; \
touch "$ALIGN_STOP_FILE"' USR1
trap 'echo "[align submit] annotate_judge: TERM: saving, then stopping"; touch "$ALIGN_STOP_FILE"' TERM
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}"
echo "[align submit] annotate_judge: task ${SLURM_ARRAY_TASK_ID} of 8 shards on $(hostname)"
"$ALIGN_PYTHON" -m align step '/scratch/my team/ws/runs/slurm/recipe-1.yaml' annotate_judge num_shards=8 &
child=$!
while true; do  # a trapped signal interrupts wait: wait again until the step exits
  status=0; wait "$child" || status=$?
  kill -0 "$child" 2>/dev/null || break
done
rm -f "$ALIGN_STOP_FILE"
if [ -e "$ALIGN_STOP_FILE.stopped" ]; then  # the step saved and stopped (the file says where)
  rm -f "$ALIGN_STOP_FILE.stopped"
  target="${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}}"
  if scontrol requeue "${target:-$SLURM_JOB_ID}"; then
    echo "[align submit] annotate_judge: saved and requeued: the next attempt resumes where it stopped"
    exit 0
  fi
  echo "[align submit] annotate_judge: saved and stopped; align submit RECIPE submits it again, and it resumes"
  exit 75
fi
exit "$status"
"""

LAUNCH = """\
#!/bin/bash
# align step round-2.train (train) of r.yaml, as 4 node(s) x 4 rank(s). Written by `align submit`; \
`sbatch THIS_FILE` runs it alone.
#SBATCH --job-name=align-round-2.train
#SBATCH --output="/scratch/my team/ws/runs/slurm/round-2.train-%j.out"
#SBATCH --open-mode=append
#SBATCH --chdir="/scratch/my team/ws"
#SBATCH --export=ALL
#SBATCH --nodes=4
#SBATCH --cpus-per-task=32
#SBATCH --mem=0
#SBATCH --qos=high
#SBATCH --signal=B:USR1@900
#SBATCH --requeue
#SBATCH --exclusive
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=4

set -euo pipefail
export ALIGN_PYTHON=/opt/env/bin/python
export PATH=/opt/env/bin:"$PATH"
echo "[align submit] round-2.train: attempt $(( ${SLURM_RESTART_COUNT:-0} + 1 )) started $(date '+%Y-%m-%d \
%H:%M:%S') on $(hostname), job ${SLURM_JOB_ID}"
export ALIGN_STOP_FILE='/scratch/my team/ws/runs/slurm/.stop-'"${SLURM_JOB_ID}"
rm -f "$ALIGN_STOP_FILE" "$ALIGN_STOP_FILE.stopped"
trap 'echo "[align submit] round-2.train: USR1 (the time limit is near): saving, then stopping"; \
touch "$ALIGN_STOP_FILE"' USR1
trap 'echo "[align submit] round-2.train: TERM: saving, then stopping"; touch "$ALIGN_STOP_FILE"' TERM
export ACCELERATE_CONFIG='/scratch/my team/ws/recipes/accelerate/zero3.yaml'
export NNODES=4 NUM_PROCESSES=16
export MAIN_PROCESS_IP="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"
export MAIN_PROCESS_PORT="${MAIN_PROCESS_PORT:-29500}"
export TORCH_NCCL_ASYNC_ERROR_HANDLING="${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}"
export LAUNCH_NODE='/scratch/my team/ws/recipes/slurm/launch_node.sh'
echo "[align submit] round-2.train: 4 node(s) x 4 rank(s)"
srun --kill-on-bad-exit=1 bash -c 'export MACHINE_RANK=$SLURM_PROCID; exec bash "$LAUNCH_NODE" "$@"' launch \
-m align step '/scratch/my team/ws/runs/slurm/recipe-1.yaml' round-2.train &
child=$!
while true; do  # a trapped signal interrupts wait: wait again until the step exits
  status=0; wait "$child" || status=$?
  kill -0 "$child" 2>/dev/null || break
done
rm -f "$ALIGN_STOP_FILE"
if [ -e "$ALIGN_STOP_FILE.stopped" ]; then  # the step saved and stopped (the file says where)
  rm -f "$ALIGN_STOP_FILE.stopped"
  target="${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}}"
  if scontrol requeue "${target:-$SLURM_JOB_ID}"; then
    echo "[align submit] round-2.train: saved and requeued: the next attempt resumes where it stopped"
    exit 0
  fi
  echo "[align submit] round-2.train: saved and stopped; align submit RECIPE submits it again, and it resumes"
  exit 75
fi
exit "$status"
"""

SINGLE = """\
#!/bin/bash
# align step pairs (pairs) of r.yaml, as one task. Written by `align submit`; `sbatch THIS_FILE` runs it alone.
#SBATCH --job-name=align-pairs
#SBATCH --output="/scratch/my team/ws/runs/slurm/pairs-%j.out"
#SBATCH --open-mode=append
#SBATCH --chdir="/scratch/my team/ws"
#SBATCH --export=ALL
#SBATCH --nodes=1
#SBATCH --cpus-per-task=4
#SBATCH --mem=16G
#SBATCH --no-requeue
#SBATCH --exclusive
#SBATCH --ntasks=1

set -euo pipefail
export ALIGN_PYTHON=/opt/env/bin/python
export PATH=/opt/env/bin:"$PATH"
echo "[align submit] pairs: attempt $(( ${SLURM_RESTART_COUNT:-0} + 1 )) started $(date '+%Y-%m-%d %H:%M:%S') \
on $(hostname), job ${SLURM_JOB_ID}"
export ALIGN_STOP_FILE='/scratch/my team/ws/runs/slurm/.stop-'"${SLURM_JOB_ID}"
rm -f "$ALIGN_STOP_FILE" "$ALIGN_STOP_FILE.stopped"
trap 'echo "[align submit] pairs: USR1 (the time limit is near): saving, then stopping"; touch "$ALIGN_STOP_FILE"' USR1
trap 'echo "[align submit] pairs: TERM: saving, then stopping"; touch "$ALIGN_STOP_FILE"' TERM
"$ALIGN_PYTHON" -m align step '/scratch/my team/ws/runs/slurm/recipe-1.yaml' pairs seed=3 &
child=$!
while true; do  # a trapped signal interrupts wait: wait again until the step exits
  status=0; wait "$child" || status=$?
  kill -0 "$child" 2>/dev/null || break
done
rm -f "$ALIGN_STOP_FILE"
if [ -e "$ALIGN_STOP_FILE.stopped" ]; then  # the step saved and stopped (the file says where)
  rm -f "$ALIGN_STOP_FILE.stopped"
  echo "[align submit] pairs: saved and stopped; align submit RECIPE submits it again, and it resumes"
  exit 75
fi
exit "$status"
"""


def test_an_array_step_script_word_for_word():
    settings = JobSettings(gpus_per_task=2, partition="gpu", account="a-12", time="12:00:00", array_parallel=4,
                           python=".venv-vllm/bin/python", sbatch_options=["--constraint=h100"],
                           env={"HF_HOME": "/scratch/hf cache", "HF_TOKEN": "$HF_TOKEN", "CACHE": "${SCRATCH}/cache $HOME $(whoami) `id` 5$"})
    array = job("annotate_judge", "annotate", "array", settings, shards=(0, 1, 2, 5), num_shards=8,
                code=WS / "runs/slurm/code/0123abcd")
    assert array.script("recipes/apertus-8b/pipeline.yaml") == ARRAY
    assert array.logs_for("777") == "/scratch/my team/ws/runs/slurm/annotate_judge-777_*.out"


def test_a_training_launch_script_word_for_word():
    launch = job("round-2.train", "train", "launch", JobSettings(nodes=4, gpus_per_node=4, qos="high",
                                                                 python="/opt/env/bin/python", signal_margin=900))
    assert launch.script("r.yaml") == LAUNCH
    assert launch.logs_for("91") == "/scratch/my team/ws/runs/slurm/round-2.train-91.out"
    assert launch.files_needed() == {
        "python": Path("/opt/env/bin/python"), "recipe": RECIPE,
        "accelerate_config": Path("/scratch/my team/ws/recipes/accelerate/zero3.yaml"),
        "launch script": Path("/scratch/my team/ws/recipes/slurm/launch_node.sh")}


def test_a_one_task_step_script_word_for_word():
    single = job("pairs", "pairs", "single", JobSettings(gpus_per_task=0, exclusive=True, mem="16G",
                                                         python="/opt/env/bin/python", signal_margin=0, requeue=False),
                 extra=("seed=3",))
    assert single.script("r.yaml") == SINGLE
    assert single.files_needed() == {"python": Path("/opt/env/bin/python"), "recipe": RECIPE}


def test_only_training_launches_span_nodes_and_one_task_steps_get_their_gpus():
    settings = JobSettings(nodes=4, gpus_per_task=1, gpus_per_node=8)
    options = {kind: job("s", "pairs", kind, settings, shards=(0,)).sbatch_options() for kind in
               ("array", "launch", "single")}
    assert "--nodes=1" in options["array"] and "--nodes=1" in options["single"] and "--nodes=4" in options["launch"]
    assert "--gpus-per-task=1" in options["single"] and "--gpus-per-task=1" in options["array"]
    assert "--gpus-per-node=8" in options["launch"] and not any("gpus-per-task" in o for o in options["launch"])


def test_the_python_is_the_setting_made_absolute_else_the_submitting_one():
    assert job("p", "pairs", "single", JobSettings(python=".venv/bin/python")).python == WS / ".venv/bin/python"
    assert job("p", "pairs", "single", JobSettings()).python == Path(sys.executable)


@pytest.mark.parametrize("indices,spec", [
    ([0, 2, 3], "0,2-3"), ([0, 1, 2, 5], "0-2,5"), ([5], "5"), ([], ""), ([0, 1, 2, 5, 7, 8], "0-2,5,7-8"),
    ([3, 4], "3-4"), ([1, 3, 5], "1,3,5"), ([0, 1, 3, 4, 9], "0-1,3-4,9"),
])
def test_array_specs_name_each_run_of_tasks(indices, spec):
    assert array_spec(indices) == spec


@pytest.mark.parametrize("value,written", [
    ("plain-value", "plain-value"), ("a b", '"a b"'), ("tab\there", '"tab\there"'), ('say "hi"', '"say \\"hi\\""'),
    ("back\\slash", '"back\\\\slash"'), ("it's", "\"it's\""), ("#hash", '"#hash"'),
    ("XL-gpu", "XL-gpu"),
])
def test_sbatch_values_are_double_quoted_only_when_slurm_would_split_or_strip_them(value, written):
    assert sbatch_value(value) == written


def test_each_stage_runs_as_its_kind_of_job():
    assert [kind_of(s) for s in ("sample", "annotate", "evaluate")] == ["array"] * 3
    assert [kind_of(s) for s in ("sft", "logprobs", "train")] == ["launch"] * 3
    assert [kind_of(s) for s in ("pairs", "split", "join", "decontaminate", "judge-validate", "sweep")] == ["single"] * 6
    with pytest.raises(KeyError, match="no SLURM job kind for stage 'plan'"):
        kind_of("plan")


# --------------------------------------------------------------------------- resources


@pytest.mark.parametrize("settings,kind,cpus,mem,exclusive", [
    (JobSettings(gpus_per_task=2, gpus_per_node=8), "array", 16, "128G", False),  # 8 CPUs a GPU, 8G a CPU
    (JobSettings(gpus_per_task=1, gpus_per_node=4), "single", 8, "64G", False),
    (JobSettings(gpus_per_task=0, gpus_per_node=8), "single", 4, "32G", False),  # no GPU: 4 CPUs
    (JobSettings(gpus_per_task=1, gpus_per_node=4), "launch", 32, "0", True),  # a launch: the node's GPUs, all of it
    (JobSettings(gpus_per_task=3, gpus_per_node=0), "launch", 4, "0", True),
    (JobSettings(cpus_per_task=6, gpus_per_task=2), "array", 6, "48G", False),
    (JobSettings(mem="200G", exclusive=False), "launch", 64, "200G", False),
    (JobSettings(exclusive=True), "array", 8, "64G", True),
])
def test_cpus_memory_and_whole_nodes_by_kind_of_job(settings, kind, cpus, mem, exclusive):
    assert (settings.cpus_for(kind), settings.mem_for(kind), settings.exclusive_for(kind)) == (cpus, mem, exclusive)


@pytest.mark.parametrize("changes,message", [
    ({"processes_per_node": 0}, "processes_per_node: must be at least 1 (or null), got 0"),
    ({"array_parallel": 0}, "array_parallel: must be at least 1 (or null), got 0"),
    ({"cpus_per_task": 0}, "cpus_per_task: must be at least 1 (or null), got 0"),
    ({"env": {"1BAD": "x", "GOOD_1": "y"}}, "env: ['1BAD'] are not environment variable names"),
    ({"env": {5: "x"}}, "env: [5] are not environment variable names"),
    ({"mem": "12 GB"}, "mem: '12 GB' is not a SLURM memory size"),
])
def test_job_settings_refuse_what_sbatch_would(changes, message):
    with pytest.raises(ConfigError) as info:
        JobSettings(**changes)
    assert str(info.value).startswith(message)


def test_a_steps_settings_are_its_stage_types_under_its_own_and_errors_name_the_step():
    config = SlurmConfig(gpus_per_task=1, stages={"annotate": {"array": 4, "gpus_per_task": 2},
                                                  "annotate_judge": {"array": 16}})
    judge = config.for_stage("annotate", "annotate_judge")
    assert (judge.array, judge.gpus_per_task) == (16, 2)
    assert config.for_stage("annotate", "annotate_rm").array == 4
    assert config.for_stage("sample").gpus_per_task == 1
    with pytest.raises(ConfigError) as info:
        SlurmConfig(stages={"annotate_judge": {"arrray": 3}}).for_stage("annotate", "annotate_judge")
    assert str(info.value).startswith("unknown key stages.annotate_judge.'arrray' for JobSettings. Did you mean "
                                      "'array'?"), str(info.value)
    with pytest.raises(ConfigError) as info:
        SlurmConfig(stages={"annotate_judge": {"array": 0}})
    assert str(info.value) == "stages.annotate_judge: array: must be at least 1, got 0"
    with pytest.raises(ConfigError) as info:
        SlurmConfig(stages={"train": {"nodes": "four"}})
    assert str(info.value).startswith("stages.train.nodes"), str(info.value)
