"""Selective activation checkpointing: recompute only a decoder layer's attention or its MLP.

transformers checkpoints whole decoder layers (``activation_checkpointing: true``), every
layer or every ``every_n_layers``-th (``activation_checkpointing_kwargs``), with the saved
inputs on the host if asked (``offload``). A whole layer is the most memory saved and the
most recomputed: the backward runs the layer's forward again, MLP included, which is about
a third more compute per step. ``checkpoint_modules`` picks a part of each checkpointed layer
instead:

- ``layer`` (default): the whole layer (transformers' own);
- ``mlp``: only the MLP is recomputed. Its activations (gate, up, their product: three
  (tokens × intermediate) tensors, about 10× hidden per token for Llama shapes) are the
  largest a layer keeps; attention's stay.
- ``attention``: only attention (its projections and the kernel) is recomputed; the MLP's
  activations stay. Less memory saved, less recomputed.

The layers chosen, the checkpoint function and its options (``use_reentrant``, ``offload``)
are transformers' own: when training starts the Trainer marks the layers to checkpoint
(``activation_checkpointing_enable``); then ``SelectiveCheckpointing``, a callback, unmarks
each and runs its attention or MLP under that same function instead.
"""

from __future__ import annotations

import functools
import types
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import TrainerCallback

from align.errors import ConfigError

CHECKPOINT_MODULES = ("layer", "attention", "mlp")
# A decoder layer's parts by the names transformers' models give them
_PARTS = {"attention": ("self_attn", "attention", "attn", "self_attention"),
          "mlp": ("mlp", "feed_forward", "ffn")}


@dataclass
class RecomputeFields:
    """What a checkpointed layer recomputes.

    checkpoint_modules (`str`, default `"layer"`):
        With `activation_checkpointing` on: `"layer"` recomputes each checkpointed decoder
        layer whole (transformers' own), `"mlp"` only its MLP, `"attention"` only its
        attention. Which layers are checkpointed is `activation_checkpointing_kwargs`'s
        `every_n_layers` (every layer by default).
    """

    checkpoint_modules: str = field(default="layer", metadata={"help": "with activation_checkpointing: layer | "
                                                                          "mlp | attention (what each checkpointed "
                                                                          "layer recomputes)"})


def check_recompute_fields(config: Any) -> None:
    """``checkpoint_modules`` is one of the parts; a part is recomputed only by non-reentrant checkpointing."""
    if config.checkpoint_modules not in CHECKPOINT_MODULES:
        raise ConfigError(f"checkpoint_modules={config.checkpoint_modules!r}: choose one of "
                          f"{list(CHECKPOINT_MODULES)}")
    kwargs = getattr(config, "activation_checkpointing_kwargs", None) or \
        getattr(config, "gradient_checkpointing_kwargs", None) or {}
    if config.checkpoint_modules != "layer" and isinstance(kwargs, dict) and kwargs.get("use_reentrant"):
        raise ConfigError(f"checkpoint_modules={config.checkpoint_modules!r} with use_reentrant=true: a layer "
                          "passes its hidden states to its attention and MLP by keyword, which reentrant "
                          "checkpointing does not differentiate; leave use_reentrant unset (false)")


def check_part(part: str) -> None:
    """A part of a layer to checkpoint alone: one of ``_PARTS`` (``layer`` is transformers' own)."""
    if part not in _PARTS:
        raise ConfigError(f"checkpoint_modules={part!r}: a part is one of {list(_PARTS)}")


def decoder_part(layer: torch.nn.Module, part: str) -> torch.nn.Module:
    """The layer's attention or MLP submodule, by the names transformers' models use."""
    for name in _PARTS[part]:
        module = getattr(layer, name, None)
        if isinstance(module, torch.nn.Module):
            return module
    raise ConfigError(f"checkpoint_modules={part!r}: {type(layer).__name__} has no {part} submodule named one of "
                      f"{list(_PARTS[part])}; use checkpoint_modules=layer")


def _checkpointed_forward(module: torch.nn.Module, checkpoint: Any) -> None:
    """``module.forward`` run under ``checkpoint`` while training with gradients (else as it is)."""
    def run(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        forward = functools.partial(type(self).forward, self)  # the class's: a copy of the model runs its own
        if self.training and torch.is_grad_enabled():
            return checkpoint(forward, *args, **kwargs)
        return forward(*args, **kwargs)

    module.forward = types.MethodType(run, module)
    module._align_checkpointed = True


def checkpoint_parts(model: torch.nn.Module, part: str) -> int:
    """Each decoder layer transformers marked for checkpointing: unmarked, its ``part`` checkpointed instead
    (with the layer's own checkpoint function). Returns how many layers changed; calling it again changes none."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    check_part(part)
    changed = 0
    for layer in model.modules():
        if isinstance(layer, GradientCheckpointingLayer) and layer.gradient_checkpointing:
            module = decoder_part(layer, part)
            layer.gradient_checkpointing = False
            if not getattr(module, "_align_checkpointed", False):
                _checkpointed_forward(module, layer._gradient_checkpointing_func)
            changed += 1
    return changed


class SelectiveCheckpointing(TrainerCallback):
    """At the start of training (the Trainer has just marked the layers to checkpoint), each marked layer's
    ``part`` is checkpointed instead of the whole layer."""

    def __init__(self, part: str):
        check_part(part)
        self.part = part

    def on_train_begin(self, args: Any, state: Any, control: Any, model: torch.nn.Module | None = None,
                       **kwargs: Any) -> None:
        if model is None or not checkpointing_on(args):
            return
        marked = checkpoint_parts(model, self.part)
        already = any(getattr(m, "_align_checkpointed", False) for m in model.modules())
        if not marked and not already:
            raise ConfigError(f"checkpoint_modules={self.part!r}: {type(model).__name__} has no decoder layer "
                              "that transformers checkpoints; use checkpoint_modules=layer")


def checkpointing_on(args: Any) -> bool:
    """Whether the run checkpoints activations (transformers 5.19+ name, or the old one)."""
    return bool(getattr(args, "activation_checkpointing", False) or getattr(args, "gradient_checkpointing", False))
