"""The SLURM client calls `align submit` and `align status` make, against stand-in commands on PATH.

Each stand-in records its arguments and answers as SLURM does (a job id, ``ID;CLUSTER``, an
error on stderr, squeue's lines), so what is asked and how each answer is read are checked
without a cluster (tests/slurm runs them against a real one).
"""

from __future__ import annotations

import stat

import pytest

from align.errors import ServiceError
from align.slurm import commands


@pytest.fixture()
def fake(tmp_path, monkeypatch):
    """``fake(name, stdout, stderr, rc)``: a command on PATH that records its argv in ``calls``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))  # the stand-ins alone (a real SLURM client may be installed here)
    calls = tmp_path / "calls"

    def make(name: str, stdout: str = "", stderr: str = "", rc: int = 0, sleep: float = 0) -> None:
        (tmp_path / f"{name}.out").write_text(stdout)
        (tmp_path / f"{name}.err").write_text(stderr)
        script = bin_dir / name
        script.write_text(f'#!/bin/bash\necho "{name} $*" >> {calls}\n/bin/sleep {sleep}\n'
                          f"/bin/cat {tmp_path / f'{name}.out'}\n/bin/cat {tmp_path / f'{name}.err'} >&2\nexit {rc}\n")
        script.chmod(script.stat().st_mode | stat.S_IEXEC)

    make.calls = lambda: calls.read_text().splitlines() if calls.exists() else []  # type: ignore[attr-defined]
    return make


def test_sbatch_submits_after_its_dependencies_and_returns_the_job_id(fake, tmp_path):
    fake("sbatch", "4242;cluster-a\n")
    assert commands.sbatch(tmp_path / "1-sft.sbatch", after=["17", "18"]) == "4242"
    fake("sbatch", "99\n")
    assert commands.sbatch(tmp_path / "2-sample.sbatch") == "99"
    assert fake.calls() == [
        f"sbatch --parsable --dependency=afterok:17:18 --kill-on-invalid-dep=yes {tmp_path / '1-sft.sbatch'}",
        f"sbatch --parsable {tmp_path / '2-sample.sbatch'}"]
    assert commands.dependency_options([]) == [] and commands.dependency_options(iter(["5"])) == \
        ["--dependency=afterok:5", "--kill-on-invalid-dep=yes"]


def test_sbatch_answers_that_are_not_a_job_id_or_an_exit_are_errors_naming_the_answer(fake, tmp_path):
    fake("sbatch", "Submitted batch job 7\n")
    with pytest.raises(ServiceError, match=r"^sbatch answered 'Submitted batch job 7', not a job id$"):
        commands.sbatch(tmp_path / "s.sbatch")
    fake("sbatch", "", "sbatch: error: Batch job submission failed:\nInvalid account\n", rc=1)
    with pytest.raises(ServiceError) as info:
        commands.sbatch(tmp_path / "s.sbatch")
    assert str(info.value) == (f"`sbatch --parsable {tmp_path / 's.sbatch'}` failed (exit 1): sbatch: error: Batch job "
                               "submission failed: | Invalid account")
    fake("sbatch", "no stderr, the reason on stdout\n", rc=2)
    with pytest.raises(ServiceError, match=r"failed \(exit 2\): no stderr, the reason on stdout$"):
        commands.sbatch(tmp_path / "s.sbatch")


def test_a_login_node_without_slurm_or_a_controller_that_hangs_is_one_clear_error(fake, tmp_path):
    with pytest.raises(ServiceError, match=r"^sbatch not found on PATH: align submit needs the SLURM client"):
        commands.sbatch(tmp_path / "s.sbatch")
    with pytest.raises(ServiceError, match=r"^sbatch not found on PATH$"):
        commands.sbatch_test_only(tmp_path / "s.sbatch")
    fake("squeue", "1 RUNNING\n", sleep=5)
    with pytest.raises(ServiceError, match=r"^`squeue --noheader` did not answer in 0.5 s"):
        commands._run(["squeue", "--noheader"], timeout=0.5)
    fake("sbatch", "", sleep=5)
    with pytest.raises(ServiceError, match=r"^sbatch --test-only .*s.sbatch did not answer in 0.5 s$"):
        commands.sbatch_test_only(tmp_path / "s.sbatch", timeout=0.5)


def test_test_only_returns_what_slurm_said_and_refusals_name_the_script(fake, tmp_path):
    fake("sbatch", "", "sbatch: Job 3 to start at 2026-01-01T00:00:00 using 8 processors\n")
    assert commands.sbatch_test_only(tmp_path / "a.sbatch") == \
        "sbatch: Job 3 to start at 2026-01-01T00:00:00 using 8 processors"
    assert fake.calls() == [f"sbatch --test-only {tmp_path / 'a.sbatch'}"]
    fake("sbatch", "partial\n", "sbatch: error: Requested node configuration is not available\n", rc=1)
    with pytest.raises(ServiceError) as info:
        commands.sbatch_test_only(tmp_path / "a.sbatch")
    assert str(info.value) == (f"sbatch --test-only {tmp_path / 'a.sbatch'} refused it: sbatch: error: Requested node "
                               "configuration is not available\npartial")


def test_active_jobs_are_the_asked_ones_still_queued_or_running(fake):
    fake("squeue", "12 RUNNING\n13 COMPLETED\n14 PENDING\n12 PENDING\n15 REQUEUED\nmalformed\n16 RUNNING x\n"
                   "99 RUNNING\n")
    assert commands.active_jobs(["12", "13", "14", "15", "16"]) == {"12": "RUNNING", "14": "PENDING", "15": "REQUEUED"}
    assert fake.calls() == ["squeue --noheader --array --format=%F %T"]
    assert commands.active_jobs([]) == {} and len(fake.calls()) == 1  # nothing asked: squeue is not called


# --------------------------------------------------------------------------- time limits


@pytest.mark.parametrize(("text", "seconds"), [
    ("30", 1800), ("30:15", 1815), ("12:00:00", 43200), ("72:00:00", 259200), ("1-00:00:00", 86400),
    ("2-12", 216000), ("2-12:30", 217800), ("0-00:02:00", 120), ("3-01:02:03", 262923), (" 45 ", 2700),
    ("UNLIMITED", None), ("infinite", None), (None, None), ("", None),
])
def test_a_slurm_time_in_every_form_slurm_takes(text, seconds):
    assert commands.slurm_seconds(text) == seconds


def test_seconds_written_as_a_slurm_time():
    assert [commands.slurm_time(s) for s in (86400, 259200, 90061, 59)] == \
        ["1-00:00:00", "3-00:00:00", "1-01:01:01", "0-00:00:59"]


SHOW_PARTITIONS = (
    "PartitionName=long AllowGroups=ALL Default=NO MaxTime=3-00:00:00 Nodes=n[1-4] State=UP\n"
    "PartitionName=short AllowGroups=ALL Default=YES MaxTime=1-00:00:00 Nodes=n[1-8] State=UP\n")


def test_a_partitions_maximum_time_is_read_from_scontrol(fake):
    fake("scontrol", SHOW_PARTITIONS)
    assert commands.partition_max_time(None) == ("short", 86400)  # the cluster's default partition
    fake("scontrol", SHOW_PARTITIONS.splitlines()[0] + "\n")
    assert commands.partition_max_time("long") == ("long", 259200)
    fake("scontrol", "PartitionName=free Default=NO MaxTime=UNLIMITED State=UP\n")
    assert commands.partition_max_time("free") == ("free", None)
    assert fake.calls()[:2] == ["scontrol --oneliner show partition", "scontrol --oneliner show partition long"]
    fake("scontrol", "")
    with pytest.raises(ServiceError, match=r"^scontrol show partition gone named no partition$"):
        commands.partition_max_time("gone")
    fake("scontrol", "PartitionName=a Default=NO MaxTime=1:00:00\nPartitionName=b Default=NO MaxTime=2:00:00\n")
    with pytest.raises(ServiceError, match=r"^scontrol show partition \(the default\) named no partition$"):
        commands.partition_max_time(None)  # no default: the job would need a partition named


def test_a_scontrol_value_may_hold_an_equals_sign():
    assert commands.key_values("JobId=5 Comment=a=b StdOut=/w/x.out  Flag") == {
        "JobId": "5", "Comment": "a=b", "StdOut": "/w/x.out"}


# --------------------------------------------------------------------------- where a job stands


SHOW_ARRAY = (
    "JobId=71 ArrayJobId=70 ArrayTaskId=0 JobName=align-sample JobState=COMPLETED Reason=None Restarts=0 "
    "ExitCode=0:0 StdOut=/w/logs/sample-70_0.out\n"
    "JobId=72 ArrayJobId=70 ArrayTaskId=1 JobName=align-sample JobState=FAILED Reason=NonZeroExitCode Restarts=1 "
    "ExitCode=2:0 StdOut=/w/logs/sample-70_1.out\n"
    "JobId=73 ArrayJobId=70 ArrayTaskId=2 JobName=align-sample JobState=RUNNING Reason=None Restarts=0 "
    "ExitCode=0:0 StdOut=/w/logs/sample-70_2.out\n")


def test_a_jobs_tasks_as_scontrol_reports_them(fake):
    fake("scontrol", SHOW_ARRAY)
    states = commands.job_states("70")
    assert [s.describe() for s in states] == [
        "job 70_0: COMPLETED, log /w/logs/sample-70_0.out",
        "job 70_1: FAILED, exit code 2, attempt 2 (requeued 1 time), log /w/logs/sample-70_1.out",
        "job 70_2: RUNNING, log /w/logs/sample-70_2.out"]
    assert states[1] == commands.JobState("70_1", "FAILED", "NonZeroExitCode", "2:0", 1, "/w/logs/sample-70_1.out")
    assert fake.calls()[-1] == "scontrol --oneliner show job 70"
    fake("scontrol", SHOW_ARRAY.splitlines()[1] + "\n")
    assert [s.job_id for s in commands.job_states("72")] == ["70_1"]  # a task asked for by its own job id
    fake("scontrol", "JobId=80 JobName=align-pairs JobState=PENDING Reason=Dependency Restarts=0 ExitCode=0:0 "
                     "StdOut=/w/logs/pairs-80.out\n")
    assert [s.describe() for s in commands.job_states("80")] == ["job 80: PENDING (Dependency)"]
    fake("scontrol", "JobId=81 JobState=TIMEOUT Reason=TimeLimit Restarts=3 ExitCode=0:15 StdOut=/w/l.out\n")
    assert [s.describe() for s in commands.job_states("81")] == [
        "job 81: TIMEOUT, exit code 0 (signal 15), attempt 4 (requeued 3 times), log /w/l.out"]


@pytest.mark.parametrize(("state", "exit_code", "restarts", "reason", "said"), [
    ("PENDING", "0:15", 1, "BeginTime", "job 9: PENDING (BeginTime), attempt 2 (requeued 1 time)"),
    ("PENDING", "0:0", 0, "None", "job 9: PENDING"),
    ("PENDING", "0:0", 0, "", "job 9: PENDING"),
    ("RUNNING", "0:15", 2, "None", "job 9: RUNNING, attempt 3 (requeued 2 times), log l.out"),
    ("COMPLETED", "1:0", 0, "None", "job 9: COMPLETED, log l.out"),
    ("COMPLETING", "1:0", 0, "None", "job 9: COMPLETING, log l.out"),
    ("FAILED", "1:0", 0, "NonZeroExitCode", "job 9: FAILED, exit code 1, log l.out"),
    ("FAILED", "", 0, "None", "job 9: FAILED, log l.out"),
    ("CANCELLED", "0:0", 0, "None", "job 9: CANCELLED, log l.out"),
    ("OUT_OF_MEMORY", "0:125", 0, "OutOfMemory", "job 9: OUT_OF_MEMORY, exit code 0 (signal 125), log l.out"),
])
def test_what_status_says_of_a_job_in_each_state(state, exit_code, restarts, reason, said):
    """A requeued job keeps the exit code of the attempt before: while it waits or runs again, that is no
    verdict; a pending job's reason is said, SLURM's None is not."""
    assert commands.JobState("9", state, reason, exit_code, restarts, "l.out").describe() == said


def test_a_query_that_hangs_is_no_answer(fake):
    fake("scontrol", "JobId=1 JobState=RUNNING\n", sleep=5)
    assert commands._answer(["scontrol", "show", "job", "1"], timeout=0.5) == ""


def test_a_failed_query_is_no_answer(fake):
    fake("scontrol", SHOW_ARRAY, "slurm_load_jobs error\n", rc=1)
    fake("sacct", "", rc=1)
    assert commands.job_states("70") == []  # what a failing scontrol printed is not read


def test_a_job_the_controller_forgot_is_read_from_accounting(fake):
    fake("scontrol", "", "slurm_load_jobs error: Invalid job id specified\n", rc=1)
    fake("sacct", "90|FAILED|1:0\n90.batch|FAILED|1:0\n91|CANCELLED by 0|0:0\n")
    assert [s.describe() for s in commands.job_states("90")] == ["job 90: FAILED, exit code 1",
                                                               "job 91: CANCELLED"]
    assert fake.calls()[-1] == "sacct --noheader --parsable2 --jobs 90 --format=JobID,State,ExitCode"


def test_without_slurm_commands_a_job_is_unknown(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert commands.job_states("5") == []
