"""Judge validation: rank statistics and every metric against hand-computed values, then
end to end with a judge that knows the ladder (τ = 1) and a random tiny model (τ ≈ 0)."""

from __future__ import annotations

import json
import math

import pytest
from judge_fakes import ScriptedBackend, response_of, responses_ab
from validation_cases import records

from rewards.degrade import Ladder, RuleDegrader, build_ladders
from rewards.judge import ConstitutionalJudge
from rewards.pairwise import combine_orders
from rewards.validation import (
    LadderResult,
    kendall_tau,
    ladder_metrics,
    qualification,
    spearman_rho,
    validate_judge,
)

Q = [{"role": "user", "content": "q"}]


def test_rank_correlations_by_hand():
    truth = [0, -1, -2, -3]  # steps 0..3, fewer flaws = better
    # pairs: 5 concordant, 1 tied in the scores (7, 7), none discordant: τ_b = 5 / √(5·6)
    assert kendall_tau([9, 7, 7, 3], truth) == pytest.approx(5 / math.sqrt(30))
    # average ranks (4, 2.5, 2.5, 1) against (4, 3, 2, 1): ρ = 4.5 / √(4.5·5)
    assert spearman_rho([9, 7, 7, 3], truth) == pytest.approx(4.5 / math.sqrt(22.5))
    # one discordant pair of three: τ = (2 − 1) / 3; ρ = 1 − 6·2 / (3·8)
    assert kendall_tau([2, 5, 1], [0, -1, -2]) == pytest.approx(1 / 3)
    assert spearman_rho([2, 5, 1], [0, -1, -2]) == pytest.approx(0.5)
    assert kendall_tau([1, 2, 3], [3, 2, 1]) == -1 and spearman_rho([1, 2, 3], [3, 2, 1]) == -1
    assert kendall_tau([5, 5, 5], [0, -1, -2]) == 0 and spearman_rho([5, 5, 5], [0, -1, -2]) == 0
    assert math.isnan(kendall_tau([1], [1]))


def _ladder(n_items, name="l", language=None):
    return Ladder(name, Q, [f"{name}-{i}" for i in range(n_items)], ["x"] * (n_items - 1), language)


def fixed_results():
    """Two ladders of 3 items with fixed pointwise scores and comparisons (pairs (i, j), i < j)."""
    a = LadderResult(_ladder(3, "a"), [8.0, 6.0, 7.0], {
        (0, 1): combine_orders(0.9, 0.7),   # agree; first shown wins: 0.9 and 0.3
        (0, 2): combine_orders(0.8, 0.4),   # disagree; first shown: 0.8, 0.6
        (1, 2): combine_orders(0.6, None),  # one order; first shown: 0.6
    })
    b = LadderResult(_ladder(3, "b"), [9.0, 9.0, 2.0], {
        (0, 1): combine_orders(0.3, 0.1),   # agree (second better); first shown: 0.3, 0.9
        (0, 2): combine_orders(1.0, 0.8),   # agree; first shown: 1.0, 0.2
        (1, 2): combine_orders(0.7, 0.9),   # agree; first shown: 0.7, 0.1
    })
    return a, b


def test_metrics_by_hand():
    a, b = fixed_results()
    m = ladder_metrics([a, b], scale=(1, 9), resamples=2000, seed=0)
    # pointwise τ: a = (8,6,7) vs (0,-1,-2): C=2 ((0,1),(0,2)), D=1 ((1,2)) -> 1/3;
    #              b = (9,9,2): C=2, one tie in the scores -> 2/√(2·3)
    tau_a, tau_b = 1 / 3, 2 / math.sqrt(6)
    tau = m["kendall_tau"]["pointwise"]
    assert tau["estimate"] == pytest.approx((tau_a + tau_b) / 2)
    # two prompts: every resample is (a, a), (a, b) or (b, b), each far above 2.5%, so the
    # 95% percentile interval runs from the smaller to the larger prompt value
    assert (tau["low"], tau["high"]) == pytest.approx((tau_a, tau_b))
    # ρ: a ranks (3,1,2) vs (3,2,1) -> 1 − 6·2/24 = 0.5; b ranks (2.5,2.5,1) vs (3,2,1) -> 1.5/√(1.5·2)
    rho = m["spearman_rho"]["pointwise"]
    assert rho["estimate"] == pytest.approx((0.5 + 1.5 / math.sqrt(3)) / 2)
    # pairwise scores: a: item0 (0.8 + 0.6)/2 = 0.7, item1 (0.2 + 0.6)/2 = 0.4, item2 (0.4 + 0.4)/2 = 0.4
    assert a.pairwise_scores() == pytest.approx([0.7, 0.4, 0.4])
    # τ_b of (0.7, 0.4, 0.4): C=2, one tie -> 2/√6; b: item0 (0.2+0.9)/2, item1 (0.8+0.8)/2, item2 (0.1+0.2)/2
    assert b.pairwise_scores() == pytest.approx([0.55, 0.8, 0.15])
    assert m["kendall_tau"]["pairwise"]["estimate"] == pytest.approx((2 / math.sqrt(6) + 1 / 3) / 2)
    # adjacent pointwise: a: 8>6 win, 6<7 loss; b: 9=9 tie, 9>2 win -> pooled (1+0+0.5+1)/4
    assert m["adjacent_accuracy"]["pointwise"]["estimate"] == pytest.approx(2.5 / 4)
    # adjacent pairwise: a: (0,1) 0.8 win, (1,2) 0.6 win; b: (0,1) 0.2 loss, (1,2) 0.8 win -> 3/4
    assert m["adjacent_accuracy"]["pairwise"]["estimate"] == pytest.approx(3 / 4)
    # position bias: a: 0.9,0.3,0.8,0.6,0.6 (5); b: 0.3,0.9,1.0,0.2,0.7,0.1 (6) -> pooled 6.4/11
    assert m["position_bias"]["estimate"] == pytest.approx(6.4 / 11)
    assert (m["position_bias"]["low"], m["position_bias"]["high"]) == pytest.approx((3.2 / 6, 3.2 / 5))
    # order agreement: a: agree, disagree (one-order pair not counted); b: 3 agree -> 4/5
    assert m["order_agreement"]["estimate"] == pytest.approx(4 / 5)
    assert (m["order_agreement"]["low"], m["order_agreement"]["high"]) == pytest.approx((0.5, 1.0))
    assert m["comparisons"] == 6 and m["single_order_comparisons"] == 1 and m["single_order_scored"] == 1
    scores = m["pointwise_scores"]
    assert scores["histogram"] == {"1": 0, "2": 1, "3": 0, "4": 0, "5": 0, "6": 1, "7": 1, "8": 1, "9": 2}
    assert [s["estimate"] for s in scores["mean_by_step"]] == pytest.approx([8.5, 7.5, 4.5])


def test_skipped_one_order_comparisons_do_not_count():
    a, _ = fixed_results()
    a.comparisons[(1, 2)] = combine_orders(0.6, None, single_order="skip")
    assert a.pairwise_scores() == pytest.approx([0.7, 0.2, 0.4])  # item 2 only has its comparison with item 0
    m = ladder_metrics([a], resamples=200)
    assert m["single_order_comparisons"] == 1 and m["single_order_scored"] == 0
    assert m["adjacent_accuracy"]["pairwise"]["estimate"] == 1.0  # only (0, 1) decided


def test_qualification_verdicts():
    metrics = {"kendall_tau": {"pointwise": {"estimate": 0.6, "low": 0.3, "high": 0.8}}}
    assert qualification(metrics, min_kendall_tau=0.5)["qualified"] is True
    assert qualification(metrics, min_kendall_tau=0.7)["qualified"] is False
    wide = {"kendall_tau": {"pointwise": {"estimate": 0.6, "low": -0.1, "high": 0.9}}}
    assert "includes 0" in qualification(wide, min_kendall_tau=0.5)["reason"]
    assert qualification(wide, min_kendall_tau=0.5, require_significant=False)["qualified"] is True


def _oracle(ladders):
    """A scripted judge that knows each text's step: pointwise mass on 9 − 2·step, pairwise on
    the less flawed response."""
    step = {text.strip(): s for ladder in ladders for s, text in enumerate(ladder.texts)}

    def answer(prompt_text, labels):
        if "RESPONSE A:" in prompt_text:
            a, b = responses_ab(prompt_text)
            first = step[a.strip()] < step[b.strip()]
            return {"A": math.log(0.9 if first else 0.1), "B": math.log(0.1 if first else 0.9)}
        return {str(9 - 2 * step[response_of(prompt_text).strip()]): 0.0}

    return answer


def test_a_judge_that_knows_the_ladder_gets_tau_one(chat_tokenizer, short_charter, tmp_path):
    recs = records()
    items = [(r["id"], r["messages"], r["completion"], r["language"]) for r in recs]
    ladders, skipped = build_ladders(items, RuleDegrader(), steps=4, seed=0)
    assert len(ladders) == len(recs) and not skipped
    judge = ConstitutionalJudge(ScriptedBackend(chat_tokenizer, _oracle(ladders)), short_charter)
    report = validate_judge(recs, judge, ladders=ladders, output_dir=tmp_path, resamples=500, min_kendall_tau=0.9)
    for group in [report["all"], *report["languages"].values()]:
        for mode in ("pointwise", "pairwise"):
            assert group["kendall_tau"][mode] == {**group["kendall_tau"][mode], "estimate": 1.0, "low": 1.0, "high": 1.0}
            assert group["spearman_rho"][mode]["estimate"] == 1.0
            assert group["adjacent_accuracy"][mode]["estimate"] == 1.0
        assert group["order_agreement"]["estimate"] == 1.0
        assert group["position_bias"]["estimate"] == pytest.approx(0.5)
    assert set(report["languages"]) == {"en", "de"}
    assert report["verdicts"]["en"]["qualified"] and report["verdicts"]["de"]["qualified"]
    assert [s["estimate"] for s in report["all"]["pointwise_scores"]["mean_by_step"]] == pytest.approx([9, 7, 5, 3, 1])
    for name in ("report.json", "report.md", "ladders.jsonl", "score_by_step.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert json.loads((tmp_path / "report.json").read_text())["verdicts"]["en"]["qualified"] is True
    md = (tmp_path / "report.md").read_text()
    assert "**en**: qualified" in md and "| de | 4 |" in md
    rows = [json.loads(line) for line in (tmp_path / "ladders.jsonl").read_text().splitlines()]
    assert len(rows) == len(ladders) and len(rows[0]["comparisons"]) == 10


def test_a_random_tiny_judge_shows_no_order(judge_lm, chat_tokenizer, short_charter, tmp_path):
    from rewards.judge_backends import TransformersJudgeBackend

    backend = TransformersJudgeBackend(judge_lm, chat_tokenizer, batch_size=16, show_progress=False)
    judge = ConstitutionalJudge(backend, short_charter)
    report = validate_judge(records(), judge, steps=3, output_dir=tmp_path, resamples=1000)
    for mode in ("pointwise", "pairwise"):
        tau = report["all"]["kendall_tau"][mode]
        assert tau["low"] < 0 < tau["high"], (mode, tau)
    assert not report["verdicts"]["all"]["qualified"]
    assert report["all"]["comparisons"] == len(records()) * 6
    assert (tmp_path / "score_by_step.png").exists()


def test_reports_are_written_atomically(chat_tokenizer, short_charter, tmp_path, monkeypatch):
    """A run that dies while writing leaves the previous files whole and no temp files."""
    from rewards.validation import report as report_module

    recs = records(("en",))[:3]
    ladders, _ = build_ladders([(r["id"], r["messages"], r["completion"], r["language"]) for r in recs],
                               RuleDegrader(), steps=2, seed=0)
    judge = ConstitutionalJudge(ScriptedBackend(chat_tokenizer, _oracle(ladders)), short_charter)
    validate_judge(recs, judge, ladders=ladders, output_dir=tmp_path, resamples=200)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert set(before) == {"report.json", "report.md", "ladders.jsonl", "score_by_step.png"}
    real, calls = report_module.ladder_row, []

    def dies_on_the_second_row(result):
        calls.append(result)
        if len(calls) == 2:
            raise KeyboardInterrupt("killed while writing ladders.jsonl")
        return real(result)

    monkeypatch.setattr(report_module, "ladder_row", dies_on_the_second_row)
    with pytest.raises(KeyboardInterrupt):
        validate_judge(recs, judge, ladders=ladders, output_dir=tmp_path, resamples=260)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} | {"report.json": before["report.json"]} == before
    assert json.loads((tmp_path / "report.json").read_text())["settings"]["resamples"] == 260  # written before
    assert len((tmp_path / "ladders.jsonl").read_text().splitlines()) == 3  # the whole previous file
