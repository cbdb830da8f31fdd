"""The offline reference log-prob pass: Σ log π_ref(y_t | x, y_<t) per completion, once.

QRPO and DPO need the reference policy's log-probs of every training completion. Computing
them once, offline, keeps the reference model out of training memory (prohibitive at 70B;
the Apertus report computes them offline too). For each pair row the pass adds ``ref_chosen_logps``, ``ref_rejected_logps``,
``chosen_length`` and ``rejected_length`` (|y| in tokens, end-of-turn included); a
single-completion row (field ``completion``) gets ``ref_completion_logps`` and
``completion_length``. A row whose prompt + completion exceeds ``max_length`` is not scored
(``over_max_length="exclude"``, the default): it is written with ``ref_skip`` (the reason)
and no log-probs, and the trainer excludes the same row; ``over_max_length="cut"`` scores
the completion's head instead, without its end-of-turn token, and counts the rows cut. Each row is bound to what was scored: ``ref_<name>_token_hash``
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
* the model whole on each process, or partitioned over the ranks (a ``LockstepModel`` of
  ``align.scoring.sharded``, DeepSpeed ZeRO-3): the same numbers, and the pass ends with the
  ranks' dummy forwards until every shard is done (docs/sharded-passes.md);
* a content-hash cache key over exactly what changes the numbers (model and weights
  fingerprint, tokenizer, chat format and its settings, ``max_length``, dtype, dataset) —
  not β, batch size, sharding or the model's layout — stored in the output's ``_job.json``:
  a resume with other settings is refused, and ``run`` reuses a finished output for the same key.

The stage ``align logprobs`` (``align.stages.logprobs``: its recipe keys, sharding over a
distributed launch, reuse of a finished output) runs this pass::

    accelerate launch -m align logprobs recipes/apertus-8b/logprobs.yaml

Tokenization (``encode_record``), batches and the log-prob kernels (``completion_logps``)
are ``align.scoring``'s; this module holds the pass over a dataset and its cache key.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from align.chat.apertus import date_text
from align.data.records import RecordError, record_id
from align.data.trl_rows import as_pair_rows
from align.errors import InputError
from align.io import read_output
from align.io.fingerprint import json_digest, weights_fingerprint
from align.jobs import run_job
from align.scoring import (
    PAIR_NAMES,
    SINGLE_NAMES,
    OverMaxLengthError,
    SequenceCollator,
    check_over_max_length_policy,
    check_truncated_policy,
    completion_logps,
    count_truncated,
    encode_record,
    mask_dtype_for,
    resolve_prefix_sharing,
    unwrap_model,
)
from align.scoring.block_attention import BLOCK_ATTENTION
from align.scoring.block_attention import block_attention as block_attention_for
from align.scoring.sharded import finish_forwards

logger = logging.getLogger(__name__)

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
    "over_max_length",
    "dtype",
    "dataset_fingerprint",
)




# --------------------------------------------------------------------------- cache key


_sha256 = json_digest


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
    num_over_max_length_skipped: int = 0  # rows of this call not scored: over max_length (``ref_skip``)
    num_over_max_length_cut: int = 0      # rows of this call scored on a cut completion (over_max_length=cut)


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
    "prompt_hash": "the prompt (the row's messages or tools)",
    "completion_hash": "the text of the completions",
    "chat_format": "chat_format",
    "chat_date": "chat_date",
    "enable_thinking": "enable_thinking",
    "max_length": "max_length",
    "over_max_length": "over_max_length",
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
                  max_length: int | None, truncated: str, over_max_length: str,
                  tokenizer_fp: str | None = None) -> dict[str, Any]:
    """The settings that decide the token ids, as the pass records them (the date resolved: None is today)."""
    return {"chat_format": chat_format, "chat_date": date_text(chat_date), "enable_thinking": bool(enable_thinking),
            "max_length": max_length, "over_max_length": over_max_length, "truncated": truncated,
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
        self.num_skipped = self.num_cut = 0  # rows of this run over max_length: excluded / cut
        self._tokens: dict[Any, int] = {}  # row id -> its tokens (the sort and the token budget both ask)

    def encode(self, record: Mapping[str, Any], cut: list[str] | None = None) -> dict[str, list[int]] | str:
        """The row's token ids, or the reason it is excluded (over ``max_length``)."""
        try:
            return encode_record(self.tokenizer, record, cut_names=cut, **self.encode_kwargs)
        except OverMaxLengthError as error:
            return error.reason

    def tokens(self, record: Mapping[str, Any]) -> int:
        """The row's tokens (prompt and completions; 0 for a row not scored), counted once per row id."""
        key = record.get("id")
        if key not in self._tokens:
            encoded = self.encode(record)
            self._tokens[key] = 0 if isinstance(encoded, str) else sum(len(v) for v in encoded.values())
        return self._tokens[key]

    def length(self, record: Mapping[str, Any]) -> int:
        """Sort key: the row's total tokens, longest first (an out-of-memory shows up at once)."""
        return -self.tokens(record)

    def _skipped(self, record: Mapping[str, Any], reason: str) -> dict[str, Any]:
        """A row the pass does not score: written with its reason (``ref_skip``) and no log-probs."""
        out = {**record, "ref_skip": reason}
        if self.binding is not None:
            out["ref_model_fingerprint"] = self.binding["model_fingerprint"]
            out["ref_inputs"] = dict(self.binding["settings"])
        return out

    def __call__(self, records: list[dict]) -> list[dict]:
        cut_rows: list[list[str]] = [[] for _ in records]
        all_encoded = [self.encode(r, c) for r, c in zip(records, cut_rows)]
        skipped = {i: e for i, e in enumerate(all_encoded) if isinstance(e, str)}
        self.num_skipped += len(skipped)
        self.num_cut += sum(bool(c) for c in cut_rows)
        kept = [i for i in range(len(records)) if i not in skipped]
        results: dict[int, dict] = {i: self._skipped(records[i], reason) for i, reason in skipped.items()}
        if kept:
            for i, row in zip(kept, self._score([records[i] for i in kept], [all_encoded[i] for i in kept])):
                results[i] = row
        return [results[i] for i in range(len(records))]

    def _score(self, records: list[dict], encoded: list[dict[str, list[int]]]) -> list[dict]:
        names = [[k[: -len("_ids")] for k in e if k != "prompt_ids"] for e in encoded]
        groups = [(e["prompt_ids"], [e[f"{n}_ids"] for n in ns]) for e, ns in zip(encoded, names)]
        batch = {k: v.to(self.device) if isinstance(v, Tensor) else v
                 for k, v in self.collator.collate_groups(groups).items()}
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
    chat_format: str,
    max_length: int | None,
    enable_thinking: bool = False,
    chat_date: str | None = None,
    dtype: str | torch.dtype | None = None,
    model_fingerprint: str | None = None,
    over_max_length: str = "exclude",
) -> dict[str, Any]:
    """The ``CACHE_KEY_FIELDS`` of a pass over ``records`` with this model and settings."""
    if dtype is None and isinstance(model, torch.nn.Module):
        dtype = next(model.parameters()).dtype
    name = model if isinstance(model, str) else getattr(model, "name_or_path", "") or type(model).__name__
    return {
        "model": str(name),
        "model_fingerprint": model_fingerprint or weights_fingerprint(model),
        "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
        "chat_format": chat_format,
        "enable_thinking": bool(enable_thinking),
        "chat_date": chat_date,
        "max_length": max_length,
        "over_max_length": over_max_length,
        "dtype": str(dtype).replace("torch.", ""),
        "dataset_fingerprint": dataset_fingerprint(records),
    }


def compute_ref_logprobs(
    records: Sequence[Mapping[str, Any]] | Any,
    model: torch.nn.Module,
    tokenizer: Any,
    *,
    chat_format: str = "apertus",
    batch_size: int = 16,
    max_batch_tokens: int | None = None,
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
    over_max_length: str = "exclude",
    prefix_sharing: bool | str = "auto",
    block_attention: bool | str = False,
) -> LogprobsResult:
    """Score shard ``shard_index`` of ``num_shards`` of ``records`` into ``output_dir`` (resumable).

    Rows are sorted by token count (longest first) and scored ``batch_size`` rows at a
    time; with ``max_batch_tokens``, a batch also holds no more than that many tokens (rows
    × its longest row's prompt and completions), so short rows go many to a forward and
    long ones few, at an even memory. Each output row is the input row plus the reference
    columns. Read the merged result with ``load_ref_logprobs(output_dir, records)``.
    ``cache_fields`` (from ``cache_fields_for``) saves recomputing the fingerprints when the
    caller has them.
    ``truncated``: as in ``encode_record`` (and the trainer's ``truncated``, which must match).
    ``over_max_length``: a row over ``max_length`` is written unscored with ``ref_skip`` (its
    reason; ``"exclude"``, default) or scored on the completion's head (``"cut"``, counted);
    the trainer's setting must match. ``prefix_sharing`` (``"auto"``: wherever the attention
    takes a 4D mask) scores a row's completions after one copy of its prompt; like
    ``padding_free`` it is a batch layout and changes no result. ``block_attention``
    (off by default; ``"auto"``: on CPU, for a model on ``sdpa``) runs attention over each
    piece of a row alone for the pass, the model back on its own implementation after.
    """
    check_over_max_length_policy(over_max_length)
    records = as_pair_rows(records)  # TRL's preference shapes read as pair rows (align.data.trl_rows)
    fields = dict(cache_fields) if cache_fields is not None else cache_fields_for(
        records, model, tokenizer, chat_format=chat_format, max_length=max_length, enable_thinking=enable_thinking,
        chat_date=chat_date, model_fingerprint=model_fingerprint, over_max_length=over_max_length)
    key = ref_cache_key(fields)
    base, parameter = unwrap_model(model), next(model.parameters())
    with block_attention_for(base, block_attention, parameter.device):
        attn = getattr(base.config, "_attn_implementation", None) or "eager"
        collator = SequenceCollator(
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0,
            padding_free=padding_free,
            attn_implementation=attn,
            mask_dtype=mask_dtype_for(attn, parameter.dtype),
            max_row_tokens=max_row_tokens,
            prefix_sharing=resolve_prefix_sharing(prefix_sharing, attn),
            attention_blocks=attn == BLOCK_ATTENTION,
        )
        check_truncated_policy(truncated)
        num_cut = count_truncated(records) if truncated == "train_without_end" else 0
        if num_cut:
            logger.warning("reference log-probs: %d truncated completions (finish_reason 'length') are scored "
                           "without an end-of-turn token (truncated=train_without_end)", num_cut)
        binding = {"model_fingerprint": reference_fingerprint(model),
                   "settings": pass_settings(tokenizer, chat_format=chat_format, chat_date=chat_date,
                                             enable_thinking=enable_thinking, max_length=max_length,
                                             truncated=truncated, tokenizer_fp=fields.get("tokenizer_fingerprint"),
                                             over_max_length=over_max_length)}
        scorer = _BatchScorer(model, tokenizer, collator, {
            "chat_format": chat_format, "max_length": max_length, "enable_thinking": enable_thinking,
            "chat_date": chat_date, "truncated": truncated, "over_max_length": over_max_length}, binding)
        was_training = model.training
        model.eval()
        try:
            job = run_job(records, scorer, output_dir, shard_index=shard_index, num_shards=num_shards,
                          batch_size=batch_size, max_batch_tokens=max_batch_tokens, size_key=scorer.tokens,
                          sort_key=scorer.length,
                          desc=f"ref log-probs {shard_index}/{num_shards}", fingerprint={"cache_key": key, **fields})
            finish_forwards(model)  # a model partitioned over ranks: forward in step until every shard is done
        finally:
            model.train(was_training)
    if scorer.num_skipped:
        logger.warning("reference log-probs: %d rows exceed max_length=%s and are not scored (over_max_length="
                       "exclude): written with ref_skip, the trainer excludes them too", scorer.num_skipped, max_length)
    if scorer.num_cut:
        logger.warning("reference log-probs: %d rows exceed max_length=%s and are scored on the completion's head, "
                       "without its end-of-turn token (over_max_length=cut)", scorer.num_cut, max_length)
    return LogprobsResult(Path(output_dir), key, fields, shard_index, num_shards,
                          job.num_processed, job.num_already_done, scorer.num_skipped, scorer.num_cut)


def _ids(records: Sequence[Mapping[str, Any]] | Any) -> list[str]:
    if hasattr(records, "column_names"):
        return list(records["id"])
    return [r["id"] for r in records]


def missing_ids(output_dir: str | Path, records: Sequence[Mapping[str, Any]] | Any) -> list[str]:
    """Ids of ``records`` that have no row in ``output_dir`` yet (all shards together)."""
    if not Path(output_dir).is_dir():
        return _ids(records)
    done = {row.get("id") for row in read_output(output_dir)}
    return [rid for rid in _ids(records) if rid not in done]


def load_ref_logprobs(output_dir: str | Path, records: Sequence[Mapping[str, Any]] | Any) -> list[dict]:
    """The pass's rows for ``records``, in their order; raises listing missing ids or bad values.

    Rows the pass skipped (``ref_skip``: over ``max_length``) come back as they are, without
    log-probs; the trainer excludes them by the same rule."""
    records = as_pair_rows(records)
    missing = missing_ids(output_dir, records)
    if missing:
        raise InputError(f"reference log-probs in {output_dir} are incomplete: {len(missing)} of "
                         f"{len(_ids(records))} rows missing, e.g. {missing[:10]}; rerun the pass "
                         "(it resumes) for every shard")
    by_id = {row.get("id"): row for row in read_output(output_dir)}
    rows = [by_id[rid] for rid in _ids(records)]  # the output may hold more rows (e.g. other splits)
    for index, row in enumerate(rows):
        if row.get("ref_skip"):  # not scored (over max_length): the trainer excludes it too
            continue
        names = PAIR_NAMES if "chosen" in row else SINGLE_NAMES
        for name in names:
            for column in (f"ref_{name}_logps", f"{name}_length"):
                value = row.get(column)
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                    raise RecordError(record_id(row, index), column, f"expected a finite number, got {value!r}")
    return rows
