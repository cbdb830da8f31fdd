"""An evaluation's completions scored again by another reward: the goal beside the reward trained on.

A policy trained on a reward model's score can raise that score without getting better at
what the score stands for (reward over-optimisation). Where a second measure exists (an
exact answer check, a stronger judge), scoring the same completions with it, paired over
the same prompts and samples, shows the gap without sampling anything again.

Rows are matched to their prompts by content, not by id alone: each ``eval.jsonl`` row
carries the digest of the prompt it answered (``prompt_digest``), and a prompt record with
the same id but other messages or tools is refused, since scoring against it would give
another prompt's score to every completion.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from align.errors import InputError, RecordError
from align.io.fingerprint import json_digest

DIGEST_FIELD = "prompt_digest"


def prompt_digest(prompt: Mapping[str, Any]) -> str:
    """A short digest of what a prompt asks (its messages and tools): an eval row carries it."""
    return json_digest({"messages": prompt.get("messages"), "tools": prompt.get("tools") or None})[:16]


def _slots(entry: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """A policy's completions in one row, named: the greedy one first (if any), then the samples."""
    return ([("greedy", entry["greedy"])] if entry.get("greedy") else []) + \
        [(f"samples[{i}]", s) for i, s in enumerate(entry["samples"])]


def _check_texts(rid: Any, name: str, entry: Mapping[str, Any]) -> None:
    """Each of a policy's completions in one row carries its text as a string."""
    for where, slot in _slots(entry):
        if not isinstance(slot.get("text"), str):
            raise RecordError(rid, f"policies.{name}.{where}.text", f"expected the completion's text, got "
                              f"{slot.get('text')!r:.60}")


def _prompts_by_id(prompts: Sequence[Mapping[str, Any]]) -> dict[Any, Mapping[str, Any]]:
    """The prompt records by id; an id twice would leave it open which prompt a row answered."""
    by_id: dict[Any, Mapping[str, Any]] = {}
    for prompt in prompts:
        if prompt["id"] in by_id:
            raise RecordError(prompt["id"], "id", "duplicate id in the prompt records (each row is matched to the "
                              "one prompt with its id)")
        by_id[prompt["id"]] = prompt
    return by_id


def _check_rows(rows: Sequence[Mapping[str, Any]], by_id: Mapping[Any, Mapping[str, Any]], provider: Any) -> None:
    """Each row once, with a prompt record of its id that asks what the row answered, and every
    completion's text: all checked before the first batch is scored."""
    field = getattr(provider, "reference_field", None)
    seen: dict[Any, int] = {}
    for index, row in enumerate(rows):
        rid = row["id"]
        if rid in seen:
            raise RecordError(rid, "id", f"duplicate id in the evaluation rows (rows {seen[rid]} and {index}): "
                              "a prompt's completions are rescored once")
        seen[rid] = index
        prompt = by_id.get(rid)
        if prompt is None:
            raise InputError(f"evaluation row {rid!r}: no prompt record with that id to score it against")
        if field and field not in prompt:
            raise InputError(f"prompt {rid!r}: no {field!r} field, which {type(provider).__name__} needs")
        if DIGEST_FIELD not in row:
            raise RecordError(rid, DIGEST_FIELD, "missing: the row does not say which prompt it answered, so it "
                              "cannot be matched to a prompt record by content (evaluate again to write it)")
        if row[DIGEST_FIELD] != prompt_digest(prompt):
            raise RecordError(rid, DIGEST_FIELD, "the prompt differs: the row answered another prompt than the "
                              "prompt record with this id (other messages or tools)")
        for name, entry in row["policies"].items():
            _check_texts(rid, name, entry)


def rescore_rows(rows: Sequence[Mapping[str, Any]], prompts: Sequence[Mapping[str, Any]], provider: Any, *,
                 batch_size: int = 256) -> list[dict[str, Any]]:
    """``eval.jsonl`` rows with every completion's ``score`` and ``skip`` replaced by ``provider``'s.

    ``prompts``: the records the evaluation ran on (``id``, ``messages``, and the provider's
    reference field, if it has one). Everything else in the rows (texts, lengths, KL) is kept,
    so the summaries of ``align.eval.summary`` apply to the result unchanged. A row whose
    prompt record differs from the prompt it answered, an id twice, or a completion without
    its text is a ``RecordError`` naming the record and the field.
    """
    by_id = _prompts_by_id(prompts)
    field = getattr(provider, "reference_field", None)
    _check_rows(rows, by_id, provider)
    out = [copy.deepcopy(dict(row)) for row in rows]
    for start in range(0, len(out), batch_size):
        batch = out[start : start + batch_size]
        entries = [(row, entry) for row in batch for entry in row["policies"].values()]
        texts = [[slot["text"] for _, slot in _slots(entry)] for _, entry in entries]
        groups = provider.score_groups([by_id[row["id"]]["messages"] for row, _ in entries], texts,
                                       references=[by_id[row["id"]][field] for row, _ in entries] if field else None)
        for (_, entry), scores in zip(entries, groups, strict=True):
            for (_, slot), score in zip(_slots(entry), scores, strict=True):
                slot["score"], slot["skip"] = score.value, score.reason
    return out


__all__ = ["prompt_digest", "rescore_rows"]
