"""QRPO or DPO preference training (docs/method.md, QRPO; DPO and length-normalised DPO), reading reference log-probs from the data.

Reads pair rows with reference log-prob columns (``align logprobs`` output), so no
reference model sits in memory (``reference=model`` or ``reference=adapter`` for runs
that skip the offline pass). Saves the policy to ``output_dir``; resumes from the last
checkpoint there when one exists.

Single process: ``align train recipes/tiny/pipeline.yaml``. On a cluster:
``accelerate launch --config_file recipes/accelerate/zero3.yaml -m align train recipes/apertus-70b/qrpo.yaml``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from align.manifests import StageRun
from align.manifests.lifecycle import Unfinished, run_stage
from align.ranks import is_writer
from align.trainers.common import device_note, keep_hub_token_out_of_outputs, last_loss
from align.trainers.preference_config import PreferenceConfig

# what `align train --help` lists first: the keys no default can stand for
REQUIRED_KEYS = {
    "input": "pair rows with reference log-probs (an `align logprobs` output)",
    "model_name_or_path": "the policy to start from (the SFT output)",
}


@dataclass
class Config(PreferenceConfig):
    """`align.trainers.preference_config.PreferenceConfig` plus the data.

    input (str): pair rows with reference log-probs (the ``align logprobs`` output
        directory or a file).
    """

    input: str = field(default="", metadata={"help": "pair rows with ref log-probs (file or stage dir)"})
    overwrite: bool = field(default=False, metadata={"help": "redo a finished or partial output made from other settings or inputs (removes only what this stage wrote there)"})


def run(config: Config) -> dict:
    """Train ``model_name_or_path`` on the pairs in ``input``; save to ``output_dir``."""
    keep_hub_token_out_of_outputs(config)
    return run_stage("train", config, _train)


def _train(run: StageRun) -> dict | Unfinished:
    from align.trainers.guards import resumable_checkpoint
    from align.trainers.preference_trainer import train
    from align.trainers.target_tracking import summary_line

    note = device_note(run.config)  # a run that does work says where it trains (a skip says nothing more)
    if note and is_writer():
        print(f"[align train] {note}")
    config, records = run.config, run.rows["input"]
    last = resumable_checkpoint(config.output_dir, world_size=config.world_size)
    if last and config.resume_from_checkpoint is None:
        print(f"[align train] resuming from {last}")
        config.resume_from_checkpoint = last
    trainer = train(config, records)
    if not trainer.is_world_process_zero():
        return Unfinished()
    summary = {"loss_type": config.loss_type, "steps": trainer.state.global_step,
               "train_loss": last_loss(trainer), "world_size": trainer.args.world_size,
               "deepspeed": bool(trainer.is_deepspeed_enabled), **trainer.data_summary}
    tracking = trainer.target_watch.summary()
    if tracking is not None:
        summary["target_tracking"] = tracking
        line = summary_line(tracking)
        if line:
            print(f"[align train] {line}")
    return summary
