"""A model's shape and parameter count from its ``config.json`` alone (no weights loaded).

Two counts that must agree: ``count_params`` writes the formula down (embeddings,
attention with grouped-query heads, the MLP, norms, a tied or untied head; docs/memory-plan.md,
"Parameters"), and ``count_on_meta`` builds the model on PyTorch's ``meta`` device (shapes
without storage) and sums what transformers itself would allocate. The plan uses the meta
count wherever transformers knows the architecture, the formula otherwise.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from align.errors import ConfigError

# Model types whose MLP is one up and one down projection (no gate): Apertus uses xIELU
# (Apertus report §3.1). Every other decoder the plan knows uses a gated MLP (SwiGLU).
PLAIN_MLP_TYPES = frozenset({"apertus", "gpt2", "gpt_neox", "gpt_bigcode", "opt", "falcon"})
# Model types that normalise queries and keys per head (QK-norm: a head_dim weight each).
QK_NORM_TYPES = frozenset({"apertus", "qwen3", "qwen3_moe"})
# Activations with trainable scalars per layer (xIELU: α_p and α_n, Apertus report §C.1).
ACTIVATION_SCALARS = {"xielu": 2}


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a decoder that memory depends on.

    ``num_params`` and ``num_tensors`` count each shared tensor once (a tied head is the
    embedding); ``largest_layer_params`` is the largest single module's own parameters
    (DeepSpeed's ``model_to_params``: the ZeRO-3 working set); ``head`` is ``lm`` (a
    vocabulary head) or ``score`` (a sequence classifier with ``num_labels`` outputs).
    """

    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    gated_mlp: bool
    qk_norm: bool
    attention_bias: bool
    hidden_act: str
    max_position_embeddings: int | None
    head: str
    num_labels: int
    num_params: int
    num_tensors: int
    largest_layer_params: int
    counted_by: str  # "meta" (transformers on the meta device) or "formula"

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim


def _get(config: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        value = config.get(name) if isinstance(config, dict) else getattr(config, name, None)
        if value is not None:
            return value
    return default


def _require(config: Any, where: str, *names: str) -> int:
    value = _get(config, *names)
    if value is None:
        raise ConfigError(f"{where}: the model config has no {' / '.join(names)}; give model_config=PATH "
                          "(a config.json with hidden_size, num_hidden_layers, num_attention_heads, "
                          "intermediate_size, vocab_size)")
    return _positive(value, where, names[0])


def _positive(value: Any, where: str, name: str) -> int:
    """A model dimension: a positive whole number (a string, NaN, 0 or 2.5 is a config that cannot be planned)."""
    import math

    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and float(value).is_integer() and value >= 1
    if not ok:
        raise ConfigError(f"{where}: the model config's {name} is {value!r}, not a positive whole number; fix the "
                          "config.json, or give model_config=PATH")
    return int(value)


DIMENSIONS = (("hidden_size", "n_embd", "d_model"), ("num_attention_heads", "n_head"),
              ("num_hidden_layers", "n_layer", "num_layers"), ("intermediate_size", "ffn_dim"), ("vocab_size",))


def text_config(config: Any) -> Any:
    """The language model's part of a (possibly multimodal) config."""
    getter = getattr(config, "get_text_config", None)
    return getter() if callable(getter) else config


def is_sequence_classifier(config: Any) -> bool:
    architectures = _get(config, "architectures", default=None) or []
    return any(str(a).endswith("ForSequenceClassification") for a in architectures)


def count_params(config: Any, where: str = "model") -> dict[str, int]:
    """The formula: parameters, parameter tensors and the largest module, by part.

    Per layer: attention h·(q + 2·kv) + q·h (+ biases), QK-norm 2·d_head, two norms 2·h,
    MLP 3·h·f gated or 2·h·f plain (+ trainable activation scalars); then the embedding
    V·h, the final norm h and the head (V·h untied, 0 tied; num_labels·h for a classifier).
    """
    config = text_config(config)
    h = _require(config, where, "hidden_size", "n_embd", "d_model")
    layers = _require(config, where, "num_hidden_layers", "n_layer", "num_layers")
    heads = _require(config, where, "num_attention_heads", "n_head")
    kv_heads = int(_get(config, "num_key_value_heads", default=heads))
    head_dim = int(_get(config, "head_dim", default=h // heads))
    f = _require(config, where, "intermediate_size", "ffn_dim")
    vocab = _require(config, where, "vocab_size")
    model_type = str(_get(config, "model_type", default=""))
    gated = model_type not in PLAIN_MLP_TYPES
    qk_norm = model_type in QK_NORM_TYPES
    bias = bool(_get(config, "attention_bias", default=False))
    q, kv = heads * head_dim, kv_heads * head_dim
    scalars = ACTIVATION_SCALARS.get(str(_get(config, "hidden_act", "hidden_activation", default="")), 0)

    attention = h * q + 2 * h * kv + q * h + ((q + 2 * kv) if bias else 0)
    mlp = (3 if gated else 2) * h * f + scalars
    layer = attention + (2 * head_dim if qk_norm else 0) + 2 * h + mlp
    layer_tensors = (4 + (3 if bias else 0) + (2 if qk_norm else 0) + 2 + (3 if gated else 2) + scalars)
    classifier = is_sequence_classifier(config)
    tied = bool(_get(config, "tie_word_embeddings", default=False)) and not classifier
    labels = int(_get(config, "num_labels", default=2)) if classifier else 0
    head = labels * h if classifier else (0 if tied else vocab * h)
    total = vocab * h + layers * layer + h + head
    largest = max(vocab * h, h * f, h * q, q * h, head)
    return {"num_params": total, "num_tensors": 2 + layers * layer_tensors + (0 if tied else 1),
            "largest_layer_params": largest, "embedding": vocab * h, "per_layer": layer, "head": head}


@contextlib.contextmanager
def _quiet_transformers():
    """Silence transformers' warnings while a model is built on the meta device (a missing
    fused kernel is irrelevant to counting)."""
    from transformers.utils import logging as hf_logging

    before = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(before)


def build_on_meta(config: Any) -> Any:
    """The model a config describes, on the meta device (shapes, no storage), or None when
    transformers does not know the architecture."""
    import torch
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
        PretrainedConfig,
    )

    if not isinstance(config, PretrainedConfig):
        return None
    auto = AutoModelForSequenceClassification if is_sequence_classifier(config) else AutoModelForCausalLM
    try:
        with _quiet_transformers(), torch.device("meta"):
            return auto.from_config(config)
    except (ValueError, KeyError, ImportError, TypeError):
        return None


def count_on_meta(model: Any) -> dict[str, int]:
    """Parameters, tensors and the largest module's own parameters of a (meta) model."""
    params = list(model.parameters())  # shared tensors (a tied head) appear once
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return {"num_params": sum(p.numel() for p in params), "num_tensors": len(params),
            "largest_layer_params": largest}


def model_shape(config: Any, where: str = "model") -> ModelShape:
    """The shape of the model a config describes; counts from the meta model when possible."""
    for names in DIMENSIONS:  # before anything computes with them
        _require(text_config(config), where, *names)
    for name in ("num_key_value_heads", "head_dim"):
        if (value := _get(text_config(config), name)) is not None:
            _positive(value, where, name)
    counts = count_params(config, where)
    counted_by = "formula"
    model = build_on_meta(config)
    if model is not None:
        counts.update(count_on_meta(model))
        counted_by = "meta"
    text = text_config(config)
    h = int(_get(text, "hidden_size", "n_embd", "d_model"))
    heads = int(_get(text, "num_attention_heads", "n_head"))
    classifier = is_sequence_classifier(config)
    model_type = str(_get(text, "model_type", default=""))
    gated, qk_norm = model_type not in PLAIN_MLP_TYPES, model_type in QK_NORM_TYPES
    if model is not None:
        modules = {name.split(".")[-2] for name, _ in model.named_parameters() if "." in name}
        gated = bool(modules & {"gate_proj", "gate_up_proj", "w1"})
        qk_norm = "q_norm" in modules
    return ModelShape(
        model_type=model_type,
        hidden_size=h,
        num_layers=int(_get(text, "num_hidden_layers", "n_layer", "num_layers")),
        num_heads=heads,
        num_kv_heads=int(_get(text, "num_key_value_heads", default=heads)),
        head_dim=int(_get(text, "head_dim", default=h // heads)),
        intermediate_size=int(_get(text, "intermediate_size", "ffn_dim")),
        vocab_size=int(_get(text, "vocab_size")),
        tie_word_embeddings=bool(_get(text, "tie_word_embeddings", default=False)) and not classifier,
        gated_mlp=gated,
        qk_norm=qk_norm,
        attention_bias=bool(_get(text, "attention_bias", default=False)),
        hidden_act=str(_get(text, "hidden_act", "hidden_activation", default="")),
        max_position_embeddings=_get(text, "max_position_embeddings"),
        head="score" if classifier else "lm",
        num_labels=int(_get(config, "num_labels", default=1)) if classifier else 0,
        num_params=counts["num_params"],
        num_tensors=counts["num_tensors"],
        largest_layer_params=counts["largest_layer_params"],
        counted_by=counted_by,
    )


def linear_shapes(config: Any) -> list[tuple[str, int, int]]:
    """(module name, in, out) of every linear layer, from the meta model (LoRA's targets);
    empty when transformers does not know the architecture."""
    import torch

    model = build_on_meta(config)
    if model is None:
        return []
    return [(name, m.in_features, m.out_features) for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear)]
