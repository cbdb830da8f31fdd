"""`align pipeline recipes/tiny/pipeline.yaml` end to end, rerun, and killed then resumed.

Each run happens in a workspace laid out as the recipe's header says (`recipes/` and
`runs/tiny_models/` under the working directory), with the exact documented command. The
only override is `sample.batch_size=1` (one prompt per job append), which gives the kill
test 24 points to land between; both runs use it, so their outputs must be equal.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from stage_helpers import make_workspace, run_cli, subprocess_env

from align.io import STAGE_COMPLETE_MARKER, read_records, stage_completion_info

STAGES = ("sft", "sample", "annotate", "pairs", "logprobs", "train", "evaluate")
OUTPUTS = {"sft": "sft", "sample": "sample", "annotate": "annotate", "pairs": "pairs", "logprobs": "logprobs",
           "train": "qrpo", "evaluate": "evaluate"}
COMMAND = ["pipeline", "recipes/tiny/pipeline.yaml", "sample.batch_size=1"]


def tree_digest(root: Path) -> dict[str, str]:
    """sha256 of every file under root (relative path -> digest)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def out_dir(workspace: Path, stage: str) -> Path:
    return workspace / "runs" / "tiny" / OUTPUTS[stage]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The whole pipeline, in-process, as `align pipeline recipes/tiny/pipeline.yaml`."""
    from align.recipe import config_builds

    workspace = make_workspace(tmp_path_factory.mktemp("pipeline"))
    before = len(config_builds())
    with contextlib.chdir(workspace):
        printed = run_cli(COMMAND)
    uninterrupted_builds.extend(config_builds()[before:])
    return workspace, printed


uninterrupted_builds: list[str] = []  # the step configs the uninterrupted run built, in order


def test_a_pipeline_run_builds_each_step_config_once(uninterrupted):
    assert uninterrupted_builds == list(STAGES)


def test_pipeline_runs_every_stage_in_order(uninterrupted):
    workspace, printed = uninterrupted
    starts = [printed.index(f"[align pipeline] step {s} ({s})\n") for s in STAGES]
    assert starts == sorted(starts)
    for stage in STAGES:
        assert f"[align {stage}] wrote runs/tiny/{OUTPUTS[stage]}\n" in printed
        info = stage_completion_info(out_dir(workspace, stage))
        assert info is not None and info["stage"] == stage
    pairs = read_records(out_dir(workspace, "pairs") / "pairs.jsonl")
    logprobs = read_records(out_dir(workspace, "logprobs"))
    assert len(pairs) > 0 and {r["id"] for r in logprobs} == {r["id"] for r in pairs}
    assert stage_completion_info(out_dir(workspace, "train"))["summary"]["steps"] == 4
    assert (out_dir(workspace, "train") / "model.safetensors").is_file()
    report = stage_completion_info(out_dir(workspace, "evaluate"))["summary"]
    assert report["prompts"] == 16 and len(report["verdicts"]) == 4
    assert (out_dir(workspace, "evaluate") / "report.md").is_file()


def test_rerun_skips_every_stage_and_changes_nothing(uninterrupted):
    workspace, _ = uninterrupted
    before = tree_digest(workspace / "runs" / "tiny")
    with contextlib.chdir(workspace):
        printed = run_cli(COMMAND)
    for stage in STAGES:
        assert f"[align {stage}] runs/tiny/{OUTPUTS[stage]} is already complete; skipping" in printed
    assert "wrote" not in printed
    assert tree_digest(workspace / "runs" / "tiny") == before


def test_python_api_reports_what_each_stage_did(uninterrupted):
    """`align.pipeline(recipe, overrides..., key=value)`: a stage redone by a changed setting is
    `made`, with every stage after it that reads its output; the others are `skipped`."""
    import shutil

    import align

    workspace, _ = uninterrupted
    copy = workspace.parent / "api-copy"
    shutil.copytree(workspace, copy, symlinks=True)
    with contextlib.chdir(copy), contextlib.redirect_stdout(None):
        report = align.pipeline("recipes/tiny/pipeline.yaml", "sample.batch_size=1", "pairs.seed=1", overwrite=True,
                                stop_after="logprobs")
    assert list(report) == list(STAGES[:5])
    assert {name: step["outcome"] for name, step in report.items()} == {
        "sft": "skipped", "sample": "skipped", "annotate": "skipped", "pairs": "made", "logprobs": "made"}
    assert report["pairs"]["output_dir"] == "runs/tiny/pairs" and report["pairs"]["summary"]["prompts"] == 24


def _complete_lines(path: Path) -> bytes:
    data = path.read_bytes() if path.exists() else b""
    return data[: data.rfind(b"\n") + 1]


def test_killed_pipeline_resumes_without_redoing_finished_work(tmp_path, uninterrupted):
    """SIGKILL inside the sample stage (after some prompts were appended), then rerun."""
    workspace = make_workspace(tmp_path / "ws")
    command = [sys.executable, "-m", "align", *COMMAND]
    shard = out_dir(workspace, "sample") / "shard-00000-of-00001.jsonl"
    log = (tmp_path / "first.log").open("w")
    first = subprocess.Popen(command, cwd=workspace, env=subprocess_env(), stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not _complete_lines(shard) and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        os.killpg(first.pid, signal.SIGKILL)
    finally:
        first.wait(timeout=60)
        log.close()
    assert first.returncode == -signal.SIGKILL, (tmp_path / "first.log").read_text()[-3000:]
    written = _complete_lines(shard)
    lines = written.count(b"\n")
    assert 1 <= lines < 24, f"the kill should land inside the sample stage, after {lines} of 24 prompts"
    sft_marker = out_dir(workspace, "sft") / STAGE_COMPLETE_MARKER
    sft_files = tree_digest(out_dir(workspace, "sft"))
    sft_mtime = sft_marker.stat().st_mtime_ns
    assert not (out_dir(workspace, "sample") / STAGE_COMPLETE_MARKER).exists()

    second = subprocess.run(command, cwd=workspace, env=subprocess_env(), capture_output=True, text=True,
                            timeout=300, check=False)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-3000:]
    assert "[align sft] runs/tiny/sft is already complete; skipping" in second.stdout
    assert "[align sft] wrote" not in second.stdout
    assert sft_marker.stat().st_mtime_ns == sft_mtime and tree_digest(out_dir(workspace, "sft")) == sft_files
    # the sample job resumed: the prompts appended before the kill are kept as they were
    assert shard.read_bytes().startswith(written)
    for stage in STAGES[1:]:
        assert f"[align {stage}] wrote runs/tiny/{OUTPUTS[stage]}" in second.stdout

    # same result as the uninterrupted run: records, rewards, pairs, ref log-probs, summaries
    reference, _ = uninterrupted
    key = lambda rows: sorted(rows, key=lambda r: r["id"])
    for stage in ("sample", "annotate", "logprobs"):
        assert key(read_records(out_dir(workspace, stage))) == key(read_records(out_dir(reference, stage))), stage
    for name in ("pairs.jsonl", "skipped.jsonl"):
        assert read_records(out_dir(workspace, "pairs") / name) == read_records(out_dir(reference, "pairs") / name)
    for stage in STAGES:
        resumed, once = stage_completion_info(out_dir(workspace, stage)), stage_completion_info(out_dir(reference, stage))
        if stage in ("sft", "train"):  # trainer summaries carry the loss; counts must match exactly
            assert resumed["summary"]["steps"] == once["summary"]["steps"], stage
        else:
            assert resumed["summary"] == once["summary"], stage
