"""Tuning on a grid (`align sweep`, `align.run_sweep`) on the tiny pipeline.

The tiny chain (SFT, sampling, rewards, pairs, reference log-probs) is made once, through
`align pipeline recipes/tiny/pipeline.yaml stop_after=logprobs` in a workspace laid out as
the recipe expects. Then a 2 x 2 grid: every point's score is the one its validation
evaluation computed (checked against the per-prompt rows of that evaluation), the chosen
point has the best recorded score, a rerun trains nothing, and a sweep killed with SIGKILL
between points is rerun without training again any point that had finished. Nothing here
asserts that any point is better than another (the tiny model learns nothing), nor a time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kill_points import KILL_SEED_ENV, kill_rng

from align.errors import ConfigError
from align.io import STAGE_COMPLETE_MARKER, read_records, stage_completion_info

REPO = Path(__file__).resolve().parents[1]
GRID = ["grid.beta=[1,5]", "grid.learning_rate=[1e-4,3e-2]"]
POINTS = ["beta-1_learning_rate-0.0001", "beta-1_learning_rate-0.03", "beta-5_learning_rate-0.0001",
          "beta-5_learning_rate-0.03"]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE"))}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               TRANSFORMERS_VERBOSITY="error", PYTHONUNBUFFERED="1")
    return env


@contextlib.contextmanager
def _inside(directory: Path):
    """The tiny recipes' paths are relative to the repository root: run from a workspace laid out like it."""
    import torch

    before, threads = Path.cwd(), torch.get_num_threads()
    os.chdir(directory)
    torch.set_num_threads(1)
    try:
        yield
    finally:
        os.chdir(before)
        torch.set_num_threads(threads)


def _align(workspace: Path, args: list[str]) -> tuple[int, str, str]:
    """`align ARGS` in this process, from the workspace; (exit status, stdout, stderr)."""
    from align.cli import main

    out, err = io.StringIO(), io.StringIO()
    with _inside(workspace), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in args])
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """recipes/ (linked), the tiny models, and the tiny pipeline's outputs up to the reference log-probs."""
    from align.testing.tiny import save_tiny_models

    root = tmp_path_factory.mktemp("sweep_ws")
    (root / "recipes").symlink_to(REPO / "recipes", target_is_directory=True)
    save_tiny_models(root / "runs" / "tiny_models")
    done = subprocess.run([sys.executable, "-m", "align", "pipeline", "recipes/tiny/pipeline.yaml",
                           "stop_after=logprobs"], cwd=root, env=_env(), capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return root


@pytest.fixture(scope="module")
def uninterrupted(workspace) -> tuple[Path, dict, str]:
    rc, out, err = _align(workspace, ["sweep", "recipes/tiny/sweep.yaml", *GRID, "output_dir=runs/sweep_once"])
    assert rc == 0, out[-2000:] + err[-3000:]
    sweep_dir = workspace / "runs" / "sweep_once"
    return sweep_dir, json.loads((sweep_dir / "sweep.json").read_text()), out


# --------------------------------------------------------------------------- the grid and the choice


def test_points_are_named_by_their_values_and_values_are_checked():
    from align.sweep import expand_grid

    points = expand_grid({"beta": [1, 5], "learning_rate": ["3e-5", 1e-4], "loss_type": ["dpo"]})
    assert [p.name for p in points] == ["beta-1_learning_rate-3e-05_loss_type-dpo",
                                        "beta-1_learning_rate-0.0001_loss_type-dpo",
                                        "beta-5_learning_rate-3e-05_loss_type-dpo",
                                        "beta-5_learning_rate-0.0001_loss_type-dpo"]
    assert points[0].settings == {"beta": 1.0, "learning_rate": 3e-05, "loss_type": "dpo"}  # YAML's "3e-5" a number
    assert points[0].label == "beta=1, learning_rate=3e-05, loss_type=dpo"
    for grid, words in [({"betta": [1]}, "grid.betta: not a setting of preference training (did you mean 'beta'?)"),
                        ({"output_dir": ["a", "b"]}, "grid.output_dir: every point starts from the same model"),
                        ({"logging_steps": [1, 2]}, "grid.logging_steps: this setting cannot change what"),
                        ({"beta": []}, "grid.beta: an empty list gives no point"),
                        ({"learning_rate": [1e-4, "1e-4"]}, "grid.learning_rate: the value 0.0001 is given twice"),
                        ({"beta": ["five"]}, "grid.beta"),
                        ({}, "grid: give at least one setting")]:
        with pytest.raises(ConfigError, match=None) as raised:
            expand_grid(grid)
        assert words in str(raised.value), (grid, str(raised.value))


def test_the_metric_must_be_one_the_validation_computes():
    from align.eval.evaluate import EvalSettings
    from align.sweep import SweepSettings

    with pytest.raises(ConfigError, match="metric: reward_greedy needs the greedy answer"):
        SweepSettings(grid={"beta": [1]}, metric="reward_greedy", validation=EvalSettings(greedy=False, n=2))
    with pytest.raises(ConfigError, match="metric: win_rate_sampled needs samples"):
        SweepSettings(grid={"beta": [1]}, metric="win_rate_sampled", validation=EvalSettings(n=0))
    with pytest.raises(ConfigError, match="is not one of"):
        SweepSettings(grid={"beta": [1]}, metric="accuracy")


def test_a_point_whose_settings_the_trainer_refuses_is_named_before_anything_trains():
    from align.sweep.grid import Point
    from align.sweep.run import point_config
    from align.trainers.preference_config import PreferenceConfig

    base = PreferenceConfig(output_dir="unused", use_cpu=True, report_to=[], beta=1.0)
    with pytest.raises(ConfigError, match=r"grid point beta=-1: beta=-1.0: must be > 0"):
        point_config(base, Point({"beta": -1.0}), Path("unused/points/x"))


def test_the_choice_is_the_best_score_and_the_first_in_grid_order_on_a_tie():
    from align.sweep.report import PointResult, choose

    def point(name: str, score: float | None) -> PointResult:
        return PointResult(name=name, settings={"beta": 1.0}, score=score, metrics={}, start={}, steps=1,
                           train_loss=None, model_dir=name, validation_dir=name)

    assert choose([point("a", 0.2), point("b", 0.5), point("c", 0.5), point("d", None)]).name == "b"
    assert choose([point("a", None)]) is None


# --------------------------------------------------------------------------- a 2 x 2 sweep


def _prompt_means(eval_rows: list[dict], policy: str) -> float:
    """The mean over prompts of each prompt's mean sample score: reward_sampled, recomputed."""
    means = []
    for row in eval_rows:
        scores = [s["score"] for s in row["policies"][policy]["samples"] if s["score"] is not None]
        if scores:
            means.append(sum(scores) / len(scores))
    return sum(means) / len(means)


@pytest.mark.slow
def test_every_point_is_trained_validated_and_recorded_and_the_best_is_chosen(workspace, uninterrupted):
    sweep_dir, report, printed = uninterrupted
    assert report["metric"] == "reward_sampled" and report["grid"] == {"beta": [1.0, 5.0],
                                                                       "learning_rate": [1e-4, 3e-2]}
    assert [p["name"] for p in report["points"]] == POINTS
    validation_ids = {r["id"] for r in read_records(REPO / "recipes/tiny/data/validation.jsonl")}
    for point in report["points"]:
        trained = stage_completion_info(sweep_dir / "points" / point["name"])
        assert trained["stage"] == "sweep-point" and trained["summary"]["steps"] == 4
        assert (sweep_dir / "points" / point["name"] / "model.safetensors").is_file()
        validated = stage_completion_info(sweep_dir / "validation" / point["name"])
        assert validated["stage"] == "sweep-validation"
        assert validated["manifest"]["settings"]["point"] == trained["output_id"]  # bound to those weights
        rows = read_records(sweep_dir / "validation" / point["name"] / "eval.jsonl")
        assert {r["id"] for r in rows} == validation_ids  # scored on the validation prompts, each once
        assert point["score"] == pytest.approx(_prompt_means(rows, point["name"]))
        assert point["score"] == point["metrics"]["reward_sampled"]["estimate"]
        assert point["start"]["reward_sampled"]["estimate"] == pytest.approx(_prompt_means(rows, "start"))
    scores = [p["score"] for p in report["points"]]
    best = max(scores)
    assert report["chosen"]["name"] == POINTS[scores.index(best)] and report["chosen"]["score"] == best
    assert report["chosen"]["model_dir"].endswith("points/" + report["chosen"]["name"])
    table = (sweep_dir / "sweep.md").read_text()
    assert table.count("\n| `beta-") == 4 and f"`{report['chosen']['name']}` (chosen)" in table
    assert (sweep_dir / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert stage_completion_info(sweep_dir)["summary"]["chosen"]["settings"] == report["chosen"]["settings"]
    assert printed.count("[align sweep] point ") == 4


@pytest.mark.slow
def test_a_rerun_trains_nothing_and_a_changed_shared_setting_is_refused(workspace, uninterrupted):
    sweep_dir, report, _ = uninterrupted
    markers = {p: (sweep_dir / "points" / p / STAGE_COMPLETE_MARKER).read_bytes() for p in POINTS}
    rc, out, err = _align(workspace, ["sweep", "recipes/tiny/sweep.yaml", *GRID, "output_dir=runs/sweep_once"])
    assert rc == 0, err[-3000:]
    assert out.count("is already complete; skipping") == 8  # each point's training and validation
    assert {p: (sweep_dir / "points" / p / STAGE_COMPLETE_MARKER).read_bytes() for p in POINTS} == markers
    assert json.loads((sweep_dir / "sweep.json").read_text())["points"] == [
        {**p, "trained_now": False, "seconds": q["seconds"]}
        for p, q in zip(report["points"], json.loads((sweep_dir / "sweep.json").read_text())["points"])]

    rc, out, err = _align(workspace, ["sweep", "recipes/tiny/sweep.yaml", *GRID, "output_dir=runs/sweep_once",
                                      "max_steps=5"])
    assert rc == 2 and "sweep-point.training.max_steps: 4 → 5" in err and "overwrite=true" in err
    assert {p: (sweep_dir / "points" / p / STAGE_COMPLETE_MARKER).read_bytes() for p in POINTS} == markers


@pytest.mark.slow
def test_a_directory_holding_other_files_is_refused(workspace, tmp_path):
    (tmp_path / "notes.md").write_text("keep me")
    rc, _, err = _align(workspace, ["sweep", "recipes/tiny/sweep.yaml", *GRID, f"output_dir={tmp_path}"])
    assert rc == 2 and "holds files that no sweep wrote (notes.md)" in err
    rc, _, err = _align(workspace, ["sweep", "recipes/tiny/sweep.yaml", *GRID, "output_dir=runs/tiny/logprobs"])
    assert rc == 2 and "holds the logprobs stage's output" in err
    assert (tmp_path / "notes.md").read_text() == "keep me"


@pytest.mark.slow
def test_a_killed_sweep_retrains_nothing_that_had_finished(workspace, uninterrupted, tmp_path):
    """SIGKILL once a seeded number of points is validated, then the same command again."""
    rng, seed = kill_rng(31, "align sweep")
    after = rng.randint(1, len(POINTS) - 1)
    replay = f"(kill seed {seed}, aimed after {after} points; replay: {KILL_SEED_ENV}={seed})"
    out_name = "runs/sweep_killed"
    command = [sys.executable, "-m", "align", "sweep", "recipes/tiny/sweep.yaml", *GRID, f"output_dir={out_name}"]
    sweep_dir = workspace / out_name
    finished = lambda: [p for p in POINTS if (sweep_dir / "validation" / p / STAGE_COMPLETE_MARKER).exists()]
    with (tmp_path / "first.log").open("w") as log:
        first = subprocess.Popen(command, cwd=workspace, env=_env(), stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        try:
            deadline = time.monotonic() + 300
            while first.poll() is None and len(finished()) < after and time.monotonic() < deadline:
                time.sleep(0.005)
            os.killpg(first.pid, signal.SIGKILL)
        finally:
            first.wait(timeout=60)
    assert first.returncode == -signal.SIGKILL, f"{replay}\n{(tmp_path / 'first.log').read_text()[-3000:]}"
    done = finished()
    assert after <= len(done) < len(POINTS), f"the kill should land mid-sweep, after {done} {replay}"
    assert not (sweep_dir / "sweep.json").exists()
    kept = {p: {part: (sweep_dir / part / p / STAGE_COMPLETE_MARKER).read_bytes() for part in ("points", "validation")}
            | {"weights": (sweep_dir / "points" / p / "model.safetensors").read_bytes()} for p in done}

    rc, out, err = _align(workspace, ["sweep", "recipes/tiny/sweep.yaml", *GRID, f"output_dir={out_name}"])
    assert rc == 0, f"{replay}\n{out[-2000:]}{err[-3000:]}"
    for p in done:
        assert f"[align sweep-point] {out_name}/points/{p} is already complete; skipping" in out, replay
        now = {part: (sweep_dir / part / p / STAGE_COMPLETE_MARKER).read_bytes() for part in ("points", "validation")}
        assert now | {"weights": (sweep_dir / "points" / p / "model.safetensors").read_bytes()} == kept[p], replay
    report = json.loads((sweep_dir / "sweep.json").read_text())
    assert [p["trained_now"] for p in report["points"]] == [p not in done for p in POINTS], replay
    # the same figures as the uninterrupted sweep: the points trained again after the kill start over
    once = uninterrupted[1]
    assert [p["metrics"] for p in report["points"]] == [p["metrics"] for p in once["points"]], replay
    assert report["chosen"]["name"] == once["chosen"]["name"]


# --------------------------------------------------------------------------- the Python API


@pytest.mark.slow
def test_run_sweep_from_a_model_in_memory(workspace, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import align
    from align.eval.evaluate import EvalSettings
    from align.logprobs import load_ref_logprobs
    from align.manifests import StaleOutputError
    from align.trainers.preference_config import PreferenceConfig
    from rewards.verifiable import VerifiableReward

    sft = workspace / "runs" / "tiny" / "sft"
    model, tokenizer = AutoModelForCausalLM.from_pretrained(sft), AutoTokenizer.from_pretrained(sft)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rows = load_ref_logprobs(workspace / "runs" / "tiny" / "logprobs",
                             read_records(workspace / "runs" / "tiny" / "pairs" / "pairs.jsonl"))
    validation = read_records(REPO / "recipes/tiny/data/validation.jsonl")
    config = PreferenceConfig(output_dir=str(tmp_path / "sweep"), loss_type="dpo", beta=1.0, num_ref_rewards=4,
                              max_length=256, max_steps=2, per_device_train_batch_size=4, optimizer="adamw",
                              learning_rate=1e-4, use_cpu=True, bf16=False, report_to=[], save_strategy="no",
                              disable_tqdm=True, chat_date="2026-01-01")
    settings = align.SweepSettings(grid={"learning_rate": [1e-4, 3e-2]}, metric="reward_greedy",
                                   validation=EvalSettings(n=2, kl=False, plots=False, max_tokens=8, resamples=200))
    with _inside(workspace):
        result = align.run_sweep(config, rows, validation, VerifiableReward(), settings, model=model,
                                 tokenizer=tokenizer)
    assert [p.name for p in result.points] == ["learning_rate-0.0001", "learning_rate-0.03"]
    assert all(p.trained_now and p.steps == 2 for p in result.points)
    assert result.chosen.score == max(p.score for p in result.points)
    assert all(torch_equal(model.state_dict()[k], v) for k, v in before.items())  # the start is left as it was
    recorded = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert [p["score"] for p in recorded["points"]] == [p.score for p in result.points]

    grown = dataclasses.replace(settings, grid={"learning_rate": [1e-4, 3e-2, 1e-3]})
    with _inside(workspace):
        again = align.run_sweep(config, rows, validation, VerifiableReward(), grown, model=model, tokenizer=tokenizer)
    assert [(p.name, p.trained_now) for p in again.points] == [
        ("learning_rate-0.0001", False), ("learning_rate-0.03", False), ("learning_rate-0.001", True)]
    assert [p.metrics for p in again.points[:2]] == [p.metrics for p in result.points]
    with _inside(workspace), pytest.raises(StaleOutputError, match="made from other settings or inputs"):
        align.run_sweep(config, rows[:-1], validation, VerifiableReward(), settings, model=model, tokenizer=tokenizer)


def torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a, b))


class _ByLength:
    """A test measure: the completion's character count times ``sign`` (a longer or a shorter answer is better)."""

    reference_field = None

    def __init__(self, sign: float):
        self.sign, self.name = sign, f"length x {sign:g}"

    def score(self, conversations, completions, *, references=None):
        from rewards.base import Score

        return [Score(self.sign * len(text), None, {}) for text in completions]

    def score_groups(self, conversations, groups, *, references=None):
        return [self.score([c] * len(g), g) for c, g in zip(conversations, groups)]

    def fingerprint(self):
        return {"provider": "test-length", "sign": self.sign}


def test_a_sweep_chooses_on_the_goal_and_names_what_the_reward_would_have_chosen(workspace, tmp_path):
    """The validation reward pays for length, the goal for brevity: every point's goal figures equal
    the same answers (its eval.jsonl) scored by hand, the choice is the goal's best, the reward's
    own best is named beside it, and a goal the sweep does not have is refused."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import align
    from align.eval.evaluate import EvalSettings
    from align.logprobs import load_ref_logprobs
    from align.trainers.preference_config import PreferenceConfig

    sft = workspace / "runs" / "tiny" / "sft"
    model, tokenizer = AutoModelForCausalLM.from_pretrained(sft), AutoTokenizer.from_pretrained(sft)
    rows = load_ref_logprobs(workspace / "runs" / "tiny" / "logprobs",
                             read_records(workspace / "runs" / "tiny" / "pairs" / "pairs.jsonl"))
    validation = read_records(REPO / "recipes/tiny/data/validation.jsonl")
    config = PreferenceConfig(output_dir=str(tmp_path / "sweep"), loss_type="dpo", beta=1.0, num_ref_rewards=4,
                              max_length=256, max_steps=2, per_device_train_batch_size=4, optimizer="adamw",
                              use_cpu=True, bf16=False, report_to=[], save_strategy="no", disable_tqdm=True,
                              chat_date="2026-01-01")
    settings = align.SweepSettings(grid={"learning_rate": [1e-4, 3e-2, 1e-1]}, metric="reward_sampled",
                                   select_on="goal", validation=EvalSettings(n=2, kl=False, plots=False,
                                                                            max_tokens=8, resamples=200))
    with pytest.raises(ConfigError, match=r"select_on: 'goal' is not a measure of this sweep \(measures: none"):
        align.run_sweep(config, rows, validation, _ByLength(1.0), settings, model=model, tokenizer=tokenizer)
    with _inside(workspace):
        result = align.run_sweep(config, rows, validation, _ByLength(1.0), settings, model=model,
                                 tokenizer=tokenizer, measures={"goal": _ByLength(-1.0)})
    for point in result.points:
        evaluated = read_records(Path(point.validation_dir) / "eval.jsonl")
        by_hand = [sum(-len(s["text"]) for s in r["policies"][point.name]["samples"]) / 2 for r in evaluated]
        goal = point.measures["goal"]["metrics"]["reward_sampled"]["estimate"]
        assert goal == pytest.approx(sum(by_hand) / len(by_hand), abs=1e-9)
        assert point.score == goal and point.reward_score == pytest.approx(-goal, abs=1e-9)
    assert result.chosen.score == max(p.score for p in result.points)
    assert result.reward_choice.reward_score == max(p.reward_score for p in result.points)
    recorded = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert recorded["select_on"] == "goal" and recorded["reward_would_choose"]["name"] == result.reward_choice.name
    table = (tmp_path / "sweep" / "sweep.md").read_text()
    assert "chosen by goal: reward_sampled" in table
    if result.reward_choice.name != result.chosen.name:
        assert f"`{result.reward_choice.name}` (the reward's choice)" in table
        assert f"The validation reward alone would have chosen {result.reward_choice.label}" in table
    else:
        assert "The validation reward alone would have chosen the same point." in table


def test_the_sweep_stage_chooses_on_its_goal_section(workspace):
    rc, out, err = _align(workspace, ["sweep", "recipes/tiny/sweep.yaml", "grid.beta=[1]", "grid.learning_rate=[1e-4]",
                                      "output_dir=runs/sweep_goal", "select_on=goal"])
    assert rc != 0 and "select_on: goal needs a goal section (e.g. goal.provider=verifiable)" in err
    rc, out, err = _align(workspace, ["sweep", "recipes/tiny/sweep.yaml", "grid.beta=[1]", "grid.learning_rate=[1e-4]",
                                      "output_dir=runs/sweep_goal", "select_on=judge"])
    assert rc != 0 and "select_on: 'judge': choose 'reward' or 'goal'" in err
    rc, out, err = _align(workspace, ["sweep", "recipes/tiny/sweep.yaml", "grid.beta=[1]", "grid.learning_rate=[1e-4]",
                                      "output_dir=runs/sweep_goal", "select_on=goal", "goal.provider=verifiable",
                                      "goal.answer_field=answer"])
    assert rc == 0, out[-2000:] + err[-3000:]
    written = json.loads((workspace / "runs" / "sweep_goal" / "sweep.json").read_text())
    assert written["select_on"] == "goal" and written["reward_would_choose"]["name"] == "beta-1_learning_rate-0.0001"
    (point,) = written["points"]
    # the goal is the same answer check as the reward here: the same figures
    assert point["measures"]["goal"]["metrics"]["reward_sampled"] == point["metrics"]["reward_sampled"]
    assert "(by the goal's reward_sampled on 16 validation prompts)" in out
