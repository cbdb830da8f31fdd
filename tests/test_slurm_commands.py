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
