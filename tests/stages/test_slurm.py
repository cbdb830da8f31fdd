"""The SLURM scripts: syntax, the job array's sharding for real, the multi-node launch line; `align submit`
dry runs from a login node.

No SLURM here: the array script runs as SLURM would run each task (plain bash with the
SLURM_ARRAY_* variables set), and the multi-node script runs against stand-ins for
`srun`, `scontrol` and `accelerate` that record what they were asked to do.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from stage_helpers import RECIPES, TINY_RECIPE, make_workspace, run_cli, subprocess_env

from align.io import STAGE_COMPLETE_MARKER, read_records, stage_completion_info

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


@pytest.mark.slow
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
    # srun: drop its options, then run the command once per task (one per node), as SLURM would
    _stub(bin_dir / "srun", 'while [[ "$1" == --* ]]; do shift; done\n'
                            'for task in $(seq 0 $((SLURM_NTASKS - 1))); do SLURM_PROCID=$task "$@" || exit; done\n')
    _stub(bin_dir / "scontrol", '[[ "$1 $2" == "show hostnames" ]] && printf "gpu-a17\\ngpu-b03\\n"\n')
    _stub(bin_dir / "accelerate", f'printf "%s\\n" "$@" >> {record}; echo ---- >> {record}\n')
    env = subprocess_env()
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", SLURM_JOB_NUM_NODES="2", SLURM_NTASKS="2",
               SLURM_JOB_NODELIST="gpu-[a17,b03]",
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


# --------------------------------------------------------------------------- the shard count of a resubmission


def test_an_explicit_shard_count_takes_the_array_task_id_as_it_is():
    from align.jobs.sharding import resolve_shard

    resubmitted = {"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_MIN": "2", "SLURM_ARRAY_TASK_COUNT": "1"}
    assert resolve_shard(None, None, resubmitted) == (0, 1)  # what the array alone says: wrong for a resubmission
    assert resolve_shard(None, 4, resubmitted) == (2, 4)
    assert resolve_shard(None, 4, {"RANK": "3", "WORLD_SIZE": "8"}) == (3, 4)
    assert resolve_shard(None, 4, {}) == (0, 4)
    assert resolve_shard(1, 4, resubmitted) == (1, 4)  # a configured shard wins over the environment
    with pytest.raises(ValueError, match=r"SLURM_ARRAY_TASK_ID=4 is not a shard of num_shards=4 .*--array=0-3"):
        resolve_shard(None, 4, {"SLURM_ARRAY_TASK_ID": "4", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "1"})


def test_the_array_script_passes_num_shards_before_the_callers_keys(tmp_path):
    """NUM_SHARDS reaches the stage as num_shards=N; a num_shards=... of the caller comes later and wins."""
    record = tmp_path / "argv.txt"
    python = tmp_path / "python"
    _stub(python, f'printf "%s\\n" "$@" > {record}\n')
    env = {k: v for k, v in subprocess_env().items() if not k.startswith("SLURM_")}
    env.update(SLURM_ARRAY_TASK_ID="2", SLURM_ARRAY_TASK_MIN="2", SLURM_ARRAY_TASK_COUNT="1", NUM_SHARDS="4",
               PYTHON=str(python))
    done = subprocess.run(["bash", str(ARRAY), "r.yaml", "batch_size=2"], capture_output=True, text=True, env=env,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert "task 2 (min 2) of 1, shards 4" in done.stdout
    assert record.read_text().split("\n")[:-1] == ["-m", "align", "annotate", "r.yaml", "num_shards=4", "batch_size=2"]
    del env["NUM_SHARDS"]
    subprocess.run(["bash", str(ARRAY), "r.yaml"], capture_output=True, text=True, env=env, check=True)
    assert record.read_text().split("\n")[:-1] == ["-m", "align", "annotate", "r.yaml"]


# --------------------------------------------------------------------------- align submit, without a cluster


def test_submit_dry_run_writes_one_script_per_stage_and_the_chain(tmp_path, monkeypatch):
    """`align submit recipes/tiny/pipeline.yaml dry_run=true`: scripts and submit.sh, nothing submitted
    (no SLURM needed; tests/slurm submits them for real)."""
    ws = make_workspace(tmp_path / "ws")
    monkeypatch.chdir(ws)
    printed = run_cli(["submit", "recipes/tiny/pipeline.yaml", "dry_run=true", "slurm.stages={annotate: {array: 3}}",
                       "slurm.sbatch_options=[--constraint=cpu]"])
    assert "dry run: nothing submitted" in printed
    logs = ws / "runs" / "tiny" / "slurm"
    stages = ["sft", "sample", "annotate", "pairs", "logprobs", "train", "evaluate"]
    assert sorted(p.name for p in logs.glob("*.sbatch")) == sorted(f"{i}-{s}.sbatch" for i, s in enumerate(stages, 1))
    assert not (logs / "jobs.json").exists()

    def options(name: str) -> dict[str, str]:
        lines = (logs / name).read_text().splitlines()
        return dict(line.removeprefix("#SBATCH --").partition("=")[::2] for line in lines if line.startswith("#SBATCH"))

    sample, annotate, train = options("2-sample.sbatch"), options("3-annotate.sbatch"), options("6-train.sbatch")
    assert sample["array"] == "0-1" and annotate["array"] == "0-2"  # the recipe's 2 shards; annotate's own 3
    assert sample["chdir"] == str(ws.resolve()) and sample["output"] == f"{logs.resolve()}/sample-%A_%a.out"
    assert sample["time"] == "00:30:00" and sample["cpus-per-task"] == "1" and "gpus-per-task" not in sample
    assert sample["mem"] == "1G"  # the recipe's own figure (the default: 8G per CPU)
    assert train["nodes"] == "1" and train["ntasks-per-node"] == "1" and "gpus-per-node" not in train
    assert "exclusive" in train and train["mem"] == "1G" and train["export"] == "ALL"  # a launch holds its node
    assert "exclusive" not in sample and sample["constraint"] == "cpu" == train["constraint"]
    recipe = next(logs.glob("recipe-*.yaml")).resolve()
    body = (logs / "3-annotate.sbatch").read_text()
    assert f'"$ALIGN_PYTHON" -m align step {recipe} annotate num_shards=3 &\n' in body
    assert f"export ALIGN_PYTHON={sys.executable}\n" in body  # the submitting environment's python by default
    launch = (logs / "6-train.sbatch").read_text()
    assert f"launch -m align step {recipe} train &\n" in launch and "launch_node.sh" in launch
    assert sample["signal"] == "B:USR1@600" and sample["open-mode"] == "append" and "requeue" in sample
    chain = (logs / "submit.sh").read_text()
    assert "JOB_SFT=$(sbatch --parsable  " in chain
    assert "JOB_ANNOTATE=$(sbatch --parsable --dependency=afterok:$JOB_SAMPLE --kill-on-invalid-dep=yes " in chain
    assert "JOB_TRAIN=$(sbatch --parsable --dependency=afterok:$JOB_SFT:$JOB_LOGPROBS --kill-on-invalid-dep=yes " \
        in chain  # after every step it reads, not only the one before
    done = subprocess.run(["bash", "-n", str(logs / "submit.sh")], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(("override", "message"), [
    ("slurm.time=43200", r"time: 43200 is a number"),
    ("slurm.stages={tokenize: {array: 2}}", r"slurm.stages: \['tokenize'\] name no step or stage"),
    ("slurm.stages={sample: {array: 0}}", r"stages\.sample[.:] ?array: must be at least 1"),
    ("slurm.stages={sample: {array: two}}", r"stages\.sample\.array: expected an integer"),
    ("slurm.gpus_per_task=-1", r"gpus_per_task: must be 0 or more"),
    ("slurm.mem=lots", r"mem: 'lots' is not a SLURM memory size"),
    ("slurm.sbatch_options=[exclusive]", r"sbatch_options: \['exclusive'\] are not options"),
    ("slurm.scripts_dir=nowhere", r"slurm.scripts_dir: .*nowhere lacks"),
])
def test_submit_refuses_bad_slurm_settings(override, message, tmp_path, monkeypatch):
    from align.stage_table import command_module as stage_module

    monkeypatch.chdir(tmp_path)  # nothing is written, and nowhere near the repository
    with pytest.raises(ValueError, match=message):
        module = stage_module("submit")
        module.run(module.config_from_args([str(TINY_RECIPE), override, "dry_run=true"]))


def test_submit_chains_the_rounds(tmp_path, monkeypatch):
    """A recipe with rounds: every step of every round is a job, each after the steps it reads (round 2's
    sampling after round 1's training)."""
    from align.stage_table import command_module as stage_module

    ws = make_workspace(tmp_path / "ws")
    monkeypatch.chdir(ws)
    module = stage_module("submit")
    with contextlib.redirect_stdout(io.StringIO()):
        module.run(module.config_from_args(["recipes/tiny/rounds.yaml", "dry_run=true", "slurm.log_dir=runs/r"]))
    chain = (ws / "runs" / "r" / "submit.sh").read_text()
    assert "JOB_ROUND_2_SAMPLE=$(sbatch --parsable --dependency=afterok:$JOB_ROUND_1_TRAIN " in chain
    assert "JOB_ROUND_2_TRAIN=$(sbatch --parsable --dependency=afterok:$JOB_ROUND_1_TRAIN:$JOB_ROUND_2_LOGPROBS " \
        in chain
    scripts = sorted(p.name for p in (ws / "runs" / "r").glob("*.sbatch"))
    assert "7-round-1.evaluate.sbatch" in scripts and "13-round-2.evaluate.sbatch" in scripts


@pytest.mark.slow
def test_one_poisoned_prompt_among_a_thousand_costs_only_itself(tmp_path, sft_run):
    """`align sample` as an array of 4 over 1,000 prompts, one of them holding the format's BOS in its text:
    every task finishes, the one prompt is a recorded skip with its reason, every other is sampled once."""
    import json

    from align.io import read_records, stage_completion_info

    prompts = [{"id": f"q{i}", "messages": [{"role": "user", "content": f"Is {i} even? Answer yes or no."}]}
               for i in range(1000)]
    prompts[617]["messages"][0]["content"] = "Is <s>617</s> even? Answer yes or no."  # HTML strikethrough
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    out = tmp_path / "sample"
    for task in range(4):
        printed = run_cli(["sample", TINY_RECIPE, f"prompts={path}", f"output_dir={out}",
                           f"sampler.model={sft_run[0]}", "n=1", "max_tokens=2", "batch_size=100",
                           "sampler.batch_size=100", "num_shards=4", f"shard_index={task}"])
        assert ("wrote" in printed) == (task == 3), printed  # the last task marks it complete
    rows = {r["id"]: r for r in read_records(out)}
    assert len(rows) == 1000 and stage_completion_info(out) is not None
    assert "special_token_text" in rows["q617"]["skip_reason"] and rows["q617"]["completions"] == []
    assert all(len(r["completions"]) == 1 and "skip_reason" not in r for rid, r in rows.items() if rid != "q617")


@pytest.mark.parametrize("size", ["apertus-8b", "apertus-70b"])
def test_status_plan_and_submit_run_on_the_apertus_pipelines_from_a_login_node(size, tmp_path, monkeypatch):
    """No GPU, no vLLM needed: the recipes' bf16 and vLLM settings are for the jobs' nodes."""
    import importlib.util

    ws = make_workspace(tmp_path / "ws")
    monkeypatch.chdir(ws)
    recipe = f"recipes/{size}/pipeline.yaml"
    status = run_cli(["status", recipe])
    assert "sft" in status and "not started" in status
    assert "jobs fit" in run_cli(["plan", recipe])
    printed = run_cli(["submit", recipe, "dry_run=true"])
    assert "dry run: nothing submitted" in printed and "a real submission would refuse" in printed
    scripts = sorted((ws / "runs" / size / "slurm").glob("*.sbatch"))
    assert len(scripts) == (11 if size == "apertus-8b" else 13)
    vllm_steps = {"classify", "sample", "sample_offline", "annotate_judge", "evaluate"}
    for script in scripts:
        step = script.stem.split("-", 1)[1]
        text = script.read_text()
        python = ".venv-vllm/bin/python" if step in vllm_steps or step == "evaluate.report" else ".venv/bin/python"
        assert f"export ALIGN_PYTHON={ws.resolve() / python}\n" in text, (step, text)
    if importlib.util.find_spec("vllm") is None:  # and the whole of it ran without vllm installed
        assert "vllm" not in sys.modules


def test_a_stale_recipe_names_every_stale_step_in_one_refusal(tmp_path, monkeypatch):
    ws = tmp_path / "ws"
    ws.mkdir()
    monkeypatch.chdir(ws)
    rows = [{"id": f"a{i}", "messages": [{"role": "user", "content": "Is 4 even?"}], "answer": "yes",
             "completions": [{"text": t, "num_tokens": 1, "finish_reason": "stop", "is_reference": True,
                              "source": "p"} for t in ("yes", "no", "yes", "no")]} for i in range(4)]
    (ws / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = {"output_dir": "runs", "steps": {
        "annotate": {"stage": "annotate", "input": "in.jsonl", "provider": "verifiable"},
        "pairs": {"stage": "pairs", "input": "@annotate"},
        "other": {"stage": "pairs", "input": "@annotate", "seed": 3}}}
    (ws / "r.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    run_cli(["pipeline", "r.yaml"])
    from align.stage_table import command_module as stage_module

    module = stage_module("submit")
    with pytest.raises(ValueError) as info:  # two steps changed, and one that reads nothing changed stays
        module.run(module.config_from_args(["r.yaml", "pairs.seed=1", "other.low_threshold=0.3", "dry_run=true"]))
    message = str(info.value)
    assert message.startswith("2 step(s) hold outputs made from other settings or inputs")
    assert "pairs (runs/pairs): pairs.seed: 0 → 1" in message and "other (runs/other): pairs.low_threshold" in message
    assert "annotate" not in message and "overwrite=true" in message
