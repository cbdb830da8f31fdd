"""The offline reference log-prob pass: Σ log π_ref(y_t | x, y_<t) per completion, once.

QRPO and DPO need the reference policy's log-probs of every training completion. Computing
them once, offline, keeps the reference model out of training memory (prohibitive at 70B;
the Apertus report computes them offline too). For each pair row the pass adds ``ref_chosen_logps``, ``ref_rejected_logps``,
``chosen_length`` and ``rejected_length`` (|y| in tokens, end-of-turn included); a
single-completion row (field ``completion``) gets ``ref_completion_logps`` and
``completion_length``. Each row is bound to what was scored: ``ref_<name>_token_hash``
(a hash of the exact prompt + completion token ids), ``ref_model_fingerprint`` (the
reference checkpoint, where it has a path) and ``ref_inputs`` (the settings the pass
tokenized with: chat format, resolved chat date, tokenizer fingerprint..., and hashes of
the row's system text, prompt and completions), so the trainer can recompute the hash and
name the setting that differs.

Guarantees:

* one tokenization: ``align.chat.encode_completion`` and the same ``max_length`` rule as
  the trainer (``encode_record``), so the trainer can check lengths against the pass;
* results independent of batch size and order (fp32: within 1e-5; sums in float64);
* resumable and sharded through ``align.jobs``: under ``accelerate launch`` / ``torchrun``
  each process takes the shard ``shard_from_env`` gives it; a killed run restarts where it
  stopped; ``missing_ids`` / ``load_ref_logprobs`` list whatever is still missing;
* a content-hash cache key over exactly what changes the numbers (model and weights
  fingerprint, tokenizer, chat format and its settings, ``max_length``, dtype, dataset) —
  not β, batch size or sharding — stored in the output's ``_job.json``: a resume with
  other settings is refused, and ``run`` reuses a finished output for the same key.

Usage::

    accelerate launch -m align.logprobs --model_name_or_path ckpt/sft --dataset pairs.jsonl \\
        --output_dir data/ref_logps --chat_date 2025-09-01
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from align.data.records import RecordError, record_id, validate_pair, validate_prompt

# align.trainers.collators is imported inside functions: align.trainers imports this module.
IGNORE_INDEX = -100

logger = logging.getLogger(__name__)

PAIR_NAMES = ("chosen", "rejected")
SINGLE_NAMES = ("completion",)

# Settings that change the reference log-probs, hence the cache key. Batch size, sharding,
# padding layout, output location and every loss setting (β, loss type) do not.
CACHE_KEY_FIELDS = (
    "model",
    "model_fingerprint",
    "tokenizer_fingerprint",
    "chat_format",
    "enable_thinking",
    "chat_date",
    "max_length",
    "dtype",
    "dataset_fingerprint",
)


# --------------------------------------------------------------------------- tokenization


def completion_names(record: Mapping[str, Any], index: int | None = None) -> tuple[str, ...]:
    """("chosen", "rejected") for a pair row, ("completion",) for a single-completion row."""
    if "chosen" in record or "rejected" in record:
        validate_pair(record, index)
        return PAIR_NAMES
    validate_prompt(record, index)
    if not isinstance(record.get("completion"), str):
        raise RecordError(record_id(record, index), "completion",
                          "expected a pair row (chosen, rejected) or a completion string")
    return SINGLE_NAMES


def fit_to_max_length(
    prompt_ids: list[int], completion_ids: list[int], max_length: int | None, *, rid: str, name: str
) -> tuple[list[int], list[int]]:
    """Cut the completion's tail so prompt + completion fit ``max_length`` (trainer and pass alike)."""
    if max_length is None or len(prompt_ids) + len(completion_ids) <= max_length:
        return prompt_ids, completion_ids
    room = max_length - len(prompt_ids)
    if room < 1:
        raise RecordError(rid, "messages", f"the prompt is {len(prompt_ids)} tokens, leaving no room for "
                          f"the {name} completion within max_length={max_length}: raise max_length or drop the row")
    return prompt_ids, completion_ids[:room]


TRUNCATED_POLICIES = ("exclude", "train_without_end")


def check_truncated_policy(truncated: str) -> None:
    if truncated not in TRUNCATED_POLICIES:
        raise ValueError(f"truncated={truncated!r}: choose one of {list(TRUNCATED_POLICIES)}")


def is_truncated_completion(record: Mapping[str, Any], name: str, index: int | None = None) -> bool:
    """Whether completion ``name`` of a row was cut at the token budget (``<name>_finish_reason`` "length")."""
    reason = record.get(f"{name}_finish_reason")
    if reason is not None and not isinstance(reason, str):
        raise RecordError(record_id(record, index), f"{name}_finish_reason",
                          f"expected a string or null, got {reason!r}")
    return reason == "length"


def count_truncated(records: Sequence[Mapping[str, Any]] | Any) -> int:
    """Completions of pair (or single-completion) rows that were cut at the token budget."""
    return sum(is_truncated_completion(row, name, i) for i, row in enumerate(map(dict, records))
               for name in PAIR_NAMES + SINGLE_NAMES if name in row)


def encode_record(
    tokenizer: Any,
    record: Mapping[str, Any],
    *,
    chat_format: str = "apertus",
    max_length: int | None = None,
    enable_thinking: bool = False,
    chat_date: str | None = None,
    index: int | None = None,
    truncated: str = "exclude",
) -> dict[str, list[int]]:
    """``prompt_ids`` and ``<name>_ids`` per completion of a row: THE tokenization of training.

    A completion whose ``<name>_finish_reason`` is "length" was cut at the sampling budget
    and never ended its turn: with ``truncated="train_without_end"`` it is encoded without
    the end-of-turn token; with ``"exclude"`` (default) such a row is an error (the pairs
    stage's default never pairs one). Bad rows raise ``RecordError`` naming the row and the field.
    """
    from align.chat import encode_completion

    check_truncated_policy(truncated)
    rid = record_id(record, index)
    out: dict[str, list[int]] = {}
    for name in completion_names(record, index):
        cut = is_truncated_completion(record, name, index)
        if cut and truncated == "exclude":
            raise RecordError(rid, f"{name}_finish_reason", "is 'length': the completion was cut at the token "
                              "budget, and truncated='exclude' does not train on it. Make pairs with "
                              "truncated=exclude (the default), or set truncated=train_without_end here and in "
                              "the trainer to score it without an end-of-turn token")
        try:
            prompt_ids, completion_ids = encode_completion(
                tokenizer, record["messages"], record[name], format=chat_format,
                tools=record.get("tools"), enable_thinking=enable_thinking, date=chat_date,
                end_of_turn=not cut,
            )
        except RecordError:
            raise
        except ValueError as error:
            raise RecordError(rid, name, f"cannot be encoded: {error}") from error
        if not completion_ids:
            raise RecordError(rid, name, "is empty and truncated: no token to score (without an end-of-turn token)")
        prompt_ids, completion_ids = fit_to_max_length(list(prompt_ids), list(completion_ids), max_length,
                                                       rid=rid, name=name)
        if out.setdefault("prompt_ids", prompt_ids) != prompt_ids:
            raise RecordError(rid, name, "its prompt tokenizes differently from the other completion's")
        out[f"{name}_ids"] = completion_ids
    return out


# --------------------------------------------------------------------------- scoring


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model under DDP / DeepSpeed / PEFT wrappers (for introspection only)."""
    while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
        model = model.module
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    return model


def _keeps_logits_by_mask(model: torch.nn.Module) -> bool:
    """Whether forward takes a 2D boolean ``logits_to_keep`` (transformers >= 5: lm_head on kept positions)."""
    import inspect

    from transformers import modeling_utils

    if not hasattr(modeling_utils, "slice_logits_to_keep"):
        return False
    return "logits_to_keep" in inspect.signature(unwrap_model(model).forward).parameters


_SCALED_HEAD_SETTINGS = ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier",
                         "logits_scaling")


def tiled_head(model: torch.nn.Module) -> torch.nn.Linear | None:
    """The plain linear LM head to project in tiles ourselves, or None to let the model do it.

    Tiling needs the head's full weight outside its own forward, so not under ZeRO-3 (sharded
    weights), nor with heads that scale or cap logits, nor with an adapter on the head.
    """
    base = unwrap_model(model)
    if not _keeps_logits_by_mask(model) or not hasattr(base, "get_output_embeddings"):
        return None
    head = base.get_output_embeddings()
    if type(head) is not torch.nn.Linear or hasattr(head.weight, "ds_id"):
        return None
    config = base.config.get_text_config() if hasattr(base.config, "get_text_config") else base.config
    if any(getattr(config, name, None) not in (None, 1.0) for name in _SCALED_HEAD_SETTINGS):
        return None
    return head


def _logps_from_logits(logits: Tensor, targets: Tensor) -> Tensor:
    """log softmax(logits)[target] in float32."""
    logits = logits.float()
    return logits.gather(-1, targets[:, None]).squeeze(-1) - logits.logsumexp(-1)


def _head_logps(hidden: Tensor, targets: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """Target log-probs of one tile of positions, through the LM head."""
    return _logps_from_logits(torch.nn.functional.linear(hidden, weight, bias), targets)


def _map_tiles(fn, sliced: tuple[Tensor, ...], shared: tuple, rows: int, recompute: bool) -> Tensor:
    """``fn`` over tiles of ``rows`` positions of ``sliced`` (plus ``shared``), concatenated.

    With ``recompute`` each tile is checkpointed: its logits are rebuilt in backward, not stored.
    """
    from torch.utils.checkpoint import checkpoint

    parts = []
    for start in range(0, max(1, sliced[0].shape[0]), rows):
        args = tuple(t[start : start + rows] for t in sliced) + shared
        parts.append(checkpoint(fn, *args, use_reentrant=False) if recompute else fn(*args))
    return torch.cat(parts)


def tiled_token_logps(hidden: Tensor, head: torch.nn.Linear, targets: Tensor, tile_elements: int = 1 << 24) -> Tensor:
    """Target log-probs (K,) from final hidden states (K, d), never holding all (K, V) logits.

    The head is applied to tiles of about ``tile_elements`` logits; under autograd each tile
    is recomputed in backward instead of stored, so memory is one tile, not K × V.
    """
    rows = max(1, tile_elements // head.out_features)
    recompute = hidden.shape[0] > rows and torch.is_grad_enabled() and (
        hidden.requires_grad or head.weight.requires_grad)
    return _map_tiles(_head_logps, (hidden, targets), (head.weight, head.bias), rows, recompute)


def model_logits(model: torch.nn.Module, inputs: Mapping[str, Any], keep: Tensor) -> Tensor:
    """Logits at the positions in ``keep`` (rows, L), flattened row-major to (K, V), from the model's own head.

    Where the model supports it, the vocabulary projection runs on those positions only,
    which saves the (rows × L × V) logits of prompt and padding tokens.
    """
    if _keeps_logits_by_mask(model):
        logits = model(**inputs, logits_to_keep=keep, use_cache=False).logits
    else:
        logits = model(**inputs, use_cache=False).logits
    if logits.dim() == 3:
        logits = logits[keep]
    if logits.shape[0] != int(keep.sum()):
        raise RuntimeError(f"model returned logits for {logits.shape[0]} positions, expected {int(keep.sum())}")
    return logits


def token_logps_at(model: torch.nn.Module, batch: Mapping[str, Any], keep: Tensor, targets: Tensor,
                   *, tiled: bool | None = None) -> Tensor:
    """log π(target | prefix) at the ``keep`` positions, float32, shape (K,).

    ``tiled`` (None: wherever ``tiled_head`` allows) projects the final hidden states through
    the LM head in tiles, so the (K, V) logits never exist at once; else the model's head
    computes the kept positions' logits.
    """
    from align.trainers.collators import model_inputs

    inputs = model_inputs(batch)
    head = tiled_head(model) if tiled in (None, True) else None
    if tiled and head is None:
        raise ValueError("this model's LM head cannot be tiled (ZeRO-3, scaled logits or an adapter on the head)")
    if head is None:
        return _logits_token_logps(model_logits(model, inputs, keep), targets)
    outputs = model(**inputs, logits_to_keep=torch.zeros_like(keep), output_hidden_states=True, use_cache=False)
    return tiled_token_logps(outputs.hidden_states[-1][keep], head, targets)


def _logits_token_logps(logits: Tensor, targets: Tensor, tile_elements: int = 1 << 24) -> Tensor:
    """Target log-probs from the model's logits, upcast to float32 one tile at a time."""
    rows = max(1, tile_elements // max(1, logits.shape[-1]))
    recompute = logits.shape[0] > rows and torch.is_grad_enabled() and logits.requires_grad
    return _map_tiles(_logps_from_logits, (logits, targets), (), rows, recompute)


def completion_logps(model: torch.nn.Module, batch: Mapping[str, Any], *, tiled: bool | None = None) -> Tensor:
    """Σ_t log π(y_t | x, y_<t) over each sequence's completion tokens: shape (S,), float64.

    ``batch`` is a collated batch (``align.trainers.collators``) of S sequences. Token
    log-probs are float32; the sums are float64 so that they do not depend on how many
    tokens share a batch (fp32 sums of ~10³ tokens would differ in the 5th digit).
    """
    labels, owners = batch["labels"], batch["sequence_index"]
    targets_at = labels[:, 1:] != IGNORE_INDEX  # position t predicts token t + 1
    keep = torch.zeros_like(labels, dtype=torch.bool)
    keep[:, :-1] = targets_at
    logps = token_logps_at(model, batch, keep, labels[:, 1:][targets_at], tiled=tiled)
    num_sequences = batch["lengths"].numel()
    sums_dtype = torch.float32 if logps.device.type == "mps" else torch.float64
    sums = torch.zeros(num_sequences, dtype=sums_dtype, device=logps.device)
    return sums.index_add(0, owners[:, 1:][targets_at], logps.to(sums_dtype))


# --------------------------------------------------------------------------- cache key


def _sha256(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def ref_cache_key(fields: Mapping[str, Any]) -> str:
    """sha256 of exactly the ``CACHE_KEY_FIELDS`` (a missing or extra field is an error)."""
    missing = [k for k in CACHE_KEY_FIELDS if k not in fields]
    extra = sorted(set(fields) - set(CACHE_KEY_FIELDS))
    if missing or extra:
        raise ValueError(f"cache key fields: missing {missing}, not part of the key {extra}")
    return _sha256({k: fields[k] for k in CACHE_KEY_FIELDS})


def dataset_fingerprint(records: Sequence[Mapping[str, Any]] | Any) -> str:
    """Hash of what the pass reads from each row (id, prompt, tools, completions), order-free."""
    used = ("id", "messages", "tools", "chosen", "rejected", "completion")
    # a cut completion is tokenized without its end of turn: hashed only then, so rows whose
    # completions ended (or that carry no finish reason) keep the fingerprint they always had
    optional = ("chosen_finish_reason", "rejected_finish_reason", "completion_finish_reason")
    digests = sorted(_sha256({**{k: row.get(k) for k in used},
                              **{k: row[k] for k in optional if row.get(k) == "length"}})
                     for row in map(dict, records))
    return _sha256(digests)


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """Hash of the tokenizer's full definition (vocabulary, merges, added tokens)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return _sha256(backend.to_str())
    return _sha256(sorted(tokenizer.get_vocab().items()))


def _file_sample_hash(path: Path, samples: int = 16, size: int = 1 << 16) -> str:
    """Hash of a file's size and ``samples`` evenly spaced chunks: cheap, content-based."""
    total = path.stat().st_size
    digest = hashlib.sha256(f"{path.name}:{total}".encode())
    with open(path, "rb") as f:
        for k in range(samples):
            f.seek(max(0, (total - size) * k // max(1, samples - 1)))
            digest.update(f.read(size))
    return digest.hexdigest()


def weights_fingerprint(model_or_path: torch.nn.Module | str | Path, *, full: bool = False) -> str:
    """Fingerprint of a model's weights: of its weight files if it has a local directory, else
    of its parameters. ``full`` hashes every byte of the files (slow for large models);
    otherwise sizes plus evenly spaced samples of each file, or of each parameter.
    """
    path = model_or_path if isinstance(model_or_path, (str, Path)) else \
        getattr(model_or_path, "name_or_path", "") or ""
    directory = Path(path) if path else None
    if directory is not None and directory.is_dir():
        files = sorted(p for p in directory.iterdir() if p.suffix in (".safetensors", ".bin", ".pt")
                       and p.is_file())
        if files:
            if full:
                return _sha256([hashlib.sha256(p.read_bytes()).hexdigest() for p in files])
            return _sha256([_file_sample_hash(p) for p in files])
    if isinstance(model_or_path, (str, Path)):
        return _sha256({"path": str(model_or_path)})  # a hub name: the revision is in the key's model field
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, param in unwrap_model(model_or_path).state_dict().items():
            flat = param.detach().reshape(-1)
            step = 1 if full else max(1, flat.numel() // 4096)
            sample = flat[::step].float().cpu().numpy().tobytes()
            digest.update(f"{name}:{tuple(param.shape)}:{param.dtype}".encode())
            digest.update(sample)
    return digest.hexdigest()


# --------------------------------------------------------------------------- the pass


@dataclass(frozen=True)
class LogprobsResult:
    """What one call of ``compute_ref_logprobs`` did, and where its output is."""

    output_dir: Path
    cache_key: str
    cache_fields: dict[str, Any]
    shard_index: int
    num_shards: int
    num_processed: int
    num_already_done: int


def _record_outputs(record: Mapping[str, Any], names: Sequence[str], logps: Sequence[float],
                    lengths: Sequence[int], encoded: Mapping[str, list[int]] | None = None,
                    binding: Mapping[str, Any] | None = None) -> dict[str, Any]:
    out = dict(record)
    for name, value, length in zip(names, logps, lengths):
        if not math.isfinite(value):
            raise RecordError(record_id(record), f"ref_{name}_logps", f"is {value} (non-finite log-prob)")
        out[f"ref_{name}_logps"] = float(value)
        out[f"{name}_length"] = int(length)
        if encoded is not None:
            out[f"ref_{name}_token_hash"] = token_hash(encoded["prompt_ids"], encoded[f"{name}_ids"])
    if binding is not None:
        out["ref_model_fingerprint"] = binding["model_fingerprint"]
        out["ref_inputs"] = {**binding["settings"], **row_text_hashes(record, names)}
    return out


# --------------------------------------------------------------------------- content binding

# What ``ref_inputs`` holds and how an error names it when the trainer's value differs,
# in the order they are reported.
REF_INPUT_LABELS = {
    "system_hash": "the system text in the row's messages",
    "prompt_hash": "the row's messages or tools",
    "completion_hash": "the completion texts",
    "chat_format": "chat_format",
    "chat_date": "chat_date",
    "enable_thinking": "enable_thinking",
    "max_length": "max_length",
    "truncated": "truncated",
    "tokenizer_fingerprint": "the tokenizer",
}
_HASHED_INPUTS = ("system_hash", "prompt_hash", "completion_hash", "tokenizer_fingerprint")


def token_hash(prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> str:
    """Hash of the exact token ids scored for one completion: prompt and completion."""
    return _sha256([[int(t) for t in prompt_ids], [int(t) for t in completion_ids]])[:32]


def row_text_hashes(record: Mapping[str, Any], names: Sequence[str]) -> dict[str, str]:
    """Hashes of a row's system text, whole prompt (messages, tools) and completion texts."""
    messages = record.get("messages") or []
    system = [m.get("content") for m in messages if isinstance(m, Mapping) and m.get("role") in ("system", "developer")]
    return {"system_hash": _sha256(system)[:16],
            "prompt_hash": _sha256([messages, record.get("tools")])[:16],
            "completion_hash": _sha256([record.get(name) for name in names])[:16]}


def pass_settings(tokenizer: Any, *, chat_format: str, chat_date: Any, enable_thinking: bool,
                  max_length: int | None, truncated: str, tokenizer_fp: str | None = None) -> dict[str, Any]:
    """The settings that decide the token ids, as the pass records them (the date resolved: None is today)."""
    from align.chat.apertus import date_text

    return {"chat_format": chat_format, "chat_date": date_text(chat_date), "enable_thinking": bool(enable_thinking),
            "max_length": max_length, "truncated": truncated,
            "tokenizer_fingerprint": tokenizer_fp or tokenizer_fingerprint(tokenizer)}


def reference_fingerprint(model_or_path: torch.nn.Module | str | Path | None) -> str | None:
    """``weights_fingerprint`` of a checkpoint known by its path (a local directory's weight files,
    or a hub name); None for a model held only in memory (nothing reliable to compare)."""
    if model_or_path is None:
        return None
    path = model_or_path if isinstance(model_or_path, (str, Path)) else \
        getattr(unwrap_model(model_or_path), "name_or_path", "") or ""
    return weights_fingerprint(str(path)) if str(path) else None


def check_ref_tokens(row: Mapping[str, Any], encoded: Mapping[str, list[int]], rid: str,
                     trainer_settings) -> None:
    """The pass scored exactly the token ids the trainer trains on, for every completion of the row.

    ``trainer_settings()`` gives the trainer's ``pass_settings`` (called only on a mismatch).
    A row without a token hash is an error: it comes from a pass that did not record one.
    """
    names = [k[: -len("_ids")] for k in encoded if k != "prompt_ids"]
    for name in names:
        column = f"ref_{name}_token_hash"
        stored = row.get(column)
        if not isinstance(stored, str) or not stored:
            raise RecordError(rid, column, "missing: these reference log-probs are not bound to the token ids they "
                              "scored (written by hand, or by an older `align logprobs`): rerun `align logprobs` "
                              "into a fresh output_dir with the trainer's settings")
        if stored == token_hash(encoded["prompt_ids"], encoded[f"{name}_ids"]):
            continue
        raise RecordError(rid, column, "the reference log-prob pass scored other token ids than the trainer "
                          f"tokenizes: {_explain_token_mismatch(row, names, trainer_settings)}. Rerun "
                          "`align logprobs` with the trainer's settings, or train with the pass's")


def _explain_token_mismatch(row: Mapping[str, Any], names: Sequence[str], trainer_settings) -> str:
    recorded = row.get("ref_inputs")
    if not isinstance(recorded, Mapping):
        return "the token ids differ (the row does not record the pass's settings)"
    ours = {**trainer_settings(), **row_text_hashes(row, names)}
    differences = []
    for key, label in REF_INPUT_LABELS.items():
        if key not in recorded or recorded[key] == ours.get(key):
            continue
        if key == "prompt_hash" and any(d.startswith(REF_INPUT_LABELS["system_hash"]) for d in differences):
            continue  # the system text is part of the prompt: name it once
        if key in _HASHED_INPUTS:
            differences.append(f"{label} differs from the pass's")
        else:
            differences.append(f"{label} is {recorded[key]!r} in the pass, {ours.get(key)!r} in the trainer")
    if not differences:
        return "the token ids differ, though every recorded setting agrees (another tokenizers or chat-template version?)"
    return "; ".join(differences)


class _BatchScorer:
    """``process_batch`` for ``align.jobs.run_job``: encode, collate, score, attach columns."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, collator: Any, encode_kwargs: dict,
                 binding: Mapping[str, Any] | None = None):
        self.model, self.tokenizer, self.collator, self.encode_kwargs = model, tokenizer, collator, encode_kwargs
        self.binding = binding
        self.device = next(model.parameters()).device

    def encode(self, record: Mapping[str, Any]) -> dict[str, list[int]]:
        return encode_record(self.tokenizer, record, **self.encode_kwargs)

    def length(self, record: Mapping[str, Any]) -> int:
        """Sort key: the row's total tokens, longest first (an out-of-memory shows up at once)."""
        encoded = self.encode(record)
        return -sum(len(v) for v in encoded.values())

    def __call__(self, records: list[dict]) -> list[dict]:
        encoded = [self.encode(r) for r in records]
        names = [[k[: -len("_ids")] for k in e if k != "prompt_ids"] for e in encoded]
        sequences = [(e["prompt_ids"], e[f"{n}_ids"]) for e, ns in zip(encoded, names) for n in ns]
        batch = {k: v.to(self.device) if isinstance(v, Tensor) else v
                 for k, v in self.collator.collate(sequences).items()}
        with torch.inference_mode():
            sums = completion_logps(self.model, batch).tolist()
        outputs, start = [], 0
        for record, e, ns in zip(records, encoded, names):
            lengths = [len(e[f"{n}_ids"]) for n in ns]
            outputs.append(_record_outputs(record, ns, sums[start : start + len(ns)], lengths, e,
                                           self.binding))
            start += len(ns)
        return outputs


def cache_fields_for(
    records: Sequence[Mapping[str, Any]] | Any,
    model: torch.nn.Module | str,
    tokenizer: Any,
    *,
    format: str,
    max_length: int | None,
    enable_thinking: bool = False,
    chat_date: str | None = None,
    dtype: str | torch.dtype | None = None,
    model_fingerprint: str | None = None,
) -> dict[str, Any]:
    """The ``CACHE_KEY_FIELDS`` of a pass over ``records`` with this model and settings."""
    if dtype is None and isinstance(model, torch.nn.Module):
        dtype = next(model.parameters()).dtype
    name = model if isinstance(model, str) else getattr(model, "name_or_path", "") or type(model).__name__
    return {
        "model": str(name),
        "model_fingerprint": model_fingerprint or weights_fingerprint(model),
        "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
        "chat_format": format,
        "enable_thinking": bool(enable_thinking),
        "chat_date": chat_date,
        "max_length": max_length,
        "dtype": str(dtype).replace("torch.", ""),
        "dataset_fingerprint": dataset_fingerprint(records),
    }


def compute_ref_logprobs(
    records: Sequence[Mapping[str, Any]] | Any,
    model: torch.nn.Module,
    tokenizer: Any,
    *,
    format: str = "apertus",
    batch_size: int = 16,
    max_length: int | None = 4096,
    output_dir: str | Path,
    enable_thinking: bool = False,
    chat_date: str | None = None,
    shard_index: int = 0,
    num_shards: int = 1,
    padding_free: bool = False,
    max_row_tokens: int | None = None,
    model_fingerprint: str | None = None,
    cache_fields: Mapping[str, Any] | None = None,
    truncated: str = "exclude",
) -> LogprobsResult:
    """Score shard ``shard_index`` of ``num_shards`` of ``records`` into ``output_dir`` (resumable).

    Rows are sorted by token count (longest first) and scored ``batch_size`` rows at a
    time; each output row is the input row plus the reference columns. Read the merged
    result with ``load_ref_logprobs(output_dir, records)``. ``cache_fields`` (from
    ``cache_fields_for``) saves recomputing the fingerprints when the caller has them.
    ``truncated``: as in ``encode_record`` (and the trainer's ``truncated``, which must match).
    """
    from align.jobs import run_job
    from align.trainers.collators import SequenceCollator

    fields = dict(cache_fields) if cache_fields is not None else cache_fields_for(
        records, model, tokenizer, format=format, max_length=max_length, enable_thinking=enable_thinking,
        chat_date=chat_date, model_fingerprint=model_fingerprint)
    key = ref_cache_key(fields)
    attn = getattr(unwrap_model(model).config, "_attn_implementation", None) or "eager"
    collator = SequenceCollator(
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0,
        padding_free=padding_free,
        attn_implementation=attn,
        mask_dtype=next(model.parameters()).dtype if attn == "eager" else None,
        max_row_tokens=max_row_tokens,
    )
    check_truncated_policy(truncated)
    num_cut = count_truncated(records) if truncated == "train_without_end" else 0
    if num_cut:
        logger.warning("reference log-probs: %d truncated completions (finish_reason 'length') are scored "
                       "without an end-of-turn token (truncated=train_without_end)", num_cut)
    binding = {"model_fingerprint": reference_fingerprint(model),
               "settings": pass_settings(tokenizer, chat_format=format, chat_date=chat_date,
                                         enable_thinking=enable_thinking, max_length=max_length, truncated=truncated,
                                         tokenizer_fp=fields.get("tokenizer_fingerprint"))}
    scorer = _BatchScorer(model, tokenizer, collator, {
        "chat_format": format, "max_length": max_length, "enable_thinking": enable_thinking, "chat_date": chat_date,
        "truncated": truncated}, binding)
    was_training = model.training
    model.eval()
    try:
        job = run_job(records, scorer, output_dir, shard_index=shard_index, num_shards=num_shards,
                      batch_size=batch_size, sort_key=scorer.length, desc=f"ref log-probs {shard_index}/{num_shards}",
                      fingerprint={"cache_key": key, **fields})
    finally:
        model.train(was_training)
    return LogprobsResult(Path(output_dir), key, fields, shard_index, num_shards,
                          job.num_processed, job.num_already_done)


def _ids(records: Sequence[Mapping[str, Any]] | Any) -> list[str]:
    if hasattr(records, "column_names"):
        return list(records["id"])
    return [r["id"] for r in records]


def missing_ids(output_dir: str | Path, records: Sequence[Mapping[str, Any]] | Any) -> list[str]:
    """Ids of ``records`` that have no row in ``output_dir`` yet (all shards together)."""
    from align.jobs import read_output

    if not Path(output_dir).is_dir():
        return _ids(records)
    done = {row.get("id") for row in read_output(output_dir)}
    return [rid for rid in _ids(records) if rid not in done]


def load_ref_logprobs(output_dir: str | Path, records: Sequence[Mapping[str, Any]] | Any) -> list[dict]:
    """The pass's rows for ``records``, in their order; raises listing missing ids or bad values."""
    from align.jobs import read_output

    missing = missing_ids(output_dir, records)
    if missing:
        raise ValueError(f"reference log-probs in {output_dir} are incomplete: {len(missing)} of "
                         f"{len(_ids(records))} rows missing, e.g. {missing[:10]}; rerun the pass "
                         "(it resumes) for every shard")
    by_id = {row.get("id"): row for row in read_output(output_dir)}
    rows = [by_id[rid] for rid in _ids(records)]  # the output may hold more rows (e.g. other splits)
    for index, row in enumerate(rows):
        names = PAIR_NAMES if "chosen" in row else SINGLE_NAMES
        for name in names:
            for column in (f"ref_{name}_logps", f"{name}_length"):
                value = row.get(column)
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                    raise RecordError(record_id(row, index), column, f"expected a finite number, got {value!r}")
    return rows


# --------------------------------------------------------------------------- entry point


@dataclass
class LogprobsConfig:
    """Settings of ``align logprobs`` (the field names match ``PreferenceConfig``'s data fields).

    model_name_or_path: the reference policy π_ref (the SFT checkpoint).
    dataset: pair rows (JSONL/JSON/Parquet file, or a job output directory).
    output_dir: where the rows with reference columns go; ``None``: under ``cache_dir``,
        named by the cache key, so a second run with the same inputs reuses it.
    cache_dir: root of keyed outputs when ``output_dir`` is None.
    chat_format, max_length, enable_thinking, chat_date: as in ``PreferenceConfig``; they
        must match the trainer's. ``chat_date`` None means today's date: pin it.
    batch_size: rows per forward (each row is 2 sequences for pairs); does not change results.
    dtype: weights dtype (``float32``, ``bfloat16``); part of the cache key.
    attn_implementation: ``sdpa`` / ``eager`` / ``flash_attention_2``; None: transformers' choice.
    padding_free / max_row_tokens: batch layout (does not change results).
    device: ``cuda``, ``cpu``...; None: this process's accelerator (``LOCAL_RANK``) or CPU.
    full_weight_hash: hash every weight byte for the key (slow) instead of samples.
    truncated: ``exclude`` (default): a row whose chosen/rejected was cut at the token budget
        (``*_finish_reason`` "length") is an error; ``train_without_end``: score it without
        an end-of-turn token. Must match the trainer's ``truncated``.
    """

    model_name_or_path: str
    dataset: str
    output_dir: str | None = None
    cache_dir: str | None = None
    chat_format: str = "apertus"
    max_length: int | None = 4096
    enable_thinking: bool = False
    chat_date: str | None = None
    batch_size: int = 16
    dtype: str = "float32"
    attn_implementation: str | None = None
    padding_free: bool = False
    max_row_tokens: int | None = None
    device: str | None = None
    full_weight_hash: bool = False
    truncated: str = "exclude"

    def __post_init__(self) -> None:
        check_truncated_policy(self.truncated)
        if self.output_dir is None and self.cache_dir is None:
            raise ValueError("set output_dir, or cache_dir to keep outputs under their cache key")
        if self.batch_size < 1:
            raise ValueError(f"batch_size={self.batch_size}: must be >= 1")
        if self.max_length is not None and self.max_length < 2:
            raise ValueError(f"max_length={self.max_length}: must be >= 2, or None")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype={self.dtype!r}: choose float32, bfloat16 or float16")


def load_records(path: str | Path) -> list[dict]:
    """Rows of a JSONL/JSON/Parquet file, or of a finished job output directory."""
    path = Path(path)
    if path.is_dir():
        from align.io import read_records
        from align.jobs import output_files, read_output

        # a job's shard directory, else any directory of .jsonl/.parquet files
        return read_output(path) if output_files(path) else read_records(path)
    if path.suffix == ".parquet":
        import datasets

        return list(datasets.load_dataset("parquet", data_files=str(path), split="train"))
    if path.suffix == ".jsonl":
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    if path.suffix == ".json":
        return json.loads(path.read_text())
    raise ValueError(f"dataset {path}: expected .jsonl, .json, .parquet or a job output directory")


def _device(config: LogprobsConfig) -> torch.device:
    import os

    if config.device:
        return torch.device(config.device)
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def resolved_output_dir(config: LogprobsConfig, key: str) -> Path:
    """``output_dir``, or the keyed directory under ``cache_dir``."""
    if config.output_dir is not None:
        return Path(config.output_dir)
    return Path(config.cache_dir) / f"ref_logps-{key[:16]}"


def run(config: LogprobsConfig) -> Path:
    """Run this process's shard; under a distributed launch, wait for all and check the merge.

    Returns the output directory. A finished output for the same cache key is reused
    without loading the model.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from align.jobs import is_complete, shard_from_env

    shard_index, num_shards = shard_from_env()
    records = load_records(config.dataset)
    tokenizer = AutoTokenizer.from_pretrained(config.model_name_or_path)
    if config.chat_date is None:
        logger.warning("chat_date is None (today's date): pin it so the trainer renders the same prompts")
    fields = cache_fields_for(
        records, config.model_name_or_path, tokenizer, format=config.chat_format, max_length=config.max_length,
        enable_thinking=config.enable_thinking, chat_date=config.chat_date, dtype=config.dtype,
        model_fingerprint=weights_fingerprint(config.model_name_or_path, full=config.full_weight_hash))
    key = ref_cache_key(fields)
    output_dir = resolved_output_dir(config, key)
    if is_complete(output_dir, records, num_shards):
        logger.info("reference log-probs for key %s already complete in %s", key[:16], output_dir)
    else:
        model = AutoModelForCausalLM.from_pretrained(
            config.model_name_or_path, dtype=getattr(torch, config.dtype),
            **({"attn_implementation": config.attn_implementation} if config.attn_implementation else {}),
        ).to(_device(config))
        compute_ref_logprobs(
            records, model, tokenizer, format=config.chat_format, batch_size=config.batch_size,
            max_length=config.max_length, output_dir=output_dir, enable_thinking=config.enable_thinking,
            chat_date=config.chat_date, shard_index=shard_index, num_shards=num_shards,
            padding_free=config.padding_free, max_row_tokens=config.max_row_tokens, cache_fields=fields,
            truncated=config.truncated)
    _wait_for_other_shards()
    if shard_index == 0 or num_shards == 1:
        missing = missing_ids(output_dir, records)
        if missing and _distributed():
            raise RuntimeError(f"after all shards finished, {len(missing)} rows are missing in {output_dir}: "
                               f"{missing[:10]}")
        if missing:
            logger.info("%d rows not written yet (other shards still running?): %s", len(missing), missing[:10])
    return output_dir


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _wait_for_other_shards() -> None:
    """Barrier when launched with accelerate/torchrun (a SLURM array has none: check later)."""
    import os

    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not _distributed():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        torch.distributed.init_process_group(backend=backend)
    if _distributed():
        torch.distributed.barrier()


def _parse_args(argv: Sequence[str] | None = None) -> LogprobsConfig:
    parser = argparse.ArgumentParser(prog="align logprobs", description=__doc__.split("\n")[0])
    for f in dataclasses.fields(LogprobsConfig):
        required = f.default is dataclasses.MISSING
        kind = {"int | None": int, "str | None": str, "int": int, "str": str}.get(str(f.type), str)
        if str(f.type) == "bool":
            parser.add_argument(f"--{f.name}", action=argparse.BooleanOptionalAction, default=f.default)
        else:
            parser.add_argument(f"--{f.name}", type=kind, required=required,
                                default=None if required else f.default)
    return LogprobsConfig(**vars(parser.parse_args(argv)))


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO)
    print(run(_parse_args(argv)))


if __name__ == "__main__":
    main()
