"""SFT dataset stages: conversation rows → token ids with labels, then truncation.

A row is ``{"messages": [...] | "<json>", "tools": [...] | "<json>" (optional), "id": str
(optional), "enable_thinking": bool (optional)}``. JSON strings let one Arrow column hold
messages whose content is a string in one row and ``{"blocks": [...]}`` in another, or
tools with different parameter schemas. ``align.chat.encode`` renders and tokenizes it once
and gives the loss mask (assistant content and its end-of-turn token); the label of a
token is its id where the mask is 1 and -100 elsewhere. TRL's ``SFTTrainer`` takes a
dataset with ``input_ids`` and ``labels`` as already processed and uses the labels as they
are, so this mask is exactly the one the loss sees.

Before tokenizing, the data hygiene of the Apertus report (E.1.1; `align.trainers.sft_hygiene`)
can run on conversation rows: ``identity_filter`` drops conversations whose assistant text
names another model or its maker, ``strip_boxed`` turns ``\\boxed{X}`` into ``X`` in
assistant answers. Both are counted (``summary``), and the dropped rows are logged with
their reason, never lost silently.

Each stage is ``Dataset → Dataset`` (pure, so ``map`` fingerprints cache it).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from datasets import Dataset

from align.chat import encode
from align.chat.encode import IGNORE_INDEX
from align.data.records import list_field, record_id
from align.errors import ConfigError, InputError, RecordError, loading
from align.io import rows_to_dataset
from align.trainers.sft_hygiene import IDENTITY_KEYWORDS, filter_identity, strip_boxed_messages

__all__ = [
    "IGNORE_INDEX",
    "clean_sft_dataset",
    "encode_sft_row",
    "labels_from_mask",
    "load_sft_dataset",
    "normalize_sft_input",
    "prepare_sft_dataset",
    "sft_json_rows",
    "sft_rows_file",
    "tokenize_sft_dataset",
    "truncate_sft_dataset",
]

logger = logging.getLogger(__name__)


def labels_from_mask(input_ids: Sequence[int], loss_mask: Sequence[int]) -> list[int]:
    """Token id where the mask is 1, -100 (ignored by the loss) where it is 0."""
    if len(input_ids) != len(loss_mask):
        raise RuntimeError(
            f"input_ids ({len(input_ids)}) and loss_mask ({len(loss_mask)}) differ in length"
        )
    return [tok if keep else IGNORE_INDEX for tok, keep in zip(input_ids, loss_mask)]


def _row_tools(row: Mapping[str, Any], rid: str) -> list[Any] | None:
    """The row's tool schemas: a list, a JSON string of a list (Arrow-friendly), or absent."""
    return list_field(row, "tools", rid) or None


def _row_messages(row: Mapping[str, Any], rid: str) -> list[Any]:
    """The conversation (a list, or its JSON string), with at least one assistant turn."""
    messages = list_field(row, "messages", rid)
    if not messages:
        raise RecordError(rid, "messages", "missing or not a non-empty list of messages")
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or "role" not in message:
            raise RecordError(rid, f"messages[{i}]", "expected a mapping with a 'role'")
    if not any(m["role"] == "assistant" for m in messages):
        raise RecordError(rid, "messages", "has no assistant message, so nothing to train on")
    return messages


def encode_sft_row(
    row: Mapping[str, Any],
    tokenizer: Any,
    *,
    index: int | None = None,
    chat_format: str = "apertus",
    chat_date: str | None = None,
    max_length: int | None = None,
) -> dict[str, list[int]]:
    """Tokenize one conversation into ``input_ids`` and ``labels`` (-100 off the loss mask).

    With ``max_length`` only its first ``max_length`` tokens are made, from a bounded prefix of
    the rendered text (``align.chat.encode.first_tokens``): a conversation far over the limit is
    never tokenized whole, and one whose trained tokens all lie past it comes back with no label
    for ``truncate_sft_dataset`` to drop. Raises `RecordError` naming the row (its id, else its
    index) and the field.
    """
    rid = record_id(row, index)
    messages = _row_messages(row, rid)
    tools = _row_tools(row, rid)
    thinking = row.get("enable_thinking")
    if thinking is not None and not isinstance(thinking, bool):
        raise RecordError(rid, "enable_thinking", f"expected a bool, got {thinking!r}")
    try:
        encoded = encode(
            tokenizer,
            messages,
            chat_format=chat_format,
            tools=tools,
            enable_thinking=bool(thinking),
            chat_date=chat_date,
            max_tokens=max_length,
        )
    except InputError as err:
        raise RecordError(rid, "messages", str(err)) from None
    cut = max_length is not None and len(encoded.input_ids) >= max_length
    if not any(encoded.loss_mask) and not cut:
        raise RecordError(
            rid, "messages", "the loss mask is all zeros (no trained assistant token)"
        )
    return {
        "input_ids": encoded.input_ids,
        "labels": labels_from_mask(encoded.input_ids, encoded.loss_mask),
    }


def tokenize_sft_dataset(
    dataset: Dataset,
    tokenizer: Any,
    *,
    chat_format: str = "apertus",
    chat_date: str | None = None,
    num_proc: int | None = None,
    max_length: int | None = None,
) -> Dataset:
    """Map conversation rows to ``input_ids`` + ``labels``, dropping every other column; with
    ``max_length``, each row's first ``max_length`` tokens only (``encode_sft_row``)."""

    def _encode(row: dict[str, Any], index: int) -> dict[str, list[int]]:
        return encode_sft_row(row, tokenizer, index=index, chat_format=chat_format, chat_date=chat_date,
                              max_length=max_length)

    return dataset.map(
        _encode,
        with_indices=True,
        remove_columns=dataset.column_names,
        num_proc=num_proc,
        desc="Tokenizing SFT conversations",
    )


def _check_max_length(max_length: int | None) -> None:
    if max_length is not None and max_length < 2:
        raise ConfigError(f"max_length must be >= 2 to hold a prediction target, got {max_length}")


def truncate_sft_dataset(dataset: Dataset, max_length: int | None) -> Dataset:
    """Cut rows to ``max_length`` tokens (keeping the start) and drop rows left untrained.

    A conversation whose assistant tokens all lie past ``max_length`` would only add prompt
    tokens with no loss; it is dropped and the count is logged, never silently.
    """
    if max_length is None:
        return dataset
    _check_max_length(max_length)
    cut = dataset.map(
        lambda row: {
            "input_ids": row["input_ids"][:max_length],
            "labels": row["labels"][:max_length],
        },
        desc=f"Truncating to {max_length} tokens",
    )
    kept = cut.filter(
        lambda row: any(label != IGNORE_INDEX for label in row["labels"][1:]),
        desc="Dropping rows with no trained token left",
    )
    if len(kept) < len(cut):
        logger.warning(
            "SFT: dropped %d of %d rows whose trained tokens all lie beyond max_length=%d",
            len(cut) - len(kept),
            len(cut),
            max_length,
        )
    return kept


def clean_sft_dataset(
    dataset: Dataset,
    *,
    strip_boxed: bool = False,
    identity_filter: bool = False,
    identity_keywords: Sequence[str] | None = None,
    summary: dict[str, Any] | None = None,
) -> Dataset:
    """The data hygiene of conversation rows: identity filter, then ``\\boxed{}`` stripping.

    ``summary`` (when given) receives ``identity_dropped`` (rows dropped) and
    ``boxed_stripped`` (rows whose answers lost a ``\\boxed{}``) for what was turned on.
    Only assistant text is read or changed (`align.trainers.sft_hygiene`).
    """
    if not (strip_boxed or identity_filter):
        return dataset
    if "messages" not in dataset.column_names:
        raise InputError("strip_boxed / identity_filter read conversations: the SFT dataset needs a "
                         "'messages' column (not pre-tokenized input_ids + labels)")
    summary = {} if summary is None else summary
    if identity_filter:
        keywords = IDENTITY_KEYWORDS if identity_keywords is None else tuple(identity_keywords)
        kept, dropped = filter_identity(dataset, keywords)
        summary["identity_dropped"] = len(dropped)
        if len(dropped):
            first = dropped[:3]  # the first three dropped rows, as columns
            examples = "; ".join(f"row {i}: {reason}"
                                 for i, reason in zip(first["row_index"], first["drop_reason"]))
            logger.warning("SFT identity filter: dropped %d of %d rows, e.g. %s", len(dropped), len(dataset),
                           examples)
        dataset = kept
    if strip_boxed:
        def _strip(row: dict[str, Any], index: int) -> dict[str, Any]:
            messages = list_field(row, "messages", record_id(row, index))
            if not messages:
                return {"messages": row["messages"], "_boxed": False}  # named by `encode_sft_row`
            stripped = strip_boxed_messages(messages, record_id(row, index))
            out = json.dumps(stripped) if isinstance(row["messages"], str) else stripped
            return {"messages": out, "_boxed": stripped != messages}

        dataset = dataset.map(_strip, with_indices=True, desc="Stripping \\boxed{} from answers")
        summary["boxed_stripped"] = int(sum(dataset["_boxed"]))
        dataset = dataset.remove_columns("_boxed")
    return dataset


def prepare_sft_dataset(
    dataset: Dataset,
    tokenizer: Any,
    *,
    chat_format: str = "apertus",
    chat_date: str | None = None,
    max_length: int | None = None,
    num_proc: int | None = None,
    strip_boxed: bool = False,
    identity_filter: bool = False,
    identity_keywords: Sequence[str] | None = None,
    summary: dict[str, Any] | None = None,
) -> Dataset:
    """Clean (``clean_sft_dataset``) and tokenize conversation rows (or check pre-tokenized
    ones), then truncate. ``summary`` (when given) receives the hygiene counts.

    A dataset that already has ``input_ids`` must also have ``labels``: without them TRL
    would train on every token, the silent error this module exists to prevent.
    """
    columns = set(dataset.column_names)
    if "input_ids" in columns:
        if strip_boxed or identity_filter:
            raise ConfigError("strip_boxed / identity_filter read conversations, but this SFT dataset is "
                              "pre-tokenized (input_ids + labels): clean the rows before tokenizing them, or "
                              "turn both off")
        if "labels" not in columns:
            raise InputError(
                "pre-tokenized SFT dataset has 'input_ids' but no 'labels' column; "
                "add labels (-100 off the loss) or pass 'messages' rows instead"
            )
        dataset = dataset.select_columns(["input_ids", "labels"])
    elif "messages" in columns:
        dataset = clean_sft_dataset(dataset, strip_boxed=strip_boxed, identity_filter=identity_filter,
                                    identity_keywords=identity_keywords, summary=summary)
        if len(dataset) == 0:
            raise InputError("SFT dataset: no row left after the identity filter")
        _check_max_length(max_length)  # said before any row is tokenized
        dataset = tokenize_sft_dataset(
            dataset, tokenizer, chat_format=chat_format, chat_date=chat_date, num_proc=num_proc,
            max_length=max_length,
        )
    else:
        raise InputError(
            f"SFT dataset needs a 'messages' column (or 'input_ids' + 'labels'); "
            f"it has {sorted(columns)}"
        )
    return truncate_sft_dataset(dataset, max_length)


# The columns SFT reads from a conversation row; ``messages`` and ``tools`` travel as JSON text.
SFT_ROW_COLUMNS = ("id", "messages", "tools", "enable_thinking")
_JSON_COLUMNS = ("messages", "tools")


def sft_json_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Conversation rows with ``messages`` and ``tools`` as JSON text (the other columns SFT
    does not read are left out).

    Arrow gives a column one type: message contents that are a string in one row and a
    ``{"blocks": [...]}`` structure (thinking, tool calls) in another cannot share a struct
    column ("cannot mix struct and non-struct"), and struct columns would add a None for
    every key some message lacks, changing what is rendered. As JSON text every row keeps
    exactly its own structure; ``encode_sft_row`` parses it back. Ids become text.
    """
    out = []
    for row in rows:
        item: dict[str, Any] = {}
        for key in SFT_ROW_COLUMNS:
            if key not in row:
                continue
            value = row[key]
            if key in _JSON_COLUMNS and value is not None and not isinstance(value, str):
                value = json.dumps(value, ensure_ascii=False)
            elif key == "id" and value is not None:
                value = str(value)
            item[key] = value
        out.append(item)
    return out


def sft_json_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """One conversation row as ``sft_json_rows`` writes it."""
    return sft_json_rows([row])[0]


def sft_rows_file(rows: Sequence[Mapping[str, Any]] | Any, cache_dir: str | Path) -> Path:
    """The JSON-encoded rows (``sft_json_rows``) as a JSONL file under ``cache_dir``, named by
    their content: written once (atomically, a line at a time: the rows are never held as one
    string), found again by every rank and after a requeue."""
    import os
    import tempfile

    import xxhash

    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    digest = xxhash.xxh3_128()
    fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=".sft-rows-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            for row in rows:
                line = json.dumps(sft_json_row(row), ensure_ascii=False) + "\n"
                digest.update(line.encode())
                handle.write(line)
        path = cache_dir / f"sft-rows-{digest.hexdigest()}.jsonl"
        if path.exists():
            os.unlink(tmp)
        else:
            os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


@dataclass
class NormalizedRows:
    """What ``normalize_sft_input`` wrote: the file of rows to train on, and what it left out."""

    path: Path
    rows: int  # rows read
    kept: int
    skipped: list[dict[str, Any]] = field(default_factory=list)  # {row, id, reason}, each row left out


def iter_input_rows(source: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(index, row) of an SFT input, streamed: a JSONL file, a directory of data files, a Parquet file (in
    record batches), a JSON list, or a ``datasets`` name. Nothing holds the whole input as Python objects."""
    from align.io import iter_jsonl
    from align.io.records import data_files, data_suffix, looks_local

    path = Path(source).expanduser()
    files = data_files(path) if path.is_dir() else [path]
    index = 0
    if not path.exists() and not looks_local(str(source)):
        from datasets import load_dataset

        with loading("input", str(source)):
            dataset = load_dataset(str(source), split="train")
        for row in dataset:
            yield index, dict(row)
            index += 1
        return
    for file in files:
        suffix = data_suffix(file)
        if suffix == ".jsonl":
            for _, row in iter_jsonl(file):
                yield index, row
                index += 1
        elif suffix == ".parquet":
            import pyarrow.parquet as pq

            for batch in pq.ParquetFile(file).iter_batches(batch_size=1024):
                for row in batch.to_pylist():
                    yield index, row
                    index += 1
        else:
            from align.io import read_records

            for row in read_records(file):
                yield index, row
                index += 1


def normalize_sft_input(source: str | Path, cache_dir: str | Path, *, chat_format: str, key: str,
                        skip: Any = None, check: Any = None) -> NormalizedRows:
    """Stream an SFT input once into the JSON-encoded rows SFT trains on (``sft_json_row``), under
    ``cache_dir``, named by ``key`` (the input's content fingerprint and the settings that decide the
    file): a rerun, every rank and a requeued job find it made. Each row is checked as it passes
    (``messages`` a non-empty list, an id once); ``skip(messages, tools) -> reason | None`` leaves a
    row out with its reason (recorded, never silent); ``check(rid, row, messages)`` raises for a row the
    stage's settings cannot train as given (``key`` must then cover those settings). Peak memory is one row and the ids seen,
    not the input: a 20 GB mixture is read by one rank, a line at a time (bench/sft_memory.py)."""
    import os
    import tempfile

    cache_dir = Path(cache_dir)
    path = cache_dir / f"sft-input-{key[:32]}.jsonl"
    record = cache_dir / f"sft-input-{key[:32]}.json"
    if path.exists() and record.exists():
        done = json.loads(record.read_text())
        return NormalizedRows(path, done["rows"], done["kept"], done["skipped"])
    cache_dir.mkdir(parents=True, exist_ok=True)
    seen: set[str] = set()
    rows = kept = 0
    skipped: list[dict[str, Any]] = []
    fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=".sft-input-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            for index, row in iter_input_rows(source):
                rows += 1
                rid = record_id(row, index)
                if isinstance(row.get("id"), str) and row["id"]:
                    if row["id"] in seen:
                        raise RecordError(rid, "id", f"duplicate id (row {index} and an earlier one)")
                    seen.add(row["id"])
                if "messages" in row:
                    messages = list_field(row, "messages", rid)
                    if not messages:
                        raise RecordError(rid, "messages", f"expected a non-empty list of messages, got "
                                          f"{row['messages']!r:.60}")
                    if check is not None:
                        check(rid, row, messages)
                    reason = skip(messages, list_field(row, "tools", rid)) if skip is not None else None
                    if reason:
                        skipped.append({"row": index, "id": row.get("id"), "reason": reason})
                        continue
                handle.write(json.dumps(sft_json_row(row) if "messages" in row else dict(row),
                                        ensure_ascii=False) + "\n")
                kept += 1
        if rows == 0:
            raise InputError(f"sft: input={str(source)!r} holds no rows")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    tmp_record = record.with_suffix(".json.tmp")
    tmp_record.write_text(json.dumps({"rows": rows, "kept": kept, "skipped": skipped}))
    os.replace(tmp_record, record)
    return NormalizedRows(path, rows, kept, skipped)


def load_sft_dataset(
    source: Dataset | str | Path | Sequence[Mapping[str, Any]],
    split: str = "train",
    *,
    cache_dir: str | Path | None = None,
    main_process_first: Any = None,
) -> Dataset:
    """A `Dataset` from a Dataset, a list of rows, or a JSONL / Parquet / JSON file path.

    Conversation rows given as a list are JSON-encoded (``sft_json_rows``). With
    ``cache_dir`` they are written once to a content-named file there and loaded from it
    (``main_process_first``: the context in which the main process goes first, e.g.
    ``TrainingArguments.main_process_first``), so the dataset is file-backed: the main
    process tokenizes it first and the other ranks, and a requeued run, reuse the
    `datasets` cache. Without ``cache_dir`` the rows stay in memory.
    """
    if isinstance(source, Dataset):
        return source
    if isinstance(source, (str, Path)):  # a Path is read like its text: a .parquet file as Parquet
        from datasets import load_dataset

        from align.io.records import data_suffix

        source = str(source)
        kind = "parquet" if data_suffix(source) == ".parquet" else "json"
        with loading("input", source):
            return load_dataset(kind, data_files=source, split=split)
    if isinstance(source, Sequence):
        rows = source
        if not any("messages" in row for row in rows):  # pre-tokenized rows (input_ids + labels)
            return rows_to_dataset([dict(row) for row in rows])
        if cache_dir is None:
            return rows_to_dataset(sft_json_rows(rows))
        from datasets import load_dataset

        with main_process_first if main_process_first is not None else contextlib.nullcontext():
            path = sft_rows_file(rows, cache_dir)
            return load_dataset("json", data_files=str(path), split="train")
    raise TypeError(
        f"SFT data must be a Dataset, a list of rows or a file path, got {type(source).__name__}"
    )
