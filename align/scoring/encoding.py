"""Encoding a pair row (or a single-completion row) into (prompt, completion) token ids.

THE tokenization of preference training and of the reference log-prob pass: both call
``encode_record``, so the pass scores exactly the token ids the trainer trains on.
``align.chat.encode_completion`` renders the prompt and the completion; a completion that
does not fit ``max_length`` loses its tail (``fit_to_max_length``); a completion cut at the
sampling budget (``<name>_finish_reason`` "length") is refused or encoded without its
end-of-turn token (``truncated``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from align.chat import encode_completion
from align.data.records import RecordError, record_id, validate_pair, validate_prompt

PAIR_NAMES = ("chosen", "rejected")
SINGLE_NAMES = ("completion",)


def completion_names(record: Mapping[str, Any], index: int | None = None) -> tuple[str, ...]:
    """("chosen", "rejected") for a pair row, ("completion",) for a single-completion row."""
    if "chosen" in record or "rejected" in record:
        validate_pair(record, index)
        return PAIR_NAMES
    validate_prompt(record, index)
    if not isinstance(record.get("completion"), str):
        raise RecordError(record_id(record, index), "completion",
                          "expected a pair row (chosen, rejected) or a completion string")
    return SINGLE_NAMES


def fit_to_max_length(
    prompt_ids: list[int], completion_ids: list[int], max_length: int | None, *, rid: str, name: str
) -> tuple[list[int], list[int]]:
    """Cut the completion's tail so prompt + completion fit ``max_length`` (trainer and pass alike)."""
    if max_length is None or len(prompt_ids) + len(completion_ids) <= max_length:
        return prompt_ids, completion_ids
    room = max_length - len(prompt_ids)
    if room < 1:
        raise RecordError(rid, "messages", f"the prompt is {len(prompt_ids)} tokens, leaving no room for "
                          f"the {name} completion within max_length={max_length}: raise max_length or drop the row")
    return prompt_ids, completion_ids[:room]


TRUNCATED_POLICIES = ("exclude", "train_without_end")


def check_truncated_policy(truncated: str) -> None:
    if truncated not in TRUNCATED_POLICIES:
        raise ValueError(f"truncated={truncated!r}: choose one of {list(TRUNCATED_POLICIES)}")


def is_truncated_completion(record: Mapping[str, Any], name: str, index: int | None = None) -> bool:
    """Whether completion ``name`` of a row was cut at the token budget (``<name>_finish_reason`` "length")."""
    reason = record.get(f"{name}_finish_reason")
    if reason is not None and not isinstance(reason, str):
        raise RecordError(record_id(record, index), f"{name}_finish_reason",
                          f"expected a string or null, got {reason!r}")
    return reason == "length"


def count_truncated(records: Sequence[Mapping[str, Any]] | Any) -> int:
    """Completions of pair (or single-completion) rows that were cut at the token budget."""
    return sum(is_truncated_completion(row, name, i) for i, row in enumerate(map(dict, records))
               for name in PAIR_NAMES + SINGLE_NAMES if name in row)


def encode_record(
    tokenizer: Any,
    record: Mapping[str, Any],
    *,
    chat_format: str = "apertus",
    max_length: int | None = None,
    enable_thinking: bool = False,
    chat_date: str | None = None,
    index: int | None = None,
    truncated: str = "exclude",
) -> dict[str, list[int]]:
    """``prompt_ids`` and ``<name>_ids`` per completion of a row: THE tokenization of training.

    A completion whose ``<name>_finish_reason`` is "length" was cut at the sampling budget
    and never ended its turn: with ``truncated="train_without_end"`` it is encoded without
    the end-of-turn token; with ``"exclude"`` (default) such a row is an error (the pairs
    stage's default never pairs one). Bad rows raise ``RecordError`` naming the row and the field.
    """
    check_truncated_policy(truncated)
    rid = record_id(record, index)
    out: dict[str, list[int]] = {}
    for name in completion_names(record, index):
        cut = is_truncated_completion(record, name, index)
        if cut and truncated == "exclude":
            raise RecordError(rid, f"{name}_finish_reason", "is 'length': the completion was cut at the token "
                              "budget, and truncated='exclude' does not train on it. Make pairs with "
                              "truncated=exclude (the default), or set truncated=train_without_end here and in "
                              "the trainer to score it without an end-of-turn token")
        try:
            prompt_ids, completion_ids = encode_completion(
                tokenizer, record["messages"], record[name], chat_format=chat_format,
                tools=record.get("tools"), enable_thinking=enable_thinking, chat_date=chat_date,
                end_of_turn=not cut,
            )
        except RecordError:
            raise
        except ValueError as error:
            raise RecordError(rid, name, f"cannot be encoded: {error}") from error
        if not completion_ids:
            raise RecordError(rid, name, "is empty and truncated: no token to score (without an end-of-turn token)")
        prompt_ids, completion_ids = fit_to_max_length(list(prompt_ids), list(completion_ids), max_length,
                                                       rid=rid, name=name)
        if out.setdefault("prompt_ids", prompt_ids) != prompt_ids:
            raise RecordError(rid, name, "its prompt tokenizes differently from the other completion's")
        out[f"{name}_ids"] = completion_ids
    return out

