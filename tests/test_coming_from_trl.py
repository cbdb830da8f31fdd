"""docs/coming-from-trl.md runs as written, and TRL's preference shapes read as pair rows.

The page's Python blocks run in order in one namespace, in a temporary directory (a TRL user's
first hour: DPO on TRL's conversational data, QRPO on its standard data with rewards as
columns, the offline reference pass). The shapes themselves are checked against hand-written
pair rows, and a row wrong in several fields is refused naming them all.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from align.data.trl_rows import as_pair_rows, from_trl_row
from align.errors import RecordError

DOC = Path(__file__).resolve().parents[1] / "docs" / "coming-from-trl.md"


def test_every_python_block_of_the_page_runs_as_written(tmp_path, monkeypatch, one_torch_thread):
    import torch

    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) == 3
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), namespace)  # noqa: S102 - the page's own examples
        trainer = namespace["trainer"]
        assert trainer.state.global_step == 2 and torch.isfinite(torch.tensor(trainer.state.log_history[-1]["train_loss"]))
    assert (tmp_path / "runs" / "trl-qrpo-offline" / "model.safetensors").exists()
    assert all(r["id"].startswith("trl-") and r["ref_chosen_logps"] < 0 for r in namespace["rows_with_reference"])


def test_the_three_trl_shapes_become_the_same_pair_row():
    expected = {"id": "x", "messages": [{"role": "user", "content": "Hi?"}], "chosen": "Hello.", "rejected": "Go."}
    standard = {"id": "x", "prompt": "Hi?", "chosen": "Hello.", "rejected": "Go."}
    conversational = {"id": "x", "prompt": [{"role": "user", "content": "Hi?"}],
                      "chosen": [{"role": "assistant", "content": "Hello."}],
                      "rejected": [{"role": "assistant", "content": "Go."}]}
    implicit = {"id": "x", "chosen": [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}],
                "rejected": [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Go."}]}
    for row in (standard, conversational, implicit):
        assert from_trl_row(row, 0) == expected, row
    assert from_trl_row(expected, 0) == expected  # align's own rows as they are


def test_a_made_id_depends_on_the_content_only():
    one = from_trl_row({"prompt": "Hi?", "chosen": "a", "rejected": "b", "chosen_reward": 1.0}, 0)
    again = from_trl_row({"prompt": "Hi?", "chosen": "a", "rejected": "b"}, 7)
    other = from_trl_row({"prompt": "Hi?", "chosen": "a", "rejected": "c"}, 0)
    assert one["id"] == again["id"] != other["id"] and one["id"].startswith("trl-")
    assert one["chosen_reward"] == 1.0 and "prompt" not in one


def test_every_wrong_field_is_named_at_once():
    with pytest.raises(RecordError) as caught:
        from_trl_row({"prompt": 3, "chosen": [{"role": "user", "content": "x"}], "rejected": None}, 4)
    message = str(caught.value)
    assert message.startswith("record '<row 4>': field 'prompt, chosen, rejected': prompt expected a non-empty string")
    assert "chosen expected a string or a list of one assistant message" in message and "rejected expected" in message
    with pytest.raises(RecordError, match="prompt ends with a 'assistant' turn"):
        from_trl_row({"prompt": [{"role": "assistant", "content": "x"}], "chosen": "a", "rejected": "b"}, 0)
    with pytest.raises(RecordError, match="differ before their last turn"):
        from_trl_row({"chosen": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "x"}],
                      "rejected": [{"role": "user", "content": "b"}, {"role": "assistant", "content": "y"}]}, 0)


def test_datasets_and_lists_of_other_rows_pass_through():
    import datasets

    own = [{"id": "a", "messages": [{"role": "user", "content": "x"}], "chosen": "a", "rejected": "b"}]
    assert as_pair_rows(own) is own
    table = datasets.Dataset.from_list(own)
    assert as_pair_rows(table) is table
    trl = datasets.Dataset.from_list([{"prompt": "x", "chosen": "a", "rejected": "b"}])
    assert as_pair_rows(trl)[0]["messages"] == [{"role": "user", "content": "x"}]
