"""Records become a `datasets.Dataset` with the columns of every row, not just the first.

``datasets.Dataset.from_list`` takes its columns from the first row, so a key the first
row lacks (``tools``, ``answer``, ``enable_thinking``...) vanished from every row: the
SFT data of calculator conversations lost its tool declarations.
"""

from __future__ import annotations

import json

import pytest

from align.io import rows_to_dataset
from align.trainers.sft_data import load_sft_dataset

TOOL = {"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}


def _chat(i: int) -> list[dict]:
    return [{"role": "user", "content": f"{i}+1"}, {"role": "assistant", "content": str(i + 1)}]


@pytest.mark.parametrize("optional", ["tools", "answer", "language", "enable_thinking", "id"])
def test_rows_to_dataset_keeps_a_column_the_first_row_lacks(optional):
    value = {"tools": [TOOL], "answer": "2", "language": "de", "enable_thinking": True, "id": "b"}[optional]
    rows = [{"messages": _chat(0)}, {"messages": _chat(1), optional: value}]
    dataset = rows_to_dataset(rows)
    assert optional in dataset.column_names
    assert dataset[optional] == [None, value]


def test_rows_to_dataset_keeps_row_order_and_first_seen_column_order():
    dataset = rows_to_dataset([{"a": 1}, {"b": 2, "a": 3}, {"c": 4}])
    assert dataset.column_names == ["a", "b", "c"]
    assert dataset.to_list() == [{"a": 1, "b": None, "c": None}, {"a": 3, "b": 2, "c": None},
                                 {"a": None, "b": None, "c": 4}]
    assert len(rows_to_dataset([])) == 0


@pytest.mark.parametrize("optional", ["tools", "id", "enable_thinking"])
def test_load_sft_dataset_keeps_optional_columns_the_first_row_lacks(optional):
    value = {"tools": [TOOL], "id": "second", "enable_thinking": True}[optional]
    rows = [{"messages": _chat(0)}, {"messages": _chat(1), optional: value}]
    dataset = load_sft_dataset(rows)
    assert optional in dataset.column_names
    assert _decoded(dataset[1][optional]) == value and dataset[0][optional] is None


def test_load_sft_dataset_keeps_the_calculator_tool_declarations():
    rows = [{"id": f"p{i}", "messages": _chat(i)} for i in range(3)]
    rows.append({"id": "tool", "messages": _chat(9), "tools": [TOOL]})
    dataset = load_sft_dataset(rows)
    assert dataset.column_names == ["id", "messages", "tools"]
    assert _decoded(dataset[3]["tools"]) == [TOOL] and dataset[0]["tools"] is None


def _decoded(value):
    """SFT rows hold ``messages`` and ``tools`` as JSON text (one Arrow type whatever their shape)."""
    return json.loads(value) if isinstance(value, str) and value[:1] in "[{" else value
