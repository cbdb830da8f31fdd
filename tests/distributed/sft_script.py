"""A few SFT steps on the tiny model, run alone or under a launcher; writes what each rank saw.

    python sft_script.py --model DIR --out OUT --mode single
    DS_ACCELERATOR=cpu accelerate launch --config_file zero2.yaml sft_script.py ... --mode deepspeed
    torchrun --nproc_per_node 2 sft_script.py ... --mode ddp

Every mode trains on the same rows with the same global batch (8 sequences per optimizer
step), so the per-step losses and the final weights must agree across modes. Each rank
writes ``OUT/facts_rank{R}.json``: world size and distributed type as the trainer saw them,
whether a DeepSpeed engine ran, the logged losses and a digest of the full weights
(gathered under ZeRO-3). The tests assert on these.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from facts import hold_at_step, rank_facts, write_facts

GLOBAL_BATCH = 8
PER_DEVICE_BATCH = 2


def sft_rows(n: int = 40) -> list[dict]:
    """Conversations of varied length and shape: system prompts, two turns, thoughts."""
    rows = []
    for i in range(n):
        messages = [
            {"role": "user", "content": f"What is {i} plus {i % 7}?" + " Explain." * (i % 4)}
        ]
        if i % 3 == 0:
            messages.insert(0, {"role": "system", "content": "You answer arithmetic questions."})
        messages.append(
            {"role": "assistant", "content": f"The sum is {i + i % 7}." + " Done." * (i % 5)}
        )
        if i % 4 == 1:
            messages.append({"role": "user", "content": "And doubled?"})
            messages.append({"role": "assistant", "content": f"Doubled it is {2 * (i + i % 7)}."})
        rows.append({"id": f"row-{i}", "messages": messages})
    return rows


def config_for(mode: str, model: str, out: Path, prompt_loss_weight: float, max_steps: int = 3,
               save_steps: int | None = None, resume: bool = False):
    """The same training setup in every mode; only the device/backend switches differ.

    ``save_steps``: checkpoint every that many steps (else none); ``resume``: start from the
    last checkpoint in ``OUT/model``.
    """
    from align.trainers.sft_config import SFTConfig

    switches = {
        "single": {"use_cpu": True},
        "ddp": {"use_cpu": True, "ddp_backend": "gloo"},
        # docs/environment.md, DeepSpeed ZeRO-2/3 on CPU: use_cpu=True would silently disable DeepSpeed.
        "deepspeed": {"use_cpu": False, "ddp_backend": "gloo"},
    }[mode]
    return SFTConfig(
        output_dir=str(out / "model"),
        model_name_or_path=model,
        bf16=False,
        report_to=[],
        seed=0,
        per_device_train_batch_size=PER_DEVICE_BATCH,
        global_batch_size=GLOBAL_BATCH,
        max_steps=max_steps,
        learning_rate=1e-3,
        optimizer="ademamix",
        ademamix_beta3=0.99,
        lr_scheduler_type="linear",
        max_grad_norm=1.0,
        logging_steps=1,
        save_strategy="steps" if save_steps else "no",
        save_steps=save_steps or 500,
        resume_from_checkpoint=True if resume else None,
        chat_date="2025-01-01",
        max_length=256,
        prompt_loss_weight=prompt_loss_weight,
        disable_tqdm=True,
        **switches,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--mode", required=True, choices=["single", "ddp", "deepspeed"])
    parser.add_argument("--prompt-loss-weight", type=float, default=0.0)
    parser.add_argument("--max-steps", type=int, default=3)
    parser.add_argument("--save-steps", type=int, default=None)
    parser.add_argument("--resume", action="store_true", help="resume from the last checkpoint in OUT/model")
    parser.add_argument("--hold-at-step", type=int, default=None,
                        help="at the end of this optimizer step, write OUT/held_at_step{S}_rank{R} and wait to be killed")
    cli = parser.parse_args()

    from align.trainers.sft_trainer import train_sft

    config = config_for(cli.mode, cli.model, cli.out, cli.prompt_loss_weight, cli.max_steps, cli.save_steps,
                        cli.resume)
    callbacks = [hold_at_step(cli.out, cli.hold_at_step)] if cli.hold_at_step else None
    trainer = train_sft(config, sft_rows(), callbacks=callbacks)
    facts = rank_facts(trainer)
    facts["gradient_accumulation_steps"] = trainer.args.gradient_accumulation_steps
    write_facts(cli.out, facts)
    print(json.dumps({k: v for k, v in facts.items() if k != "weights"}), flush=True)
    if os.environ.get("RANK") is not None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.barrier()


if __name__ == "__main__":
    main()
