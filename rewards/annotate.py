"""The annotation stage: score every completion of every prompt record, resumably.

Reads prompt records with `completions` (see `align.data.records`) and writes each record
back with, per completion and in the same order:

    rewards:        float | None
    reward_skips:   str | None      (why the reward is None: empty completion, NaN, ...)
    reward_details: dict            (provider extras: truncated, judge mass, pairwise rank)

plus `reward_provider` (the provider's name). Output goes through `align.jobs.run_job`:
sharded, append-only, a killed run resumes where it stopped, and a resume with other
provider settings is refused (the provider's fingerprint is stored with the job).

Every record is validated before any scoring starts, so a bad row stops the job with an
error naming the record and field instead of surfacing hours in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from align.data.records import passing_skips, skip_reason, skip_row_id, validate_prompt
from align.errors import InputError, RecordError
from align.jobs import JobResult, run_job
from rewards.base import RewardProvider, Score, checked
from rewards.text import plain_messages
from rewards.verifiable import reference_problem


def validate_for_annotation(record: Mapping[str, Any], index: int, reference_field: str | None) -> None:
    """A prompt, a non-empty list of completions with string `text`, and the reference if needed; a skip row
    (a stage before could not make its completions: ``skip_reason``) needs only its id."""
    if skip_reason(record) is not None:  # passed on as it came, so it must still say which prompt it stands for
        skip_row_id(record, index)
        return
    validate_prompt(record, index)
    rid = record["id"]  # validate_prompt made sure of it
    try:
        plain_messages(record["messages"])
    except InputError as error:  # structured content the providers cannot read
        raise RecordError(rid, "messages", str(error)) from None
    completions = record.get("completions")
    if not isinstance(completions, list) or not completions:
        raise RecordError(rid, "completions", "missing or not a non-empty list, and the row is no skip row (no "
                          "skip_reason): run sampling first")
    for i, completion in enumerate(completions):
        if not isinstance(completion, Mapping) or not isinstance(completion.get("text"), str):
            raise RecordError(rid, f"completions[{i}].text", f"expected a string, got {completion!r:.80}")
    if reference_field is not None and (problem := reference_problem(record.get(reference_field))):
        raise RecordError(rid, reference_field, problem)


def score_records(records: Sequence[Mapping[str, Any]], provider: RewardProvider) -> list[dict[str, Any]]:
    """Score one batch of records; returns them with rewards, skips and details added (a skip row passes on as
    it came: ``annotate`` runs this through ``passing_skips``)."""
    field = provider.reference_field
    for index, record in enumerate(records):
        validate_for_annotation(record, index, field)
    conversations = [r["messages"] for r in records]
    groups = [[c["text"] for c in r["completions"]] for r in records]
    references = [r[field] for r in records] if field else None
    scored = provider.score_groups(conversations, groups, references=references)
    out = []
    for record, group, scores in zip(records, groups, scored, strict=True):
        if len(scores) != len(group):
            raise RuntimeError(f"record {record['id']!r}: provider returned {len(scores)} scores for {len(group)} completions")
        final = [_final(s) for s in scores]
        out.append(
            {
                **record,
                "rewards": [s.value for s in final],
                "reward_skips": [s.reason for s in final],
                "reward_details": [dict(s.details) for s in final],
                "reward_provider": provider.name,
            }
        )
    return out


def _final(score: Score) -> Score:
    """The last line of defence: a NaN/inf value becomes a recorded skip."""
    return score if score.value is None else checked(score.value, **score.details)


def annotate(
    records: Sequence[Mapping[str, Any]] | Any,
    provider: RewardProvider,
    output_dir: str | Path,
    *,
    shard_index: int = 0,
    num_shards: int = 1,
    batch_size: int = 16,
) -> JobResult:
    """Score all completions of this shard's records into `output_dir` (resumable).

    `records` is a list of dicts or a `datasets.Dataset`. `batch_size` counts prompt
    records per provider call (each carries all of its completions).
    """
    for index in range(len(records)):
        validate_for_annotation(dict(records[index]), index, provider.reference_field)
    return run_job(
        records,
        passing_skips(lambda batch: score_records(batch, provider)),
        output_dir,
        shard_index=shard_index,
        num_shards=num_shards,
        batch_size=batch_size,
        sort_key=lambda r: sum(len(c["text"]) for c in r.get("completions") or []),
        desc=f"annotate ({provider.name})",
        fingerprint=provider.fingerprint(),
    )
