"""The sweep's bookkeeping with training and evaluation stood in: which point wins, what is written,
what a rerun skips, resumes or refuses.

`run_sweep` runs for real (manifests, completion markers, sweep.json, sweep.md, sweep.png);
only the trainer and the evaluation are replaced by recorders that write a file and report
the figures this test chooses, so every figure a point is chosen by is known in advance:
the choice by each of the four metrics, ties, the grid-edge warning, a point that cannot be
scored. tests/test_sweep.py runs the same sweep with real training on the tiny pipeline.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from align.errors import ConfigError, InputError
from align.eval.evaluate import EvalSettings
from align.sweep import SweepSettings
from align.sweep.grid import Point, at_edge, format_value
from align.sweep.inputs import (
    check_sweep_dir,
    identify_provider,
    start_fingerprint,
    validation_overlap,
)
from align.sweep.report import PointResult, SweepResult, choose, markdown
from align.sweep.run import TRAINING_ONLY_KEYS, in_memory_sampler, prepared_once, run_sweep
from align.sweep.settings import point_metrics, score_of, start_metrics
from align.trainers.target_tracking import TargetWatch
from rewards.verifiable import VerifiableReward

PROMPTS = [{"id": f"v{i}", "messages": [{"role": "user", "content": f"Sort {i}"}], "answer": str(i)} for i in range(3)]
ROWS = [{"id": "r0", "messages": [{"role": "user", "content": "Sort 1"}], "chosen": "1", "rejected": "2"},
        {"id": "r1", "messages": [{"role": "user", "content": "Sort 9"}], "chosen": "9", "rejected": "8"}]


def interval(estimate: float, spread: float = 0.05) -> dict[str, float]:
    return {"estimate": estimate, "low": estimate - spread, "high": estimate + spread, "n": 3, "confidence": 0.95}


def figures(sampled: float, greedy: float, win_sampled: float, win_greedy: float) -> dict[str, Any]:
    return {"sampled": sampled, "greedy": greedy, "win_sampled": win_sampled, "win_greedy": win_greedy}


class Stand:
    """The trainer and the evaluation, recorded; ``scores[point name]`` are the figures its evaluation reports."""

    def __init__(self, scores: dict[str, dict[str, float]]):
        self.scores = scores
        self.trained: list[tuple[str, Any]] = []  # (point dir name, resume_from_checkpoint)
        self.evaluated: list[str] = []

    def train(self, config, data, policy, *, tokenizer, callbacks):
        out = Path(config.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "model.safetensors").write_bytes(f"{config.beta} {config.learning_rate}".encode())
        self.trained.append((out.name, config.resume_from_checkpoint))
        history = [{"loss": 0.5, "step": 1}, {"loss": 0.25 * config.beta, "step": 2}, {"train_runtime": 1.0}]
        return SimpleNamespace(state=SimpleNamespace(log_history=history, global_step=2), model="MODEL",
                               data_summary={"pairs": len(data)}, target_watch=TargetWatch(None))

    def evaluate(self, prompts, policies, provider, output_dir, *, baseline, settings, source):
        name = next(p.name for p in policies if p.name != baseline)
        self.evaluated.append(name)
        self.built = [p.sampler() if callable(p.sampler) else p.sampler for p in policies]
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        (Path(output_dir) / "report.json").write_text("{}")
        f = self.scores[name]
        win = lambda v: None if v is None else {"rate": interval(v)}
        return {"prompts": len(prompts), "overall": {
            "policies": {baseline: {"reward_sampled": interval(0.3), "reward_greedy": interval(0.2),
                                    "length": interval(7.0, 1.0)},
                         name: {"reward_sampled": None if f["sampled"] is None else interval(f["sampled"]),
                                "reward_greedy": interval(f["greedy"]), "kl": interval(0.01, 0.0),
                                "length": interval(6.0, 1.0)}},
            "comparisons": {name: {"win_rate_reward_sampled": win(f["win_sampled"]),
                                   "win_rate_reward_greedy": win(f["win_greedy"]),
                                   "reward_difference_sampled": interval((f["sampled"] or 0) - 0.3),
                                   "reward_difference_greedy": interval(f["greedy"] - 0.2)}}}}


# beta-1 wins on sampled reward, beta-4 on greedy reward, beta-16 on both win rates
SCORES = {"beta-1": figures(0.9, 0.1, 0.2, 0.3), "beta-4": figures(0.5, 0.8, 0.4, 0.1),
          "beta-16": figures(0.4, 0.3, 0.9, 0.95)}


@pytest.fixture()
def stand(monkeypatch):
    from align.eval import evaluate as evaluate_module
    from align.trainers import preference_data, preference_trainer

    recorder = Stand(dict(SCORES))
    monkeypatch.setattr(preference_data, "prepare_dataset", lambda rows, tok, config, model, counted: list(rows))
    monkeypatch.setattr(preference_trainer, "train", recorder.train)
    monkeypatch.setattr(evaluate_module, "evaluate", recorder.evaluate)
    return recorder


def base_config(out: Path, **changes):
    from align.trainers.preference_config import PreferenceConfig

    return PreferenceConfig(output_dir=str(out), model_name_or_path="org/start", use_cpu=True, report_to=[],
                            beta=1.0, **changes)


def sweep(tmp_path: Path, tokenizer, metric: str = "reward_sampled", grid: dict | None = None, **kwargs):
    settings = SweepSettings(grid=grid or {"beta": [1, 4, 16]}, metric=metric,
                             validation=EvalSettings(n=2, kl=False, plots=False, resamples=200))
    factory = kwargs.pop("sampler", lambda name, model: ("SAMPLER", name, str(model)))
    return run_sweep(base_config(tmp_path / "sweep", **kwargs.pop("config", {})), ROWS, PROMPTS,
                     VerifiableReward(), settings, tokenizer=tokenizer, sampler=factory, **kwargs)


@pytest.mark.parametrize("metric,winner", [("reward_sampled", "beta-1"), ("reward_greedy", "beta-4"),
                                           ("win_rate_sampled", "beta-16"), ("win_rate_greedy", "beta-16")])
def test_the_point_chosen_is_the_best_by_the_metric_asked(metric, winner, stand, tmp_path, tiny_tokenizer):
    result = sweep(tmp_path, tiny_tokenizer, metric)
    assert result.chosen.name == winner
    key = {"reward_sampled": "sampled", "reward_greedy": "greedy", "win_rate_sampled": "win_sampled",
           "win_rate_greedy": "win_greedy"}[metric]
    assert [p.score for p in result.points] == [SCORES[n][key] for n in ("beta-1", "beta-4", "beta-16")]
    written = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert written["chosen"] == {"name": winner, "settings": {"beta": float(winner.split("-")[1])},
                                 "score": SCORES[winner][key], "model_dir": str(tmp_path / "sweep/points" / winner)}
    assert written["chosen_at_grid_edge"] == {"beta": winner != "beta-4"}


def test_what_a_sweep_writes_and_prints(stand, tmp_path, tiny_tokenizer, capsys):
    result = sweep(tmp_path, tiny_tokenizer)
    out = tmp_path / "sweep"
    assert sorted(p.name for p in out.iterdir()) == ["points", "sweep.json", "sweep.md", "sweep.png", "validation"]
    assert stand.trained == [("beta-1", None), ("beta-4", None), ("beta-16", None)]
    assert stand.evaluated == ["beta-1", "beta-4", "beta-16"]
    first = result.points[0]
    assert (first.steps, first.train_loss, first.trained_now) == (2, 0.25, True)
    assert first.validation_dir == str(out / "validation" / "beta-1") and first.start["reward_sampled"] == \
        interval(0.3)
    assert first.metrics == point_metrics(stand.evaluate(PROMPTS, [SimpleNamespace(name="start", sampler=None),
                                                       SimpleNamespace(name="beta-1", sampler=None)], None, tmp_path / "x", baseline="start", settings=None, source=""), "beta-1")
    written = json.loads((out / "sweep.json").read_text())
    assert written["metric"] == "reward_sampled" and written["grid"] == {"beta": [1.0, 4.0, 16.0]}
    assert written["validation_prompts"] == 3 and written["validation_prompts_also_trained_on"] == 1
    assert written["start"] == {"reward_sampled": interval(0.3), "reward_greedy": interval(0.2),
                                "length": interval(7.0, 1.0)}
    assert [p["name"] for p in written["points"]] == ["beta-1", "beta-4", "beta-16"]
    assert (out / "sweep.md").read_text() == markdown(result)
    printed = capsys.readouterr().out
    assert "[align sweep] warning: 1 of 3 validation prompts are prompts of the training pairs; their scores are " \
           "optimistic" in printed
    assert "[align sweep] point 2/3: beta=4" in printed
    assert "[align sweep] beta=1: reward_sampled 90.0 [85.0, 95.0] <- chosen" in printed
    assert "[align sweep] beta=16: reward_sampled 40.0 [35.0, 45.0]\n" in printed
    assert f"[align sweep] wrote {out / 'sweep.json'}, {out / 'sweep.md'}, {out / 'sweep.png'}" in printed


def test_a_rerun_trains_nothing_a_changed_setting_is_refused_and_overwrite_redoes_it(stand, tmp_path, tiny_tokenizer):
    first = sweep(tmp_path, tiny_tokenizer)
    again = sweep(tmp_path, tiny_tokenizer)
    assert len(stand.trained) == 3 and len(stand.evaluated) == 3  # nothing redone
    assert [p.trained_now for p in again.points] == [False] * 3
    assert [(p.score, p.steps, p.train_loss) for p in again.points] == [(p.score, p.steps, p.train_loss)
                                                                         for p in first.points]
    with pytest.raises(InputError, match="made from other settings or inputs"):
        sweep(tmp_path, tiny_tokenizer, config={"max_steps": 7})
    sweep(tmp_path, tiny_tokenizer, config={"max_steps": 7}, overwrite=True)
    assert len(stand.trained) == 6 and len(stand.evaluated) == 6


def test_a_point_retrained_is_validated_again_and_a_killed_point_resumes(stand, tmp_path, tiny_tokenizer, capsys):
    sweep(tmp_path, tiny_tokenizer)
    out = tmp_path / "sweep"
    (out / "points" / "beta-4" / "_COMPLETE.json").unlink()  # beta-4 was killed before it finished ...
    (out / "points" / "beta-4" / "checkpoint-2").mkdir()  # ... after its first checkpoint
    sweep(tmp_path, tiny_tokenizer)
    assert stand.trained[3:] == [("beta-4", str(out / "points" / "beta-4" / "checkpoint-2"))]
    assert stand.evaluated[3:] == ["beta-4"]  # other weights, so its validation is redone
    assert "[align sweep] beta=4: resuming from" in capsys.readouterr().out


def test_a_sweep_where_no_point_can_be_scored_chooses_none(stand, tmp_path, tiny_tokenizer):
    stand.scores = {name: figures(None, 0.1, None, None) for name in SCORES}
    result = sweep(tmp_path, tiny_tokenizer)
    assert result.chosen is None and result.at_edge == {}
    assert "No point could be scored." in (tmp_path / "sweep" / "sweep.md").read_text()
    assert json.loads((tmp_path / "sweep" / "sweep.json").read_text())["chosen"] is None


def test_the_samplers_see_the_saved_point_and_the_start_as_given(stand, tmp_path, tiny_tokenizer):
    sweep(tmp_path, tiny_tokenizer, grid={"beta": [1]}, sampler=lambda name, model: (name, str(model)))
    assert stand.built == [("start", "org/start"), ("beta-1", str(tmp_path / "sweep" / "points" / "beta-1"))]


def test_an_empty_set_of_pairs_is_refused(stand, tmp_path, tiny_tokenizer):
    settings = SweepSettings(grid={"beta": [1]})
    with pytest.raises(InputError, match="^records: no pair rows to train on$"):
        run_sweep(base_config(tmp_path / "s"), [], PROMPTS, VerifiableReward(), settings, tokenizer=tiny_tokenizer)


# --------------------------------------------------------------------------- the parts


def test_the_choice_breaks_ties_by_grid_order_and_skips_unscored_points():
    def p(name, score):
        return PointResult(name, {"beta": 1.0}, score, {}, {}, 1, None, name, name)

    assert choose([p("a", None), p("b", 0.5), p("c", 0.5), p("d", 0.4)]).name == "b"
    assert choose([p("a", 0.1), p("b", 0.7), p("c", 0.2)]).name == "b"
    assert choose([p("a", -0.5), p("b", -0.2)]).name == "b"
    assert choose([]) is None and choose([p("a", None)]) is None


@pytest.mark.parametrize("grid,chosen,edge", [
    ({"beta": [1, 4, 16]}, {"beta": 1}, {"beta": True}),
    ({"beta": [1, 4, 16]}, {"beta": 16}, {"beta": True}),
    ({"beta": [1, 4, 16]}, {"beta": 4}, {"beta": False}),
    ({"beta": [16, 1, 4]}, {"beta": 4}, {"beta": False}),  # min and max, not the first and last given
    ({"beta": [16, 1, 4]}, {"beta": 16}, {"beta": True}),
    ({"beta": [1, 4]}, {"beta": 1}, {}),  # two values: every choice is an edge, which says nothing
    ({"loss_type": ["qrpo", "dpo", "x"]}, {"loss_type": "dpo"}, {}),  # not numbers
    ({"beta": [1, 4, 16], "seed": [1, 2, 3]}, {"beta": 4}, {"beta": False}),  # a key not chosen on
    ({"flag": [True, False, True]}, {"flag": True}, {}),
])
def test_a_choice_at_the_edge_of_the_grid_is_flagged(grid, chosen, edge):
    assert at_edge(grid, chosen) == edge


def test_the_sweep_table_word_for_word(tmp_path):
    grid = {"beta": [1.0, 4.0, 16.0], "learning_rate": [1e-4]}
    start = {"reward_sampled": interval(0.3), "reward_greedy": interval(0.2)}

    def point(beta: float, sampled: float | None, loss: float | None) -> PointResult:
        metrics = {} if sampled is None else {"reward_sampled": interval(sampled), "reward_greedy": interval(0.5),
                                              "gain_sampled": interval(sampled - 0.3)}
        name = Point({"beta": beta, "learning_rate": 1e-4}).name
        return PointResult(name, {"beta": beta, "learning_rate": 1e-4}, sampled, metrics, start, 10, loss,
                           f"/s/points/{name}", f"/s/validation/{name}")

    points = [point(1.0, 0.25, 0.5), point(4.0, None, None), point(16.0, 0.75, 0.01234)]
    result = SweepResult(grid=grid, metric="reward_sampled", points=points, chosen=points[2], validation_prompts=40,
                         validation_overlap=2)
    points[0].metrics["kl"] = interval(0.123)
    assert markdown(result) == (
        "# Sweep: 3 points, chosen by reward_sampled on 40 validation prompts\n\n"
        "reward_sampled: mean reward of the n samples per validation prompt (accuracy, with a verifiable reward). "
        "The reward columns are the validation reward's. Figures in points (x100) with 95% bootstrap intervals "
        "over prompts; KL in nats.\n\n"
        "| point | beta | learning_rate | reward_sampled (chosen by) | reward, samples | reward, greedy | gain vs start, "
        "samples | KL | steps | train loss | not chosen because |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n"
        "| start |  |  | 30.0 [25.0, 35.0] | 30.0 [25.0, 35.0] | 20.0 [15.0, 25.0] |  |  |  |  |  |\n"
        "| `beta-1_learning_rate-0.0001` | 1 | 0.0001 | 25.0 [20.0, 30.0] | 25.0 [20.0, 30.0] | 50.0 [45.0, 55.0] | "
        "-5.0 [-10.0, +0.0] | 0.123 | 10 | 0.5 |  |\n"
        "| `beta-4_learning_rate-0.0001` | 4 | 0.0001 | - | - | - | - | - | 10 | - |  |\n"
        "| `beta-16_learning_rate-0.0001` (chosen) | 16 | 0.0001 | 75.0 [70.0, 80.0] | 75.0 [70.0, 80.0] | "
        "50.0 [45.0, 55.0] | +45.0 [+40.0, +50.0] | - | 10 | 0.01234 |  |\n"
        "\n"
        "Chosen: beta=16, learning_rate=0.0001 (/s/points/beta-16_learning_rate-0.0001).\n"
        "The chosen beta is at the edge of the grid: the best value may lie beyond it.\n"
        "Warning: 2 validation prompts are also prompts of the training pairs.\n")
    win = SweepResult(grid=grid, metric="win_rate_greedy", points=points, chosen=None, validation_prompts=40)
    assert "| start |  |  |  | 30.0 [25.0, 35.0] |" in markdown(win) and "No point could be scored." in markdown(win)
    assert "Warning" not in markdown(win)


def test_a_points_figures_are_read_from_its_evaluation_report():
    report = {"overall": {"policies": {"start": {"reward_sampled": 1, "reward_greedy": 2, "length": 3, "kl": 9},
                                       "p": {"reward_sampled": 4, "reward_greedy": 5, "kl": 6, "length": 7}},
                          "comparisons": {"p": {"win_rate_reward_sampled": {"rate": 8},
                                                "win_rate_reward_greedy": {"rate": 10},
                                                "reward_difference_sampled": 11, "reward_difference_greedy": 12}}}}
    assert point_metrics(report, "p") == {"reward_sampled": 4, "reward_greedy": 5, "win_rate_sampled": 8,
                                          "win_rate_greedy": 10, "gain_sampled": 11, "gain_greedy": 12, "kl": 6,
                                          "length": 7}
    report["overall"]["comparisons"]["p"]["win_rate_reward_greedy"] = None  # nothing decided
    assert point_metrics(report, "p")["win_rate_greedy"] is None
    assert start_metrics(report, "start") == {"reward_sampled": 1, "reward_greedy": 2, "length": 3}
    assert score_of({"reward_sampled": {"estimate": 0.25}}, "reward_sampled") == 0.25
    assert score_of({"reward_sampled": None}, "reward_sampled") is None and score_of({}, "reward_greedy") is None


def test_values_are_written_in_names_and_tables_in_their_shortest_form():
    assert [format_value(v) for v in (True, None, 3e-5, 1e-4, 0.1234567, 5, "dpo")] == \
        ["true", "none", "3e-05", "0.0001", "0.123457", "5", "dpo"]
    assert Point({"lr_scheduler_type": "cosine/with restarts", "beta": 2.5}).name == \
        "lr_scheduler_type-cosine_with_restarts_beta-2.5"


def test_the_sweep_directory_holds_a_sweep_or_nothing(tmp_path):
    check_sweep_dir(tmp_path / "new")
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="is a file, not a directory"):
        check_sweep_dir(tmp_path / "file")
    other = tmp_path / "other"
    other.mkdir()
    for i in range(7):
        (other / f"f{i}.txt").write_text("x")
    (other / ".hidden").write_text("x")
    with pytest.raises(InputError) as info:
        check_sweep_dir(other)
    assert "holds files that no sweep wrote (f0.txt, f1.txt, f2.txt, f3.txt, f4.txt and 2 more)" in str(info.value)
    stage = tmp_path / "stage"
    stage.mkdir()
    (stage / "_COMPLETE.json").write_text(json.dumps({"stage": "pairs"}))
    with pytest.raises(InputError, match="holds the pairs stage's output; choose another output_dir"):
        check_sweep_dir(stage)
    earlier = tmp_path / "earlier"
    (earlier / "points").mkdir(parents=True)
    (earlier / "_COMPLETE.json").write_text(json.dumps({"stage": "sweep"}))
    check_sweep_dir(earlier)


def test_what_a_sweep_is_bound_to(tmp_path):
    import torch

    from align.io.fingerprint import json_digest, weights_fingerprint

    model = torch.nn.Linear(2, 2)
    assert start_fingerprint(model, "ignored") == {"kind": "weights", "fingerprint": weights_fingerprint(model)}
    assert "path" not in start_fingerprint(None, "org/start")
    with pytest.raises(ConfigError, match="model_name_or_path: give the start policy"):
        start_fingerprint(None, "")
    provider = VerifiableReward()
    assert identify_provider(provider, None) == json_digest(provider.fingerprint())
    assert identify_provider(lambda: provider, "given") == "given"
    with pytest.raises(ConfigError, match="provider: a function that builds the reward provider needs "
                                          "provider_fingerprint"):
        identify_provider(lambda: provider, None)
    tools = [{"id": "t", "messages": ROWS[0]["messages"], "tools": [{"name": "sort"}]}]
    assert validation_overlap(ROWS, PROMPTS) == 1 and validation_overlap(ROWS + tools, tools) == 1
    assert validation_overlap(ROWS, [{"messages": ROWS[0]["messages"], "tools": []}]) == 1  # no tools: none


def test_pairs_are_tokenized_once_only_for_grids_of_training_settings(monkeypatch):
    from align.trainers import preference_data

    calls = []
    monkeypatch.setattr(preference_data, "prepare_dataset",
                        lambda rows, tok, config, model, counted: calls.append(len(rows)) or counted.update(
                            over_max_length=1) or "PREPARED")
    assert prepared_once("CONFIG", ROWS, "TOK", None, {"beta": [1], "learning_rate": [1]}) == \
        ("PREPARED", {"over_max_length": 1})
    assert prepared_once("CONFIG", ROWS, "TOK", None, {"beta": [1], "max_length": [64]}) == (ROWS, {})
    assert calls == [2] and {"beta", "learning_rate", "max_steps", "seed"} <= TRAINING_ONLY_KEYS
    assert not {"max_length", "loss_type", "chat_date"} & TRAINING_ONLY_KEYS


def test_validation_samplers_run_on_the_models_in_memory(monkeypatch):
    from align.sampling import hf

    made = []
    monkeypatch.setattr(hf, "TransformersSampler", lambda model, tokenizer, **kw: made.append((model, tokenizer, kw)))

    class Model:
        evaluated = False

        def eval(self):
            self.evaluated = True

    config = SimpleNamespace(chat_format="apertus", chat_date="2025-09-01", enable_thinking=False)
    build = in_memory_sampler(config, SimpleNamespace(batch_size=7), "TOK")
    model = Model()
    build("beta-1", model)
    build("start", Path("/runs/sft"))
    build("hub", "org/start")
    assert model.evaluated and made[0][0] is model and made[1][0] == "/runs/sft" and made[2][0] == "org/start"
    assert made[0][2] == {"chat_format": "apertus", "chat_date": "2025-09-01", "enable_thinking": False,
                          "batch_size": 7, "model_name": "beta-1"}
    assert [m[1] for m in made] == ["TOK"] * 3 and made[1][2]["model_name"] == "start"


def test_a_point_past_a_guard_is_listed_with_the_reason_and_never_chosen():
    from align.eval.evaluate import EvalSettings
    from align.sweep.settings import SweepSettings, guard_failure

    start = {"length": interval(10.0)}
    guards = SweepSettings(grid={"beta": [1]}, max_kl=0.5, max_length_ratio=1.5,
                           validation=EvalSettings(n=2, kl=True))
    assert guard_failure({"kl": interval(0.5), "length": interval(15.0)}, start, guards) is None  # at the limits
    assert guard_failure({"kl": interval(0.51), "length": interval(10.0)}, start, guards) == "KL 0.51 > max_kl 0.5"
    assert guard_failure({"kl": interval(0.1), "length": interval(15.1)}, start, guards) == (
        "answers 1.51x the start policy's length > max_length_ratio 1.5")
    assert guard_failure({"length": interval(10.0)}, start, guards) == "KL not measured (max_kl needs it)"
    assert guard_failure({"kl": interval(9.0), "length": interval(99.0)}, start,
                         SweepSettings(grid={"beta": [1]})) is None  # no guards set
    with pytest.raises(ConfigError, match="max_kl: the guard needs the points' KL: set validation.kl=true"):
        SweepSettings(grid={"beta": [1]}, max_kl=1.0)

    def p(name, score, excluded=None):
        return PointResult(name, {"beta": 1.0}, score, {}, {}, 1, None, name, name, reward_score=-score,
                           excluded=excluded)

    points = [p("a", 0.2), p("b", 0.9, "KL 3 > max_kl 1"), p("c", 0.5)]
    assert choose(points).name == "c" and choose(points, by_reward=True).name == "a"
    assert choose([p("b", 0.9, "KL 3 > max_kl 1")]) is None
    result = SweepResult(grid={"beta": [1.0]}, metric="reward_sampled", points=[points[1]], chosen=None,
                         validation_prompts=4)
    text = markdown(result)
    assert "| KL 3 > max_kl 1 |" in text and text.endswith("No point could be chosen: every scored point is past "
                                                           "a guard.\n")
