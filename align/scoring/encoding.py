"""Encoding a pair row (or a single-completion row) into (prompt, completion) token ids.

THE tokenization of preference training and of the reference log-prob pass: both call
``encode_record``, so the pass scores exactly the token ids the trainer trains on.
``align.chat.encode_completion`` renders the prompt and the completion; a row whose prompt
and completion do not fit ``max_length`` is excluded (``over_max_length="exclude"``, the
default: ``OverMaxLengthError``, which the pass and the trainer record as a skip with its
reason) or has the completion's tail cut (``"cut"``, ``fit_to_max_length``; the cut
completion loses its end-of-turn token while R_q and β/|y| still describe the whole text,
so this is an opt-in, counted); a completion cut at the sampling budget
(``<name>_finish_reason`` "length") is refused or encoded without its end-of-turn token
(``truncated``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from align.chat import encode_completion
from align.data.records import record_id, validate_pair, validate_prompt
from align.errors import ConfigError, InputError, RecordError

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


OVER_MAX_LENGTH_POLICIES = ("exclude", "cut")


def check_over_max_length_policy(over_max_length: str) -> None:
    if over_max_length not in OVER_MAX_LENGTH_POLICIES:
        raise ConfigError(f"over_max_length={over_max_length!r}: choose one of {list(OVER_MAX_LENGTH_POLICIES)}")


class OverMaxLengthError(RecordError):
    """A row whose prompt + completion exceeds ``max_length`` (``over_max_length="exclude"``).

    ``reason`` is the one-line skip reason the log-prob pass writes in ``ref_skip`` and the
    trainer logs; the pass and the trainer exclude such rows alike.
    """

    def __init__(self, rid: str, name: str, prompt_tokens: int, completion_tokens: int, max_length: int):
        self.prompt_tokens, self.completion_tokens, self.max_length = prompt_tokens, completion_tokens, max_length
        self.reason = (f"over_max_length: prompt {prompt_tokens} + {name} {completion_tokens} tokens > "
                       f"max_length={max_length}")
        super().__init__(rid, name, f"{self.reason}; the row is excluded (over_max_length=exclude). Raise "
                         "max_length (the sampler's max_model_len is the longest prompt + completion it "
                         "writes), or set over_max_length=cut in the pass and the trainer to train on the "
                         "completion's head without its end-of-turn token")


def fit_to_max_length(
    prompt_ids: list[int], completion_ids: list[int], max_length: int | None, *, rid: str, name: str,
    over_max_length: str = "exclude",
) -> tuple[list[int], list[int]]:
    """Prompt + completion within ``max_length`` (trainer and pass alike): refused (``OverMaxLengthError``,
    ``over_max_length="exclude"``) or the completion's tail cut (``"cut"``)."""
    if max_length is None or len(prompt_ids) + len(completion_ids) <= max_length:
        return prompt_ids, completion_ids
    room = max_length - len(prompt_ids)
    if over_max_length == "exclude":
        raise OverMaxLengthError(rid, name, len(prompt_ids), len(completion_ids), max_length)
    if room < 1:
        raise RecordError(rid, "messages", f"the prompt is {len(prompt_ids)} tokens, leaving no room for "
                          f"the {name} completion within max_length={max_length}: raise max_length or drop the row")
    return prompt_ids, completion_ids[:room]


def is_over_max_length(encoded: Mapping[str, list[int]], max_length: int | None) -> bool:
    """Whether an ``encode_record(..., max_length=None)`` result would be cut or excluded at ``max_length``."""
    if max_length is None:
        return False
    prompt = len(encoded["prompt_ids"])
    return any(prompt + len(v) > max_length for k, v in encoded.items() if k != "prompt_ids")


TRUNCATED_POLICIES = ("exclude", "train_without_end")


def check_truncated_policy(truncated: str) -> None:
    if truncated not in TRUNCATED_POLICIES:
        raise ConfigError(f"truncated={truncated!r}: choose one of {list(TRUNCATED_POLICIES)}")


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
    over_max_length: str = "exclude",
    cut_names: list[str] | None = None,
) -> dict[str, list[int]]:
    """``prompt_ids`` and ``<name>_ids`` per completion of a row: THE tokenization of training.

    A completion whose ``<name>_finish_reason`` is "length" was cut at the sampling budget
    and never ended its turn: with ``truncated="train_without_end"`` it is encoded without
    the end-of-turn token; with ``"exclude"`` (default) such a row is an error (the pairs
    stage's default never pairs one). Bad rows raise ``RecordError`` naming the row and the field.

    A completion that does not fit ``max_length`` after its prompt raises ``OverMaxLengthError``
    (``over_max_length="exclude"``, default; callers record the row as skipped) or loses its
    tail (``"cut"``; its name is appended to ``cut_names`` when a list is given, to count them).
    """
    check_truncated_policy(truncated)
    check_over_max_length_policy(over_max_length)
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
        except InputError as error:  # the text or the tokenizer (align.chat); a bug keeps its own class
            raise RecordError(rid, name, f"cannot be encoded: {error}") from error
        if not completion_ids:
            raise RecordError(rid, name, "is empty and truncated: no token to score (without an end-of-turn token)")
        num_before = len(completion_ids)
        prompt_ids, completion_ids = fit_to_max_length(list(prompt_ids), list(completion_ids), max_length,
                                                       rid=rid, name=name, over_max_length=over_max_length)
        if cut_names is not None and len(completion_ids) < num_before:
            cut_names.append(name)
        if out.setdefault("prompt_ids", prompt_ids) != prompt_ids:
            raise RecordError(rid, name, "its prompt tokenizes differently from the other completion's")
        out[f"{name}_ids"] = completion_ids
    return out

