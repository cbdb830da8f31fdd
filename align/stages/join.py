"""A policy's samples joined to π_ref's reference samples, prompt by prompt: what a round of
``align pipeline`` with ``reference: initial`` annotates (docs/rounds.md).

``input`` holds the prompt records with the n reference completions drawn from π_ref (a
``sample`` output, ``mode: reference``); ``completions`` holds the same prompts with the
completions drawn from the policy being trained (another ``sample`` output). Each output
record is the input record with the policy's completions appended, marked
``is_reference: false`` (each keeps its ``source``, which names the model that drew it).
So the pairs stage takes quantile rewards against π_ref's completions alone, and picks
chosen and rejected among every scored completion of the prompt, the policy's and the
references (docs/method.md, Quantile rewards and Pair selection). Both outputs must hold
the same prompts: the same ids, each with the same messages. The annotate stage then scores
the references and the policy's completions of a prompt together, as one group (the
judge's pairwise ranking and the empty-completion rule compare within a prompt's group).
One file given as both (by the same path, through a link, or an output directory and a file
in it) is refused: joined with itself, it would double every prompt's completions.
Writes ``output_dir/records.jsonl``.

Example: ``align join input=runs/round-1/sample completions=runs/round-2/sample output_dir=runs/round-2/join``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from align.data.records import skip_reason
from align.errors import InputError, RecordError
from align.io import write_jsonl
from align.manifests import StageRun
from align.manifests.lifecycle import run_stage

# what `align join --help` lists first: the keys no default can stand for
REQUIRED_KEYS = {
    'input': "π_ref's reference samples",
    'completions': "the policy's samples",
}


OUTPUT_FILE = "records.jsonl"


@dataclass
class Config:
    input: str = field(default="", metadata={"help": "prompt records with π_ref's reference completions (a sample "
                                             "stage output, mode reference)"})
    completions: str = field(default="", metadata={"help": "the same prompts with the policy's completions (a sample "
                                                   "stage output): appended as candidates, is_reference false"})
    output_dir: str = field(default="runs/join", metadata={"help": "where records.jsonl goes"})
    overwrite: bool = field(default=False, metadata={"help": "redo a finished or partial output made from other "
                                                     "settings or inputs (removes only what this stage wrote there)"})


def _check_ids(rows: Sequence[Mapping[str, Any]], key: str) -> None:
    """Every row is joined by its id: a non-empty string, or an error naming the row."""
    for index, row in enumerate(rows):
        rid = row.get("id")
        if not isinstance(rid, str) or not rid:
            raise RecordError(f"<{key} row {index}>", "id", f"expected a non-empty string id (rows are joined by "
                              f"it), got {rid!r}")


def _ids_agree(references: Sequence[Mapping[str, Any]], candidates: Sequence[Mapping[str, Any]]) -> None:
    """The same prompt ids on both sides, or an error naming the first few that differ."""
    _check_ids(references, "input")
    _check_ids(candidates, "completions")
    ref_ids, cand_ids = [r["id"] for r in references], {r["id"] for r in candidates}
    missing = [i for i in ref_ids if i not in cand_ids]
    extra = sorted(cand_ids - set(ref_ids))
    if missing or extra:
        raise InputError(f"join: input and completions hold other prompts: {len(missing)} ids only in input "
                         f"{missing[:5]}, {len(extra)} only in completions {extra[:5]} (both must be sampled from "
                         "the same prompts)")


def join_records(references: Sequence[Mapping[str, Any]],
                 candidates: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each reference record with the other policy's completions appended as non-references."""
    _ids_agree(references, candidates)
    by_id = {r["id"]: r for r in candidates}
    out = []
    for ref in references:
        other = by_id[ref["id"]]
        if other.get("messages") != ref.get("messages"):
            raise RecordError(ref["id"], "messages", "differ between input and completions (the same id names "
                              "two prompts)")
        added = [{**c, "is_reference": False} for c in other.get("completions") or []]
        row = {**ref, "completions": [*(ref.get("completions") or []), *added],
               "num_overlong": (ref.get("num_overlong") or 0) + (other.get("num_overlong") or 0)}
        reasons = {side: reason for side, reason in (("input", skip_reason(ref)),
                                                      ("completions", skip_reason(other))) if reason}
        if reasons:  # either side missing makes the round's comparison impossible for this prompt: a skip row
            row["skip_reason"] = next(iter(reasons.values())) if len(reasons) == 1 else \
                "; ".join(f"{side}: {reason}" for side, reason in reasons.items())
        out.append(row)
    return out


def _one_data(a: Path, b: Path) -> bool:
    """Whether two paths name the same data: one file (through symlinks or hard links), or a
    stage output directory and a file in it."""
    if os.path.samefile(a, b):
        return True
    a, b = a.resolve(), b.resolve()
    return (a.is_dir() and b.is_relative_to(a)) or (b.is_dir() and a.is_relative_to(b))


def check_two_inputs(config: Config) -> None:
    """``input`` and ``completions`` must be two sample outputs: one file given twice would add
    every reference completion to itself as the policy's, doubling each prompt's completions."""
    given = Path(config.input).expanduser(), Path(config.completions).expanduser()
    if not all(path.exists() for path in given):
        return  # a missing path is named when the stage reads its inputs
    if _one_data(*given):
        raise InputError(f"join: input={config.input!r} and completions={config.completions!r} give the same "
                         f"data twice ({given[0].resolve()}): joined with itself, every prompt's completions would "
                         "be doubled; completions is the policy's sample output, input π_ref's")


def run(config: Config) -> dict[str, Any]:
    """Join the two sample outputs; mark the output complete."""
    check_two_inputs(config)
    return run_stage("join", config, _join)


def _join(run: StageRun) -> dict[str, Any]:
    config, references, candidates = run.config, run.rows["input"], run.rows["completions"]
    rows = join_records(references, candidates)
    run.check_owner()
    write_jsonl(Path(config.output_dir) / OUTPUT_FILE, rows)
    summary = {"prompts": len(rows), "skipped": sum(skip_reason(r) is not None for r in rows),
               "reference_completions": sum(bool(c.get("is_reference")) for r in references
                                            for c in r.get("completions") or []),
               "added_completions": sum(len(r.get("completions") or []) for r in candidates)}
    return summary
