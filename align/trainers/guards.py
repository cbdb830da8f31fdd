"""What keeps a long training run from being lost or marked complete when it is broken.

- **A diverged run stops.** ``check_finite_loss`` (every training step) and
  ``check_finite_weights`` (after the last step, before the model is saved) raise
  ``TrainingDivergedError`` naming the step and the last good checkpoint: a NaN loss is
  never logged as 0 and written as a finished model (transformers' ``logging_nan_inf_filter``
  would hide it in the logs).
- **Checkpoints come.** ``save_every_minutes`` saves by wall clock as well as by
  ``save_steps`` (which may be a ratio of the run, ``0.05``: every 5%).
- **A torn checkpoint is never resumed from.** ``CheckpointRecords`` writes
  ``align_checkpoint.json`` into each checkpoint once it is saved whole (the world size and
  ZeRO stage it was saved with); ``resumable_checkpoint`` takes the newest checkpoint that
  has it and a readable ``trainer_state.json``, skips a torn one with a warning, and refuses
  to resume DeepSpeed optimizer states saved by another number of ranks, naming both.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from align import stopping
from align.errors import AlignError, ConfigError
from align.io.ledger import note
from align.ranks import any_rank

logger = logging.getLogger(__name__)

CHECKPOINT_RECORD = "align_checkpoint.json"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


class TrainingDivergedError(AlignError, RuntimeError):
    """The loss or the weights are not finite: the run stops, unmarked, naming the step."""


@dataclass
class CheckpointFields:
    """When a trainer saves, besides ``save_steps``.

    save_every_minutes (`float` or `None`, default `None`):
        Also save a checkpoint once this many minutes passed since the last one (a 70B run's
        steps can take minutes each); `None`: by `save_steps` alone.
    """

    save_every_minutes: float | None = field(default=None, metadata={
        "help": "also save once this many minutes passed since the last checkpoint; None: save_steps alone"})


def check_checkpoint_fields(config: Any) -> None:
    minutes = config.save_every_minutes
    if minutes is not None and not minutes > 0:
        raise ConfigError(f"save_every_minutes={minutes}: must be > 0, or None")


def last_checkpoint_name(output_dir: str | Path) -> str:
    found = resumable_checkpoint(output_dir, quiet=True)
    return f"the last good checkpoint is {found}" if found else "no checkpoint was saved yet"


def check_finite_loss(trainer: Any, loss: torch.Tensor) -> None:
    """Stop at the first step whose loss is not finite."""
    value = loss.detach()
    if not bool(torch.isfinite(value).all()):
        step = trainer.state.global_step + 1
        raise TrainingDivergedError(
            f"the loss is {value.float().mean().item()} at step {step}: training diverged (a learning rate or beta "
            f"too large, or bad data); {last_checkpoint_name(trainer.args.output_dir)}. Nothing is marked complete")


def check_finite_weights(trainer: Any) -> None:
    """Stop before saving a model with a weight that is not finite (every rank checks its own part)."""
    model = trainer.model_wrapped if getattr(trainer, "model_wrapped", None) is not None else trainer.model
    bad = []
    for name, param in model.named_parameters():
        tensor = getattr(param, "ds_tensor", None)  # ZeRO-3: this rank's partition
        tensor = param.data if tensor is None or tensor.numel() == 0 else tensor
        if tensor.numel() and not bool(torch.isfinite(tensor).all()):
            bad.append(name)
    count = torch.tensor([len(bad)], dtype=torch.int64,
                         device=trainer.args.device if torch.distributed.is_initialized() and
                         torch.distributed.get_backend() == "nccl" else "cpu")
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.MAX)
    if int(count.item()):
        names = ", ".join(bad[:5]) or "on another rank"
        raise TrainingDivergedError(
            f"after step {trainer.state.global_step} some weights are not finite ({names}): training diverged; "
            f"{last_checkpoint_name(trainer.args.output_dir)}. The model is not saved and nothing is marked complete")


class StopOnRequest(TrainerCallback):
    """At a step's end, when the cluster asked this job to stop (``align.stopping``) on any rank: save a checkpoint
    and end training, on every rank at the same step; the stage then stops without marking its output."""

    def __init__(self) -> None:
        self.reason: str | None = None

    def on_step_end(self, args, state, control, **kwargs):
        reason = stopping.requested()
        if any_rank(reason is not None):
            self.reason = reason or "another rank was asked to stop"
            control.should_save = True
            control.should_training_stop = True
        return control


def raise_if_stopped(trainer: Any) -> None:
    """After ``trainer.train()``: a run ended early on request stops the stage (its checkpoint is its progress)."""
    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, StopOnRequest) and callback.reason is not None:
            raise stopping.Stopped(f"training stopped at step {trainer.state.global_step} after saving "
                                   f"checkpoint-{trainer.state.global_step} ({callback.reason}): run the step again to "
                                   "resume from it")


class CheckpointRecords(TrainerCallback):
    """Note each checkpoint in the stage's ledger before it is written, save by wall clock, and record a
    checkpoint as whole once it is saved (``align_checkpoint.json``)."""

    def __init__(self, every_minutes: float | None = None):
        self.every = every_minutes
        self.last = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        if self.every is not None and time.monotonic() - self.last >= self.every * 60:
            control.should_save = True
        if control.should_save:
            note(Path(args.output_dir) / f"checkpoint-{state.global_step}")  # before the trainer writes it
        return control

    def on_save(self, args, state, control, **kwargs):
        self.last = time.monotonic()
        path = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if state.is_world_process_zero and path.is_dir():
            record = {"global_step": state.global_step, "world_size": args.world_size,
                      "deepspeed": bool(args.deepspeed or os.environ.get("ACCELERATE_USE_DEEPSPEED") == "true"),
                      "saved_at": time.time()}
            tmp = path / f".{CHECKPOINT_RECORD}.tmp"
            tmp.write_text(json.dumps(record))
            os.replace(tmp, path / CHECKPOINT_RECORD)
        return control


def _whole(path: Path) -> dict[str, Any] | None:
    """The checkpoint's record when it was saved whole, else None. The trainer writes
    ``trainer_state.json`` after the weights and optimizer states; ``align_checkpoint.json``
    (when present) comes last and must agree with it."""
    try:
        state = json.loads((path / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return None
    step = int(_CHECKPOINT.match(path.name).group(1))
    if not isinstance(state, dict) or state.get("global_step") != step:
        return None
    try:
        record = json.loads((path / CHECKPOINT_RECORD).read_text())
    except (OSError, ValueError):
        return {"global_step": step}
    return record if isinstance(record, dict) and record.get("global_step") == step else None


def resumable_checkpoint(output_dir: str | Path, *, world_size: int | None = None, quiet: bool = False) -> str | None:
    """The newest checkpoint saved whole (torn ones are skipped with a warning); None if there is none.

    With ``world_size``: a checkpoint of a DeepSpeed run saved by another number of ranks is
    refused (its optimizer states are partitioned per rank).
    """
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return None
    found = sorted(((int(m.group(1)), p) for p in output_dir.iterdir() if (m := _CHECKPOINT.match(p.name))
                    and p.is_dir()), reverse=True)
    for step, path in found:
        record = _whole(path)
        if record is None:
            if not quiet:
                logger.warning("%s was not saved whole (killed while saving?): resuming from an earlier checkpoint",
                               path)
                print(f"[align] {path} was not saved whole (killed while saving?); skipping it")
            continue
        saved = record.get("world_size")
        if world_size is not None and record.get("deepspeed") and isinstance(saved, int) and saved != world_size:
            raise ConfigError(f"{path} was saved by {saved} DeepSpeed ranks; this launch has {world_size}. Its "
                              "optimizer states are partitioned per rank: resume with the same number of ranks "
                              "(nodes x GPUs), or start over in another output_dir")
        return str(path)
    return None
