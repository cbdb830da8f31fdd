"""The 70B path on 2 CPU ranks: every model partitioned, no rank holding one whole, results as one process.

One launch under the shipped ZeRO-3 config (recipes/accelerate/zero3.yaml, zero3_init_flag:
true, made to run 2 CPU processes) runs, through the CLI, what the 70B recipes run on GPUs:

1. `align logprobs ... sharding=zero3`: the reference log-prob pass, each rank scoring its own
   rows (7 and 4 of 11: unequal shards, so one rank runs dummy forwards);
2. `align evaluate ... kl_only=true kl_sharding=zero3`: the evaluation's KL step over
   generations an earlier one-process run made, policy and reference both partitioned;
3. `align sft ...` and 4. `align train ...` (QRPO): the trainers' loads under
   `zero3_init_flag` (the training rows are the one-process pass's, so that both runs read
   them in the same order).

Checked: every load left each rank holding its ZeRO-3 partitions only (measured on the
tensors right after the load returned: about half the model's bytes, nothing whole); the
partitioned forwards were run in step (the same count on both ranks); and each result equals
the one-process run: log-probs and KL log-ratios within 1e-5, the same cache key and
manifest, the same KL job fingerprint, the trained weights within 1e-5.
"""

from __future__ import annotations

import json

import pytest
import torch
from dist_utils import assert_weights_close, deepspeed_command, load_weights, run, run_cli

pytestmark = pytest.mark.distributed

REPO = __import__("pathlib").Path(__file__).resolve().parents[2]
TINY = REPO / "recipes" / "tiny"
RECIPE = TINY / "pipeline.yaml"
DATE = "2026-01-01"


def pair_rows() -> list[dict]:
    """11 pairs: by id, 7 land on rank 0 and 4 on rank 1 (unequal shards)."""
    return [{"id": f"pair-{i}", "messages": [{"role": "user", "content": f"What is {i} plus {i % 5}?"}],
             "chosen": f"It is {i + i % 5}." + " Sure." * (i % 3), "rejected": "No idea." + " Hmm." * (i % 4),
             "chosen_quantile": 1.0, "rejected_quantile": [0.0, 0.25, 0.5][i % 3]} for i in range(11)]


def commands(root, model, sft_policy) -> dict[str, list]:
    """Each stage's command line; ``distributed`` adds the switches of a 2-rank CPU launch."""
    evaluate = ["evaluate", RECIPE, f"prompts={TINY / 'data' / 'held_out.jsonl'}", "plots=false", "resamples=200",
                f"policies=[{{name: base, model: {model}}}, {{name: sft, model: {sft_policy}}}]",
                "baseline=base", "batch_size=4", "kl_batch_size=3"]
    return {
        "logprobs": ["logprobs", RECIPE, f"model_name_or_path={model}", f"input={root / 'pairs.jsonl'}",
                     "max_length=128", "batch_size=2", "device=null"],
        "evaluate": evaluate,
        "sft": ["sft", RECIPE, f"model_name_or_path={model}", f"input={TINY / 'data' / 'sft.jsonl'}", "max_steps=3",
                "per_device_train_batch_size=4", "global_batch_size=8", "logging_steps=1"],
        "train": ["train", RECIPE, f"model_name_or_path={model}", "max_steps=2", "per_device_train_batch_size=2",
                  "global_batch_size=4", "max_length=128"],
    }


DISTRIBUTED = ["use_cpu=false", "ddp_backend=gloo"]  # docs/environment.md: use_cpu=true would turn DeepSpeed off


@pytest.fixture(scope="module")
def runs(tiny_dirs, tmp_path_factory):
    """One process first (the references, and the evaluation's first run), then the 2-rank launch."""
    root = tmp_path_factory.mktemp("zero3")
    (root / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in pair_rows()))
    model = tiny_dirs["policy"]
    single = root / "single"
    run_cli([*commands(root, model, None)["sft"], f"output_dir={single / 'sft'}"])
    cmd = commands(root, model, single / "sft")
    run_cli([*cmd["logprobs"], f"output_dir={single / 'logprobs'}"])
    run_cli([*cmd["train"], f"input={single / 'logprobs'}", f"output_dir={single / 'train'}"])
    run_cli([*cmd["evaluate"], f"output_dir={single / 'evaluate'}"])  # KL in process, the sampler's models
    # the partitioned evaluation's first run: generates and scores, leaves KL to its own launch
    dist = root / "dist"
    first = run_cli([*cmd["evaluate"], f"output_dir={dist / 'evaluate'}", "kl_sharding=zero3"])
    plan = [
        {"name": "logprobs", "argv": [*cmd["logprobs"], f"output_dir={dist / 'logprobs'}", "sharding=zero3"]},
        {"name": "evaluate", "argv": [*cmd["evaluate"], f"output_dir={dist / 'evaluate'}", "kl_sharding=zero3",
                                      "kl_only=true"]},
        {"name": "sft", "argv": [*commands(root, model, None)["sft"], f"output_dir={dist / 'sft'}", *DISTRIBUTED]},
        {"name": "train", "argv": [*cmd["train"], f"input={single / 'logprobs'}", f"output_dir={dist / 'train'}",
                                   *DISTRIBUTED]},
    ]
    for step in plan:
        step["argv"] = [str(a) for a in step["argv"]]
    (root / "plan.json").write_text(json.dumps(plan))
    out = root / "facts"
    run(deepspeed_command(3, "zero3_stages_script.py", ["--plan", str(root / "plan.json"), "--out", str(out)], root),
        root / "launch.log")
    facts = [json.loads((out / f"facts_rank{r}.json").read_text()) for r in (0, 1)]
    last = run_cli([*cmd["evaluate"], f"output_dir={dist / 'evaluate'}", "kl_sharding=zero3"])  # writes the report
    return {"single": single, "dist": dist, "facts": facts, "first": first, "last": last, "model": model}


def test_each_load_leaves_every_rank_with_half_the_weights(runs):
    facts = runs["facts"]
    for f in facts:
        assert f["env_world_size"] == f["torch_world_size"] == 2 and f["backend"] == "gloo", f
        assert f["zero3_init"] == "true"  # the shipped recipe's zero3_init_flag reached the ranks
        assert f["exits"] == {"logprobs": 0, "evaluate": 0, "sft": 0, "train": 0}
    loads = [f["loads"] for f in facts]
    assert [(load["command"], load["kind"]) for load in loads[0]] == [
        ("logprobs", "scoring"), ("evaluate", "scoring"), ("evaluate", "scoring"), ("sft", "trainer"),
        ("train", "trainer")]
    assert [(load["command"], load["path"]) for load in loads[1]] == \
        [(load["command"], load["path"]) for load in loads[0]]
    for mine, theirs in zip(*loads):
        whole = mine["whole_bytes"]
        assert whole == theirs["whole_bytes"] > 400_000, mine  # the tiny model: ~460 kB of float32
        for load in (mine, theirs):
            # every weight a partition, no parameter holding data: no whole copy on the rank
            assert load["partitioned"] == load["parameters"] and load["data_bytes"] == 0, load
            # half the bytes, up to the padding of each weight to a multiple of 2 elements
            assert whole / 2 <= load["held_bytes"] <= whole / 2 + 4 * load["parameters"], load
        assert mine["held_bytes"] + theirs["held_bytes"] >= whole


def test_partitioned_forwards_run_in_step_on_unequal_shards(runs):
    forwards = [f["forwards"] for f in runs["facts"]]
    assert [(x["command"], x["path"]) for x in forwards[0]] == [(x["command"], x["path"]) for x in forwards[1]]
    assert [x["command"] for x in forwards[0]] == ["logprobs", "evaluate", "evaluate"]
    for mine, theirs in zip(*forwards):
        assert mine["real"] + mine["dummy"] == theirs["real"] + theirs["dummy"], (mine, theirs)
        # released by the stage: no DeepSpeed registry kept the engine (and its memory) alive
        assert mine["engine_freed"] and theirs["engine_freed"], (mine, theirs)
    logprobs = [f[0] for f in forwards]
    assert sorted(x["real"] for x in logprobs) == [2, 4]  # 4 and 7 rows, 2 per batch
    assert sorted(x["dummy"] for x in logprobs) == [0, 2]  # the rank with fewer rows kept in step


def test_the_partitioned_pass_equals_one_process(runs):
    from align.io import read_output

    single, dist = runs["single"] / "logprobs", runs["dist"] / "logprobs"
    want = {r["id"]: r for r in read_output(single)}
    got = {r["id"]: r for r in read_output(dist)}
    assert set(got) == set(want) == {r["id"] for r in pair_rows()}
    for rid, row in want.items():
        for column in ("ref_chosen_logps", "ref_rejected_logps"):
            assert got[rid][column] == pytest.approx(row[column], abs=1e-5), (rid, column)
        for column in ("chosen_length", "rejected_length", "ref_chosen_token_hash", "ref_model_fingerprint"):
            assert got[rid][column] == row[column]
    job = [json.loads((d / "_job.json").read_text()) for d in (single, dist)]
    assert job[0]["cache_key"] == job[1]["cache_key"]  # the layout is not part of the key
    manifest = [json.loads((d / "_COMPLETE.json").read_text())["manifest_fingerprint"] for d in (single, dist)]
    assert manifest[0] == manifest[1]  # nor of the manifest (sharding is a neutral key)
    assert len(list(dist.glob("shard-*-of-00002.done.json"))) == 2


def test_the_partitioned_kl_equals_one_process(runs):
    from align.io import read_output

    assert "kl_only=true" in runs["first"] and "waiting" in runs["first"]  # the first run left KL to its launch
    single, dist = runs["single"] / "evaluate", runs["dist"] / "evaluate"
    want = {r["id"]: r["logratios"] for r in read_output(single / "kl" / "sft")}
    got = {r["id"]: r["logratios"] for r in read_output(dist / "kl" / "sft")}
    assert set(got) == set(want) and len(want) == 16
    for rid, values in want.items():
        assert got[rid] == pytest.approx(values, abs=1e-5), rid
    assert sum(abs(v) for values in want.values() for v in values) > 0.1  # the two models do differ
    # the KL job's fingerprint (whole weights, gathered from the partitions) is the layout-free one
    jobs = [json.loads((d / "kl" / "sft" / "_job.json").read_text()) for d in (single, dist)]
    assert jobs[0] == jobs[1]
    reports = [json.loads((d / "report.json").read_text()) for d in (single, dist)]
    kl = [r["overall"]["policies"]["sft"]["kl"] for r in reports]
    assert kl[1] == pytest.approx(kl[0], abs=1e-6)
    assert "kl" not in reports[1]["overall"]["policies"]["base"]  # the reference has none
    assert (dist / "_COMPLETE.json").exists()


@pytest.mark.parametrize("stage", ["sft", "train"])
def test_trainers_loaded_partitioned_train_like_one_process(runs, stage):
    single, dist = load_weights(runs["single"] / stage), load_weights(runs["dist"] / stage)
    assert_weights_close(dist, single, atol=1e-5)
    initial = load_weights(runs["model"])
    assert [name for name in initial if not torch.equal(dist[name], initial[name])]  # it trained
    summary = json.loads((runs["dist"] / stage / "_COMPLETE.json").read_text())["summary"]
    assert summary["steps"] == {"sft": 3, "train": 2}[stage]

