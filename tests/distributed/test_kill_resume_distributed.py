"""2-process DeepSpeed runs killed with SIGKILL after a checkpoint, resumed with the same command.

Each case trains 4 optimizer steps with a checkpoint every 2, once uninterrupted and once
killed (the launcher and every process under it, SIGKILL) in step 3: checkpoint-2 is complete
and both ranks have finished step 3 and hold there (``--hold-at-step 3``: each writes a marker
file and waits), so the kill lands at the same point of the run on any machine. Then it is
relaunched with ``--resume`` (``resume_from_checkpoint=True``: the last checkpoint in the
output directory). The resumed run must end with the uninterrupted run's
weights, within floating-point tolerance: the ZeRO optimizer shards (AdEMAMix state), the
scheduler, the RNG states and the data position all came back.

Lean on purpose (each case is 3 launches): QRPO under ZeRO-2 and ZeRO-3, SFT under ZeRO-2
and ZeRO-3, QRPO with a LoRA adapter under ZeRO-2.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from dist_utils import (
    NUM_PROCESSES,
    TIMEOUT_S,
    _env,
    assert_weights_close,
    deepspeed_command,
    load_weights,
    read_facts,
    run,
)
from facts import held_marker
from test_qrpo_distributed import pairs_file  # noqa: F401  (fixture: the QRPO tests' pairs with reference log-probs)

pytestmark = pytest.mark.distributed

MAX_STEPS, SAVE_STEPS = 4, 2
HOLD_STEP = SAVE_STEPS + 1  # the killed run stops here: after checkpoint-2, before checkpoint-4


def _checkpoint_done(model_dir: Path, step: int) -> bool:
    """checkpoint-STEP holds the trainer state (written last, by rank 0) and both ranks' RNG states."""
    folder = model_dir / f"checkpoint-{step}"
    return all((folder / name).is_file() for name in ("trainer_state.json", "rng_state_0.pth", "rng_state_1.pth"))


def kill_tree(pid: int) -> None:
    """SIGKILL a launcher and every process under it: the ranks that torch's elastic agent starts
    are not in the launcher's process group, so killing the group alone leaves them training."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:  # it ended by itself: the caller's exit-status check says how
        return
    for proc in procs:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs[1:], timeout=60)  # the launcher itself is reaped by Popen.wait (its exit status)


def _held(out: Path) -> bool:
    """Every rank finished step HOLD_STEP and waits there (``hold_at_step`` in facts.py)."""
    return all(held_marker(out, HOLD_STEP, rank).is_file() for rank in range(NUM_PROCESSES))


def kill_after_checkpoint(command: list[str], model_dir: Path, log: Path) -> None:
    """Run ``command --hold-at-step HOLD_STEP``; SIGKILL it once every rank holds there."""
    out = model_dir.parent
    with log.open("w") as stream:
        launcher = subprocess.Popen([*command, "--hold-at-step", str(HOLD_STEP)], env=_env(), stdout=stream,
                                    stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + TIMEOUT_S
            while launcher.poll() is None and time.monotonic() < deadline:
                if _held(out) and _checkpoint_done(model_dir, SAVE_STEPS):
                    break
                time.sleep(0.05)
            held = _held(out)
            kill_tree(launcher.pid)
        finally:
            launcher.wait(timeout=60)
    assert launcher.returncode == -signal.SIGKILL, f"the run ended before the kill:\n{log.read_text()[-4000:]}"
    assert held, f"the ranks never held at step {HOLD_STEP}:\n{log.read_text()[-4000:]}"
    assert _checkpoint_done(model_dir, SAVE_STEPS)
    assert not list(model_dir.parent.glob("facts_rank*.json")), "a rank finished training after the kill"
    assert not (model_dir / "model.safetensors").exists() and not (model_dir / "adapter_model.safetensors").exists()
    assert not (model_dir / f"checkpoint-{MAX_STEPS}").exists(), "the kill landed after the last checkpoint"


def final_weights(model_dir: Path, lora: bool) -> dict[str, torch.Tensor]:
    if lora:  # the adapter alone is saved
        from safetensors.torch import load_file

        return load_file(model_dir / "adapter_model.safetensors")
    return load_weights(model_dir)


CASES = {
    "qrpo-zero2": ("qrpo_script.py", 2, False),
    "qrpo-zero3": ("qrpo_script.py", 3, False),
    "sft-zero2": ("sft_script.py", 2, False),
    "qrpo-lora-zero2": ("qrpo_script.py", 2, True),
    "sft-zero3": ("sft_script.py", 3, False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_killed_deepspeed_run_resumes_to_the_uninterrupted_weights(case, tmp_path, tiny_dirs, request):
    script, stage, lora = CASES[case]
    extra = ["--max-steps", str(MAX_STEPS), "--save-steps", str(SAVE_STEPS)]
    if script == "qrpo_script.py":
        extra += ["--data", str(request.getfixturevalue("pairs_file")), "--no-gen-eval"] + (["--lora"] if lora else [])

    def command(out: Path, *more: str) -> list[str]:
        return deepspeed_command(stage, script, ["--model", str(tiny_dirs["policy"]), "--out", str(out), *extra,
                                                 *more], tmp_path)

    once = tmp_path / "once"
    run(command(once), tmp_path / "once.log")
    killed = tmp_path / "killed"
    kill_after_checkpoint(command(killed), killed / "model", tmp_path / "killed.log")
    state = killed / "model" / f"checkpoint-{SAVE_STEPS}" / "trainer_state.json"
    saved_at = state.stat().st_mtime_ns
    run(command(killed, "--resume"), tmp_path / "resumed.log")

    # resumed from checkpoint-2 (a fresh start would have written it again), and finished the run
    assert state.stat().st_mtime_ns == saved_at
    assert [f["global_step"] for f in read_facts(killed, 2)] == [MAX_STEPS, MAX_STEPS]
    got, want = final_weights(killed / "model", lora), final_weights(once / "model", lora)
    assert_weights_close(got, want, atol=1e-5)
    initial = {} if lora else load_weights(tiny_dirs["policy"])
    assert all(not torch.equal(got[name], initial[name]) for name in initial), "weights never trained"
    if lora:  # LoRA's B matrices start at zero: trained, they moved
        assert any(name.endswith("lora_B.weight") and value.abs().sum() > 0 for name, value in got.items())
