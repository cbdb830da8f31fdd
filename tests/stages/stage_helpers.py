"""Helpers of the stage tests: paths, running `align` in-process, tiny saved models."""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "recipes"
TINY_RECIPE = RECIPES / "tiny" / "pipeline.yaml"
TINY_DATA = RECIPES / "tiny" / "data"
DATE = "2026-01-01"  # the tiny recipe's chat_date


@contextlib.contextmanager
def one_torch_thread():
    """One torch thread: tiny models gain nothing from more, and the cores are shared."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def subprocess_env() -> dict[str, str]:
    """Environment for `python -m align` children: one thread, quiet, no SLURM leakage."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE"))}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               TRANSFORMERS_VERBOSITY="error", PYTHONUNBUFFERED="1")
    return env


def run_cli(args: list[str]) -> str:
    """`align ARGS` in-process; returns what it printed (and fails on a non-zero exit)."""
    from align.cli import main

    buffer = io.StringIO()
    previous = os.environ.get("ALIGN_TRACEBACK")
    os.environ["ALIGN_TRACEBACK"] = "1"  # a failing stage raises here, for pytest.raises
    try:
        with one_torch_thread(), contextlib.redirect_stdout(buffer):
            rc = main([str(a) for a in args])
    finally:
        if previous is None:
            os.environ.pop("ALIGN_TRACEBACK", None)
        else:
            os.environ["ALIGN_TRACEBACK"] = previous
    out = buffer.getvalue()
    assert rc == 0, f"align {' '.join(args)} exited {rc}:\n{out}"
    return out


def save_stage_models(root: Path) -> dict[str, Path]:
    """Tiny policy (no chat template, as a base model) and reward model (ChatML template)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from align.chat import install_format
    from align.testing.tiny import save_tiny_models

    paths = save_tiny_models(root)
    rm_dir = paths["reward_model"]
    tokenizer = AutoTokenizer.from_pretrained(rm_dir)
    model = AutoModelForSequenceClassification.from_pretrained(rm_dir)
    install_format(tokenizer, model, chat_format="chatml")
    model.save_pretrained(rm_dir)
    tokenizer.save_pretrained(rm_dir)
    return paths


def make_workspace(root: Path) -> Path:
    """A directory laid out like the repo root for the tiny recipe's relative paths:
    `recipes/` (linked to the repo's) and `runs/tiny_models/` as the recipe's header says."""
    from align.testing.tiny import save_tiny_models

    root.mkdir(parents=True, exist_ok=True)
    (root / "recipes").symlink_to(RECIPES, target_is_directory=True)
    save_tiny_models(root / "runs" / "tiny_models")
    return root
