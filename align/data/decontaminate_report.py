"""The decontamination report: one row per removed record, and the per-benchmark summary.

Pure functions of the matches ``align.data.decontaminate`` found (over the types of
``align.data.decontaminate_types``; this module does not import the matcher);
``summary_lines`` is the human-readable digest the stage logs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from align.data.decontaminate_types import BenchmarkPrompts, MatchSettings, TrainPrompt
from align.data.ngram_index import Match, gram_length


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
    bench: BenchmarkPrompts, lengths: list[int], config: MatchSettings
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
    config: MatchSettings,
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


def _settings(config: MatchSettings) -> dict[str, Any]:
    tokenizer = config.tokenizer if isinstance(config.tokenizer, str) else repr(config.tokenizer)
    return {
        "ngram": config.ngram,
        "min_block": config.min_block,
        "ratio": config.ratio,
        "tokenizer": tokenizer,
        "turns": config.turns,
        "text_field": config.text_field,
    }


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """The summary in a few lines: kept and removed records, then one line per benchmark."""
    train = summary["train"]
    lines = [f"kept {train['kept']} of {train['records']} records, removed {train['removed']}"]
    for name, entry in summary["benchmarks"].items():
        lines.append(f"  {name}: {entry['removed_records']} records removed, {entry['matched_items']} of "
                     f"{entry['prompts']} benchmark items matched, {entry['too_short']} too short to match")
    return lines
