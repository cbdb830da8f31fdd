"""QRPO with 2 CPU processes under ZeRO-2 and ZeRO-3 (shipped recipes), against one process.

The pairs carry reference log-probs from the offline pass (`align.logprobs`), computed with
the initial policy. One launch per ZeRO stage; each test checks that the ranks trained
together (world size 2 seen by the trainer, identical weights, a DeepSpeed engine with the
right ZeRO optimizer around AdEMAMix), that losses and saved weights match one process
with the same 4 pairs per step, and that the saved model loads with `from_pretrained`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from dist_utils import (
    HERE,
    TIMEOUT_S,
    assert_deepspeed,
    assert_synchronised,
    assert_weights_close,
    cpu_accelerate_config,
    deepspeed_command,
    load_weights,
    read_facts,
    run,
    single_command,
)
from dist_utils import _env as dist_env
from facts import weights_digest
from ports import free_port

pytestmark = pytest.mark.distributed

SCRIPT = "qrpo_script.py"


def pair_rows(n: int = 16) -> list[dict]:
    """Pairs of varied lengths; chosen beat every reference (R_q = 1), rejected did not."""
    return [
        {
            "id": f"pair-{i}",
            "messages": [{"role": "user", "content": f"What is {i} plus {i % 5}?"}],
            "chosen": f"It is {i + i % 5}." + " Sure." * (i % 3),
            "rejected": "No idea." + " Hmm." * (i % 4),
            "chosen_quantile": 1.0,
            "rejected_quantile": [0.0, 0.1, 0.2][i % 3],
        }
        for i in range(n)
    ]


def write_pairs(policy: Path, root: Path) -> Path:
    """Pair rows with reference log-probs of the initial policy, as `align logprobs` writes them."""
    from qrpo_script import CHAT_DATE, MAX_LENGTH
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from align.logprobs import compute_ref_logprobs, load_ref_logprobs

    rows = pair_rows()
    compute_ref_logprobs(
        rows,
        AutoModelForCausalLM.from_pretrained(policy),
        AutoTokenizer.from_pretrained(policy),
        chat_format="apertus",
        batch_size=8,
        max_length=MAX_LENGTH,
        chat_date=CHAT_DATE,
        output_dir=root / "ref",
    )
    path = root / "pairs.jsonl"
    path.write_text(
        "".join(json.dumps(row) + "\n" for row in load_ref_logprobs(root / "ref", rows))
    )
    return path


@pytest.fixture(scope="module")
def pairs_file(tiny_dirs, tmp_path_factory):
    return write_pairs(tiny_dirs["policy"], tmp_path_factory.mktemp("qrpo_pairs"))


@pytest.fixture(scope="module")
def single_process_run(tiny_dirs, pairs_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("qrpo_single")
    run(
        single_command(
            SCRIPT,
            ["--model", str(tiny_dirs["policy"]), "--data", str(pairs_file), "--out", str(out)],
        ),
        out / "log.txt",
    )
    return read_facts(out, 1)[0], load_weights(out / "model")


@pytest.mark.parametrize("stage", [2, 3])
def test_qrpo_two_ranks_train_like_one_process(
    tmp_path, tiny_dirs, pairs_file, single_process_run, stage
):
    out = tmp_path / "run"
    args = ["--model", str(tiny_dirs["policy"]), "--data", str(pairs_file), "--out", str(out)]
    run(deepspeed_command(stage, SCRIPT, args, tmp_path), tmp_path / "log.txt")

    facts = read_facts(out, 2)
    assert_synchronised(facts)
    assert_deepspeed(facts, stage)
    for f in facts:
        assert "AdEMAMix" in f["optimizer_chain"] and f["global_step"] == 3
        assert f["gradient_accumulation_steps"] == 1  # 4 pairs = 2 per device × 2 ranks

    reference, reference_weights = single_process_run
    assert reference["trainer_world_size"] == 1 and reference["gradient_accumulation_steps"] == 2
    # the evaluation callback generated under ZeRO-{stage} (weights gathered), at the start and every 2 steps,
    # and logged the same numbers on both ranks as one process did
    for f in facts:
        assert [entry["step"] for entry in f["gen_eval"]] == [0, 2, 3]
        assert {"reward", "win_rate", "length"} <= set(f["gen_eval"][1])
        assert [entry["step"] for entry in f["gen_eval_logged"]] == [0, 2, 3]
        assert "gen_eval/win_rate" in f["gen_eval_logged"][1]
    assert facts[0]["gen_eval"] == facts[1]["gen_eval"]
    for mine, single in zip(facts[0]["gen_eval"], reference["gen_eval"]):
        assert mine == pytest.approx(single, rel=1e-5)
    assert facts[0]["losses"] == pytest.approx(reference["losses"], rel=1e-5)

    from transformers import AutoModelForCausalLM

    assert (
        weights_digest(AutoModelForCausalLM.from_pretrained(out / "model"), None)[0]
        == facts[0]["weights_sha256"]
    )
    saved = load_weights(out / "model")
    assert_weights_close(saved, reference_weights, atol=1e-5)
    initial = load_weights(tiny_dirs["policy"])
    assert [
        name for name in initial if torch.equal(saved[name], initial[name])
    ] == []  # every weight trained


def test_apertus_under_zero3_two_ranks_trains_like_one_process(tmp_path):
    """The recipes' architecture under the recipes' setup: a tiny Apertus (xIELU with trainable
    scalars per layer, QK-norm, untied head) partitioned by ZeRO-3 over 2 ranks, stepped by
    AdEMAMix, gives one process's losses and weights, the xIELU scalars trained too."""
    from align.testing.tiny import save_tiny_models

    policy = save_tiny_models(tmp_path / "models", architecture="apertus")["policy"]
    pairs = write_pairs(policy, tmp_path)
    single, run_dir = tmp_path / "single", tmp_path / "run"
    args = ["--model", str(policy), "--data", str(pairs)]
    run(single_command(SCRIPT, [*args, "--out", str(single)]), tmp_path / "single.txt")
    run(deepspeed_command(3, SCRIPT, [*args, "--out", str(run_dir)], tmp_path), tmp_path / "log.txt")

    facts = read_facts(run_dir, 2)
    assert_synchronised(facts)
    assert_deepspeed(facts, 3)
    assert all("AdEMAMix" in f["optimizer_chain"] and f["global_step"] == 3 for f in facts)
    assert facts[0]["losses"] == pytest.approx(read_facts(single, 1)[0]["losses"], rel=1e-5)
    saved, initial, alone = load_weights(run_dir / "model"), load_weights(policy), load_weights(single / "model")
    embedding = "model.embed_tokens.weight"
    assert_weights_close({k: v for k, v in saved.items() if k != embedding},
                         {k: v for k, v in alone.items() if k != embedding}, atol=1e-5)
    # The untied input embedding: each used token's row moves by its own gradient only; measured,
    # one row of 75 differed by 5.7e-5 (3% of its largest update; the rest below 1.2e-7): each row
    # within 5% of its own largest update, as AdEMAMix's normalisation amplifies a small gradient's
    # rounding differences.
    moved = (alone[embedding] - initial[embedding]).abs().amax(1)
    assert bool(((saved[embedding] - alone[embedding]).abs().amax(1) <= 0.05 * moved + 1e-6).all())
    scalars = [name for name in initial if "alpha" in name]
    assert len(scalars) == 4  # alpha_p and alpha_n in each of the 2 layers
    assert [name for name in initial if torch.equal(saved[name], initial[name])] == []  # scalars included


LAUNCH_NODE = HERE.parents[1] / "recipes" / "slurm" / "launch_node.sh"


def test_multinode_rehearsal_two_launchers_train_like_one_process(
    tmp_path, tiny_dirs, pairs_file, single_process_run
):
    """recipes/slurm/train_multinode.sbatch on one machine: two `accelerate launch --num_machines 2`
    (machine ranks 0 and 1, one process each) built by recipes/slurm/launch_node.sh, the script
    the sbatch runs on every node, meeting on 127.0.0.1 under ZeRO-2."""
    out = tmp_path / "run"
    config = cpu_accelerate_config(2, tmp_path)
    env = {**dist_env(), "ACCELERATE_CONFIG": str(config), "NNODES": "2", "NUM_PROCESSES": "2",
           "MAIN_PROCESS_IP": "127.0.0.1", "MAIN_PROCESS_PORT": str(free_port()),
           "ACCELERATE_LAUNCH": f"{sys.executable} -m accelerate.commands.launch"}
    args = [str(HERE / SCRIPT), "--model", str(tiny_dirs["policy"]), "--data", str(pairs_file),
            "--out", str(out), "--mode", "deepspeed"]
    machines = []
    for rank in (0, 1):
        log = (tmp_path / f"machine{rank}.log").open("w")
        machines.append((subprocess.Popen(["bash", str(LAUNCH_NODE), *args], env={**env, "MACHINE_RANK": str(rank)},
                                          stdout=log, stderr=subprocess.STDOUT), log))
    try:
        codes = [proc.wait(timeout=TIMEOUT_S) for proc, _ in machines]
    finally:
        for proc, log in machines:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
    logs = "\n".join(f"--- machine {r}:\n" + (tmp_path / f"machine{r}.log").read_text()[-4000:] for r in (0, 1))
    assert codes == [0, 0], logs

    facts = read_facts(out, 2)
    assert_synchronised(facts)  # world size 2 as the trainer saw it, one gloo group, same weights
    assert_deepspeed(facts, 2)
    # one process on each "machine": node ranks 0 and 1, each the only process of its node
    assert [(f["node_rank"], f["local_rank"]) for f in facts] == [(0, 0), (1, 0)], facts
    for f in facts:
        assert f["global_step"] == 3 and f["gradient_accumulation_steps"] == 1
    reference, reference_weights = single_process_run
    assert facts[0]["losses"] == pytest.approx(reference["losses"], rel=1e-5)
    assert_weights_close(load_weights(out / "model"), reference_weights, atol=1e-5)
