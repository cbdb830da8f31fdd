"""Preference dataset preparation: pair rows → the trainer's columns (token ids, quantiles, ref log-probs).

A pair row (``align.data.records``: ``messages``, ``chosen``, ``rejected``, optional
``tools``) is validated (errors name the row and the field), tokenized with
``align.scoring.encode_record`` (THE tokenization of the reference log-prob pass, a
completion cut at the sampling budget included, ``truncated``), checked against what the pass
scored (its lengths, its per-completion token hashes, its reference checkpoint), and given
its quantile rewards (QRPO). The mirror of ``align.trainers.sft_data`` for pairs.

A row whose prompt + completion exceeds ``max_length`` is excluded by default
(``over_max_length="exclude"``): ``prepare_dataset`` leaves it out and logs how many, with
the first ids and the reason, as the log-prob pass does (it writes such rows unscored, with
``ref_skip``). ``over_max_length="cut"`` trains on the completion's head instead (counted).

``prepare_dataset`` runs it through ``datasets.map``. A file-backed dataset is prepared by
the main process first and the other ranks find its cache; rows held in memory have no
cache to share, so every rank prepares them at once (``preparation_order``).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import datasets

from align.data.quantiles import quantile_rewards
from align.data.records import record_id, validate_pair
from align.data.trl_rows import from_trl_row
from align.errors import ConfigError, InputError, RecordError
from align.io import read_records, rows_to_dataset
from align.logprobs import check_ref_tokens, pass_settings, reference_fingerprint
from align.scoring import PAIR_NAMES, OverMaxLengthError, count_truncated, encode_record
from align.trainers.common import preparation_order

__all__ = [
    "PREPARED_COLUMNS",
    "check_ref_model",
    "expected_ref_fingerprint",
    "pair_quantiles",
    "prepare_dataset",
    "prepare_row",
]

logger = logging.getLogger(__name__)

PREPARED_COLUMNS = ("id", "prompt_ids", "chosen_ids", "rejected_ids", "chosen_quantile",
                    "rejected_quantile", "ref_chosen_logps", "ref_rejected_logps")
# A list of rows goes through `datasets.map` as one JSON column: Arrow would unify the rows'
# nested structures (a None for every key some message lacks), changing what is rendered.
_JSON_ROW = "_row_json"
# Per prepared row: why it is left out (over max_length; "" when kept) and how many completions were cut.
_SKIP, _CUT = "_over_max_length", "_num_cut"


def _number(row: Mapping[str, Any], name: str, rid: str) -> float:
    value = row.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RecordError(rid, name, f"expected a finite number, got {value!r}")
    return float(value)


def _num_ref_rewards(row: Mapping[str, Any], configured: int | None, rid: str) -> int | None:
    """n from the config, checked against the row's own ``num_ref_rewards`` when it has one.

    A row whose sampling dropped overlong references (``num_ref_dropped``, from the pairs
    stage) has ``num_ref_rewards = n - num_ref_dropped``, its own grid.
    """
    found = row.get("num_ref_rewards")
    if found is not None and configured is not None and found != configured:
        dropped = row.get("num_ref_dropped") or 0
        if dropped and found == configured - dropped:
            return found
        extra = f" minus num_ref_dropped={dropped}" if dropped else ""
        raise RecordError(rid, "num_ref_rewards", f"is {found}, but the config says num_ref_rewards={configured}{extra}")
    return configured if configured is not None else found


def pair_quantiles(row: Mapping[str, Any], num_ref_rewards: int | None, index: int | None = None) -> tuple[float, float]:
    """(R_q chosen, R_q rejected): precomputed columns, else from rewards vs. ``ref_rewards``."""
    rid = record_id(row, index)
    n = _num_ref_rewards(row, num_ref_rewards, rid)
    if row.get("chosen_quantile") is not None and row.get("rejected_quantile") is not None:
        values = []
        for name in ("chosen_quantile", "rejected_quantile"):
            q = _number(row, name, rid)
            if not 0.0 <= q <= 1.0:
                raise RecordError(rid, name, f"is {q}, outside [0, 1]")
            if n and abs(q * n - round(q * n)) > 1e-6:
                raise RecordError(
                    rid,
                    name,
                    f"is {q}, not a multiple of 1/n with n = {n} (docs/method.md, Quantile rewards)",
                )
            values.append(q)
        return values[0], values[1]
    if row.get("ref_rewards") is None or row.get("chosen_reward") is None or row.get("rejected_reward") is None:
        raise RecordError(rid, "chosen_quantile", "missing: QRPO needs chosen_quantile and rejected_quantile, "
                          "or chosen_reward, rejected_reward and ref_rewards")
    rewards = [_number(row, "chosen_reward", rid), _number(row, "rejected_reward", rid)]
    try:
        qc, qr = quantile_rewards(rewards, row["ref_rewards"], expected_n=n)
    except InputError as error:
        raise RecordError(rid, "ref_rewards", str(error)) from error
    return qc, qr


def _check_ref_lengths(row: Mapping[str, Any], encoded: Mapping[str, list[int]], rid: str) -> None:
    """The pass's |y| must equal ours: else it tokenized differently and its log-probs are for other tokens."""
    for name in PAIR_NAMES:
        expected, ours = row.get(f"{name}_length"), len(encoded[f"{name}_ids"])
        if expected != ours:
            raise RecordError(rid, f"{name}_length", f"is {expected} in the reference log-prob pass, but the trainer "
                              f"tokenizes {ours} completion tokens: rerun `align logprobs` with the trainer's "
                              "chat_format, chat_date, max_length and tokenizer")


def prepare_row(row: Mapping[str, Any], index: int, tokenizer: Any, config: Any,
                cut: list[str] | None = None) -> dict[str, Any]:
    """One pair row → the trainer's columns (token ids, quantiles, reference log-probs).

    A row over ``max_length`` raises ``OverMaxLengthError`` (``over_max_length="exclude"``;
    ``prepare_dataset`` records it as skipped), or its completion is cut (``"cut"``: the
    names of the cut completions are appended to ``cut``).
    """
    need_ref = config.reference == "precomputed"
    validate_pair(row, index)
    rid = record_id(row, index)
    encoded = encode_record(tokenizer, row, chat_format=config.chat_format, max_length=config.max_length,
                            enable_thinking=config.enable_thinking, chat_date=config.chat_date, index=index,
                            truncated=config.truncated, over_max_length=config.over_max_length, cut_names=cut)
    if need_ref and row.get("ref_skip"):
        raise RecordError(rid, "ref_skip", f"the reference log-prob pass did not score this row ({row['ref_skip']}), "
                          f"but the trainer fits it in max_length={config.max_length}: rerun `align logprobs` with "
                          "the trainer's max_length and over_max_length")
    validate_pair(row, index, need_ref_logps=need_ref)
    out: dict[str, Any] = {"id": rid, **encoded}
    if need_ref:
        check_ref_tokens(row, encoded, rid, lambda: pass_settings(
            tokenizer, chat_format=config.chat_format, chat_date=config.chat_date,
            enable_thinking=config.enable_thinking, max_length=config.max_length, truncated=config.truncated,
            over_max_length=config.over_max_length))
        _check_ref_lengths(row, encoded, rid)
        out["ref_chosen_logps"] = float(row["ref_chosen_logps"])
        out["ref_rejected_logps"] = float(row["ref_rejected_logps"])
    if config.loss.uses_quantile_rewards:
        out["chosen_quantile"], out["rejected_quantile"] = pair_quantiles(row, config.num_ref_rewards, index)
    return out


def expected_ref_fingerprint(config: Any, model: Any = None) -> str | None:
    """The reference checkpoint's fingerprint as the trainer knows it: ``ref_model_name_or_path``,
    else the policy's starting checkpoint (``model_name_or_path``, or the model's own path);
    None when the model is held only in memory. Under a launch, rank 0 hashes the checkpoint once
    and the other ranks receive its fingerprint (every rank calls this at the same point)."""
    from align.ranks import on_rank_zero

    return on_rank_zero(lambda: reference_fingerprint(config.ref_model_name_or_path or config.model_name_or_path
                                                      or model))


def check_ref_model(row: Mapping[str, Any], expected: str | None, rid: str) -> None:
    """The pass's ``ref_model_fingerprint`` must be the trainer's reference checkpoint (when both are known)."""
    found = row.get("ref_model_fingerprint")
    if expected is not None and found is not None and found != expected:
        raise RecordError(rid, "ref_model_fingerprint", f"is {str(found)[:16]}…, the weights the reference "
                          f"log-prob pass scored with, but the trainer's reference checkpoint is {expected[:16]}…: "
                          "rerun `align logprobs` with the checkpoint the policy starts from, or name the pass's "
                          "checkpoint in ref_model_name_or_path")


def _prepared_features(config: Any) -> datasets.Features:
    """The prepared columns, typed, plus the skip reason and cut count (a skipped row has empty ids)."""
    ids = datasets.List(datasets.Value("int64"))
    features = {"id": datasets.Value("string"), "prompt_ids": ids, "chosen_ids": ids, "rejected_ids": ids}
    if config.reference == "precomputed":
        features |= {"ref_chosen_logps": datasets.Value("float64"), "ref_rejected_logps": datasets.Value("float64")}
    if config.loss.uses_quantile_rewards:
        features |= {"chosen_quantile": datasets.Value("float64"), "rejected_quantile": datasets.Value("float64")}
    return datasets.Features({**features, _SKIP: datasets.Value("string"), _CUT: datasets.Value("int64")})


def _prepare_one(row: Mapping[str, Any], index: int, tokenizer: Any, config: Any, expected: str | None,
                 features: datasets.Features) -> dict[str, Any]:
    row = from_trl_row(json.loads(row[_JSON_ROW]) if _JSON_ROW in row else dict(row), index)
    if config.reference == "precomputed":
        check_ref_model(row, expected, record_id(row, index))
    cut: list[str] = []
    try:
        return {**prepare_row(row, index, tokenizer, config, cut), _SKIP: "", _CUT: len(cut)}
    except OverMaxLengthError as error:
        empty = {name: [] if isinstance(feature, datasets.List) else 0.0 for name, feature in features.items()}
        return {**empty, "id": record_id(row, index), _SKIP: error.reason, _CUT: 0}


def prepare_dataset(dataset: Any, tokenizer: Any, config: Any, model: Any = None,
                    summary: dict[str, Any] | None = None) -> datasets.Dataset:
    """Pair rows (list, ``datasets.Dataset`` or a file path) → a dataset of trainer columns.

    A dataset that already has ``prompt_ids`` is taken as prepared and returned as is.
    With precomputed references every row's token hash is checked (``check_ref_tokens``),
    and its ``ref_model_fingerprint`` against the reference checkpoint (``model``: the policy,
    used when the config names no checkpoint path). Runs as ``datasets.map`` on the main
    process first when the dataset is file-backed, on all ranks at once otherwise
    (``preparation_order``). ``summary``, when given, receives ``over_max_length_skipped``
    (rows left out: over ``max_length``, ``over_max_length="exclude"``) and
    ``over_max_length_cut`` (rows trained on a cut completion).
    """
    if isinstance(dataset, (str, Path)):
        dataset = read_records(dataset)
    if isinstance(dataset, datasets.IterableDataset):
        raise TypeError("streaming datasets are not supported: pass a datasets.Dataset or a list of rows")
    if isinstance(dataset, datasets.Dataset) and "prompt_ids" in dataset.column_names:
        return dataset
    if len(dataset) == 0:
        raise InputError("the preference dataset is empty")
    if not isinstance(dataset, datasets.Dataset):
        dataset = rows_to_dataset({_JSON_ROW: json.dumps(dict(row))} for row in dataset)
    expected = expected_ref_fingerprint(config, model) if config.reference == "precomputed" else None
    if getattr(config, "process_index", 0) != 0:  # one set of `datasets` progress bars: the main process's
        datasets.disable_progress_bars()
    features = _prepared_features(config)
    with preparation_order(config, dataset, "preference dataset preparation"):
        prepared = dataset.map(_prepare_one, with_indices=True, remove_columns=dataset.column_names,
                               fn_kwargs={"tokenizer": tokenizer, "config": config, "expected": expected,
                                          "features": features},
                               features=features, desc="Tokenizing preference pairs")
        skips = [(rid, reason) for rid, reason in zip(prepared["id"], prepared[_SKIP]) if reason]
        num_cut = sum(n > 0 for n in prepared[_CUT])
        if skips:
            prepared = prepared.filter(lambda reason: not reason, input_columns=_SKIP,
                                       desc="Leaving out pairs over max_length")
    prepared = prepared.remove_columns([_SKIP, _CUT])
    if summary is not None:
        summary.update(over_max_length_skipped=len(skips), over_max_length_cut=num_cut)
    if skips:
        logger.warning("preference data: %d of %d rows exceed max_length=%s and are left out (over_max_length="
                       "exclude), e.g. %s", len(skips), len(dataset), config.max_length,
                       "; ".join(f"{rid}: {reason}" for rid, reason in skips[:3]))
    if num_cut:
        logger.warning("preference data: %d rows exceed max_length=%s and are trained on the completion's head, "
                       "without its end-of-turn token (over_max_length=cut)", num_cut, config.max_length)
    if len(prepared) == 0:
        raise ConfigError(f"every one of the {len(dataset)} preference rows exceeds max_length={config.max_length} "
                          f"(e.g. {skips[0][0]}: {skips[0][1]}): raise max_length, or set over_max_length=cut")
    if config.truncated == "train_without_end":
        num_cut = _count_cut(dataset)
        if num_cut:
            logger.warning("preference data: %d truncated completions (finish_reason 'length') are trained "
                           "without an end-of-turn token (truncated=train_without_end)", num_cut)
    return prepared


def _count_cut(dataset: datasets.Dataset) -> int:
    if _JSON_ROW in dataset.column_names:
        return count_truncated(json.loads(text) for text in dataset[_JSON_ROW])
    return count_truncated(dataset)
