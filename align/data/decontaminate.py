"""Remove training prompts that copy or closely paraphrase benchmark prompts.

Method (Apertus report §E.1.2; docs/method.md, Decontamination): every training prompt is checked against every
benchmark prompt that shares a token 8-gram with it; the pair is aligned with
``difflib.SequenceMatcher`` (Ratcliff–Obershelp, autojunk off), blocks shorter than 5
tokens are dropped, and the prompt is contaminated when the summed block length exceeds
half the benchmark prompt's length. An inverted n-gram index (``align.data.ngram_index``)
keeps this from comparing all pairs.

Benchmark prompts shorter than ``ngram`` tokens are indexed by their ``min_block``-grams,
so the same rule applies to them with no n-gram prefilter to miss a match; prompts shorter
than ``min_block`` tokens can never hold a counted block and are reported as
``too_short`` in the summary, never matched.

Entry points: ``decontaminate`` (in memory), ``decontaminate_files`` (writes
``kept.jsonl``, ``removed.jsonl`` and ``summary.json``), ``run`` (what
``align decontaminate RECIPE.yaml`` calls).
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml
from tqdm.auto import tqdm

from align.data.ngram_index import Match, NgramIndex, build_tokenizer, gram_length
from align.data.records import RecordError

logger = logging.getLogger(__name__)

TURNS = ("all", "first")


# --------------------------------------------------------------------------- configs


@dataclass
class BenchmarkSpec:
    """One benchmark to decontaminate against.

    Fields:
        name (str): label used in the report; unique within a run.
        path (str): a ``.jsonl`` or ``.parquet`` file, or anything
            ``datasets.load_dataset`` accepts (hub name, local dataset directory).
        split (str, default "test"): split for ``load_dataset`` sources; ignored for files.
        text_field (str, default "prompt"): column holding the prompt text (a string).
        id_field (str | None, default None): column with item ids for the report; the row
            index is always reported.
        subset (str | None, default None): ``load_dataset`` configuration name (e.g. an
            MMLU subject).
    """

    name: str
    path: str
    split: str = "test"
    text_field: str = "prompt"
    id_field: str | None = None
    subset: str | None = None

    def __post_init__(self) -> None:
        for key in ("name", "path", "text_field"):
            value = getattr(self, key)
            if not isinstance(value, str) or not value:
                raise ValueError(f"benchmarks: {key!r} must be a non-empty string, got {value!r}")


@dataclass
class DecontaminationConfig:
    """Settings of ``align decontaminate``; this docstring is its manual.

    Data:
        train_path (str | None): training set, ``.jsonl``/``.parquet`` or a
            ``load_dataset`` source. Needed by ``decontaminate_files``/``run`` only.
        train_split (str, default "train"): split for ``load_dataset`` sources.
        train_text_field (str | None, default None): None reads the record schema
            (``id`` + ``messages``, user turns checked); a column name reads raw prompts
            from that string field instead.
        turns ("all" | "first", default "all"): in messages mode, check every user turn
            or only the first one. A record is removed if any checked turn matches.
        benchmarks (list[BenchmarkSpec | dict]): the benchmarks, each with a unique name.
        output_dir (str | None): where ``kept.jsonl``, ``removed.jsonl`` and
            ``summary.json`` are written.

    Matching (defaults from the Apertus report §E.1.2):
        ngram (int, default 8, ≥ 1): prefilter n-gram length, in tokens.
        min_block (int, default 5, ≥ 1): SequenceMatcher blocks shorter than this are
            dropped before summing.
        ratio (float, default 0.5, in (0, 1)): contaminated when the summed blocks exceed
            ``ratio`` × the benchmark prompt's length in tokens.
        tokenizer (str | callable, default "regex"): "regex" is a fast lowercased word and
            punctuation tokenizer (CJK split per character); another string is a HF
            tokenizer name or path (no special tokens); a callable maps text to ints or
            strings (must be picklable when ``num_workers`` > 1).

    Execution:
        num_workers (int | None, default None = os.cpu_count()): processes for matching.
        chunk_size (int, default 512): training prompts per task sent to a worker.
        progress (bool, default True): show a tqdm bar.
        examples_per_benchmark (int, default 5): removed examples kept in the summary.
    """

    train_path: str | None = None
    train_split: str = "train"
    train_text_field: str | None = None
    turns: str = "all"
    benchmarks: list[BenchmarkSpec] = field(default_factory=list)
    output_dir: str | None = None

    ngram: int = 8
    min_block: int = 5
    ratio: float = 0.5
    tokenizer: str | Callable[[str], Iterable[Hashable]] = "regex"

    num_workers: int | None = None
    chunk_size: int = 512
    progress: bool = True
    examples_per_benchmark: int = 5

    def __post_init__(self) -> None:
        self.benchmarks = [_as_benchmark_spec(b, i) for i, b in enumerate(self.benchmarks)]
        names = [b.name for b in self.benchmarks]
        if len(set(names)) != len(names):
            raise ValueError(f"benchmarks: names must be unique, got {names}")
        if self.turns not in TURNS:
            raise ValueError(f"turns: expected one of {TURNS}, got {self.turns!r}")
        for key in ("ngram", "min_block", "chunk_size"):
            _check_int(key, getattr(self, key), low=1)
        _check_int("examples_per_benchmark", self.examples_per_benchmark, low=0)
        if self.num_workers is not None:
            _check_int("num_workers", self.num_workers, low=1)
        if (
            isinstance(self.ratio, bool)
            or not isinstance(self.ratio, (int, float))
            or not 0 < self.ratio < 1
        ):
            raise ValueError(
                f"ratio: expected a number in (0, 1), got {self.ratio!r} (the paper uses 0.5)"
            )
        if self.train_text_field is not None and not (
            isinstance(self.train_text_field, str) and self.train_text_field
        ):
            raise ValueError(
                f"train_text_field: expected a column name or null, got {self.train_text_field!r}"
            )
        if not (isinstance(self.tokenizer, str) and self.tokenizer) and not callable(
            self.tokenizer
        ):
            raise ValueError(
                f"tokenizer: expected 'regex', a HF tokenizer name/path or a callable, got {self.tokenizer!r}"
            )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DecontaminationConfig:
        """Build from a recipe mapping; an unknown key is an error, never ignored."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"decontaminate recipe: unknown keys {unknown}; valid keys: {sorted(known)}"
            )
        return cls(**data)

    def workers(self) -> int:
        """The resolved number of worker processes."""
        return self.num_workers or os.cpu_count() or 1

    def check_file_run(self) -> None:
        """Check the fields that only the file-based run needs."""
        missing = [k for k in ("train_path", "output_dir") if not getattr(self, k)]
        if missing:
            raise ValueError(f"decontaminate: {', '.join(missing)} must be set to run on files")
        if not self.benchmarks:
            raise ValueError(
                "decontaminate: benchmarks is empty; list at least one {name, path, text_field}"
            )


def _check_int(key: str, value: Any, *, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{key}: expected an integer ≥ {low}, got {value!r}")


def _as_benchmark_spec(entry: BenchmarkSpec | Mapping[str, Any], i: int) -> BenchmarkSpec:
    if isinstance(entry, BenchmarkSpec):
        return entry
    if not isinstance(entry, Mapping):
        raise ValueError(
            f"benchmarks[{i}]: expected a mapping with name, path, text_field; got {entry!r}"
        )
    known = {f.name for f in fields(BenchmarkSpec)}
    unknown = sorted(set(entry) - known)
    if unknown:
        raise ValueError(f"benchmarks[{i}]: unknown keys {unknown}; valid keys: {sorted(known)}")
    missing = [k for k in ("name", "path") if k not in entry]
    if missing:
        raise ValueError(f"benchmarks[{i}]: missing {missing}")
    return BenchmarkSpec(**entry)


def load_config(path: str | os.PathLike) -> DecontaminationConfig:
    """Read a decontamination recipe (YAML mapping of ``DecontaminationConfig`` fields)."""
    with open(path, encoding="utf-8") as handle:
        data = yaml.safe_load(handle) or {}
    if not isinstance(data, Mapping):
        raise ValueError(f"{path}: expected a mapping of settings, got {type(data).__name__}")
    return DecontaminationConfig.from_dict(data)


# --------------------------------------------------------------------------- inputs


@dataclass
class BenchmarkPrompts:
    """A loaded benchmark: its prompt texts and, optionally, item ids."""

    name: str
    texts: list[str]
    ids: list[Any] | None = None
    source: str = "<memory>"
    text_field: str = "text"

    def __post_init__(self) -> None:
        if not self.texts:
            raise ValueError(f"{self.source}: benchmark {self.name!r} has no prompts")
        for i, text in enumerate(self.texts):
            if not isinstance(text, str):
                raise RecordError(
                    f"{self.source} row {i}",
                    self.text_field,
                    f"expected a string, got {type(text).__name__} {text!r:.80}",
                )
        if self.ids is not None and len(self.ids) != len(self.texts):
            raise ValueError(
                f"{self.source}: benchmark {self.name!r} has {len(self.ids)} ids for {len(self.texts)} prompts"
            )


def read_rows(path: str, *, split: str = "train", subset: str | None = None) -> Any:
    """Rows of a ``.jsonl``/``.parquet`` file (list of dicts) or a ``load_dataset`` source."""
    if path.endswith((".jsonl", ".parquet")):
        if not Path(path).is_file():
            raise ValueError(f"{path}: file not found")
        return _read_jsonl(path) if path.endswith(".jsonl") else _read_parquet(path)
    import datasets

    try:
        return datasets.load_dataset(path, subset, split=split)
    except Exception as err:  # report which source failed, keep the cause
        raise ValueError(
            f"{path}: could not load split {split!r} with datasets.load_dataset: {err}"
        ) from err


def _read_jsonl(path: str) -> list[dict[str, Any]]:
    rows = []
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}: line {line_no}: not valid JSON ({err.msg})") from err
            if not isinstance(row, dict):
                raise ValueError(
                    f"{path}: line {line_no}: expected a JSON object, got {type(row).__name__}"
                )
            rows.append(row)
    return rows


def _read_parquet(path: str) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def load_benchmark(spec: BenchmarkSpec) -> BenchmarkPrompts:
    """Load one benchmark and check its text (and id) field on every row."""
    rows = read_rows(spec.path, split=spec.split, subset=spec.subset)
    source = spec.path
    if len(rows) == 0:
        raise ValueError(f"{source}: benchmark {spec.name!r} is empty (split {spec.split!r})")
    wanted = [spec.text_field] + ([spec.id_field] if spec.id_field else [])
    columns = getattr(rows, "column_names", None)
    for key in wanted:
        if columns is not None and key not in columns:
            raise RecordError(
                f"{source} (benchmark {spec.name!r})", key, f"no such column; columns: {columns}"
            )
    if columns is not None:  # a datasets.Dataset: read the columns, not row dicts
        texts, ids = (
            list(rows[spec.text_field]),
            list(rows[spec.id_field]) if spec.id_field else None,
        )
    else:
        texts, ids = _columns_from_rows(rows, source, spec.text_field, spec.id_field)
    return BenchmarkPrompts(spec.name, texts, ids, source, spec.text_field)


def _columns_from_rows(
    rows: list[dict], source: str, text_field: str, id_field: str | None
) -> tuple[list, list | None]:
    texts, ids = [], [] if id_field else None
    for i, row in enumerate(rows):
        for key in [text_field] + ([id_field] if id_field else []):
            if key not in row:
                raise RecordError(
                    f"{source} row {i}", key, f"missing; fields present: {sorted(row)}"
                )
        texts.append(row[text_field])
        if id_field:
            ids.append(row[id_field])
    return texts, ids


def as_benchmarks(
    benchmarks: Sequence[BenchmarkPrompts] | Mapping[str, Sequence[str]],
) -> list[BenchmarkPrompts]:
    """Accept loaded benchmarks, or a plain ``{name: [prompt, ...]}`` mapping."""
    if isinstance(benchmarks, Mapping):
        out = [BenchmarkPrompts(name, list(texts)) for name, texts in benchmarks.items()]
    else:
        out = list(benchmarks)
    if not out:
        raise ValueError("decontaminate: no benchmarks given")
    names = [b.name for b in out]
    if len(set(names)) != len(names):
        raise ValueError(f"decontaminate: benchmark names must be unique, got {names}")
    return out


# --------------------------------------------------------------------------- prompts


@dataclass(frozen=True)
class TrainPrompt:
    """A piece of training text to check: which record, which message, what text."""

    record: int
    message: int | None
    text: str


class FieldProblem(ValueError):
    """A bad field inside a record, located by a path such as ``messages[2].content``."""

    def __init__(self, field: str, problem: str):
        self.field, self.problem = field, problem
        super().__init__(f"{field}: {problem}")


def user_text(content: Any, where: str = "content") -> str:
    """Text of a user message: a string, or the text parts of ``{"parts": [...]}``."""
    if isinstance(content, str):
        return content
    if isinstance(content, Mapping) and isinstance(content.get("parts"), list):
        texts = []
        for j, part in enumerate(content["parts"]):
            if not isinstance(part, Mapping):
                raise FieldProblem(
                    f"{where}.parts[{j}]", f"expected a mapping, got {type(part).__name__}"
                )
            if part.get("type") != "text":
                continue  # images and other non-text parts cannot be matched
            if not isinstance(part.get("text"), str):
                raise FieldProblem(
                    f"{where}.parts[{j}].text", f"expected a string, got {part.get('text')!r:.80}"
                )
            texts.append(part["text"])
        return "\n".join(texts)
    raise FieldProblem(where, f"expected a string or {{'parts': [...]}}, got {content!r:.80}")


def record_prompts(
    record: Any, index: int, source: str, config: DecontaminationConfig
) -> list[TrainPrompt]:
    """The texts of one training record that are checked, per the config's mode."""
    label = f"{source} row {index}"
    if not isinstance(record, Mapping):
        raise RecordError(label, "<record>", f"expected a mapping, got {type(record).__name__}")
    if config.train_text_field is not None:
        text = record.get(config.train_text_field)
        if not isinstance(text, str):
            problem = (
                "missing"
                if config.train_text_field not in record
                else f"expected a string, got {type(text).__name__}"
            )
            raise RecordError(label, config.train_text_field, problem)
        return [TrainPrompt(index, None, text)]
    if not isinstance(record.get("id"), str) or not record["id"]:
        raise RecordError(
            label,
            "id",
            "missing or not a non-empty string (or set train_text_field for raw prompts)",
        )
    label = f"{label} (id {record['id']!r})"
    messages = record.get("messages")
    if not isinstance(messages, list):
        raise RecordError(
            label, "messages", f"expected a list of messages, got {type(messages).__name__}"
        )
    prompts = []
    for m, message in enumerate(messages):
        if not isinstance(message, Mapping) or "role" not in message or "content" not in message:
            raise RecordError(
                label, f"messages[{m}]", "expected a mapping with 'role' and 'content'"
            )
        if message["role"] != "user":
            continue
        try:
            prompts.append(
                TrainPrompt(index, m, user_text(message["content"], f"messages[{m}].content"))
            )
        except FieldProblem as err:
            raise RecordError(label, err.field, err.problem) from None
        if config.turns == "first":
            break
    if not prompts:
        raise RecordError(label, "messages", "has no user message to check")
    return prompts


def training_prompts(
    records: Iterable[Any], source: str, config: DecontaminationConfig
) -> list[TrainPrompt]:
    """Every checked text of every record, in record order."""
    out: list[TrainPrompt] = []
    for index, record in enumerate(records):
        out.extend(record_prompts(record, index, source, config))
    return out


# --------------------------------------------------------------------------- matching

_WORKER: dict[str, Any] = {}


def _init_worker(index: NgramIndex, tokenize: Callable[[str], Sequence[int]]) -> None:
    _WORKER["index"], _WORKER["tokenize"] = index, tokenize


def _match_texts(texts: Sequence[str]) -> list[list[Match]]:
    index, tokenize = _WORKER["index"], _WORKER["tokenize"]
    return [index.match(tokenize(text)) for text in texts]


def match_texts(
    texts: Sequence[str],
    index: NgramIndex,
    tokenize: Callable[[str], Sequence[int]],
    config: DecontaminationConfig,
) -> list[list[Match]]:
    """Matches of each text, with a process pool when the config asks for several workers.

    Results come back in input order, so the pool and a single process agree exactly.
    """
    chunks = [texts[i : i + config.chunk_size] for i in range(0, len(texts), config.chunk_size)]
    workers = min(config.workers(), len(chunks))
    bar = tqdm(total=len(texts), unit="prompt", desc="decontaminate", disable=not config.progress)
    results: list[list[Match]] = []
    try:
        if workers <= 1:
            _init_worker(index, tokenize)
            for chunk in chunks:
                results.extend(_match_texts(chunk))
                bar.update(len(chunk))
        else:
            context = multiprocessing.get_context("spawn")
            with context.Pool(
                workers, initializer=_init_worker, initargs=(index, tokenize)
            ) as pool:
                for done in pool.imap(_match_texts, chunks):
                    results.extend(done)
                    bar.update(len(done))
    finally:
        bar.close()
        _WORKER.clear()
    return results


# --------------------------------------------------------------------------- report


def _bench_places(benchmarks: list[BenchmarkPrompts]) -> list[tuple[int, int]]:
    """(benchmark number, row) of each global benchmark-item number in the index."""
    return [(b, i) for b, bench in enumerate(benchmarks) for i in range(len(bench.texts))]


def _match_entry(
    match: Match, message: int | None, bench: BenchmarkPrompts, row: int, bench_tokens: int
) -> dict[str, Any]:
    return {
        "benchmark": bench.name,
        "bench_index": row,
        "bench_id": bench.ids[row] if bench.ids is not None else None,
        "bench_text": bench.texts[row],
        "message_index": message,
        "matched_tokens": match.matched,
        "bench_tokens": bench_tokens,
        "overlap_ratio": round(match.matched / bench_tokens, 4),
    }


def removed_rows(
    records: Any,
    prompts: list[TrainPrompt],
    matches: list[list[Match]],
    benchmarks: list[BenchmarkPrompts],
    bench_lengths: list[int],
) -> list[dict[str, Any]]:
    """One row per contaminated record, with every (turn, benchmark item) it matched."""
    places = _bench_places(benchmarks)
    rows: dict[int, dict[str, Any]] = {}
    for prompt, found in zip(prompts, matches):
        if not found:
            continue
        if prompt.record not in rows:
            record = records[prompt.record]
            rid = record.get("id") if isinstance(record, Mapping) else None
            rows[prompt.record] = {
                "index": prompt.record,
                "id": rid,
                "matches": [],
                "record": record,
            }
        for match in found:
            b, row = places[match.bench]
            entry = _match_entry(
                match, prompt.message, benchmarks[b], row, bench_lengths[match.bench]
            )
            rows[prompt.record]["matches"].append(entry)
    return [rows[i] for i in sorted(rows)]


def _clip(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _benchmark_counts(
    bench: BenchmarkPrompts, lengths: list[int], config: DecontaminationConfig
) -> dict[str, Any]:
    kinds = [gram_length(n, config.ngram, config.min_block) for n in lengths]
    return {
        "source": bench.source,
        "prompts": len(bench.texts),
        "too_short": sum(k is None for k in kinds),
        "short_indexed": sum(k is not None and k < config.ngram for k in kinds),
        "removed_records": 0,
        "matched_items": 0,
        "examples": [],
    }


def _example(row: dict[str, Any], match: dict[str, Any], train_text: str) -> dict[str, Any]:
    return {
        "train_index": row["index"],
        "train_id": row["id"],
        "train_text": _clip(train_text),
        "bench_index": match["bench_index"],
        "bench_id": match["bench_id"],
        "bench_text": _clip(match["bench_text"]),
        "overlap_ratio": match["overlap_ratio"],
    }


def summarize(
    benchmarks: list[BenchmarkPrompts],
    bench_lengths: list[int],
    removed: list[dict],
    prompts: list[TrainPrompt],
    num_records: int,
    config: DecontaminationConfig,
) -> dict[str, Any]:
    """Counts per benchmark (removed records, matched items, unmatchable prompts) + examples."""
    per, start = {}, 0
    for bench in benchmarks:
        per[bench.name] = _benchmark_counts(
            bench, bench_lengths[start : start + len(bench.texts)], config
        )
        start += len(bench.texts)
    texts = {(p.record, p.message): p.text for p in prompts}
    items: dict[str, set[int]] = {name: set() for name in per}
    for row in removed:
        for name in dict.fromkeys(m["benchmark"] for m in row["matches"]):
            entry = per[name]
            entry["removed_records"] += 1
            first = next(m for m in row["matches"] if m["benchmark"] == name)
            if len(entry["examples"]) < config.examples_per_benchmark:
                entry["examples"].append(
                    _example(row, first, texts[row["index"], first["message_index"]])
                )
        for match in row["matches"]:
            items[match["benchmark"]].add(match["bench_index"])
    for name, entry in per.items():
        entry["matched_items"] = len(items[name])
    train = {
        "records": num_records,
        "prompts_checked": len(prompts),
        "kept": num_records - len(removed),
        "removed": len(removed),
    }
    return {"train": train, "benchmarks": per, "settings": _settings(config)}


def _settings(config: DecontaminationConfig) -> dict[str, Any]:
    tokenizer = config.tokenizer if isinstance(config.tokenizer, str) else repr(config.tokenizer)
    return {
        "ngram": config.ngram,
        "min_block": config.min_block,
        "ratio": config.ratio,
        "tokenizer": tokenizer,
        "turns": config.turns,
        "train_text_field": config.train_text_field,
    }


# --------------------------------------------------------------------------- entry points


def decontaminate(
    train_records: Any,
    benchmarks: Sequence[BenchmarkPrompts] | Mapping[str, Sequence[str]],
    config: DecontaminationConfig | None = None,
    *,
    source: str = "train_records",
) -> tuple[Any, list[dict[str, Any]], dict[str, Any]]:
    """Split training records into kept and removed against the benchmarks.

    ``train_records`` is a list of dicts or a ``datasets.Dataset`` (then ``kept`` is a
    Dataset too, via ``select``). ``benchmarks`` are loaded benchmarks or a
    ``{name: [prompt, ...]}`` mapping; ``config.benchmarks`` and paths are not used here.
    Each removed row is ``{"index", "id", "matches": [...], "record"}``, one match per
    (checked turn, benchmark item) over the threshold.
    """
    config = config or DecontaminationConfig()
    benches = as_benchmarks(benchmarks)
    started = time.perf_counter()
    tokenize = build_tokenizer(config.tokenizer)
    bench_ids = [tokenize(text) for bench in benches for text in bench.texts]
    index = NgramIndex(
        bench_ids, ngram=config.ngram, min_block=config.min_block, ratio=config.ratio
    )
    prompts = training_prompts(train_records, source, config)
    num_records = len(train_records)
    logger.info(
        "decontaminate: %d records, %d prompts vs %d benchmark prompts (%s); %d grams indexed; %d workers",
        num_records,
        len(prompts),
        len(bench_ids),
        ", ".join(b.name for b in benches),
        len(index),
        min(config.workers(), -(-len(prompts) // config.chunk_size)),
    )
    matches = match_texts([p.text for p in prompts], index, tokenize, config)
    lengths = [len(ids) for ids in bench_ids]
    removed = removed_rows(train_records, prompts, matches, benches, lengths)
    drop = {row["index"] for row in removed}
    keep = [i for i in range(num_records) if i not in drop]
    kept = (
        train_records.select(keep)
        if _is_dataset(train_records)
        else [train_records[i] for i in keep]
    )
    summary = summarize(benches, lengths, removed, prompts, num_records, config)
    summary["index_grams"] = len(index)
    summary["seconds"] = round(time.perf_counter() - started, 3)
    return kept, removed, summary


def _is_dataset(records: Any) -> bool:
    return hasattr(records, "select") and hasattr(records, "column_names")


def decontaminate_files(config: DecontaminationConfig) -> dict[str, Any]:
    """Load the training set and benchmarks named in the config, write the three outputs.

    Writes ``kept.jsonl`` (records unchanged), ``removed.jsonl`` (see ``decontaminate``)
    and ``summary.json`` into ``config.output_dir``; returns the summary.
    """
    config.check_file_run()
    benches = [load_benchmark(spec) for spec in config.benchmarks]
    train = read_rows(config.train_path, split=config.train_split)
    kept, removed, summary = decontaminate(train, benches, config, source=config.train_path)
    summary["train"]["source"] = config.train_path
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    _write_jsonl(out / "kept.jsonl", kept)
    _write_jsonl(out / "removed.jsonl", removed)
    _write_text(
        out / "summary.json", json.dumps(summary, indent=2, ensure_ascii=False, default=str) + "\n"
    )
    return summary


def _write_jsonl(path: Path, rows: Iterable[Mapping[str, Any]]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(row, ensure_ascii=False, default=str) + "\n" for row in rows)
    tmp.replace(path)  # never leave a half-written output under the final name


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def run(config: DecontaminationConfig) -> dict[str, Any]:
    """The ``align decontaminate`` stage: run on files and log the per-benchmark report."""
    logger.info("decontaminate config: %s", json.dumps(asdict(config), default=repr))
    summary = decontaminate_files(config)
    train = summary["train"]
    logger.info(
        "kept %d of %d records, removed %d", train["kept"], train["records"], train["removed"]
    )
    for name, entry in summary["benchmarks"].items():
        logger.info(
            "  %s: %d records removed, %d of %d benchmark items matched, %d too short to match",
            name,
            entry["removed_records"],
            entry["matched_items"],
            entry["prompts"],
            entry["too_short"],
        )
    return summary


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m align.data.decontaminate RECIPE.yaml`` until the ``align`` CLI wires it."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("recipe", help="YAML recipe with DecontaminationConfig fields")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    run(load_config(args.recipe))


if __name__ == "__main__":
    main()
