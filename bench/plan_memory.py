"""Measure one GPU's memory for a training step and a forward pass, against `align plan`'s formulas.

A random-weight model of the shape given (Apertus-like by default: xIELU MLP, QK-norm,
grouped-query attention, untied 131k vocabulary) is built in bf16 on one GPU and run as
align's trainers run it without DeepSpeed: a micro-batch of ``--sequences`` × ``--length``
tokens, the loss through align.scoring's tiled LM head, backward, one AdEMAMix step. For
each phase it prints PyTorch's allocated bytes next to the plan's part for it:

  weights              allocated after building the model
  activations          allocated after the forward (graph alive) minus before it
  backward peak        peak during backward minus the weights (activations + head + gradients)
  optimizer states     allocated after the step minus weights and gradients
  forward (no grad)    peak of a forward under inference mode minus the weights

    python bench/plan_memory.py                       # Apertus-like, 1.0B parameters
    python bench/plan_memory.py --checkpointing       # with activation checkpointing
    python bench/plan_memory.py --mlp gated --model-type llama   # a Llama-shaped model

It needs a CUDA GPU (numbers on CPU mean nothing here); docs/memory-plan.md, "Measured",
has the numbers of an H100.
"""

from __future__ import annotations

import argparse
import json

import torch


def build(args: argparse.Namespace):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        args.model_type, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        head_dim=args.hidden // args.heads, vocab_size=args.vocab, tie_word_embeddings=False,
        max_position_embeddings=max(4096, args.length))
    config._attn_implementation = args.attn
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    return config, model


def loss_of(model, input_ids: torch.Tensor) -> torch.Tensor:
    """Mean token log-prob through align.scoring's tiled head (the preference trainer's path)."""
    from align.scoring.logps import tiled_token_logps

    hidden = model.model(input_ids=input_ids, use_cache=False).last_hidden_state
    keep = torch.ones_like(input_ids, dtype=torch.bool)
    keep[:, -1] = False
    targets = input_ids[:, 1:].reshape(-1)
    return -tiled_token_logps(hidden[keep], model.lm_head, targets).mean()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-type", default="apertus")
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=10752)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=131072)
    parser.add_argument("--sequences", type=int, default=2)
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--attn", default="sdpa")
    parser.add_argument("--checkpointing", action="store_true")
    args = parser.parse_args()

    from align.optim import build_optimizer
    from align.plan.memory import (
        ForwardJob,
        Launch,
        TrainingJob,
        forward_memory,
        training_memory,
    )
    from align.plan.optimizer_states import optimizer_layout
    from align.plan.shapes import model_shape

    torch.manual_seed(0)
    config, model = build(args)
    if args.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    shape = model_shape(config)
    gib = float(1 << 30)
    alloc = torch.cuda.memory_allocated
    weights = alloc()
    ids = torch.randint(0, args.vocab, (args.sequences, args.length), device="cuda")
    base = alloc()

    plan_job = TrainingJob(shape, args.sequences, args.length, args.checkpointing, 2,
                           optimizer_layout("ademamix"), "tiled")
    plan = training_memory(plan_job, Launch(1, 0))
    forward_plan = forward_memory(ForwardJob(shape, args.sequences * args.length, 2, "tiled"), Launch(1, 0))

    torch.cuda.reset_peak_memory_stats()
    loss = loss_of(model, ids)
    after_forward = alloc()
    forward_peak = torch.cuda.max_memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss.backward()
    backward_peak = torch.cuda.max_memory_allocated()
    grads = alloc() - base
    optimizer = build_optimizer("ademamix", [p for p in model.parameters()], lr=1e-6, total_steps=10)
    torch.cuda.reset_peak_memory_stats()
    optimizer.step()
    step_peak = torch.cuda.max_memory_allocated()
    states = alloc() - base - grads
    optimizer.zero_grad(set_to_none=True)
    del loss
    torch.cuda.empty_cache()

    model.eval()
    before = alloc()
    torch.cuda.reset_peak_memory_stats()
    with torch.inference_mode():
        hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state
        from align.scoring.logps import tiled_token_logps

        tiled_token_logps(hidden[:, :-1].reshape(-1, hidden.shape[-1]), model.lm_head, ids[:, 1:].reshape(-1))
    inference_peak = torch.cuda.max_memory_allocated() - before

    measured = {
        "weights": weights, "activations_after_forward": after_forward - base, "forward_peak_above_weights":
        forward_peak - base, "backward_peak_above_weights": backward_peak - base, "gradients": grads,
        "optimizer_states": states, "step_peak": step_peak, "inference_peak_above_weights": inference_peak,
    }
    planned = {p.name: p.bytes for p in plan.parts}
    planned["total"] = plan.total
    # the first step: no optimizer states exist during the first backward
    planned["backward_peak_above_weights"] = plan.part("gradients") + plan.phase_bytes("backward")
    planned["step_peak"] = plan.phase_bytes("always") + plan.phase_bytes("step")
    planned["inference_peak_above_weights"] = forward_plan.total - forward_plan.part("weights")
    print(json.dumps({"shape": {k: getattr(shape, k) for k in ("num_params", "hidden_size", "num_layers",
                                                              "intermediate_size", "vocab_size")},
                      "checkpointing": args.checkpointing, "tokens": args.sequences * args.length,
                      "measured_gib": {k: round(v / gib, 3) for k, v in measured.items()},
                      "planned_gib": {k: round(v / gib, 3) for k, v in planned.items()}}, indent=1))


if __name__ == "__main__":
    main()
