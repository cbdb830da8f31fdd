"""SFT with 2 CPU processes under ZeRO-2, ZeRO-3 and plain DDP, against one process.

One launch per setup; the script (sft_script.py) writes each rank's facts. Each test checks
that the ranks really trained together (world size 2 seen by the trainer, identical
weights on both ranks, the DeepSpeed engine / DDP wrapper present), that the logged losses
and the saved weights match a single-process run with the same global batch, and that the
saved model loads with `from_pretrained` and is exactly what the ranks held.
"""

from __future__ import annotations

import pytest
import torch
from dist_utils import (
    assert_ddp,
    assert_deepspeed,
    assert_synchronised,
    assert_weights_close,
    ddp_command,
    deepspeed_command,
    load_weights,
    read_facts,
    run,
    single_command,
)
from facts import weights_digest

pytestmark = pytest.mark.distributed

SCRIPT = "sft_script.py"


@pytest.fixture(scope="module")
def single_process_run(tiny_dirs, tmp_path_factory):
    """The one-process reference for a given prompt-loss weight (run once, then reused)."""
    cache: dict[float, tuple[dict, dict]] = {}

    def get(prompt_loss_weight: float) -> tuple[dict, dict]:
        if prompt_loss_weight not in cache:
            out = tmp_path_factory.mktemp("sft_single")
            args = [
                "--model",
                str(tiny_dirs["policy"]),
                "--out",
                str(out),
                "--prompt-loss-weight",
                str(prompt_loss_weight),
            ]
            run(single_command(SCRIPT, args), out / "log.txt")
            cache[prompt_loss_weight] = (read_facts(out, 1)[0], load_weights(out / "model"))
        return cache[prompt_loss_weight]

    return get


@pytest.mark.parametrize(
    "setup, prompt_loss_weight", [("zero2", 0.0), ("zero3", 0.25), ("ddp", 0.0)]
)
def test_two_ranks_train_like_one_process(
    tmp_path, tiny_dirs, single_process_run, setup, prompt_loss_weight
):
    out = tmp_path / "run"
    args = [
        "--model",
        str(tiny_dirs["policy"]),
        "--out",
        str(out),
        "--prompt-loss-weight",
        str(prompt_loss_weight),
    ]
    if setup == "ddp":
        command = ddp_command(SCRIPT, args)
    else:
        command = deepspeed_command(int(setup[-1]), SCRIPT, args, tmp_path)
    run(command, tmp_path / "log.txt")

    facts = read_facts(out, 2)
    assert_synchronised(facts)
    if setup == "ddp":
        assert_ddp(facts)
    else:
        assert_deepspeed(facts, int(setup[-1]))
    for f in facts:
        assert "AdEMAMix" in f["optimizer_chain"] and f["global_step"] == 3
        assert f["gradient_accumulation_steps"] == 2  # global batch 8 = 2 per device × 2 ranks × 2
        # AdEMAMix from align.optim inside the DDP/ZeRO wrapper, warmups over the run's 3 steps
        assert f["optimizer_settings"]["t_alpha"] == f["optimizer_settings"]["t_beta3"] == 3
        assert f["optimizer_settings"]["betas"] == [0.9, 0.999, 0.99]

    reference, reference_weights = single_process_run(prompt_loss_weight)
    assert reference["trainer_world_size"] == 1 and reference["gradient_accumulation_steps"] == 4
    assert facts[0]["losses"] == pytest.approx(reference["losses"], rel=1e-5)

    saved = load_weights(out / "model")
    from transformers import AutoModelForCausalLM

    assert (
        weights_digest(AutoModelForCausalLM.from_pretrained(out / "model"), None)[0]
        == facts[0]["weights_sha256"]
    )
    assert_weights_close(saved, reference_weights, atol=1e-5)
    initial = load_weights(tiny_dirs["policy"])
    assert [
        name for name in initial if torch.equal(saved[name], initial[name])
    ] == []  # every weight trained
