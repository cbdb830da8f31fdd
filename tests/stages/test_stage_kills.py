"""The long stages, killed with SIGKILL mid-run through the CLI, then rerun with the same command.

Each test runs the stage once uninterrupted, then starts the same command in a child process,
waits until a number of rows (at least one, drawn from a seeded generator: the seed and the
row count are printed; ``ALIGN_KILL_SEED`` replays them, see tests/kill_points.py) sits
complete in the job's shard file,
kills the whole process group with SIGKILL and reruns the command. The rows written before
the kill are kept byte for byte, every id appears exactly once (none lost, none twice), and
the output equals the uninterrupted run's. `batch_size=1` (one row per append) in both runs
gives the kill many points to land between and the same batches either way.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from kill_points import KILL_SEED_ENV, complete_lines, kill_once_written, kill_rng
from stage_helpers import TINY_DATA, TINY_RECIPE, run_cli, subprocess_env

from align.io import STAGE_COMPLETE_MARKER, read_records, stage_completion_info

pytestmark = pytest.mark.slow

SHARD = "shard-00000-of-00001.jsonl"


def kill_and_resume(stage_args: list[str], out: Path, total: int, log: Path, seed: int) -> tuple[bytes, str]:
    """`align STAGE_ARGS output_dir=OUT`, SIGKILLed after a seeded random number of rows, then rerun.

    Returns the complete rows written before the kill and what the rerun printed.
    """
    command = [sys.executable, "-m", "align", *map(str, stage_args), f"output_dir={out}"]
    shard = out / SHARD
    rng, seed = kill_rng(seed, f"align {stage_args[0]}")
    after = rng.randint(1, max(1, total // 2))
    print(f"[kill points] align {stage_args[0]}: SIGKILL once {after} of {total} rows are written", flush=True)
    replay = f"(kill seed {seed}, aimed after {after} rows; replay: {KILL_SEED_ENV}={seed})"
    returncode = kill_once_written(command, shard, after, log, env=subprocess_env(), deadline_s=300)
    assert returncode == -signal.SIGKILL, f"{replay}\n{log.read_text()[-3000:]}"
    written = complete_lines(shard)
    lines = written.count(b"\n")
    print(f"[kill points] align {stage_args[0]}: killed with {lines} rows written", flush=True)
    assert after <= lines < total, f"the kill should land mid-stage, it came after {lines} of {total} rows {replay}"
    assert not (out / STAGE_COMPLETE_MARKER).exists(), replay

    again = subprocess.run(command, env=subprocess_env(), capture_output=True, text=True, timeout=600, check=False)
    assert again.returncode == 0, f"{replay}\n" + again.stdout[-2000:] + again.stderr[-3000:]
    assert shard.read_bytes().startswith(written), f"rows from before the kill changed {replay}"
    return written, again.stdout


def assert_same_rows(resumed: Path, once: Path, expected_ids: set[str], stage: str) -> None:
    rows = read_records(resumed)
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), f"rows written twice: {sorted(i for i in set(ids) if ids.count(i) > 1)}"
    assert set(ids) == expected_ids, f"rows lost: {sorted(expected_ids - set(ids))}"
    by_id = lambda rs: sorted(rs, key=lambda r: r["id"])
    assert by_id(rows) == by_id(read_records(once))
    info, reference = stage_completion_info(resumed), stage_completion_info(once)
    assert info is not None and info["stage"] == stage and info["summary"] == reference["summary"]


PROMPT_IDS = {r["id"] for r in read_records(TINY_DATA / "prompts.jsonl")}


def test_killed_sample_stage_resumes_to_the_uninterrupted_output(tmp_path, sft_run):
    args = ["sample", TINY_RECIPE, f"prompts={TINY_DATA / 'prompts.jsonl'}", f"sampler.model={sft_run[0]}",
            "batch_size=1"]
    run_cli([*args, f"output_dir={tmp_path / 'once'}"])
    kill_and_resume(args, tmp_path / "killed", len(PROMPT_IDS), tmp_path / "killed.log", seed=11)
    assert_same_rows(tmp_path / "killed", tmp_path / "once", PROMPT_IDS, "sample")


def test_killed_judge_annotation_resumes_to_the_uninterrupted_output(tmp_path, sample_run, sft_run):
    charter = tmp_path / "charter.md"
    charter.write_text("# Test charter\n\n## 1. Answers\n[1.1] Answer the question that was asked.\n"
                       "[1.2] Keep short answers short.\n")
    args = ["annotate", TINY_RECIPE, f"input={sample_run[0]}", "provider=judge", "backend=transformers",
            f"model={sft_run[0]}", f"charter={charter}", "scale=[1,9]", "top_k_pairwise=2", "device=cpu",
            "batch_size=1"]
    run_cli([*args, f"output_dir={tmp_path / 'once'}"])
    kill_and_resume(args, tmp_path / "killed", len(PROMPT_IDS), tmp_path / "killed.log", seed=12)
    assert_same_rows(tmp_path / "killed", tmp_path / "once", PROMPT_IDS, "annotate")


def test_killed_logprobs_stage_resumes_to_the_uninterrupted_output(tmp_path, pairs_run, sft_run):
    pairs = pairs_run[0] / "pairs.jsonl"
    ids = {r["id"] for r in read_records(pairs)}
    assert len(ids) >= 4, "the tiny chain should give a few pairs to kill between"
    args = ["logprobs", TINY_RECIPE, f"model_name_or_path={sft_run[0]}", f"input={pairs}", "batch_size=1"]
    run_cli([*args, f"output_dir={tmp_path / 'once'}"])
    kill_and_resume(args, tmp_path / "killed", len(ids), tmp_path / "killed.log", seed=13)
    assert_same_rows(tmp_path / "killed", tmp_path / "once", ids, "logprobs")
