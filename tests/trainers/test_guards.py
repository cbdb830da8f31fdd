"""align.trainers.guards: a diverged run stops unmarked, checkpoints come by the clock too, a torn checkpoint
is never resumed from, DeepSpeed states of another rank count are refused."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
import torch

from align.config import ConfigError
from align.trainers.guards import (
    CHECKPOINT_RECORD,
    CheckpointRecords,
    TrainingDivergedError,
    check_finite_loss,
    check_finite_weights,
    resumable_checkpoint,
)


def checkpoint(root, step: int, *, state: bool = True, record: dict | None = None):
    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"weights")
    if state:
        (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    if record is not None:
        (path / CHECKPOINT_RECORD).write_text(json.dumps({"global_step": step, **record}))
    return path


def test_a_torn_checkpoint_is_skipped_for_the_one_before(tmp_path, capsys):
    checkpoint(tmp_path, 10, record={"world_size": 1, "deepspeed": False})
    checkpoint(tmp_path, 20, state=False)  # killed while saving: no trainer_state.json
    (tmp_path / "checkpoint-30").mkdir()  # killed at once
    assert resumable_checkpoint(tmp_path) == str(tmp_path / "checkpoint-10")
    assert "checkpoint-30 was not saved whole" in capsys.readouterr().out


def test_a_checkpoint_whose_state_disagrees_with_its_name_is_torn(tmp_path):
    path = checkpoint(tmp_path, 10)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": 9}))
    (path / "trainer_state.json").with_name("x").write_text("")
    assert resumable_checkpoint(tmp_path, quiet=True) is None


def test_deepspeed_states_of_another_rank_count_are_refused(tmp_path):
    checkpoint(tmp_path, 10, record={"world_size": 32, "deepspeed": True})
    with pytest.raises(ConfigError, match=r"saved by 32 DeepSpeed ranks; this launch has 16"):
        resumable_checkpoint(tmp_path, world_size=16)
    assert resumable_checkpoint(tmp_path, world_size=32).endswith("checkpoint-10")
    checkpoint(tmp_path / "ddp", 10, record={"world_size": 8, "deepspeed": False})
    assert resumable_checkpoint(tmp_path / "ddp", world_size=2).endswith("checkpoint-10")  # DDP: any count


def trainer_like(tmp_path, model=None, step: int = 6):
    return SimpleNamespace(state=SimpleNamespace(global_step=step), args=SimpleNamespace(output_dir=str(tmp_path),
                                                                                          device="cpu"),
                           model=model, model_wrapped=None)


def test_a_loss_that_is_not_finite_stops_the_run_naming_the_step_and_the_checkpoint(tmp_path):
    checkpoint(tmp_path, 5, record={"world_size": 1})
    check_finite_loss(trainer_like(tmp_path), torch.tensor(0.3))
    with pytest.raises(TrainingDivergedError, match=r"the loss is nan at step 7.*the last good checkpoint is "
                                                    r".*checkpoint-5"):
        check_finite_loss(trainer_like(tmp_path), torch.tensor(float("nan")))
    with pytest.raises(TrainingDivergedError, match=r"the loss is inf"):
        check_finite_loss(trainer_like(tmp_path), torch.tensor(float("inf")))


def test_weights_that_are_not_finite_are_never_saved(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    check_finite_weights(trainer_like(tmp_path, model))
    with torch.no_grad():
        model[1].weight[0, 1] = float("nan")
    with pytest.raises(TrainingDivergedError, match=r"after step 6 some weights are not finite \(1.weight\)"):
        check_finite_weights(trainer_like(tmp_path, model))


def test_save_every_minutes_asks_for_a_checkpoint_by_the_clock(tmp_path):
    callback = CheckpointRecords(every_minutes=1.0)
    args = SimpleNamespace(output_dir=str(tmp_path))
    control = SimpleNamespace(should_save=False)
    state = SimpleNamespace(global_step=3)
    assert callback.on_step_end(args, state, control).should_save is False
    callback.last = time.monotonic() - 61
    assert callback.on_step_end(args, state, control).should_save is True
    with pytest.raises(ConfigError, match="save_every_minutes=0"):
        from align.trainers.preference_config import PreferenceConfig

        PreferenceConfig(output_dir=str(tmp_path), use_cpu=True, save_every_minutes=0)


def test_a_diverging_preference_run_is_not_marked_complete(tmp_path, tiny_dirs):
    """`align train beta=1e308`: the loss is NaN from the first step; the stage stops, exit 2, no marker."""
    import contextlib
    import io

    from align.cli import main

    rows = [{"id": f"p{i}", "messages": [{"role": "user", "content": "Is 4 even?"}], "chosen": "yes",
             "rejected": "no", "chosen_reward": 1.0, "rejected_reward": 0.0, "chosen_quantile": 1.0,
             "rejected_quantile": 0.25, "num_ref_rewards": 4, "pair_fallback": None, "chosen_finish_reason": "stop",
             "rejected_finish_reason": "stop", "num_ref_dropped": 0} for i in range(4)]
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["train", f"input={data}", f"output_dir={tmp_path / 'qrpo'}", f"model_name_or_path={tiny_dirs['policy']}",
                   "reference=model", "use_cpu=true", "bf16=false", "report_to=[]", "max_steps=2", "beta=1e308",
                   "per_device_train_batch_size=2", "save_strategy='no'", "disable_tqdm=true", "optimizer=adamw",
                   "chat_date=2026-01-01"])
    assert rc == 2 and "TrainingDivergedError: the loss is nan at step " in err.getvalue(), err.getvalue()[-2000:]
    assert not (tmp_path / "qrpo" / "_COMPLETE.json").exists()
