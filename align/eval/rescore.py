"""An evaluation's completions scored again by another reward: the goal beside the reward trained on.

A policy trained on a reward model's score can raise that score without getting better at
what the score stands for (reward over-optimisation). Where a second measure exists (an
exact answer check, a stronger judge), scoring the same completions with it, paired over
the same prompts and samples, shows the gap without sampling anything again.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from align.errors import InputError


def _texts(entry: Mapping[str, Any]) -> list[str]:
    """A policy's completions in one row: the greedy one first (if any), then the samples."""
    return ([entry["greedy"]["text"]] if entry.get("greedy") else []) + [s["text"] for s in entry["samples"]]


def rescore_rows(rows: Sequence[Mapping[str, Any]], prompts: Sequence[Mapping[str, Any]], provider: Any, *,
                 batch_size: int = 256) -> list[dict[str, Any]]:
    """``eval.jsonl`` rows with every completion's ``score`` and ``skip`` replaced by ``provider``'s.

    ``prompts``: the records the evaluation ran on (``id``, ``messages``, and the provider's
    reference field, if it has one). Everything else in the rows (texts, lengths, KL) is kept,
    so the summaries of ``align.eval.summary`` apply to the result unchanged.
    """
    by_id = {p["id"]: p for p in prompts}
    field = getattr(provider, "reference_field", None)
    out = [copy.deepcopy(dict(row)) for row in rows]
    for row in out:
        prompt = by_id.get(row["id"])
        if prompt is None:
            raise InputError(f"evaluation row {row['id']!r}: no prompt record with that id to score it against")
        if field and field not in prompt:
            raise InputError(f"prompt {row['id']!r}: no {field!r} field, which {type(provider).__name__} needs")
    for start in range(0, len(out), batch_size):
        batch = out[start : start + batch_size]
        entries = [(row, entry) for row in batch for entry in row["policies"].values()]
        groups = provider.score_groups([by_id[row["id"]]["messages"] for row, _ in entries],
                                       [_texts(entry) for _, entry in entries],
                                       references=[by_id[row["id"]][field] for row, _ in entries] if field else None)
        for (_, entry), scores in zip(entries, groups, strict=True):
            slots = ([entry["greedy"]] if entry.get("greedy") else []) + list(entry["samples"])
            for slot, score in zip(slots, scores, strict=True):
                slot["score"], slot["skip"] = score.value, score.reason
    return out


__all__ = ["rescore_rows"]
