"""What each ``checkpoint_modules`` choice keeps for backward, per decoder layer, at a real model's shape.

    python bench/checkpoint_memory.py                       # Llama-3-8B-like layer, 2,048 tokens
    python bench/checkpoint_memory.py --hidden 2048 --intermediate 5632 --heads 16 --kv-heads 8 --tokens 1024

Builds one decoder layer of the given shape (random weights, float32 on CPU unless
``--dtype bfloat16``), runs one forward and backward of a (1, tokens) batch, and counts the
bytes autograd keeps between them (a saved-tensors hook; each storage once): without
checkpointing, with transformers' whole-layer checkpointing, and with only the attention or
only the MLP checkpointed. The counts are the activation memory a GPU holds per layer per
sequence of that length: the figure does not depend on the device, so a CPU gives it. It
prints each choice against no checkpointing and against whole layers, and the extra forward
FLOPs each recomputes (the matrix products of the part it reruns).
"""

from __future__ import annotations

import argparse
import copy
import json

import torch


def layer_model(args: argparse.Namespace):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=256, hidden_size=args.hidden, intermediate_size=args.intermediate,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.kv_heads, max_position_embeddings=args.tokens)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(getattr(torch, args.dtype)).train()


class Kept:
    """The storages autograd keeps for backward inside the decoder layers: saved tensors, and the inputs a
    checkpoint holds to run its part again (each storage once; the weights, which backward also reads, not)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.storages: dict[int, int] = {}
        self.inside = False
        self.weights = {p.untyped_storage().data_ptr() for p in model.parameters()}  # saved, but not activations

    def note(self, value) -> None:
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            if storage.data_ptr() not in self.weights:
                self.storages[storage.data_ptr()] = storage.nbytes()
        elif isinstance(value, (tuple, list)):
            for item in value:
                self.note(item)
        elif isinstance(value, dict):
            for item in value.values():
                self.note(item)

    def pack(self, tensor):
        if self.inside:
            self.note(tensor)
        return tensor

    def counting(self, checkpoint):
        """``checkpoint`` that notes the inputs it holds."""
        def run(function, *args, **kwargs):
            self.note(args)
            self.note(kwargs)
            return checkpoint(function, *args, **kwargs)
        return run


def kept_bytes(model, choice: str | None, tokens: int) -> int:
    """Bytes kept for backward per decoder layer over one forward, with ``choice`` checkpointed."""
    from align.trainers.checkpointing import checkpoint_parts

    model = copy.deepcopy(model)
    kept = Kept(model)
    if choice is not None:
        model.activation_checkpointing_enable()
        for layer in model.model.layers:
            layer._gradient_checkpointing_func = kept.counting(layer._gradient_checkpointing_func)
        if choice != "layer":
            checkpoint_parts(model, choice)
    layers = model.model.layers
    hooks = [layers[0].register_forward_pre_hook(lambda *_: setattr(kept, "inside", True)),
             layers[-1].register_forward_hook(lambda *_: setattr(kept, "inside", False))]
    ids = torch.randint(0, 256, (1, tokens), generator=torch.Generator().manual_seed(0))
    with torch.autograd.graph.saved_tensors_hooks(kept.pack, lambda tensor: tensor):
        hidden = model.model(input_ids=ids).last_hidden_state
    hidden.float().square().mean().backward()
    for hook in hooks:
        hook.remove()
    return sum(kept.storages.values()) // len(layers)


def recomputed_flops(args: argparse.Namespace, choice: str | None) -> int:
    """Forward FLOPs of the matrix products a choice runs again per layer (attention's kernel not counted)."""
    head = args.hidden // args.heads
    attention = 2 * args.tokens * args.hidden * (2 * args.hidden + 2 * args.kv_heads * head)
    mlp = 2 * args.tokens * 3 * args.hidden * args.intermediate
    return {None: 0, "attention": attention, "mlp": mlp, "layer": attention + mlp}[choice]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--intermediate", type=int, default=14336)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args(argv)
    model = layer_model(args)
    kept = {choice: kept_bytes(model, choice, args.tokens) for choice in (None, "attention", "mlp", "layer")}
    forward = recomputed_flops(args, "layer")
    print(f"one decoder layer: hidden {args.hidden}, intermediate {args.intermediate}, heads {args.heads}/"
          f"{args.kv_heads}, {args.tokens} tokens, {args.dtype}\n")
    print("| checkpoint_modules | kept per layer (MiB) | vs none | vs whole layer | forward recomputed |")
    print("|---|---|---|---|---|")
    for choice, size in kept.items():
        label = "(no checkpointing)" if choice is None else choice
        print(f"| {label} | {size / 2**20:,.1f} | {size / kept[None]:.2f}x | {size / kept['layer']:.2f}x | "
              f"{recomputed_flops(args, choice) / forward:.0%} of the layer's |")
    print(json.dumps({"settings": vars(args), "kept_bytes_per_layer": {str(k): v for k, v in kept.items()}}))


if __name__ == "__main__":
    main()
