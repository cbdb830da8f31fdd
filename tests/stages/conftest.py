"""Fixtures of the stage tests: tiny saved models and the stage chain.

The tiny models here are this directory's own copy (not the session-wide `tiny_dirs`),
because the reward model gets a chat template installed and saved back.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from stage_helpers import (
    TINY_DATA,
    TINY_RECIPE,
    one_torch_thread,
    run_cli,
    save_stage_models,
    subprocess_env,
)


@pytest.fixture(autouse=True)
def _one_thread():
    with one_torch_thread():
        yield


@pytest.fixture(scope="session")
def stage_models(tmp_path_factory) -> dict[str, Path]:
    return save_stage_models(tmp_path_factory.mktemp("stage_models"))


# ---------------------------------------------------------------------------------------
# Each stage run ALONE through the CLI (`align STAGE recipes/tiny/pipeline.yaml key=value`),
# reading the previous stage's output from disk. Session-scoped so that several test
# modules share one chain; each returns (output dir, what the stage printed).


@pytest.fixture(scope="session")
def stage_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("stage_chain")


@pytest.fixture(scope="session")
def sft_run(stage_root, stage_models):
    out = stage_root / "sft"
    printed = run_cli(["sft", TINY_RECIPE, f"model_name_or_path={stage_models['policy']}",
                       f"input={TINY_DATA / 'sft.jsonl'}", f"output_dir={out}"])
    return out, printed


@pytest.fixture(scope="session")
def sample_run(stage_root, sft_run):
    out = stage_root / "sample"
    printed = run_cli(["sample", TINY_RECIPE, f"prompts={TINY_DATA / 'prompts.jsonl'}", f"output_dir={out}",
                       f"sampler.model={sft_run[0]}"])
    return out, printed


@pytest.fixture(scope="session")
def annotate_run(stage_root, sample_run):
    out = stage_root / "annotate"
    printed = run_cli(["annotate", TINY_RECIPE, f"input={sample_run[0]}", f"output_dir={out}"])
    return out, printed


@pytest.fixture(scope="session")
def pairs_run(stage_root, annotate_run):
    """Through `python -m align` in a child process, as a user would type it."""
    import subprocess
    import sys

    out = stage_root / "pairs"
    done = subprocess.run(
        [sys.executable, "-m", "align", "pairs", str(TINY_RECIPE), f"input={annotate_run[0]}", f"output_dir={out}"],
        check=False, capture_output=True, text=True, env=subprocess_env(), timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out, done.stdout


@pytest.fixture(scope="session")
def logprobs_run(stage_root, sft_run, pairs_run):
    out = stage_root / "logprobs"
    printed = run_cli(["logprobs", TINY_RECIPE, f"model_name_or_path={sft_run[0]}",
                       f"input={pairs_run[0] / 'pairs.jsonl'}", f"output_dir={out}"])
    return out, printed


@pytest.fixture(scope="session")
def train_run(stage_root, sft_run, logprobs_run):
    out = stage_root / "qrpo"
    printed = run_cli(["train", TINY_RECIPE, f"model_name_or_path={sft_run[0]}", f"input={logprobs_run[0]}",
                       f"output_dir={out}"])
    return out, printed
