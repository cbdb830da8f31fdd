"""What a rank saw during a run, written as JSON for the distributed tests to assert on.

Kept apart from the test files so the launched scripts import only this (no pytest).
"""

from __future__ import annotations

import hashlib
import json
import os
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch


def _gathered(model: torch.nn.Module, zero_stage: int | None):
    """Context in which every parameter is whole on this rank (ZeRO-3 shards them)."""
    if zero_stage == 3:
        import deepspeed

        return deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None)
    return nullcontext()


def weights_digest(model: torch.nn.Module, zero_stage: int | None) -> tuple[str, int]:
    """SHA-256 over every parameter (name order, float32 bytes) and the element count."""
    digest, count = hashlib.sha256(), 0
    with _gathered(model, zero_stage):
        for name, param in sorted(model.named_parameters(), key=lambda item: item[0]):
            data = param.detach().to(torch.float32).contiguous().cpu()
            digest.update(name.encode())
            digest.update(data.numpy().tobytes())
            count += data.numel()
    return digest.hexdigest(), count


def resident_parameters(model: torch.nn.Module) -> dict[str, int]:
    """Bytes of parameters this rank holds against the whole model's, measured on the tensors.

    A ZeRO-3 partition counts its local piece (``p.ds_tensor``) and, for the whole, its full
    size (``p.ds_numel``); any other parameter counts whole in both. ``data_bytes`` is what
    the parameters' ``.data`` hold (0 when every weight is partitioned and none is gathered).
    """
    while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
        model = model.module
    held = whole = data = partitioned = count = 0
    for param in model.parameters():
        count += 1
        data += param.data.numel() * param.element_size()
        if hasattr(param, "ds_tensor"):
            partitioned += 1
            held += param.ds_tensor.numel() * param.ds_tensor.element_size()
            whole += param.ds_numel * param.element_size()
        else:
            held += param.numel() * param.element_size()
            whole += param.numel() * param.element_size()
    return {"held_bytes": held, "whole_bytes": whole, "data_bytes": data, "partitioned": partitioned,
            "parameters": count}


def _optimizer_chain(optimizer: Any) -> list[str]:
    """Class names from the outer wrapper (Accelerate, DeepSpeed) down to the real optimizer."""
    chain, seen = [], set()
    while optimizer is not None and id(optimizer) not in seen:
        seen.add(id(optimizer))
        chain.append(type(optimizer).__name__)
        optimizer = getattr(optimizer, "optimizer", None)
    return chain


def _innermost_settings(optimizer: Any) -> dict[str, Any]:
    """Hyperparameters of the real optimizer's first group (AdEMAMix: betas, alpha, warmups)."""
    while getattr(optimizer, "optimizer", None) is not None:
        optimizer = optimizer.optimizer
    group = optimizer.param_groups[0]
    keys = ("betas", "alpha", "t_alpha", "t_beta3", "eps", "weight_decay")
    return {
        k: list(group[k]) if isinstance(group[k], tuple) else group[k] for k in keys if k in group
    }


def rank_facts(trainer: Any) -> dict[str, Any]:
    """World size, distributed type, DeepSpeed engine and stage, losses and weight digest."""
    plugin = getattr(trainer.accelerator.state, "deepspeed_plugin", None)
    zero_stage = (
        plugin.zero_stage if (plugin is not None and trainer.is_deepspeed_enabled) else None
    )
    digest, count = weights_digest(trainer.model, zero_stage)
    wrapped = trainer.model_wrapped
    return {
        "rank": int(os.environ.get("RANK", "0")),
        "env_world_size": int(os.environ.get("WORLD_SIZE", "1")),
        # torchrun's node rank (GROUP_RANK) and the rank within the node
        "node_rank": int(os.environ.get("GROUP_RANK", "0")),
        "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
        "trainer_world_size": trainer.args.world_size,
        "num_processes": trainer.accelerator.num_processes,
        "distributed_type": str(trainer.accelerator.distributed_type),
        "deepspeed_enabled": bool(trainer.is_deepspeed_enabled),
        "engine": type(wrapped).__name__,
        "ddp_wrapped": isinstance(wrapped, torch.nn.parallel.DistributedDataParallel),
        "zero_stage": zero_stage,
        "torch_distributed": torch.distributed.is_initialized(),
        "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
        "optimizer_chain": _optimizer_chain(trainer.optimizer),
        "optimizer_settings": _innermost_settings(trainer.optimizer),
        "losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
        "global_step": trainer.state.global_step,
        "weights_sha256": digest,
        "num_weights": count,
    }


def write_facts(out: Path, facts: dict[str, Any]) -> None:
    """Write ``out/facts_rank{R}.json`` for this rank."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"facts_rank{facts['rank']}.json").write_text(json.dumps(facts, indent=1))


def held_marker(out: Path, step: int, rank: int) -> Path:
    """The file a rank writes when it holds at ``step`` (see ``hold_at_step``)."""
    return out / f"held_at_step{step}_rank{rank}"


def hold_at_step(out: Path, step: int, limit_s: float = 900.0):
    """A callback that, at the end of optimizer step ``step``, writes ``held_marker`` and waits to be
    killed: the kill tests kill on the markers of every rank, so the kill lands at that point of the
    run (after the checkpoint before it, before the next one) however fast the machine is. Exits
    with status 3 if nobody kills it within ``limit_s``.
    """
    import time

    from transformers import TrainerCallback

    class HoldAtStep(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step != step:
                return
            rank = int(os.environ.get("RANK", "0"))
            out.mkdir(parents=True, exist_ok=True)
            held_marker(out, step, rank).write_text(json.dumps({"rank": rank, "global_step": state.global_step}))
            deadline = time.monotonic() + limit_s
            while time.monotonic() < deadline:
                time.sleep(0.1)
            os._exit(3)

    return HoldAtStep()
