"""What each later round of the demo starts from, writes where, and trains with, with the heavy parts stood in.

The rounds run for real in tests/demo/test_demo.py (``rounds=2``); here each part a round calls
(loading π_{k-1}, sampling, annotation, pairs, the reference pass, the one-point sweep) is
replaced by a recorder, so a wrong start policy (round 4 from round 2's policy), a wrong
directory, a sampler named for the wrong round or a setting that is not the one round 1 chose
shows in seconds, for rounds 2 to 4.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from align.demo import rounds
from align.demo.config import DATE, GENERATE_BATCH, DemoConfig
from align.demo.parts import demo_reward
from align.demo.reward import GradedSortingReward
from align.demo.rounds import (
    RoundResult,
    previous_policy,
    round_comparisons,
    round_policies,
    run_round,
)
from align.errors import ConfigError
from rewards.verifiable import VerifiableReward


@dataclass
class Point:
    model_dir: str
    settings: dict
    steps: int = 12
    score: float = 0.5


@dataclass
class Sweep:
    chosen: Point | None
    start: dict = field(default_factory=lambda: {"reward_greedy": 0.25})
    metric: str = "reward_greedy"


def state(tmp_path: Path) -> SimpleNamespace:
    return SimpleNamespace(
        config=DemoConfig(rounds=4), out=tmp_path, tokenizer="TOKENIZER", rounds={},
        splits={"prompts": ["P"], "validation": ["V"]},
        sweeps={"qrpo": Sweep(Point("/runs/qrpo/beta-4", {"beta": 4.0, "learning_rate": 1e-3})),
                "dpo": Sweep(Point("/runs/dpo/beta-0.1", {"beta": 0.1, "learning_rate": 3e-4}))})


@pytest.fixture()
def parts(monkeypatch):
    """Every part a round calls, recorded; ``pairs`` is what pairs_into returns next."""
    import transformers

    from align.demo import parts as demo_parts
    from align.sampling import hf
    from align.sweep import run as sweep_run

    calls: dict[str, list] = {"load": [], "sampler": [], "sample": [], "train": [], "sweep": []}
    box: dict[str, Any] = {"pairs": [{"chosen_quantile": 1.0, "rejected_quantile": 0.25},
                                     {"chosen_quantile": 0.5, "rejected_quantile": 0.0}],
                           "skips": [{"reason": "no contrast: all right"}, {"reason": "no contrast: all wrong"},
                                     {"reason": "too long: 300 tokens"}],
                           "trained": True}

    class Model:
        def __init__(self, path):
            self.path = path

        def eval(self):
            return self

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda path: calls["load"].append(path) or Model(path))
    calls["pairs"], calls["references"] = [], []
    monkeypatch.setattr(hf, "TransformersSampler", lambda model, tokenizer, **kw: calls["sampler"].append(
        (model.path, tokenizer, kw.pop("model_name"), kw)) or "SAMPLER")
    monkeypatch.setattr(demo_parts, "sample_into", lambda out, config, prompts, sampler: calls["sample"].append(
        (out, config.rounds, prompts, sampler)))
    monkeypatch.setattr(demo_parts, "annotate_into", lambda out, config: ["ANNOTATED", out, config.reward])
    monkeypatch.setattr(demo_parts, "pairs_into", lambda out, config, annotated, tok: calls["pairs"].append(
        (out, config.rounds, annotated, tok)) or (box["pairs"], box["skips"]))
    monkeypatch.setattr(demo_parts, "reference_rows", lambda out, pairs, model, tok: calls["references"].append(
        (out, len(pairs), model.path, tok)) or [("ROWS", out, model.path)])
    monkeypatch.setattr(demo_parts, "preference_config", lambda config, out, method: calls["train"].append(
        (config.rounds, out, method)) or out)

    def run_sweep(config, rows, validation, reward, settings, *, model, tokenizer, measures):
        calls["sweep"].append({"config": config, "rows": rows, "validation": validation, "grid": settings.grid,
                               "measures": measures,
                               "settings": settings, "reward": reward.fingerprint(), "model": model.path,
                               "tokenizer": tokenizer})
        chosen = Point(f"{config}/point", dict(settings.grid)) if box["trained"] else None
        return Sweep(chosen)

    monkeypatch.setattr(sweep_run, "run_sweep", run_sweep)
    return calls, box


def test_each_round_starts_from_the_round_before_for_each_method(tmp_path, parts, capsys):
    calls, _ = parts
    s = state(tmp_path)
    for k in (2, 3, 4):
        run_round(s, k)
    assert calls["load"] == ["/runs/qrpo/beta-4", "/runs/dpo/beta-0.1",
                             f"{tmp_path}/round-2/qrpo/train/point", f"{tmp_path}/round-2/dpo/train/point",
                             f"{tmp_path}/round-3/qrpo/train/point", f"{tmp_path}/round-3/dpo/train/point"]
    assert [r.round for r in s.rounds["qrpo"]] == [2, 3, 4] and [r.method for r in s.rounds["dpo"]] == ["dpo"] * 3
    assert previous_policy(s, "dpo", 2) == "/runs/dpo/beta-0.1"
    assert previous_policy(s, "dpo", 5) == f"{tmp_path}/round-4/dpo/train/point"
    assert [name for _, _, name, _ in calls["sampler"]] == ["demo-qrpo", "demo-dpo", "demo-qrpo-round-2",
                                                            "demo-dpo-round-2", "demo-qrpo-round-3", "demo-dpo-round-3"]
    assert calls["sampler"][3][:2] == (f"{tmp_path}/round-2/dpo/train/point", "TOKENIZER")
    assert all(kw == {"chat_format": "apertus", "batch_size": GENERATE_BATCH, "chat_date": DATE}
               for *_, kw in calls["sampler"])
    assert calls["sample"][3] == (tmp_path / "round-3" / "dpo", 4, ["P"], "SAMPLER")
    out = tmp_path / "round-3" / "dpo"
    assert calls["pairs"][3] == (out, 4, ["ANNOTATED", out, "exact"], "TOKENIZER")
    assert calls["references"][3] == (out, 2, f"{tmp_path}/round-2/dpo/train/point", "TOKENIZER")
    assert calls["train"][:2] == [(4, tmp_path / "round-2" / "qrpo" / "train", "qrpo"),
                                  (4, tmp_path / "round-2" / "dpo" / "train", "dpo")]
    printed = capsys.readouterr().out
    assert "[align demo] round 3, DPO ..." in printed and "[align demo] round 4, QRPO ..." in printed


def test_a_round_trains_once_with_the_settings_round_one_chose(tmp_path, parts):
    calls, _ = parts
    s = state(tmp_path)
    run_round(s, 2)
    qrpo, dpo = calls["sweep"]
    assert qrpo["grid"] == {"beta": [4.0], "learning_rate": [1e-3]} and dpo["grid"] == {"beta": [0.1],
                                                                                        "learning_rate": [3e-4]}
    assert qrpo["config"] == tmp_path / "round-2" / "qrpo" / "train" and qrpo["validation"] == ["V"] and qrpo["tokenizer"] == "TOKENIZER"
    assert qrpo["rows"] == [("ROWS", tmp_path / "round-2" / "qrpo", "/runs/qrpo/beta-4")]  # π_{k-1} is the reference
    assert qrpo["model"] == "/runs/qrpo/beta-4"
    assert qrpo["measures"] == {} and qrpo["settings"].select_on == "reward"  # trained on exact: one measure
    assert qrpo["reward"] == demo_reward(s.config).fingerprint() == VerifiableReward(match="exact").fingerprint()
    assert dpo["settings"] == replace(s.config.sweep_settings("dpo"), grid={"beta": [0.1], "learning_rate": [3e-4]})
    found = s.rounds["qrpo"][0]
    assert (found.pairs, found.skipped_prompts, found.skip_reasons) == (2, 3, {"no contrast": 2, "too long": 1})
    assert (found.mean_chosen_quantile, found.mean_rejected_quantile) == (0.75, 0.125)
    assert found.as_json() == {
        "round": 2, "start": "/runs/qrpo/beta-4", "policy": f"{tmp_path}/round-2/qrpo/train/point", "pairs": 2,
        "skipped_prompts": 3, "skip_reasons": {"no contrast": 2, "too long": 1}, "mean_chosen_quantile": 0.75,
        "mean_rejected_quantile": 0.125, "trained": True, "settings": {"beta": [4.0], "learning_rate": [1e-3]},
        "steps": 12, "validation": {"score": 0.5, "start": 0.25}}


def test_a_round_without_pairs_keeps_its_policy_and_says_why(tmp_path, parts, capsys):
    calls, box = parts
    box["pairs"] = []
    s = state(tmp_path)
    run_round(s, 2)
    found = s.rounds["dpo"][0]
    assert found.result is None and found.policy_dir == "/runs/dpo/beta-0.1" and calls["sweep"] == []
    assert (found.mean_chosen_quantile, found.mean_rejected_quantile) == (None, None)
    assert "[align demo] round 2, DPO: no prompt gave a pair ({'no contrast': 2, 'too long': 1}); the policy " \
           "stays as it was" in capsys.readouterr().out


def test_a_trained_policy_that_cannot_be_scored_stops_the_demo(tmp_path, parts):
    _, box = parts
    box["trained"] = False
    with pytest.raises(RuntimeError, match="^round 3, qrpo: the trained policy could not be scored on the "
                                           "validation prompts$"):
        rounds.method_round(SimpleNamespace(**{**vars(state(tmp_path)), "rounds": {"qrpo": [
            RoundResult("qrpo", 2, "/a", 0, 0)]}}), "qrpo", 3)


def test_the_evaluation_lists_every_later_round_and_compares_each_with_the_one_before(tmp_path, monkeypatch):
    from align.eval import summary

    s = state(tmp_path)
    s.rounds = {"qrpo": [RoundResult("qrpo", 2, "/q1", 1, 0, result=Sweep(Point("/q2", {}))),
                         RoundResult("qrpo", 3, "/q2", 0, 4)],
                "dpo": [RoundResult("dpo", 2, "/d1", 1, 0, result=Sweep(Point("/d2", {})))]}
    assert round_policies(s) == [("qrpo-round-2", "/q2"), ("qrpo-round-3", "/q2"), ("dpo-round-2", "/d2")]
    asked = []

    def comparison_summary(rows, name, baseline, settings):
        asked.append((name, baseline))
        assert (rows, settings) == (["ROW"], "SETTINGS")
        return {"reward_difference_sampled": f"S-{name}", "reward_difference_greedy": f"G-{name}",
                "win_rate_reward_sampled": f"W-{name}", "verdicts": [f"V-{name}"]}

    monkeypatch.setattr(summary, "comparison_summary", comparison_summary)
    compared = round_comparisons(s, ["ROW"], "SETTINGS")
    assert asked == [("qrpo-round-2", "qrpo"), ("qrpo-round-3", "qrpo-round-2"), ("dpo-round-2", "dpo")]
    assert compared["qrpo"][1] == {"round": 3, "against": "qrpo-round-2", "sampled": "S-qrpo-round-3",
                                   "greedy": "G-qrpo-round-3", "win_rate_sampled": "W-qrpo-round-3",
                                   "verdicts": ["V-qrpo-round-3"]}
    assert [c["against"] for c in compared["dpo"]] == ["dpo"]


def test_a_demo_of_one_round_has_no_later_policies_or_comparisons(tmp_path):
    s = state(tmp_path)
    assert round_policies(s) == [] and round_comparisons(s, [], None) == {}


def test_a_graded_run_trains_every_round_on_the_graded_reward(tmp_path, parts):
    """``reward=graded``: the annotation, and the one-point sweep's validation, use the graded reward
    with the run's noise and bias, in every later round."""
    calls, _ = parts
    s = state(tmp_path)
    s.config = DemoConfig(rounds=4, reward="graded", reward_noise=0.3, reward_length_bias=0.2)
    run_round(s, 2)
    expected = GradedSortingReward(noise=0.3, length_bias=0.2).fingerprint()
    assert [sweep["reward"] for sweep in calls["sweep"]] == [expected, expected]
    assert calls["pairs"][0][2][2] == "graded"


def test_on_the_graded_reward_a_round_scores_exact_accuracy_beside_it(tmp_path, parts):
    calls, _ = parts
    s = state(tmp_path)
    s.config = DemoConfig(rounds=2, reward="graded")
    run_round(s, 2)
    qrpo, _ = calls["sweep"]
    assert list(qrpo["measures"]) == ["exact"] and qrpo["measures"]["exact"].fingerprint()["match"] == "exact"
    assert qrpo["settings"].select_on == "exact"  # one point: nothing to choose, both measures reported
    assert DemoConfig(reward="graded", select_on="reward").sweep_select_on == "reward"
    with pytest.raises(ConfigError, match="select_on: unknown 'gold'; choose 'goal' or 'reward'"):
        DemoConfig(select_on="gold")
