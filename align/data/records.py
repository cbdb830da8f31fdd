"""The one record schema that every stage reads and writes, and its validation.

Stages talk through datasets on disk, one row per prompt. A stage validates what it
reads and rejects a bad row with an error naming the record and the field, so a bad row
is never silently dropped or half-used.

Prompt record (sampling adds ``completions``; annotation adds ``rewards``)::

    id:           str, stable across stages (jobs resume by it)
    messages:     list of {"role", "content"}: the prompt conversation, ending with a
                  user turn
    completions:  list of {"text": str, "is_reference": bool, "num_tokens": int,
                  "finish_reason": str, "source": str}; the last three optional
                  (COMPLETION_DEFAULTS; docs/your-data.md)
    rewards:      list of float | None, one per completion
    reward_skips: list of str | None, why a reward is None
    num_ref_dropped: int (optional), reference samples that sampling with
                  ``overlong=drop`` removed; the pairs stage expects n - num_ref_dropped

A completion with ``finish_reason`` "length" was cut at the token budget: it never ended
its turn, so it must not be trained with an end-of-turn token (see ``truncated`` in the
pairs stage and the trainer).

Pair record (``align pairs`` output, what the preference trainer reads)::

    id, messages, chosen, rejected, chosen_reward, rejected_reward,
    chosen_quantile, rejected_quantile, num_ref_rewards, pair_fallback,
    chosen_finish_reason, rejected_finish_reason, num_ref_dropped
    (+ tools, the prompt's tool declarations, when it has them)

The reference log-prob pass adds ``ref_chosen_logps``, ``ref_rejected_logps``,
``chosen_length`` and ``rejected_length``, and binds them to what it scored:
``ref_chosen_token_hash``, ``ref_rejected_token_hash`` (the exact token ids),
``ref_model_fingerprint`` and ``ref_inputs`` (its settings; see ``align.logprobs``).
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from align.errors import RecordError
from align.stage_table import SKIP_FIELD

COMPLETION_FIELDS: dict[str, type | tuple[type, ...]] = {
    "text": str,
    "num_tokens": int,
    "finish_reason": str,
    "is_reference": bool,
    "source": str,
}

PAIR_FIELDS = (
    "id",
    "messages",
    "chosen",
    "rejected",
    "chosen_reward",
    "rejected_reward",
    "chosen_quantile",
    "rejected_quantile",
    "num_ref_rewards",
    "pair_fallback",
    "chosen_finish_reason",
    "rejected_finish_reason",
    "num_ref_dropped",
)

REF_LOGP_FIELDS = ("ref_chosen_logps", "ref_rejected_logps", "chosen_length", "rejected_length")


def list_field(record: Mapping[str, Any], field: str, rid: Any) -> list[Any] | None:
    """A list column (``messages``, ``tools``) as a list: the one rule for every reader.

    Parquet and Arrow tables often hold such a column as JSON text, so a string is parsed;
    text that is not JSON, or JSON that is not a list, is an error naming the record and the
    field. Absent, None or an empty string: None.
    """
    value = record.get(field)
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise RecordError(rid, field, f"JSON text that does not parse ({err.msg} at character {err.pos})") \
                from None
        except RecursionError:
            raise RecordError(rid, field, "JSON text nested too deep to read") from None
    if not isinstance(value, list):
        raise RecordError(rid, field, f"expected a list, got {type(value).__name__}")
    return value


def record_id(record: Mapping[str, Any], index: int | None = None) -> str:
    """The id to name in errors: the record's own id, else its row index."""
    rid = record.get("id") if isinstance(record, Mapping) else None
    if isinstance(rid, str) and rid:
        return rid
    return f"<row {index}>" if index is not None else "<unknown>"


def validate_prompt(record: Mapping[str, Any], index: int | None = None) -> None:
    """Check the fields every stage needs: a string id and a prompt ending in a user turn."""
    if not isinstance(record, Mapping):
        raise RecordError(f"<row {index}>", "<record>", f"expected a mapping, got {type(record).__name__}")
    rid = record_id(record, index)
    if not isinstance(record.get("id"), str) or not record["id"]:
        raise RecordError(rid, "id", "missing or not a non-empty string")
    messages = record.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RecordError(rid, "messages", "missing or not a non-empty list of messages")
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or "role" not in message or "content" not in message:
            raise RecordError(rid, f"messages[{i}]", "expected a mapping with 'role' and 'content'")
    if messages[-1]["role"] != "user":
        raise RecordError(rid, "messages", f"prompt must end with a user turn, ends with {messages[-1]['role']!r}")


COMPLETION_DEFAULTS: dict[str, Any] = {
    # a completion supplied from elsewhere is taken as one that ended its turn; mark a cut
    # one "length" (it is then never trained with an end-of-turn token)
    "finish_reason": "stop",
    # where it came from, for the reports; a sampler writes its backend and model
    "source": "supplied",
    # its length in tokens, as the sampler counted it; None: not counted (nothing reads it
    # before evaluation, which counts its own samples)
    "num_tokens": None,
}
COMPLETION_HINT = ("a completion needs text and is_reference (true: a sample of the reference policy, one of "
                   "the quantiles' references; false: another completion to pair); num_tokens, finish_reason "
                   "and source are optional (docs/your-data.md)")


def completion_problems(completion: Any, i: int) -> list[tuple[str, str]]:
    """(field, problem) for every missing or mistyped field of completion `i`."""
    if not isinstance(completion, Mapping):
        return [(f"completions[{i}]", f"expected a mapping, got {type(completion).__name__}")]
    problems = []
    for name, kind in COMPLETION_FIELDS.items():
        if name not in completion or completion[name] is None:
            if name not in COMPLETION_DEFAULTS:
                problems.append((f"completions[{i}].{name}", "missing"))
            continue
        value = completion[name]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            problems.append((f"completions[{i}].{name}", f"expected {kind.__name__}, got {value!r}"))
    return problems


def validate_completions(record: Mapping[str, Any], index: int | None = None) -> None:
    """Check ``completions`` has the sampler's fields with the right types; one error lists
    every problem of the record (a missing field once, with the completions it is missing in)."""
    validate_prompt(record, index)
    rid = record_id(record, index)
    completions = record.get("completions")
    if not isinstance(completions, list) or not completions:
        raise RecordError(rid, "completions", "missing or empty")
    problems = [p for i, c in enumerate(completions) for p in completion_problems(c, i)]
    if not problems:
        return
    missing: dict[str, list[int]] = {}
    others: list[str] = []
    for field, problem in problems:
        if problem == "missing":
            name = field.split(".", 1)[1]
            missing.setdefault(name, []).append(int(field[field.index("[") + 1:field.index("]")]))
        else:
            others.append(f"{field}: {problem}")
    said = [f"{name} missing in completion{'s' if len(at) > 1 else ''} {_index_ranges(at)}"
            for name, at in missing.items()]
    raise RecordError(rid, problems[0][0], "; ".join(said + others) + f" ({COMPLETION_HINT})")


def _index_ranges(indices: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def with_completion_defaults(record: Mapping[str, Any]) -> Mapping[str, Any]:
    """The record with each completion's absent optional fields filled in (the record itself
    when none is absent): what a stage reads after `validate_completions`."""
    completions = record["completions"]
    filled = [{**c, **{k: v for k, v in COMPLETION_DEFAULTS.items() if c.get(k) is None}} for c in completions]
    return record if filled == completions else {**record, "completions": filled}


def validate_rewards(record: Mapping[str, Any], index: int | None = None) -> None:
    """Check ``rewards`` lines up with ``completions``: finite floats or None with a reason."""
    validate_completions(record, index)
    rid = record_id(record, index)
    rewards, skips = record.get("rewards"), record.get("reward_skips")
    n = len(record["completions"])
    if not isinstance(rewards, list) or len(rewards) != n:
        raise RecordError(rid, "rewards", f"expected a list of {n} rewards, got {rewards!r}")
    if skips is not None and (not isinstance(skips, list) or len(skips) != n):
        raise RecordError(rid, "reward_skips", f"expected a list of {n} entries")
    for i, reward in enumerate(rewards):
        if reward is None:
            if not skips or not skips[i]:
                raise RecordError(rid, f"rewards[{i}]", "is None without a reason in reward_skips")
            continue
        if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or type(reward).__name__ == "bool_":
            raise RecordError(rid, f"rewards[{i}]", f"expected a float, got {reward!r}")
        if not math.isfinite(reward):
            raise RecordError(rid, f"rewards[{i}]", f"is {reward} (NaN/inf rewards are an error)")


def validate_pair(record: Mapping[str, Any], index: int | None = None, *, need_ref_logps: bool = False) -> None:
    """Check a pair row has what the preference trainer reads."""
    validate_prompt(record, index)
    rid = record_id(record, index)
    for name in ("chosen", "rejected"):
        if not isinstance(record.get(name), str):
            raise RecordError(rid, name, f"expected a completion string, got {record.get(name)!r}")
        reason = record.get(f"{name}_finish_reason")
        if reason is not None and not isinstance(reason, str):
            raise RecordError(rid, f"{name}_finish_reason", f"expected a string or null, got {reason!r}")
    if need_ref_logps:
        for name in REF_LOGP_FIELDS:
            value = record.get(name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise RecordError(rid, name, f"expected a finite number, got {value!r}: the reference log-probs are "
                                  "missing (score them first: `align logprobs`, or align.compute_ref_logprobs in "
                                  "Python; or set reference=\"model\" to score the reference during training)")


def validate_all(records: Iterable[Mapping[str, Any]], check) -> None:
    """Run one of the validators above over a dataset, naming the first bad row."""
    for index, record in enumerate(records):
        check(record, index)


def same_value(found: Any, wanted: Any) -> bool:
    """A field's value as ``where`` names it: true is not 1, null only null, and the text "false" not false; a
    number equals the same number written as an int or a float (3 and 3.0)."""
    if isinstance(found, bool) or isinstance(wanted, bool) or found is None or wanted is None:
        return found is wanted
    if isinstance(found, numbers.Real) and isinstance(wanted, numbers.Real):
        return found == wanted
    return type(found) is type(wanted) and found == wanted


def skip_reason(row: Mapping[str, Any]) -> str | None:
    """Why a stage before could not do its work for this row (a skip row), or None for a row to work on."""
    reason = row.get(SKIP_FIELD) if isinstance(row, Mapping) else None
    return reason if isinstance(reason, str) and reason else None


def skip_row_id(record: Mapping[str, Any], index: int) -> str:
    """A skip row's id: a skip row is passed on as it came, and the stages after match it to its prompt by
    that id, so one without an id is refused where it is first read."""
    rid = record.get("id")
    if not isinstance(rid, str) or not rid:
        raise RecordError(record_id(record, index), "id", "a skip row needs the id of the prompt it stands for "
                          f"(skip_reason: {skip_reason(record)!r:.80})")
    return rid


def passing_skips(process: Callable[[list[dict]], list[dict]]) -> Callable[[list[dict]], list[dict]]:
    """``process`` over the rows of a batch that are not skip rows; each skip row passes on unchanged, in its
    place (a stage never fails on, nor works on, a row a stage before it could not make)."""
    def run(batch: list[dict]) -> list[dict]:
        live = [row for row in batch if skip_reason(row) is None]
        done = iter(process(live) if live else [])
        return [dict(row) if skip_reason(row) is not None else next(done) for row in batch]

    return run
