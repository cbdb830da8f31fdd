"""TRL's preference rows read as align's pair rows, so a dataset made for TRL's DPOTrainer trains as it is.

TRL's preference datasets come in three shapes:

- standard: ``prompt``, ``chosen`` and ``rejected`` are strings;
- conversational: ``prompt`` is a list of messages, ``chosen`` and ``rejected`` lists holding
  the assistant's turn;
- implicit prompt: no ``prompt``; ``chosen`` and ``rejected`` are whole conversations that
  share every turn but the last, the assistant's answer.

align's pair rows hold the prompt as ``messages`` (ending with the user's turn), the two
answers as strings, and an ``id`` (docs/your-data.md). A row in a TRL shape becomes one:
the id, when missing, is made from the row's content (the same row gets the same id in the
reference log-prob pass and in training), and the rewards QRPO reads (``chosen_reward``,
``rejected_reward`` and ``ref_rewards``, or the two quantiles) pass through as columns. Every
field that cannot be read is named at once, in one error.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from align.errors import RecordError

ANSWERS = ("chosen", "rejected")


def is_trl_row(row: Mapping[str, Any]) -> bool:
    """A row in one of TRL's shapes (no ``messages``, and a prompt or conversations to take it from)."""
    if not isinstance(row, Mapping) or "messages" in row:
        return False
    return "prompt" in row or all(isinstance(row.get(name), list) for name in ANSWERS)


def from_trl_row(row: Mapping[str, Any], index: int | None = None) -> dict[str, Any]:
    """An align pair row from a row in a TRL shape; any other row is returned as it is."""
    if not is_trl_row(row):
        return dict(row) if isinstance(row, Mapping) else row
    problems: dict[str, str] = {}
    if "prompt" in row:
        messages = _prompt(row["prompt"], problems)
        answers = {name: _answer(row.get(name), name, problems) for name in ANSWERS}
    else:
        messages, answers = _implicit(row, problems)
    rid = row.get("id") if isinstance(row.get("id"), str) and row.get("id") else _made_id(messages, answers)
    if problems:
        raise RecordError(rid if "id" in row or index is None else f"<row {index}>", ", ".join(problems),
                          "; ".join(f"{name} {problem}" for name, problem in problems.items())
                          + " (TRL's preference formats: docs/coming-from-trl.md)")
    out = {k: v for k, v in row.items() if k != "prompt"}
    return {**out, "id": rid, "messages": messages, **answers}


def _prompt(prompt: Any, problems: dict[str, str]) -> list[dict[str, Any]] | None:
    """A string is one user turn; a list of messages is taken as it is, and must end with the user's turn."""
    if isinstance(prompt, str) and prompt:
        return [{"role": "user", "content": prompt}]
    if _is_messages(prompt) and prompt:
        if prompt[-1]["role"] != "user":
            problems["prompt"] = f"ends with a {prompt[-1]['role']!r} turn; a prompt ends with the user's turn"
        return [dict(m) for m in prompt]
    problems["prompt"] = f"expected a non-empty string or list of messages, got {_shown(prompt)}"
    return None


def _answer(value: Any, name: str, problems: dict[str, str]) -> str | None:
    """A string as it is; a list of one assistant message, its content."""
    if isinstance(value, str):
        return value
    if _is_messages(value) and len(value) == 1 and value[0]["role"] == "assistant" \
            and isinstance(value[0]["content"], str):
        return value[0]["content"]
    problems[name] = (f"expected a string or a list of one assistant message with text content, got "
                      f"{_shown(value)}")
    return None


def _implicit(row: Mapping[str, Any], problems: dict[str, str]) -> tuple[list[dict] | None, dict[str, Any]]:
    """Two whole conversations: the turns they share are the prompt, each one's last turn its answer."""
    chosen, rejected = row.get("chosen"), row.get("rejected")
    for name, value in (("chosen", chosen), ("rejected", rejected)):
        if not _is_messages(value) or len(value) < 2:
            problems[name] = f"expected a conversation of at least two messages, got {_shown(value)}"
    if problems:
        return None, {"chosen": None, "rejected": None}
    if chosen[:-1] != rejected[:-1]:
        problems["chosen"] = "and rejected differ before their last turn: with no prompt, they must share every turn "
        problems["chosen"] += "but the last (or give the prompt as `prompt`)"
        return None, {"chosen": None, "rejected": None}
    messages = _prompt(chosen[:-1], problems)
    return messages, {name: _answer(value[-1:], name, problems) for name, value in (("chosen", chosen),
                                                                                     ("rejected", rejected))}


def _is_messages(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(m, Mapping) and "role" in m and "content" in m for m in value)


def _made_id(messages: Any, answers: Mapping[str, Any]) -> str:
    """An id from the row's content: the same row is the same id in every pass over it."""
    payload = json.dumps({"messages": messages, **answers}, sort_keys=True, ensure_ascii=False, default=str)
    return "trl-" + hashlib.sha256(payload.encode()).hexdigest()[:16]


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def as_pair_rows(records: Any) -> Any:
    """``records`` with rows in a TRL shape made pair rows (a list); anything else as it is."""
    columns = getattr(records, "column_names", None)
    if columns is not None:
        if "messages" in columns or ("prompt" not in columns and "chosen" not in columns):
            return records
    elif not isinstance(records, list) or not any(is_trl_row(row) for row in records):
        return records
    return [from_trl_row(row, index) for index, row in enumerate(records)]
