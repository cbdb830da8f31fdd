"""A few QRPO steps on the tiny model, run alone or under a launcher; writes what each rank saw.

    python qrpo_script.py --model DIR --data PAIRS.jsonl --out OUT --mode single
    DS_ACCELERATOR=cpu accelerate launch --config_file zero3.yaml qrpo_script.py ... \
        --mode deepspeed

PAIRS.jsonl holds pair rows with their reference log-probs (from `align.logprobs`), so no
reference model is in memory (docs/method.md, What the trainer computes). Every mode trains with 4 pairs per optimizer step
(2 per device, accumulating to 4), so losses and weights must agree across modes. Each
rank writes ``OUT/facts_rank{R}.json`` (see facts.py); the model is saved to ``OUT/model``.

A `GenerationEvalCallback` generates on 6 prompts at the start and every 2 steps (under
ZeRO-3 it must gather the sharded weights to generate); what it logged goes into the facts.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from facts import hold_at_step, rank_facts, write_facts

GLOBAL_PAIRS = 4
PER_DEVICE_PAIRS = 2
CHAT_DATE = "2025-01-01"
MAX_LENGTH = 128


def config_for(mode: str, model: str, out: Path, max_steps: int = 3, save_steps: int | None = None,
               resume: bool = False, lora: bool = False):
    """The same QRPO setup in every mode; only the device/backend switches differ.

    ``save_steps``: checkpoint every that many steps (else none); ``resume``: start from the
    last checkpoint in ``OUT/model``; ``lora``: train a LoRA adapter (r=4) instead of all weights.
    """
    from align.trainers.preference_config import PreferenceConfig

    world = int(os.environ.get("WORLD_SIZE", "1"))
    switches = {
        "single": {"use_cpu": True},
        "ddp": {"use_cpu": True, "ddp_backend": "gloo"},
        "deepspeed": {
            "use_cpu": False,
            "ddp_backend": "gloo",
        },  # use_cpu=True would disable DeepSpeed
    }[mode]
    return PreferenceConfig(
        output_dir=str(out / "model"),
        model_name_or_path=model,
        loss_type="qrpo",
        bf16=False,
        report_to=[],
        seed=0,
        per_device_train_batch_size=PER_DEVICE_PAIRS,
        gradient_accumulation_steps=GLOBAL_PAIRS // (PER_DEVICE_PAIRS * world),
        max_steps=max_steps,
        learning_rate=1e-3,
        max_grad_norm=1.0,
        logging_steps=1,
        save_strategy="steps" if save_steps else "no",
        save_steps=save_steps or 500,
        resume_from_checkpoint=True if resume else None,
        **({"lora_r": 4, "lora_alpha": 8, "lora_dropout": 0.0} if lora else {}),
        disable_tqdm=True,
        max_length=MAX_LENGTH,
        chat_date=CHAT_DATE,
        **switches,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--mode", required=True, choices=["single", "ddp", "deepspeed"])
    parser.add_argument("--max-steps", type=int, default=3)
    parser.add_argument("--save-steps", type=int, default=None)
    parser.add_argument("--resume", action="store_true", help="resume from the last checkpoint in OUT/model")
    parser.add_argument("--hold-at-step", type=int, default=None,
                        help="at the end of this optimizer step, write OUT/held_at_step{S}_rank{R} and wait to be killed")
    parser.add_argument("--lora", action="store_true")
    parser.add_argument("--no-gen-eval", action="store_true", help="leave the generation callback out")
    cli = parser.parse_args()

    from transformers import AutoTokenizer

    from align.eval.callback import GenerationEvalCallback
    from align.trainers.preference_trainer import train
    from rewards.verifiable import VerifiableReward

    rows = [json.loads(line) for line in Path(cli.data).read_text().splitlines() if line.strip()]
    prompts = [{"id": f"eval-{i}", "messages": [{"role": "user", "content": f"What is {i} plus 1?"}],
                "answer": str(i + 1)} for i in range(6)]
    tokenizer = AutoTokenizer.from_pretrained(cli.model)
    callback = GenerationEvalCallback(prompts, VerifiableReward(), tokenizer, eval_steps=2, chat_date=CHAT_DATE,
                                      max_tokens=8, batch_size=4)
    config = config_for(cli.mode, cli.model, cli.out, cli.max_steps, cli.save_steps, cli.resume, cli.lora)
    callbacks = ([] if cli.no_gen_eval else [callback]) + \
        ([hold_at_step(cli.out, cli.hold_at_step)] if cli.hold_at_step else [])
    trainer = train(config, rows, tokenizer=tokenizer, callbacks=callbacks or None)
    facts = rank_facts(trainer)
    facts["gradient_accumulation_steps"] = trainer.args.gradient_accumulation_steps
    facts["gen_eval"] = callback.history
    facts["gen_eval_logged"] = [{k: v for k, v in entry.items() if k.startswith("gen_eval/") or k == "step"}
                                for entry in trainer.state.log_history if any(k.startswith("gen_eval/") for k in entry)]
    write_facts(cli.out, facts)
    print(json.dumps({k: v for k, v in facts.items() if k != "weights"}), flush=True)


if __name__ == "__main__":
    main()
