"""What a cluster does to a long run, settled before it happens: time limits, preemption, environments,
models fetched once, code frozen per submission (align.stopping, align.drivers.submit_checks, align.slurm).

Each behaviour is checked without a cluster here; tests/slurm/test_cluster_time_limits.py runs them on a
one-machine SLURM cluster (a time limit reached, a task requeued, a partition's maximum).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from align import stopping
from align.drivers import submit_checks
from align.errors import ConfigError, ServiceError
from align.slurm.config import JobSettings, SlurmConfig
from align.slurm.scripts import StepJob

REPO = Path(__file__).resolve().parents[1]


def job(step: str, **settings) -> StepJob:
    return StepJob(step, "train", "launch", JobSettings(**settings), Path("/r.yaml"), Path("/w"), Path("/w/l"),
                   Path("/w/recipes/slurm"))


# --------------------------------------------------------------------------- time limits


def test_a_time_over_the_partitions_maximum_is_refused_naming_it():
    jobs = [job("sft", time="72:00:00"), job("pairs", time="02:00:00"), job("train")]
    fitted, problems = submit_checks.fit_time_limits(jobs, lambda partition: ("short", 86400))
    assert fitted == jobs
    assert problems == ["sft: time 72:00:00 is over partition short's maximum 1-00:00:00 (SLURM would keep the job "
                        "PENDING (PartitionTimeLimit) for good): set slurm.stages.sft.time to at most that, or "
                        "slurm.over_time_limit: chain to run it as chained attempts"]


def test_chained_attempts_ask_for_the_maximum(capsys):
    jobs = [job("sft", time="72:00:00", over_time_limit="chain", partition="short"), job("x", time="1-00:00:00")]
    asked = []
    fitted, problems = submit_checks.fit_time_limits(jobs, lambda p: asked.append(p) or (p or "d", 86400))
    assert problems == [] and [j.settings.time for j in fitted] == ["1-00:00:00", "1-00:00:00"]
    assert asked == ["short", None]  # each partition asked once
    assert "run as chained attempts" in capsys.readouterr().out


def test_without_a_limit_anywhere_nothing_is_refused():
    jobs = [job("sft", time="30-00:00:00")]
    assert submit_checks.fit_time_limits(jobs, lambda p: ("inf", None)) == (jobs, [])


def test_required_keys_name_the_steps_that_lack_them():
    jobs = [job("sft", partition="gpu"), job("pairs")]
    assert submit_checks.required_problems(jobs, ["partition", "account"]) == [
        "slurm.partition is required by this recipe (slurm.required) and unset for ['pairs']: set it, e.g. "
        "`align submit RECIPE slurm.partition=...`",
        "slurm.account is required by this recipe (slurm.required) and unset for every job: set it, e.g. "
        "`align submit RECIPE slurm.account=...`"]
    with pytest.raises(ConfigError, match=r"required: \['acount'\] are not job settings"):
        SlurmConfig(required=["acount"])


# --------------------------------------------------------------------------- environment


def test_a_steps_env_adds_to_the_top_levels():
    config = SlurmConfig(env={"HF_HOME": "/s/hf", "A": "top"}, stages={"annotate": {"env": {"A": "stage", "B": "b"}},
                                                                       "judge": {"env": {"C": "c"}}})
    assert config.for_stage("annotate", "judge").env == {"HF_HOME": "/s/hf", "A": "stage", "B": "b", "C": "c"}
    assert config.for_stage("sample", "sample").env == {"HF_HOME": "/s/hf", "A": "top"}


def test_a_variable_in_env_reaches_the_job_as_its_value_and_is_never_written(tmp_path):
    """The export lines of a job script, run by bash with the submitting environment: the token's value arrives,
    the script holds only its name, and text that is no variable stays text."""
    settings = JobSettings(env={"HF_TOKEN": "$HF_TOKEN", "CACHE": "${SCRATCH}/hf $(touch pwned)",
                                "TAGGED": "Xpre-$SCRATCH-X\\ $XDG_X"})
    script = StepJob("s", "pairs", "single", settings, Path("/r.yaml"), tmp_path, tmp_path, tmp_path).script("r")
    exports = [line for line in script.splitlines() if line.startswith(("export HF_TOKEN", "export CACHE",
                                                                         "export TAGGED"))]
    done = subprocess.run(["bash", "-c", "\n".join([*exports, 'echo "$HF_TOKEN|$CACHE|$TAGGED"'])], cwd=tmp_path,
                          env={"PATH": os.environ["PATH"], "HF_TOKEN": "hf_dummy_secret", "SCRATCH": "/scr",
                               "XDG_X": "/xdg"},
                          capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "hf_dummy_secret|/scr/hf $(touch pwned)|Xpre-/scr-X\\ /xdg"
    assert "hf_dummy_secret" not in script and not (tmp_path / "pwned").exists()


# --------------------------------------------------------------------------- models fetched once


def test_the_hub_models_of_a_recipe_are_those_no_step_makes_and_no_server_holds(monkeypatch):
    from align.drivers import load_recipe

    monkeypatch.chdir(REPO)
    recipe = load_recipe("recipes/apertus-8b/pipeline.yaml", devices="defer")
    assert submit_checks.hub_models(recipe) == {  # the SFT output (runs/...) is a step's: made on the cluster
        "swiss-ai/Apertus-8B-2509": ["sft.model_name_or_path"],
        "Qwen/Qwen3-32B": ["classify.model", "sample_offline.sampler.model", "annotate_judge.model",
                           "evaluate.reward.model"],
        "Skywork/Skywork-Reward-V2-Llama-3.1-8B": ["annotate_rm.model"]}
    served = load_recipe("recipes/apertus-8b/pipeline.yaml", ["annotate_judge.backend=openai",
                                                               "annotate_judge.base_url=http://h:8000/v1"],
                         devices="defer")
    assert "annotate_judge.model" not in submit_checks.hub_models(served).get("Qwen/Qwen3-32B", [])
    policies = load_recipe("recipes/apertus-8b/pipeline.yaml", ["evaluate.sampler.backend=openai",
                                                                 "evaluate.sampler.base_url=http://h:8000/v1"],
                           devices="defer")
    assert not any(where.startswith("evaluate.policies") for where in
                   sum(submit_checks.hub_models(policies).values(), []))


def test_models_are_fetched_into_the_cache_the_jobs_read_once(tmp_path):
    calls = []
    cached = {"org/cached"}

    def download(repo, cache_dir=None, local_files_only=False):
        calls.append((repo, cache_dir, local_files_only))
        if local_files_only and repo not in cached:
            raise FileNotFoundError(repo)

    models = {"org/cached": ["a.model"], "org/new": ["b.model", "c.tokenizer"]}
    cache = submit_checks.hub_cache({"HF_HOME": str(tmp_path / "hf")})
    assert cache == str(tmp_path / "hf" / "hub")
    lines = submit_checks.fetch_models(models, cache, dry_run=False, download=download)
    assert lines == [f"fetched org/new into {cache}"]
    assert calls == [("org/cached", cache, True), ("org/new", cache, True), ("org/new", cache, False)]
    assert submit_checks.fetch_models(models, None, dry_run=True, download=download) == [
        "would fetch org/cached into the default Hugging Face cache (named by a.model)",
        "would fetch org/new into the default Hugging Face cache (named by b.model, c.tokenizer)"]


def test_a_model_that_cannot_be_fetched_stops_the_submission_naming_it():
    def download(repo, cache_dir=None, local_files_only=False):
        raise OSError("no route to host")

    with pytest.raises(ServiceError, match=r"^fetching org/m \(named by s.model\) into /c failed: OSError: no route "
                                           r"to host; the jobs run offline"):
        submit_checks.fetch_models({"org/m": ["s.model"]}, "/c", dry_run=False, download=download)


def test_the_hub_cache_follows_the_recipes_env():
    assert submit_checks.hub_cache({}) is None
    assert submit_checks.hub_cache({"HF_HUB_CACHE": "/a/hub", "HF_HOME": "/b"}) == "/a/hub"
    os.environ["ALIGN_TEST_SCRATCH"] = "/scratch/me"
    try:
        assert submit_checks.hub_cache({"HF_HOME": "$ALIGN_TEST_SCRATCH/hf"}) == "/scratch/me/hf/hub"
    finally:
        del os.environ["ALIGN_TEST_SCRATCH"]


# --------------------------------------------------------------------------- code frozen


def test_the_code_a_submission_runs_is_a_snapshot_made_once_per_content(tmp_path):
    root = tmp_path / "checkout"
    for name in submit_checks.PACKAGES:
        (root / name / "__pycache__").mkdir(parents=True)
        (root / name / "__init__.py").write_text(f"# {name}\n")
        (root / name / "__pycache__" / "x.pyc").write_bytes(b"\0")
    first = submit_checks.code_snapshot(tmp_path / "logs", root)
    assert sorted(str(p.relative_to(first)) for p in first.rglob("*") if p.is_file()) == [
        "align/__init__.py", "charter/__init__.py", "rewards/__init__.py"]
    assert submit_checks.code_snapshot(tmp_path / "logs", root) == first
    (root / "align" / "__init__.py").write_text("# edited during the run\n")
    second = submit_checks.code_snapshot(tmp_path / "logs", root)
    assert second != first and (first / "align" / "__init__.py").read_text() == "# align\n"


def test_a_job_refuses_to_run_other_code_than_its_submission_froze(tmp_path, monkeypatch):
    monkeypatch.setenv("ALIGN_CODE", str(tmp_path / "snapshot"))
    with pytest.raises(ConfigError, match=r"this job runs align from .*, not the code its submission froze"):
        submit_checks.check_frozen_code()
    monkeypatch.setenv("ALIGN_CODE", str(submit_checks.package_root()))
    submit_checks.check_frozen_code()


def test_a_job_run_from_the_repository_root_runs_the_snapshot(tmp_path):
    """`python -m align` puts the working directory first on sys.path: a job whose --chdir is the checkout would
    import the checkout, not the snapshot; the script's PYTHONSAFEPATH keeps the snapshot first."""
    code = submit_checks.code_snapshot(tmp_path / "logs")
    script = replace(job("train"), code=code).script("r")
    exports = next(line for line in script.splitlines() if line.startswith("export PYTHONPATH="))
    probe = "import align, sys; print(align.__file__)"
    done = subprocess.run(["bash", "-c", f"{exports}\ncd {REPO}\npython -c {probe!r}\n"
                                         f"python -m align status recipes/tiny/pipeline.yaml > /dev/null"],
                          capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(code / "align" / "__init__.py")


def test_a_variable_the_submitting_shell_lacks_is_refused_before_anything_runs(monkeypatch):
    monkeypatch.delenv("ALIGN_TEST_UNSET", raising=False)
    monkeypatch.setenv("ALIGN_TEST_SET", "1")
    assert submit_checks.unset_variables({"A": "$ALIGN_TEST_SET/x", "B": "${ALIGN_TEST_UNSET}", "C": "plain"}) == [
        "slurm.env.B=${ALIGN_TEST_UNSET}: $ALIGN_TEST_UNSET is not set here"]


def test_chained_attempts_need_a_signal_and_a_requeue():
    for changes in ({"requeue": False}, {"signal_margin": 0}):
        with pytest.raises(ConfigError, match=r"over_time_limit: chain runs a step as attempts"):
            JobSettings(over_time_limit="chain", **changes)


# --------------------------------------------------------------------------- stopping at a safe point


def test_a_job_stops_after_a_whole_batch_and_a_rerun_finishes_it(tmp_path, monkeypatch):
    from align.jobs import run_job

    stop = tmp_path / "stop"
    monkeypatch.setenv(stopping.STOP_FILE_ENV, str(stop))
    rows = [{"id": f"r{i}"} for i in range(10)]
    seen = []

    def process(batch):
        seen.extend(r["id"] for r in batch)
        if len(seen) == 4:
            stop.write_text("")  # the cluster's signal, as the batch script turns it into the file
        return [{**r, "done": True} for r in batch]

    with pytest.raises(stopping.Stopped, match=r"stopped after 4 of 10 rows \(the job's stop file .* was written"):
        run_job(rows, process, tmp_path / "out", batch_size=2)
    stop.unlink()
    run_job(rows, process, tmp_path / "out", batch_size=2)
    written = [json.loads(line)["id"] for line in (tmp_path / "out" / "shard-00000-of-00001.jsonl").read_text()
               .splitlines()]
    assert sorted(written) == sorted(r["id"] for r in rows) and len(seen) == 10  # nothing redone, nothing lost


def test_a_signal_asks_for_a_stop_and_a_second_one_ends_the_process():
    code = ("import os, signal, time\nfrom align import stopping\nstopping.install()\n"
            "os.kill(os.getpid(), signal.SIGUSR1)\nprint(stopping.requested(), flush=True)\n"
            "os.kill(os.getpid(), signal.SIGUSR1)\ntime.sleep(5)\nprint('still here')\n")
    done = subprocess.run(["python", "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert "SIGUSR1 received" in done.stdout and "still here" not in done.stdout
    assert done.returncode == -10  # the second signal, as without the handler


def test_a_stopped_stage_exits_75_for_its_batch_script_to_requeue(tmp_path, monkeypatch, capsys):
    from align.cli import main

    rows = tmp_path / "in.jsonl"
    rows.write_text("".join(json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": "q"}],
                                        "answer": "yes", "completions": [{"text": "yes"}]}) + "\n" for i in range(6)))
    stop = tmp_path / "stop"
    stop.write_text("")
    monkeypatch.setenv(stopping.STOP_FILE_ENV, str(stop))
    assert main(["annotate", f"input={rows}", f"output_dir={tmp_path / 'out'}", "provider=verifiable",
                 "batch_size=2"]) == stopping.STOPPED_EXIT
    assert "stopped after 2 of 6 rows" in capsys.readouterr().err
    assert not (tmp_path / "out" / "_COMPLETE.json").exists()
    stop.unlink()
    assert main(["annotate", f"input={rows}", f"output_dir={tmp_path / 'out'}", "provider=verifiable",
                 "batch_size=2"]) == 0
    assert json.loads((tmp_path / "out" / "_COMPLETE.json").read_text())["summary"]["records"] == 6


def test_training_stopped_at_a_step_saves_and_a_rerun_ends_as_an_uninterrupted_run(tmp_path, tiny_dirs,
                                                                                   monkeypatch, capsys):
    """The cluster asks at step 3 of 6: the step's checkpoint is saved, the output is not marked, the CLI exits 75;
    run again, SFT resumes from checkpoint-3 and its weights equal those of a run never stopped."""
    import torch
    from safetensors.torch import load_file

    from align.cli import main

    def sft(out: Path) -> int:
        return main(["sft", f"model_name_or_path={tiny_dirs['policy']}", f"input={REPO / 'recipes/tiny/data/sft.jsonl'}",
                     f"output_dir={out}", "max_steps=6", "per_device_train_batch_size=8", "learning_rate=3e-3",
                     "optimizer=adamw", "seed=0", "use_cpu=true", "bf16=false", "report_to=[]", "save_strategy='no'",
                     "disable_tqdm=true", "chat_date=2026-01-01", "max_length=256"])

    assert sft(tmp_path / "whole") == 0
    asked = []

    def at_step_three() -> str | None:
        asked.append(1)
        return "SIGUSR1 received" if len(asked) == 3 else None

    monkeypatch.setattr(stopping, "requested", at_step_three)
    assert sft(tmp_path / "stopped") == stopping.STOPPED_EXIT
    assert "training stopped at step 3 after saving checkpoint-3 (SIGUSR1 received)" in capsys.readouterr().err
    assert (tmp_path / "stopped" / "checkpoint-3" / "trainer_state.json").exists()
    assert not (tmp_path / "stopped" / "_COMPLETE.json").exists()
    monkeypatch.setattr(stopping, "requested", lambda: None)
    assert sft(tmp_path / "stopped") == 0
    assert "resuming from" in capsys.readouterr().out
    whole = load_file(tmp_path / "whole" / "model.safetensors")
    resumed = load_file(tmp_path / "stopped" / "model.safetensors")
    for name, value in whole.items():
        torch.testing.assert_close(resumed[name], value, rtol=0, atol=1e-6, msg=name)


# --------------------------------------------------------------------------- align status and the jobs


def test_status_says_where_the_job_of_each_step_not_done_stands(tmp_path, monkeypatch, capsys):
    """A step done says nothing of its job; one not done gets its latest job's state from jobs.json and
    scontrol (here a stand-in), many finished tasks of an array in one line."""
    from align.cli import main
    from align.drivers import status

    rows = tmp_path / "in.jsonl"
    rows.write_text(json.dumps({"id": "a", "messages": [{"role": "user", "content": "q"}], "answer": "yes",
                                "other": "yes", "completions": [{"text": "yes"}]}) + "\n")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"""
output_dir: {tmp_path / 'runs'}
steps:
  done: {{stage: annotate, input: {rows}, provider: verifiable}}
  pending: {{stage: annotate, input: {rows}, provider: verifiable, answer_field: other}}
slurm: {{log_dir: {tmp_path / 'logs'}}}
""")
    assert main(["step", str(recipe), "done"]) == 0
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "jobs.json").write_text(json.dumps({"done": {"job_id": "11"}, "pending": {"job_id": "12"},
                                                             "gone": {"script": "x"}}))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "scontrol"
    fake.write_text(f"#!/bin/bash\necho \"$*\" >> {tmp_path / 'asked'}\ncat <<'EOF'\n" + "".join(
        f"JobId={i} ArrayJobId=12 ArrayTaskId={i} JobState=COMPLETED Reason=None Restarts=0 ExitCode=0:0 "
        f"StdOut=/l/{i}.out\n" for i in range(3)) +
        "JobId=99 ArrayJobId=12 ArrayTaskId=3 JobState=PENDING Reason=Priority Restarts=0 ExitCode=0:0 "
        "StdOut=/l/3.out\nEOF\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    capsys.readouterr()
    report = main(["status", str(recipe)])
    out = capsys.readouterr().out
    assert report == 0
    lines = out.splitlines()
    done_at = next(i for i, line in enumerate(lines) if line.startswith("done "))
    assert lines[done_at + 1].startswith("pending ")  # nothing under a step that is done
    assert (tmp_path / "asked").read_text().splitlines() == ["--oneliner show job 12"]  # the job of the step
    assert lines[done_at + 2:done_at + 4] == ["                 3 tasks COMPLETED",
                                              "                 job 12_3: PENDING (Priority)"], out
    assert status.submitted_jobs(status.config_from_args([str(recipe)])) == {"done": {"job_id": "11"},
                                                                             "pending": {"job_id": "12"}}
    (tmp_path / "logs" / "jobs.json").write_text("{not json")
    assert status.submitted_jobs(status.config_from_args([str(recipe)])) == {}


def test_many_finished_tasks_are_one_line_and_one_is_itself():
    from align.drivers.status import job_lines
    from align.slurm.commands import JobState

    done, failed, running = JobState("5_0", "COMPLETED"), JobState("5_1", "FAILED", exit_code="1:0"), \
        JobState("5_2", "RUNNING")
    assert job_lines([done, failed]) == ["job 5_1: FAILED, exit code 1", "job 5_0: COMPLETED"]
    assert job_lines([done, JobState("5_3", "COMPLETED"), running]) == ["2 tasks COMPLETED", "job 5_2: RUNNING"]
    assert job_lines([]) == []


def test_a_pipeline_asked_to_stop_stops_between_steps(tmp_path, monkeypatch, capsys):
    from align.cli import main

    rows = tmp_path / "in.jsonl"
    rows.write_text(json.dumps({"id": "a", "messages": [{"role": "user", "content": "q"}], "answer": "yes",
                                "completions": [{"text": "yes"}, {"text": "no"}]}) + "\n")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"annotate: {{input: {rows}, output_dir: {tmp_path / 'a'}, provider: verifiable}}\n"
                      f"pairs: {{input: {tmp_path / 'a'}, output_dir: {tmp_path / 'p'}}}\n")
    asked = []
    monkeypatch.setattr(stopping, "requested", lambda: "SIGTERM received" if asked.append(1) or len(asked) > 2 else None)
    assert main(["pipeline", str(recipe)]) == stopping.STOPPED_EXIT
    assert "stopped before step pairs (SIGTERM received): run the pipeline again" in capsys.readouterr().err
    assert (tmp_path / "a" / "_COMPLETE.json").exists() and not (tmp_path / "p").exists()


def test_a_model_partitioned_over_a_launch_of_one_process_gets_its_process_group(monkeypatch):
    import torch.distributed as dist

    from align.scoring.sharded import init_distributed
    from ports import free_port

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    try:
        init_distributed()
        assert dist.is_initialized() and dist.get_world_size() == 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
