"""Remove training prompts that copy or closely paraphrase benchmark prompts: the matching.

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

Pure: records and benchmark prompts in memory, ``(kept, removed, summary)`` out
(``decontaminate``); the settings and the types the matching and its report share are
``align.data.decontaminate_types``, the rows and summary are built by
``align.data.decontaminate_report``.
Reading files, the recipe and writing the outputs are the stage's,
``align.stages.decontaminate`` (``align decontaminate RECIPE.yaml``).
"""

from __future__ import annotations

import logging
import multiprocessing
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from tqdm.auto import tqdm

from align.data.decontaminate_report import removed_rows, summarize
from align.data.decontaminate_types import BenchmarkPrompts, MatchSettings, TrainPrompt
from align.data.ngram_index import Match, NgramIndex, build_tokenizer
from align.errors import ConfigError, InputError, RecordError

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------- benchmarks


def as_benchmarks(
    benchmarks: Sequence[BenchmarkPrompts] | Mapping[str, Sequence[str]],
) -> list[BenchmarkPrompts]:
    """Accept loaded benchmarks, or a plain ``{name: [prompt, ...]}`` mapping."""
    if isinstance(benchmarks, Mapping):
        out = [BenchmarkPrompts(name, list(texts)) for name, texts in benchmarks.items()]
    else:
        out = list(benchmarks)
    if not out:
        raise ConfigError("decontaminate: no benchmarks given")
    names = [b.name for b in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"decontaminate: benchmark names must be unique, got {names}")
    return out


# --------------------------------------------------------------------------- prompts


class FieldProblem(InputError):
    """A bad field inside a record, located by a path such as ``messages[2].content`` (the
    caller names the record: a ``RecordError``)."""

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
    record: Any, index: int, source: str, config: MatchSettings
) -> list[TrainPrompt]:
    """The texts of one training record that are checked, per the config's mode."""
    label = f"{source} row {index}"
    if not isinstance(record, Mapping):
        raise RecordError(label, "<record>", f"expected a mapping, got {type(record).__name__}")
    if config.text_field is not None:
        text = record.get(config.text_field)
        if not isinstance(text, str):
            problem = (
                "missing"
                if config.text_field not in record
                else f"expected a string, got {type(text).__name__}"
            )
            raise RecordError(label, config.text_field, problem)
        return [TrainPrompt(index, None, text)]
    if not isinstance(record.get("id"), str) or not record["id"]:
        raise RecordError(
            label,
            "id",
            "missing or not a non-empty string (or set text_field for raw prompts)",
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
    records: Iterable[Any], source: str, config: MatchSettings
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
    config: MatchSettings,
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



# --------------------------------------------------------------------------- entry point


def decontaminate(
    records: Any,
    benchmarks: Sequence[BenchmarkPrompts] | Mapping[str, Sequence[str]],
    config: MatchSettings | None = None,
    *,
    source: str = "records",
) -> tuple[Any, list[dict[str, Any]], dict[str, Any]]:
    """Split training records into kept and removed against the benchmarks.

    ``records`` is a list of dicts or a ``datasets.Dataset`` (then ``kept`` is a
    Dataset too, via ``select``). ``benchmarks`` are loaded benchmarks or a
    ``{name: [prompt, ...]}`` mapping; ``config.benchmarks`` and paths are not used here.
    Each removed row is ``{"index", "id", "matches": [...], "record"}``, one match per
    (checked turn, benchmark item) over the threshold.
    """
    config = config or MatchSettings()
    benches = as_benchmarks(benchmarks)
    started = time.perf_counter()
    tokenize = build_tokenizer(config.tokenizer)
    bench_ids = [tokenize(text) for bench in benches for text in bench.texts]
    index = NgramIndex(
        bench_ids, ngram=config.ngram, min_block=config.min_block, ratio=config.ratio
    )
    prompts = training_prompts(records, source, config)
    num_records = len(records)
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
    removed = removed_rows(records, prompts, matches, benches, lengths)
    drop = {row["index"] for row in removed}
    keep = [i for i in range(num_records) if i not in drop]
    kept = (
        records.select(keep)
        if _is_dataset(records)
        else [records[i] for i in keep]
    )
    summary = summarize(benches, lengths, removed, prompts, num_records, config)
    summary["index_grams"] = len(index)
    summary["seconds"] = round(time.perf_counter() - started, 3)
    return kept, removed, summary


def _is_dataset(records: Any) -> bool:
    return hasattr(records, "select") and hasattr(records, "column_names")
