"""Remove training prompts that overlap benchmark prompts (Apertus §E.1.2; docs/method.md, Decontamination).

An 8-gram prefilter over an inverted index, then Ratcliff-Obershelp matching blocks of at
least 5 tokens; a prompt is contaminated when its blocks cover more than half of a
benchmark prompt. Writes ``kept.jsonl``, ``removed.jsonl`` (each with the benchmark items
it matched and the overlap ratio) and ``summary.json`` (per benchmark).

Config here (the recipe), matching in ``align.data.decontaminate``, the report in
``align.data.decontaminate_report``, files through ``align.io``.

Example: ``align decontaminate recipes/decontaminate.yaml num_workers=8``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from align.data.decontaminate import BenchmarkPrompts, MatchSettings, decontaminate
from align.data.decontaminate_report import summary_lines
from align.errors import ConfigError, InputError, MissingInputError, RecordError
from align.io import iter_jsonl, read_records, write_json, write_jsonl
from align.io.records import data_suffix
from align.manifests import StageRun
from align.manifests.lifecycle import run_stage

# what `align decontaminate --help` lists first: the keys no default can stand for
REQUIRED_KEYS = {
    "input": "training records",
    "output_dir": "where kept.jsonl and removed.jsonl go",
}


__all__ = ["BenchmarkSpec", "Config", "DecontaminationConfig", "decontaminate_files", "load_benchmark", "run"]

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------- config


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
                raise ConfigError(f"benchmarks: {key!r} must be a non-empty string, got {value!r}")


@dataclass
class DecontaminationConfig(MatchSettings):
    """Settings of ``align decontaminate``; this docstring (with ``MatchSettings``'s) is its manual.

    Data:
        input (str | None): the training set to filter, ``.jsonl``/``.parquet`` or a
            ``load_dataset`` source (described like each benchmark: ``input``, ``split``,
            ``text_field``).
        split (str, default "train"): the input's split for ``load_dataset`` sources.
        benchmarks (list[BenchmarkSpec | dict]): the benchmarks, each with a unique name.
        output_dir (str | None): where ``kept.jsonl``, ``removed.jsonl`` and
            ``summary.json`` are written.
        overwrite (bool, default false): redo a finished or partial output made from other
            settings or inputs (removes only what this stage wrote there).
    """

    input: str | None = None
    split: str = "train"
    benchmarks: list[BenchmarkSpec] = field(default_factory=list)
    output_dir: str | None = None
    overwrite: bool = False

    def __post_init__(self) -> None:
        self.benchmarks = [_as_benchmark_spec(b, i) for i, b in enumerate(self.benchmarks)]
        names = [b.name for b in self.benchmarks]
        if len(set(names)) != len(names):
            raise ConfigError(f"benchmarks: names must be unique, got {names}")
        super().__post_init__()

    def check_file_run(self) -> None:
        """Check the fields that only the file-based run needs."""
        missing = [k for k in ("input", "output_dir") if not getattr(self, k)]
        if missing:
            raise ConfigError(f"decontaminate: {', '.join(missing)} must be set to run on files")
        if not self.benchmarks:
            raise ConfigError(
                "decontaminate: benchmarks is empty; list at least one {name, path, text_field}"
            )


Config = DecontaminationConfig


def _as_benchmark_spec(entry: BenchmarkSpec | Mapping[str, Any], i: int) -> BenchmarkSpec:
    if isinstance(entry, BenchmarkSpec):
        return entry
    if not isinstance(entry, Mapping):
        raise ConfigError(
            f"benchmarks[{i}]: expected a mapping with name, path, text_field; got {entry!r}"
        )
    known = {f.name for f in fields(BenchmarkSpec)}
    unknown = sorted(set(entry) - known)
    if unknown:
        raise ConfigError(f"benchmarks[{i}]: unknown keys {unknown}; valid keys: {sorted(known)}")
    missing = [k for k in ("name", "path") if k not in entry]
    if missing:
        raise ConfigError(f"benchmarks[{i}]: missing {missing}")
    return BenchmarkSpec(**entry)



# --------------------------------------------------------------------------- inputs


def _file_line(path: Path, line: int) -> str:
    return f"{path}: line {line}"


def read_rows(path: str, *, split: str = "train", subset: str | None = None) -> Any:
    """Rows of a ``.jsonl``/``.parquet`` file (list of dicts) or a ``load_dataset`` source."""
    if data_suffix(path) in (".jsonl", ".parquet"):
        if not Path(path).is_file():
            raise MissingInputError(f"{path}: file not found")
        if data_suffix(path) == ".jsonl":
            return [row for _, row in iter_jsonl(path, where=_file_line)]
        return read_records(path)
    import datasets
    from datasets.exceptions import DatasetsError

    try:
        return datasets.load_dataset(path, subset, split=split)
    except (OSError, ValueError, DatasetsError) as err:  # a source the recipe names: not found, no such split
        raise InputError(
            f"{path}: could not load split {split!r} with datasets.load_dataset: {err}"
        ) from err


def load_benchmark(spec: BenchmarkSpec) -> BenchmarkPrompts:
    """Load one benchmark and check its text (and id) field on every row."""
    rows = read_rows(spec.path, split=spec.split, subset=spec.subset)
    source = spec.path
    if len(rows) == 0:
        raise InputError(f"{source}: benchmark {spec.name!r} is empty (split {spec.split!r})")
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


# --------------------------------------------------------------------------- the stage


def decontaminate_files(config: DecontaminationConfig) -> dict[str, Any]:
    """Load the training set and benchmarks named in the config, write the three outputs.

    Writes ``kept.jsonl`` (records unchanged), ``removed.jsonl`` (see
    ``align.data.decontaminate.decontaminate``) and ``summary.json`` into
    ``config.output_dir``; returns the summary.
    """
    train, benches = read_inputs(config)
    return write_outputs(config, train, benches)


def read_inputs(config: DecontaminationConfig) -> tuple[list[dict[str, Any]], list[BenchmarkPrompts]]:
    """The training rows and every benchmark's prompts, read before anything is written."""
    config.check_file_run()
    benches = [load_benchmark(spec) for spec in config.benchmarks]
    return read_rows(config.input, split=config.split), benches


def write_outputs(config: DecontaminationConfig, train: list[dict[str, Any]], benches: list[BenchmarkPrompts],
                  check_owner: Any = None) -> dict[str, Any]:
    """Match, then write kept.jsonl, removed.jsonl and summary.json (``check_owner`` first, when given)."""
    kept, removed, summary = decontaminate(train, benches, config, source=config.input)
    summary["train"]["source"] = config.input
    out = Path(config.output_dir)
    if check_owner is not None:
        check_owner()
    write_jsonl(out / "kept.jsonl", kept, default=str)
    write_jsonl(out / "removed.jsonl", removed, default=str)
    write_json(out / "summary.json", summary)
    return summary


def run(config: DecontaminationConfig) -> dict:
    """Decontaminate the training file against every benchmark in the recipe."""
    if config.output_dir is None:
        raise ConfigError("decontaminate: output_dir is required (where kept.jsonl and removed.jsonl go)")
    return run_stage("decontaminate", config, _write, prepare=_read)


def _read(run: StageRun) -> None:
    logger.info("decontaminate config: %s", json.dumps(asdict(run.config), default=repr))
    run.held["train"], run.held["benchmarks"] = read_inputs(run.config)


def _write(run: StageRun) -> dict[str, Any]:
    summary = write_outputs(run.config, run.held["train"], run.held["benchmarks"], run.check_owner)
    for line in summary_lines(summary):
        logger.info("%s", line)
    return summary
