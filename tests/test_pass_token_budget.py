"""The reference log-prob pass batched by a token budget (``max_batch_tokens``): batches as planned by hand,
each within the budget, the same log-probs as row-count batches, and a killed run resumed with no row
lost or written twice."""

from __future__ import annotations

import json
import random

import pytest

from align.errors import ConfigError
from align.jobs.runner import plan_batches, run_job
from align.logprobs import _BatchScorer, compute_ref_logprobs, load_ref_logprobs
from align.stages.logprobs import LogprobsConfig
from align.testing.tiny import build_causal_lm

DATE = "2025-09-01"


@pytest.mark.parametrize("sizes, batch_size, budget, expected", [
    # longest first: 10 and 9 fill 20 (2 × 10); four rows of at most 5 fill 20; the rest
    ([10, 9, 5, 5, 4, 2, 2, 1], 16, 20, [(0, 2), (2, 6), (6, 8)]),
    # the row cap still holds under a large budget
    ([3, 3, 3, 3, 3], 2, 1000, [(0, 2), (2, 4), (4, 5)]),
    # a row over the budget is scored alone, not dropped
    ([50, 3, 3], 16, 20, [(0, 1), (1, 3)]),
    # unsorted sizes: a longer row later raises the batch's width for every row in it
    ([2, 10, 2], 16, 20, [(0, 2), (2, 3)]),
    ([], 4, 20, []),
])
def test_batches_by_hand(sizes, batch_size, budget, expected):
    assert plan_batches(len(sizes), batch_size, budget, sizes) == expected


def test_without_a_budget_batches_are_batch_size_rows():
    assert plan_batches(7, 3) == [(0, 3), (3, 6), (6, 7)]


@pytest.mark.parametrize("seed", range(5))
def test_every_batch_fits_and_none_could_take_the_next_row(seed):
    rng = random.Random(seed)
    sizes = sorted((rng.randint(1, 300) for _ in range(200)), reverse=True)
    batch_size, budget = rng.choice([4, 16, 64]), rng.choice([256, 1000, 4096])
    batches = plan_batches(len(sizes), batch_size, budget, sizes)
    assert [i for start, end in batches for i in range(start, end)] == list(range(len(sizes)))
    for n, (start, end) in enumerate(batches):
        rows = end - start
        assert rows <= batch_size
        assert rows == 1 or rows * max(sizes[start:end]) <= budget
        if n + 1 < len(batches):  # the next row did not fit, by count or by tokens
            assert rows == batch_size or (rows + 1) * max(sizes[start:end + 1]) > budget


def test_a_budget_needs_a_size_per_record():
    with pytest.raises(ValueError, match=r"one size per record \(3\), got 2"):
        plan_batches(3, 4, 10, [1, 2])
    with pytest.raises(ConfigError, match="max_batch_tokens=0: must be >= 1"):
        run_job([{"id": "a"}], lambda batch: batch, "unused", max_batch_tokens=0, size_key=len)


def test_the_stage_refuses_an_empty_budget():
    with pytest.raises(ConfigError, match=r"max_batch_tokens=0: must be >= 1, or None"):
        LogprobsConfig(model_name_or_path="m", input="p.jsonl", output_dir="o", max_batch_tokens=0)


# --------------------------------------------------------------------------- the pass


def pair_rows() -> list[dict]:
    rng = random.Random(0)
    return [{"id": f"r{i}", "messages": [{"role": "user", "content": f"Question {i}?"}],
             "chosen": " ".join(["yes"] * rng.randint(1, 60)), "rejected": " ".join(["no"] * rng.randint(1, 20))}
            for i in range(24)]


@pytest.fixture(scope="module")
def model(tiny_tokenizer):
    return build_causal_lm(tiny_tokenizer)


def batches_scored(monkeypatch) -> list[list[int]]:
    """Each forward's rows, as their token counts (prompt and both completions)."""
    seen: list[list[int]] = []
    score = _BatchScorer._score

    def spy(self, records, encoded):
        seen.append([sum(len(v) for v in e.values()) for e in encoded])
        return score(self, records, encoded)

    monkeypatch.setattr(_BatchScorer, "_score", spy)
    return seen


def scored(directory) -> dict[str, tuple[float, float]]:
    rows = load_ref_logprobs(directory, pair_rows())
    return {row["id"]: (row["ref_chosen_logps"], row["ref_rejected_logps"]) for row in rows}


def test_the_pass_keeps_each_forward_within_the_budget_and_its_results(model, tiny_tokenizer, tmp_path,
                                                                       monkeypatch):
    settings = {"chat_format": "apertus", "max_length": 512, "chat_date": DATE, "batch_size": 8}
    compute_ref_logprobs(pair_rows(), model, tiny_tokenizer, output_dir=tmp_path / "rows", **settings)
    seen = batches_scored(monkeypatch)
    budget = 400
    compute_ref_logprobs(pair_rows(), model, tiny_tokenizer, output_dir=tmp_path / "tokens", max_batch_tokens=budget,
                         **settings)
    flat = [size for batch in seen for size in batch]
    assert len(flat) == 24 and flat == sorted(flat, reverse=True)  # every row once, longest first
    assert all(len(batch) <= 8 and (len(batch) == 1 or len(batch) * max(batch) <= budget) for batch in seen)
    assert len(seen[0]) < len(seen[-1])  # long rows few to a forward, short ones many
    by_tokens, by_rows = scored(tmp_path / "tokens"), scored(tmp_path / "rows")
    assert by_tokens.keys() == by_rows.keys()
    for rid, logps in by_rows.items():  # float32 forwards of other batch shapes: equal to rounding
        assert by_tokens[rid] == pytest.approx(logps, rel=1e-5), rid


def test_a_killed_budgeted_run_resumes_with_each_row_once(tmp_path):
    records = [{"id": f"r{i}", "text": "x" * (i % 7 + 1)} for i in range(20)]
    calls = []

    def process(batch):
        calls.append(len(batch))
        if len(calls) == 3:
            raise RuntimeError("node lost")
        return [{**row, "done": True} for row in batch]

    budget = dict(batch_size=8, max_batch_tokens=12, size_key=lambda row: len(row["text"]),
                  sort_key=lambda row: -len(row["text"]))
    with pytest.raises(RuntimeError, match="node lost"):
        run_job(records, process, tmp_path, **budget)
    first = sum(calls[:2])
    result = run_job(records, process, tmp_path, **budget)
    assert result.num_already_done == first and result.num_processed == 20 - first
    ids = [json.loads(line)["id"] for path in tmp_path.glob("*.jsonl") for line in path.read_text().splitlines()]
    assert sorted(ids) == sorted(r["id"] for r in records)


def test_the_stage_batches_by_its_budget_under_the_same_cache_key(tiny_dirs, tmp_path, monkeypatch):
    from align.stages.logprobs import run_pass

    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in pair_rows()))
    base = dict(model_name_or_path=str(tiny_dirs["policy"]), input=str(data), cache_dir=str(tmp_path / "c"),
                max_length=512, chat_date=DATE, batch_size=8)
    seen = batches_scored(monkeypatch)
    by_rows = run_pass(LogprobsConfig(**base))
    assert [len(batch) for batch in seen] == [8, 8, 8]
    seen.clear()
    assert run_pass(LogprobsConfig(**base, max_batch_tokens=400)) == by_rows  # a layout: same key
    assert seen == []  # and that output is complete: nothing to score again
    run_pass(LogprobsConfig(**{**base, "cache_dir": str(tmp_path / "d")}, max_batch_tokens=400))
    assert len(seen) > 3 and all(len(b) == 1 or len(b) * max(b) <= 400 for b in seen)
