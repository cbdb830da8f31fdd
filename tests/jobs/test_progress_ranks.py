"""Progress bars: the main process draws them, the other ranks of a launch stay quiet."""

from __future__ import annotations

import pytest

from align.jobs import run_job


def _double(batch):
    return [{"id": r["id"], "y": 2 * r["x"]} for r in batch]


@pytest.mark.parametrize(("rank", "drawn"), [(None, True), ("0", True), ("1", False)])
def test_job_bar_only_on_the_main_rank(rank, drawn, tmp_path, monkeypatch, capsys):
    if rank is None:
        monkeypatch.delenv("RANK", raising=False)
    else:
        monkeypatch.setenv("RANK", rank)
    records = [{"id": f"r{i}", "x": i} for i in range(5)]
    run_job(records, _double, tmp_path / "out", batch_size=2, desc="doubling")
    assert ("doubling" in capsys.readouterr().err) is drawn
