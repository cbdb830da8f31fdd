"""`align` commands run in one launch of ranks that hold models partitioned (ZeRO-3); writes what each rank saw.

    DS_ACCELERATOR=cpu accelerate launch --config_file cpu_zero3.yaml zero3_stages_script.py \
        --plan PLAN.json --out OUT

PLAN.json is a list of ``{"name": ..., "argv": [...]}``: `align` command lines, run in order in
this process through the CLI entry point (``align.cli.main``), as `accelerate launch -m align
...` runs them. Every model load of a scoring pass (``align.scoring.sharded.load_scoring_model``)
and of a trainer (``load_causal_lm``) is recorded right after it returns: the bytes of
parameters this rank holds (facts.resident_parameters). After each command the forwards each
partitioned scoring model ran on this rank (real and dummy), and whether its DeepSpeed
engine was freed once the stage released it, are recorded too. Each rank writes
``OUT/facts_rank{R}.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import weakref
from pathlib import Path

from facts import resident_parameters, write_facts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--plan", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--mode", choices=["deepspeed"], default="deepspeed")  # dist_utils.deepspeed_command adds it
    cli = parser.parse_args()

    import torch

    from align.cli import main as align_main
    from align.scoring import sharded
    from align.stages import logprobs as logprobs_stage
    from align.trainers import preference_trainer, sft_trainer

    loads: list[dict] = []
    scoring_models: list = []
    command = {"name": None}

    def recorded(real, kind):
        def load(*args, **kwargs):
            model = real(*args, **kwargs)
            loads.append({"command": command["name"], "kind": kind, "path": str(args[0]),
                          **resident_parameters(model)})
            if isinstance(model, sharded.LockstepModel):
                scoring_models.append((command["name"], model, unwrapped_path(model), weakref.ref(model.module)))
            return model
        return load

    logprobs_stage.load_scoring_model = recorded(logprobs_stage.load_scoring_model, "scoring")
    sharded.load_scoring_model = recorded(sharded.load_scoring_model, "scoring")  # imported at call time by evaluate
    sft_trainer.load_causal_lm = recorded(sft_trainer.load_causal_lm, "trainer")
    preference_trainer.load_causal_lm = recorded(preference_trainer.load_causal_lm, "trainer")

    exits = {}
    for step in json.loads(cli.plan.read_text()):
        command["name"] = step["name"]
        exits[step["name"]] = align_main(step["argv"])
    gc.collect()
    forwards = [{"command": name, "path": path, "real": model.real_forwards, "dummy": model.dummy_forwards,
                 "engine_freed": engine() is None} for name, model, path, engine in scoring_models]
    write_facts(cli.out, {
        "rank": int(os.environ.get("RANK", "0")),
        "env_world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "torch_world_size": torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1,
        "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
        "zero3_init": os.environ.get("ACCELERATE_DEEPSPEED_ZERO3_INIT"),
        "exits": exits,
        "loads": loads,
        "forwards": forwards,
    })
    if torch.distributed.is_initialized():
        torch.distributed.barrier()


def unwrapped_path(model) -> str:
    from align.scoring import unwrap_model

    return str(unwrap_model(model).name_or_path)


if __name__ == "__main__":
    main()
