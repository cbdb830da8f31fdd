"""What a sweep records and what it is bound to, with training and evaluation stood in.

`run_sweep` runs for real (manifests, completion markers, sweep.json, sweep.md, sweep.png);
the trainer and the evaluation are recorders (as in tests/test_sweep_bookkeeping.py) that
also keep what they were handed: the policy, the tokenizer, the callbacks, the provider,
the validation settings. Read back here: the settings a sweep validates with by default and
those it refuses, what each point's and each validation's completion marker holds, which
change of input makes a rerun refuse (or, with overwrite, redo) a point or its validation,
what trains from a start model in memory, the words of sweep.md and of the errors, and what
the picture shows.
"""

from __future__ import annotations

import copy
import itertools
import json
import struct
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import matplotlib
import pytest

from align.errors import ConfigError, InputError, RecordError
from align.eval.evaluate import EvalSettings
from align.sweep import SweepSettings
from align.sweep.grid import Point, check_grid, coerce_value
from align.sweep.inputs import check_sweep_dir, validation_overlap
from align.sweep.plots import plot_sweeps
from align.sweep.points import Trained, train_point, validate_point
from align.sweep.report import PointResult, SweepResult, markdown
from align.sweep.run import TRAINING_ONLY_KEYS, prepared_once, run_sweep
from align.trainers.target_tracking import TargetWatch
from rewards.verifiable import VerifiableReward

PROMPTS = [{"id": f"v{i}", "messages": [{"role": "user", "content": f"Sort {i}"}], "answer": str(i)} for i in range(3)]
ROWS = [{"id": "r0", "messages": [{"role": "user", "content": "Sort 7"}], "chosen": "7", "rejected": "2"},
        {"id": "r1", "messages": [{"role": "user", "content": "Sort 9"}], "chosen": "9", "rejected": "8"}]
MEANS = "mean reward of the n samples per validation prompt (accuracy, with a verifiable reward)"


def interval(estimate: float, spread: float = 0.05) -> dict[str, float]:
    return {"estimate": estimate, "low": estimate - spread, "high": estimate + spread, "n": 3, "confidence": 0.95}


class Recorder:
    """The trainer, the data preparation and the evaluation, each keeping what it was handed.

    ``history``: the trainer's log history (default: two logged losses, the last 0.25 x beta).
    ``nudge``: the trainer adds 1 to the weights of the policy it is given (a torch module).
    """

    def __init__(self):
        self.history: list[dict[str, Any]] | None = None
        self.nudge = False
        self.trained: list[dict[str, Any]] = []
        self.prepared: list[tuple[Any, Any, Any]] = []
        self.evaluated: list[dict[str, Any]] = []
        self.samplers: list[tuple[str, Any, Any, dict]] = []  # TransformersSampler(model, tokenizer, **kw)

    def prepare(self, rows, tokenizer, config, model, counted):
        self.prepared.append((tokenizer, config, model))
        return list(rows)

    def train(self, config, data, policy, *, tokenizer, callbacks):
        import torch

        out = Path(config.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "model.safetensors").write_bytes(f"{config.beta}".encode())
        seen = None
        if isinstance(policy, torch.nn.Module):
            seen = {"training": policy.training, "weights": [p.detach().clone() for p in policy.parameters()]}
            if self.nudge:
                with torch.no_grad():
                    for p in policy.parameters():
                        p.add_(1.0)
        self.trained.append({"dir": out.name, "policy": policy, "seen": seen, "tokenizer": tokenizer,
                             "callbacks": callbacks})
        history = self.history if self.history is not None else [
            {"loss": 0.5, "step": 1}, {"loss": 0.25 * config.beta, "step": 2}, {"train_runtime": 1.0}]
        model = policy if policy is not None else SimpleNamespace(name=f"trained {out.name}", eval=lambda: None)
        return SimpleNamespace(state=SimpleNamespace(log_history=history, global_step=2), model=model,
                               data_summary={"pairs": len(data)}, target_watch=TargetWatch(None))

    def evaluate(self, prompts, policies, provider, output_dir, *, baseline, settings, source):
        name = next(p.name for p in policies if p.name != baseline)
        lazy = [callable(p.sampler) for p in policies]
        built = {p.name: p.sampler() if callable(p.sampler) else p.sampler for p in policies}
        self.evaluated.append({"name": name, "provider": provider, "settings": settings, "source": source,
                               "lazy": lazy, "built": built, "prompts": len(prompts)})
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        (Path(output_dir) / "report.json").write_text("{}")
        score = {"beta-1": 0.9, "beta-4": 0.5, "beta-16": 0.4}.get(name, 0.6)
        return {"prompts": len(prompts), "overall": {
            "policies": {baseline: {"reward_sampled": interval(0.3), "reward_greedy": interval(0.2),
                                    "length": interval(7.0, 1.0)},
                         name: {"reward_sampled": interval(score), "reward_greedy": interval(0.5),
                                "kl": interval(0.01, 0.0), "length": interval(6.0, 1.0)}},
            "comparisons": {name: {"win_rate_reward_sampled": {"rate": interval(0.7)},
                                   "win_rate_reward_greedy": {"rate": interval(0.6)},
                                   "reward_difference_sampled": interval(score - 0.3),
                                   "reward_difference_greedy": interval(0.3)}}}}

    def sampler(self, model, tokenizer, **kwargs):
        self.samplers.append((kwargs["model_name"], model, tokenizer, kwargs))
        return SimpleNamespace(name=kwargs["model_name"])


@pytest.fixture()
def rec(monkeypatch):
    from align.eval import evaluate as evaluate_module
    from align.sampling import hf
    from align.trainers import preference_data, preference_trainer

    recorder = Recorder()
    monkeypatch.setattr(preference_data, "prepare_dataset", recorder.prepare)
    monkeypatch.setattr(preference_trainer, "train", recorder.train)
    monkeypatch.setattr(evaluate_module, "evaluate", recorder.evaluate)
    monkeypatch.setattr(hf, "TransformersSampler", recorder.sampler)
    return recorder


def base_config(out: Path, **changes):
    from align.trainers.preference_config import PreferenceConfig

    return PreferenceConfig(output_dir=str(out), model_name_or_path="org/start", use_cpu=True, report_to=[],
                            beta=1.0, **changes)


def validation(**changes) -> EvalSettings:
    return EvalSettings(**{"n": 2, "kl": False, "plots": False, "resamples": 200, **changes})


def sweep(tmp_path: Path, tokenizer, *, grid=None, rows=ROWS, prompts=PROMPTS, provider=None, settings=None,
          sampler="factory", **kwargs):
    settings = settings or SweepSettings(grid=grid or {"beta": [1, 4]}, validation=validation())
    factory = (lambda name, model: ("SAMPLER", name, model)) if sampler == "factory" else sampler
    return run_sweep(base_config(tmp_path / "sweep", **kwargs.pop("config", {})), rows, prompts,
                     provider or VerifiableReward(), settings, tokenizer=tokenizer, sampler=factory, **kwargs)


def marker(path: Path) -> dict[str, Any]:
    return json.loads((path / "_COMPLETE.json").read_text())


def refused(stage: str, path: Path) -> str:
    """The start of the error for a rerun whose inputs differ from what ``path`` was made from."""
    import re

    return f"^{stage}: {re.escape(str(path))} holds an output made from other settings or inputs: "


# --------------------------------------------------------------------------- the settings


def test_validation_by_default_is_four_samples_and_a_greedy_answer_without_kl_or_plots():
    settings = SweepSettings(grid={"beta": [1]})
    assert settings.metric == "reward_sampled"
    assert (settings.validation.n, settings.validation.greedy) == (4, True)
    assert settings.validation.kl is False and settings.validation.plots is False


def test_the_validation_settings_a_sweep_refuses():
    SweepSettings(grid={"beta": [1]}, validation=EvalSettings(n=1))  # one sample is enough to choose by
    with pytest.raises(ConfigError) as info:
        SweepSettings(grid={"beta": [1]}, validation=EvalSettings(n=0))
    assert str(info.value) == "metric: reward_sampled needs samples: set validation.n to 1 or more"
    SweepSettings(grid={"beta": [1]}, metric="reward_greedy", validation=EvalSettings(n=0))
    sharded = ("validation.num_shards, validation.shard_index: a sweep evaluates each point in one process, after "
               "training it (leave them at 1 and 0)")
    for shards in ({"num_shards": 2}, {"shard_index": 1}, {"num_shards": 4, "shard_index": 3}):
        with pytest.raises(ConfigError) as info:
            SweepSettings(grid={"beta": [1]}, validation=EvalSettings(**shards))
        assert str(info.value) == sharded


def test_the_sweep_stages_settings_are_checked_as_training_settings_too(tmp_path):
    from align.stages.sweep import Config

    with pytest.raises(ConfigError) as info:
        Config(output_dir=str(tmp_path / "s"), model_name_or_path="org/start", use_cpu=True, report_to=[],
               grid={"beta": [1]}, beta=-1.0)
    assert str(info.value).startswith("beta=-1.0: must be > 0")


def test_a_single_value_is_a_grid_of_one_point_and_a_misspelt_key_is_named():
    assert check_grid({"beta": 5, "loss_type": "dpo"}) == {"beta": [5.0], "loss_type": ["dpo"]}
    assert [p.name for p in SweepSettings(grid={"loss_type": "dpo", "beta": [1, 2]}).points()] == \
        ["loss_type-dpo_beta-1", "loss_type-dpo_beta-2"]
    with pytest.raises(ConfigError) as info:
        coerce_value("betta", 1)
    assert str(info.value) == ("grid.betta: not a setting of preference training (did you mean 'beta'?); "
                               "`align train --help` lists them")
    with pytest.raises(ConfigError) as info:
        coerce_value("qqqqqqqq", 1)
    assert str(info.value) == "grid.qqqqqqqq: not a setting of preference training; `align train --help` lists them"


def test_pairs_are_tokenized_once_even_for_a_grid_over_every_training_only_setting(monkeypatch):
    from align.trainers import preference_data

    monkeypatch.setattr(preference_data, "prepare_dataset", lambda rows, tok, config, model, counted: "PREPARED")
    grid = {key: [1] for key in TRAINING_ONLY_KEYS}
    assert prepared_once("CONFIG", ROWS, "TOK", None, grid) == ("PREPARED", {})


# --------------------------------------------------------------------------- the inputs


def test_a_validation_prompt_is_a_training_prompt_by_its_messages_and_tools():
    swapped = [{"messages": [{"content": "Sort 7", "role": "user"}]}]  # the same turn, its keys in another order
    assert validation_overlap(ROWS, swapped) == 1
    with_tools = [{**ROWS[0], "tools": [{"name": "sort"}]}]
    assert validation_overlap(with_tools, [{"messages": ROWS[0]["messages"], "tools": [{"name": "sort"}]}]) == 1
    assert validation_overlap(with_tools, [{"messages": ROWS[0]["messages"], "tools": [{"name": "add"}]}]) == 0
    assert validation_overlap(with_tools, [{"messages": ROWS[0]["messages"]}]) == 0


@pytest.mark.parametrize("count,shown", [
    (5, "f0.txt, f1.txt, f2.txt, f3.txt, f4.txt"),
    (6, "f0.txt, f1.txt, f2.txt, f3.txt, f4.txt and 1 more"),
    (1, "f0.txt"),
])
def test_the_files_that_keep_a_sweep_out_of_a_directory_are_named(tmp_path, count, shown):
    for i in range(count):
        (tmp_path / f"f{i}.txt").write_text("x")
    with pytest.raises(InputError) as info:
        check_sweep_dir(tmp_path)
    assert str(info.value) == (f"output_dir={str(tmp_path)!r} holds files that no sweep wrote ({shown}); choose a new "
                               "or empty output_dir, or an earlier sweep's")


def test_validation_prompts_are_checked_by_name_and_for_the_providers_reference(rec, tmp_path, tiny_tokenizer):
    without = [dict(PROMPTS[0]), {k: v for k, v in PROMPTS[1].items() if k != "answer"}]
    with pytest.raises(RecordError) as info:
        sweep(tmp_path, tiny_tokenizer, prompts=without)
    assert str(info.value) == ("record 'v1': field 'answer': missing: the verifiable reward compares completions "
                               "with it (validation prompts, row 1)")
    with pytest.raises(RecordError) as info:
        sweep(tmp_path, tiny_tokenizer, prompts=[PROMPTS[0], PROMPTS[0]])
    assert str(info.value) == "record 'v0': field 'id': appears twice (validation prompts, rows 0 and 1)"
    assert rec.trained == []


# --------------------------------------------------------------------------- what is written


def test_what_each_point_and_each_validation_record(rec, tmp_path, tiny_tokenizer, capsys, drawn):
    rec.history = [{"loss": 0.5, "step": 1}, {"loss": 0.4, "step": 2}, {"loss": 0.125, "step": 3},
                   {"train_runtime": 1.0}]
    result = sweep(tmp_path, tiny_tokenizer)
    out = tmp_path / "sweep"
    assert result.output_dir == str(out)
    point = marker(out / "points" / "beta-1")
    assert point["stage"] == "sweep-point" and point["config"]["output_dir"] == str(out / "points" / "beta-1")
    assert point["summary"] == {"settings": {"beta": 1.0}, "steps": 2, "train_loss": 0.125,
                                "log_history": rec.history, "target_tracking": None, "pairs": 2}
    assert [(p.steps, p.train_loss) for p in result.points] == [(2, 0.125), (2, 0.125)]  # the last loss logged
    checked = marker(out / "validation" / "beta-4")
    assert checked["stage"] == "sweep-validation"
    assert checked["config"]["output_dir"] == str(out / "validation" / "beta-4")
    assert checked["config"]["settings"] == {
        "greedy": True, "n": 2, "temperature": 1.0, "top_p": 1.0, "max_tokens": 512, "seed": 0, "judge_pairwise": True,
        "pairwise_samples": 1, "kl": False, "kl_reference": None, "kl_sharding": "replicate", "kl_only": False,
        "tie_margin": 0.0, "resamples": 200, "confidence": 0.95}  # no batch sizes, shards or plots
    assert set(checked["summary"]) == {"settings", "metrics", "start", "prompts"}
    assert checked["summary"]["settings"] == {"beta": 4.0} and checked["summary"]["prompts"] == 3
    assert checked["summary"]["metrics"]["reward_sampled"] == interval(0.5)
    assert checked["summary"]["start"] == {"reward_sampled": interval(0.3), "reward_greedy": interval(0.2),
                                           "length": interval(7.0, 1.0)}
    # the evaluation ran with the sweep's validation settings, its provider, on "validation prompts"
    first = rec.evaluated[0]
    assert first["settings"] == validation() and first["source"] == "validation prompts"
    assert isinstance(first["provider"], VerifiableReward)
    written = json.loads((out / "sweep.json").read_text())
    assert written["metric_means"] == MEANS
    printed = capsys.readouterr().out
    assert "[align sweep-point]" not in printed and "[align sweep-validation]" not in printed  # the sweep's own lines
    (fig,) = drawn
    assert fig._suptitle.get_text() == "validation reward_sampled over the grid"
    assert fig.axes[0].get_title() == "chosen beta=1"


def test_a_point_that_logged_no_loss_has_none(rec, tmp_path, tiny_tokenizer):
    rec.history = [{"train_runtime": 1.0}]
    result = sweep(tmp_path, tiny_tokenizer, grid={"beta": [1]})
    assert result.points[0].train_loss is None
    assert marker(tmp_path / "sweep" / "points" / "beta-1")["summary"]["train_loss"] is None
    assert "| `beta-1` (chosen) | 1 | 90.0 [85.0, 95.0] |" in (tmp_path / "sweep" / "sweep.md").read_text()


def test_fewer_steps_than_logging_steps_report_the_runs_mean_loss(rec, tmp_path, tiny_tokenizer):
    rec.history = [{"train_runtime": 1.0, "train_loss": 0.375}]  # what the trainer logs when training ends
    result = sweep(tmp_path, tiny_tokenizer, grid={"beta": [1]})
    assert result.points[0].train_loss == 0.375
    assert marker(tmp_path / "sweep" / "points" / "beta-1")["summary"]["train_loss"] == 0.375


def test_each_points_time_is_written_in_tenths_of_a_second(rec, tmp_path, tiny_tokenizer, monkeypatch):
    from align.sweep import run as run_module

    clock = itertools.count(1000.0, 1.26)  # each point: 1.26 s from its start to its end
    monkeypatch.setattr(run_module, "time", SimpleNamespace(time=lambda: next(clock)))
    result = sweep(tmp_path, tiny_tokenizer)
    assert [p.seconds for p in result.points] == [1.3, 1.3]
    written = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert [p["seconds"] for p in written["points"]] == [1.3, 1.3]


def test_the_sweep_table_ends_with_what_was_chosen_word_for_word():
    grid = {"beta": [1.0, 4.0, 16.0], "learning_rate": [1e-5, 1e-4, 1e-3]}

    def point(beta, lr, score):
        settings = {"beta": beta, "learning_rate": lr}
        metrics = {} if score is None else {"reward_sampled": interval(score)}
        name = Point(settings).name
        return PointResult(name, settings, score, metrics, {}, 10, None, f"/s/points/{name}", f"/s/validation/{name}")

    points = [point(1.0, 1e-5, 0.2), point(4.0, 1e-4, 0.3), point(16.0, 1e-3, 0.9)]
    both = SweepResult(grid=grid, metric="reward_sampled", points=points, chosen=points[2], validation_prompts=8)
    assert markdown(both).endswith(
        "\n\nChosen: beta=16, learning_rate=0.001 (/s/points/beta-16_learning_rate-0.001).\n"
        "The chosen beta, learning_rate is at the edge of the grid: the best value may lie beyond it.\n")
    inside = SweepResult(grid=grid, metric="reward_sampled", points=points, chosen=points[1], validation_prompts=8)
    assert markdown(inside).endswith("\n\nChosen: beta=4, learning_rate=0.0001 (/s/points/beta-4_learning_rate-0.0001).\n")
    none = SweepResult(grid=grid, metric="reward_sampled", points=[point(1.0, 1e-5, None)], chosen=None,
                       validation_prompts=8)
    assert markdown(none).endswith("| 10 | - |  |\n\nNo point could be scored.\n")


# --------------------------------------------------------------------------- what training and validation get


def test_each_point_trains_a_copy_of_the_start_model_in_memory(rec, tmp_path, tiny_tokenizer):
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).eval()
    before = [p.detach().clone() for p in model.parameters()]
    rec.nudge = True  # each trainer changes the weights it is given
    sweep(tmp_path, tiny_tokenizer, model=model, callbacks=lambda point: [f"callback of {point.name}"])
    assert [t["dir"] for t in rec.trained] == ["beta-1", "beta-4"]
    for trained in rec.trained:
        assert isinstance(trained["policy"], torch.nn.Linear) and trained["policy"] is not model
        assert trained["seen"]["training"] is True  # in training mode
        assert all(torch.equal(a, b) for a, b in zip(trained["seen"]["weights"], before))  # from the start's weights
        assert trained["tokenizer"] is tiny_tokenizer
    assert [t["callbacks"] for t in rec.trained] == [["callback of beta-1"], ["callback of beta-4"]]
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before)) and not model.training
    # the pairs were prepared once, with the sweep's tokenizer and settings and the start model
    assert len(rec.prepared) == 1
    tokenizer, config, start = rec.prepared[0]
    assert tokenizer is tiny_tokenizer and start is model and config.output_dir == str(tmp_path / "sweep")
    # validation: the start as given, each point as saved (a sampler factory loads it), each built when its turn comes
    assert [e["built"] for e in rec.evaluated] == [
        {"start": ("SAMPLER", "start", model), "beta-1": ("SAMPLER", "beta-1", tmp_path / "sweep/points/beta-1")},
        {"start": ("SAMPLER", "start", model), "beta-4": ("SAMPLER", "beta-4", tmp_path / "sweep/points/beta-4")}]
    assert [e["lazy"] for e in rec.evaluated] == [[True, True]] * 2


def test_without_a_sampler_validation_runs_on_the_trained_models_in_memory(rec, tmp_path, tiny_tokenizer):
    sweep(tmp_path, tiny_tokenizer, grid={"beta": [1]}, sampler=None, config={"chat_date": "2025-01-02"})
    (evaluated,) = rec.evaluated
    assert evaluated["lazy"] == [False, False]  # both built before the evaluation starts
    assert [(name, model if isinstance(model, str) else model.name, tok) for name, model, tok, _ in rec.samplers] \
        == [("start", "org/start", tiny_tokenizer), ("beta-1", "trained beta-1", tiny_tokenizer)]
    kwargs = rec.samplers[1][3]
    assert kwargs == {"chat_format": base_config(tmp_path).chat_format, "chat_date": "2025-01-02",
                      "enable_thinking": base_config(tmp_path).enable_thinking, "batch_size": 256,
                      "model_name": "beta-1"}


def test_the_tokenizer_is_the_start_models_when_none_is_given(rec, tmp_path, tiny_tokenizer, monkeypatch):
    import transformers

    asked = []
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        lambda name, *a, **kw: asked.append(name) or tiny_tokenizer)
    sweep(tmp_path, None, grid={"beta": [1]})
    assert asked == ["org/start"] and rec.trained[0]["tokenizer"] is tiny_tokenizer


def test_points_and_validations_called_alone_keep_what_they_made(rec, tmp_path, tiny_tokenizer):
    point = Point({"beta": 1.0})
    fingerprints = {"start": {"kind": "name", "fingerprint": "a"}, "tokenizer": "t", "rows": "r",
                    "validation": "v", "provider": "p"}
    config = base_config(tmp_path / "points" / "beta-1")
    trained = train_point(point, config, lambda: (ROWS, {}), fingerprints=fingerprints)
    with pytest.raises(InputError, match=refused("sweep-point", tmp_path / "points" / "beta-1")):
        train_point(point, base_config(tmp_path / "points" / "beta-1", max_steps=3), lambda: (ROWS, {}),
                    fingerprints=fingerprints)
    assert len(rec.trained) == 1
    found = Trained(summary=trained.summary, output_id=trained.output_id)  # found finished, not trained now
    args = (point, found, tmp_path / "validation" / "beta-1", PROMPTS, VerifiableReward(), validation())
    kwargs = {"policy": "P", "start_policy": "S", "sampler": lambda name, model: (name, model)}
    validate_point(*args, fingerprints=fingerprints, **kwargs)
    assert rec.evaluated[0]["lazy"] == [True, True] and rec.evaluated[0]["built"] == {"start": ("start", "S"),
                                                                                      "beta-1": ("beta-1", "P")}
    other = {**fingerprints, "start": {"kind": "name", "fingerprint": "b"}}  # another start policy beside it
    with pytest.raises(InputError, match=refused("sweep-validation", tmp_path / "validation" / "beta-1")):
        validate_point(*args, fingerprints=other, **kwargs)
    assert len(rec.evaluated) == 1


# --------------------------------------------------------------------------- what a rerun is bound to


def test_a_rerun_with_other_pairs_or_another_tokenizer_is_refused_at_the_first_point(rec, tmp_path, tiny_tokenizer):
    sweep(tmp_path, tiny_tokenizer, grid={"beta": [1]})
    first = tmp_path / "sweep" / "points" / "beta-1"
    with pytest.raises(InputError, match=refused("sweep-point", first)):
        sweep(tmp_path, tiny_tokenizer, grid={"beta": [1]}, rows=ROWS + [{**ROWS[0], "id": "r2", "chosen": "7!"}])
    other = copy.deepcopy(tiny_tokenizer)
    other.add_tokens(["<extra-token>"])
    with pytest.raises(InputError, match=refused("sweep-point", first)):
        sweep(tmp_path, other, grid={"beta": [1]})
    assert len(rec.trained) == 1


def test_a_rerun_with_another_start_model_retrains_every_point(rec, tmp_path, tiny_tokenizer):
    import torch

    torch.manual_seed(0)
    sweep(tmp_path, tiny_tokenizer, grid={"beta": [1]}, model=torch.nn.Linear(3, 2))
    torch.manual_seed(1)
    other = torch.nn.Linear(3, 2)
    with pytest.raises(InputError, match=refused("sweep-point", tmp_path / "sweep" / "points" / "beta-1")):
        sweep(tmp_path, tiny_tokenizer, grid={"beta": [1]}, model=other)
    sweep(tmp_path, tiny_tokenizer, grid={"beta": [1]}, model=other, overwrite=True)
    assert [t["dir"] for t in rec.trained] == ["beta-1", "beta-1"]
    assert [e["name"] for e in rec.evaluated] == ["beta-1", "beta-1"]


@pytest.mark.parametrize("change", ["prompts", "provider", "settings"])
def test_a_rerun_with_other_validation_inputs_revalidates_without_retraining(rec, tmp_path, tiny_tokenizer, change):
    sweep(tmp_path, tiny_tokenizer, grid={"beta": [1]})
    other = {"prompts": {"prompts": PROMPTS[:2]}, "provider": {"provider_fingerprint": "another provider"},
             "settings": {"settings": SweepSettings(grid={"beta": [1]}, validation=validation(n=3))}}[change]
    with pytest.raises(InputError, match=refused("sweep-validation", tmp_path / "sweep" / "validation" / "beta-1")):
        sweep(tmp_path, tiny_tokenizer, grid={"beta": [1]}, **other)
    sweep(tmp_path, tiny_tokenizer, grid={"beta": [1]}, overwrite=True, **other)
    assert [t["dir"] for t in rec.trained] == ["beta-1"]  # the point is kept
    assert [e["name"] for e in rec.evaluated] == ["beta-1", "beta-1"]


def test_a_rerun_that_changes_only_how_validation_is_batched_redoes_nothing(rec, tmp_path, tiny_tokenizer):
    sweep(tmp_path, tiny_tokenizer, grid={"beta": [1]})
    sweep(tmp_path, tiny_tokenizer, settings=SweepSettings(grid={"beta": [1]}, validation=validation(
        batch_size=3, kl_batch_size=5, plots=True)))
    assert len(rec.trained) == 1 and len(rec.evaluated) == 1


def test_a_provider_built_later_is_bound_by_the_fingerprint_given_with_it(rec, tmp_path, tiny_tokenizer):
    build = lambda: VerifiableReward()
    one = {"grid": {"beta": [1]}, "provider": build}
    sweep(tmp_path, tiny_tokenizer, provider_fingerprint="verifiable v1", **one)
    assert rec.evaluated[0]["provider"] is build  # built by the evaluation, after the policies generated
    sweep(tmp_path, tiny_tokenizer, provider_fingerprint="verifiable v1", **one)
    assert len(rec.evaluated) == 1
    with pytest.raises(InputError, match=refused("sweep-validation", tmp_path / "sweep" / "validation" / "beta-1")):
        sweep(tmp_path, tiny_tokenizer, provider_fingerprint="verifiable v2", **one)


# --------------------------------------------------------------------------- the picture


def png_size(path: Path) -> tuple[int, int]:
    return struct.unpack(">II", path.read_bytes()[16:24])


def scored(settings, score, metric="reward_sampled"):
    name = Point(settings).name
    metrics = {} if score is None else {metric: interval(score)}
    return PointResult(name, settings, score, metrics, {"reward_sampled": interval(0.3)}, 1, None, name, name)


def series_of(ax) -> dict[str, list[float]]:
    return {c.get_label(): list(c.lines[0].get_xdata()) for c in ax.containers}


@pytest.mark.parametrize("values,scale", [([1, 4], "log"), ([0.5, 2], "log"), ([2, 3], "linear"),
                                          ([0, 1, 2], "linear"), ([1, 3.9], "linear")])
def test_the_x_axis_is_logarithmic_when_positive_values_span_four_times_or_more(drawn, tmp_path, values, scale):
    points = [scored({"beta": v}, 0.5) for v in values]
    result = SweepResult(grid={"beta": values}, metric="reward_sampled", points=points, chosen=points[0],
                         validation_prompts=4)
    plot_sweeps({"": result}, tmp_path / "x.png", title="t")
    assert drawn[0].axes[0].get_xscale() == scale


def test_series_of_other_values_sit_side_by_side_and_an_unscored_one_is_left_out(drawn, tmp_path):
    grid = {"loss_type": ["qrpo", "dpo"], "beta": [1, 2, 3]}
    points = [scored({"loss_type": t, "beta": b}, None if b == 1 else 0.5) for t in grid["loss_type"]
              for b in grid["beta"]]
    result = SweepResult(grid=grid, metric="reward_sampled", points=points, chosen=None, validation_prompts=4)
    plot_sweeps({"": result}, tmp_path / "x.png", title="t")
    found = series_of(drawn[0].axes[0])
    assert list(found) == ["beta=2", "beta=3"]  # beta=1 has no score; the others still drawn, in their places
    assert found["beta=2"] == pytest.approx([0.0, 1.0]) and found["beta=3"] == pytest.approx([0.04, 1.04])


def test_two_series_on_a_linear_axis_are_dodged_apart_evenly(drawn, tmp_path):
    grid = {"loss_type": ["qrpo", "dpo"], "beta": [1, 2]}
    points = [scored({"loss_type": t, "beta": b}, 0.5) for t in grid["loss_type"] for b in grid["beta"]]
    result = SweepResult(grid=grid, metric="reward_sampled", points=points, chosen=None, validation_prompts=4)
    plot_sweeps({"": result}, tmp_path / "x.png", title="t")
    found = series_of(drawn[0].axes[0])
    assert found["beta=1"] == pytest.approx([-0.02, 0.98]) and found["beta=2"] == pytest.approx([0.02, 1.02])


def test_panels_sit_side_by_side_on_one_y_scale_at_a_fixed_size(drawn, tmp_path, monkeypatch):
    monkeypatch.setitem(matplotlib.rcParams, "savefig.dpi", 50)  # a user's matplotlibrc changes nothing
    monkeypatch.setitem(matplotlib.rcParams, "figure.dpi", 72)
    low = [scored({"beta": b}, s) for b, s in ((1, 0.1), (4, 0.2))]
    high = [scored({"beta": b}, s) for b, s in ((1, 0.8), (4, 0.9))]
    results = {"a": SweepResult(grid={"beta": [1, 4]}, metric="reward_sampled", points=low, chosen=low[1],
                                validation_prompts=4),
               "b": SweepResult(grid={"beta": [1, 4]}, metric="reward_sampled", points=high, chosen=high[1],
                                validation_prompts=4)}
    plot_sweeps(results, tmp_path / "two.png", title="t")
    left, right = drawn[0].axes
    assert left.get_position().x0 < right.get_position().x0
    assert left.get_position().y0 == pytest.approx(right.get_position().y0)
    assert left.get_ylim() == right.get_ylim()  # one y scale
    assert png_size(tmp_path / "two.png") == (1040, 380)  # 2 x 5.2 by 3.8 inches at 100 dpi
    plot_sweeps({"a": results["a"]}, tmp_path / "one.png", title="t")
    assert png_size(tmp_path / "one.png") == (520, 380)


def test_the_look_of_the_picture(drawn, tmp_path):
    points = [scored({"beta": b}, s) for b, s in ((1, 0.2), (4, 0.6))]
    result = SweepResult(grid={"beta": [1, 4]}, metric="reward_sampled", points=points, chosen=points[1],
                         validation_prompts=4)
    plot_sweeps({"": result}, tmp_path / "x.png", title="t")
    (ax,) = drawn[0].axes
    (bars,) = ax.containers
    line, caps = bars.lines[0], bars.lines[1]
    assert (line.get_marker(), line.get_markersize()) == ("o", 4)  # each score a dot
    assert caps and all(cap.get_markersize() == 6 for cap in caps)  # the intervals capped, 3 points each side
    (star,) = [x for x in ax.get_lines() if x.get_marker() == "*"]
    assert star.get_markersize() == 16 and star.get_color() == line.get_color()  # the chosen point, in its colour
    (start,) = [x for x in ax.get_lines() if x.get_label() == "start policy"]
    assert (start.get_color(), start.get_linestyle(), start.get_linewidth()) == ("gray", "--", 0.8)
    assert ax.title.get_fontsize() == 9
    assert all(text.get_fontsize() == 8 for text in ax.get_legend().get_texts())
