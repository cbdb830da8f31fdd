"""`align submit` on a tiny mirror of the Apertus step graph, for real, in a working directory with a space.

The recipe (written below, the shape of recipes/apertus-8b/pipeline.yaml on tiny models):
SFT; classify the prompts (the classifier behind an OpenAI-compatible server, a fake one
here that labels "Is N even?" controversial when 3 divides N); then two rounds of: reference
samples from the round's policy, offline completions from the base model, rewards from a
reward model for the prompts that are not controversial and from the constitutional judge for
the others, pairs over both, the reference pass, QRPO, and an evaluation of SFT against the
round's policy. Two interpreters: the array steps (sampling, annotation, evaluation) run the
second one (tests/slurm/second_python.py, which records each step it runs), the others the
first.

The first `align submit` holds one task of round 2's judge annotation after its first batch
and the test cancels it: that array fails, and every step after it is cancelled by SLURM. A
second `align submit` resubmits that one task and what follows; at the end every output is
complete, the cancelled shard holds each of its rows once, and a third submission finds
nothing to submit. Every job's CPUs and memory are the recipe's (``scontrol show job``).
"""

from __future__ import annotations

import json
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from slurm_helpers import REPO, job_records, log_tails, run, wait_for, wait_for_file

from align.io import STAGE_COMPLETE_MARKER, read_records, stage_completion_info
from align.jobs import shard_of

pytestmark = pytest.mark.slurm

ROUND_STEPS = ("sample", "sample_offline", "annotate_rm", "annotate_judge", "pairs", "logprobs", "train", "evaluate")
ARRAY_STEPS = ("classify", "sample", "sample_offline", "annotate_rm", "annotate_judge", "evaluate")
HOLD = "round-2.annotate_judge"
SHARDS = 2


def controversial(n: int) -> bool:
    return n % 3 == 0


class FakeClassifierServer(BaseHTTPRequestHandler):
    """An OpenAI-compatible server whose model answers the classifier's question: label 2 ("controversial")
    for "Is N even?" when 3 divides N, else 0. Token ids in, token ids out, as vLLM serves them."""

    tokenizer = None

    def do_GET(self):
        self._reply({"data": [{"id": "tiny-classifier", "max_model_len": 8192}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        text = self.tokenizer.decode(body["prompt"])
        number = int(re.findall(r"Is (\d+) an even", text)[-1])
        answer = json.dumps({"reasoning": "a test", "classification": "2" if controversial(number) else "0"})
        ids = self.tokenizer.encode(answer, add_special_tokens=False) + [body["stop_token_ids"][0]]
        self._reply({"choices": [{"index": i, "token_ids": ids, "finish_reason": "stop"} for i in range(body["n"])]})

    def _reply(self, data):
        raw = json.dumps(data).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def classifier_server():
    from align.testing.tiny import build_tokenizer

    FakeClassifierServer.tokenizer = build_tokenizer()
    httpd = HTTPServer(("127.0.0.1", 0), FakeClassifierServer)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()


def the_recipe(url: str, second_python: Path) -> dict:
    transformers = {"backend": "transformers", "device": "cpu", "batch_size": 8}
    trainer = {"max_length": 256, "use_cpu": True, "bf16": False, "report_to": [], "save_strategy": "no",
               "disable_tqdm": True, "optimizer": "adamw", "seed": 0}
    return {
        "output_dir": "runs/graph",
        "rounds": 2, "reference": "previous", "initial_policy": "@sft",
        "defaults": {"chat_date": "2026-01-01"},
        "steps": {
            "sft": {"stage": "sft", "model_name_or_path": "runs/tiny_models/policy",
                    "input": "recipes/tiny/data/sft.jsonl", "max_steps": 40, "per_device_train_batch_size": 16,
                    "learning_rate": 3.0e-3, "lr_scheduler_type": "constant", "warmup_steps": 0, **trainer},
            "classify": {"stage": "annotate", "provider": "classifier", "backend": "openai", "base_url": url,
                         "model": "tiny-classifier", "tokenizer": "@sft", "input": "recipes/tiny/data/prompts.jsonl",
                         "max_tokens": 64, "max_attempts": 1, "batch_size": 4},
            "sample": {"stage": "sample", "prompts": "@classify", "n": 4, "max_tokens": 8, "batch_size": 4,
                       "sampler": {"model": "@policy", **transformers}},
            "sample_offline": {"stage": "sample", "mode": "offline", "prompts": "@sample", "n": 1, "max_tokens": 8,
                               "batch_size": 4, "on_unclassified": "persona",
                               "sampler": {"model": "runs/tiny_models/policy", **transformers}},
            "annotate_rm": {"stage": "annotate", "input": "@sample_offline", "provider": "reward_model",
                            "model": "runs/tiny_models/reward_model", "device": "cpu", "batch_size": 4,
                            "where": {"controversial": False}},
            "annotate_judge": {"stage": "annotate", "input": "@sample_offline", "provider": "judge",
                               "model": "@sft", "device": "cpu", "charter": "charter.md", "top_k_pairwise": 0,
                               "batch_size": 2, "where": {"controversial": [True, None]}},
            "pairs": {"stage": "pairs", "input": ["@annotate_rm", "@annotate_judge"], "num_ref_rewards": 4},
            "logprobs": {"stage": "logprobs", "input": "@pairs/pairs.jsonl", "model_name_or_path": "@reference",
                         "max_length": 256, "dtype": "float32", "device": "cpu"},
            "train": {"stage": "train", "input": "@logprobs", "model_name_or_path": "@policy",
                      "ref_model_name_or_path": "@reference", "loss_type": "qrpo", "num_ref_rewards": 4,
                      "max_steps": 2, "per_device_train_batch_size": 4, "learning_rate": 1.0e-4, **trainer},
            "evaluate": {"stage": "evaluate", "prompts": "recipes/tiny/data/held_out.jsonl", "baseline": "sft",
                         "policies": [{"name": "sft", "model": "@initial"}, {"name": "trained", "model": "@train"}],
                         "sampler": transformers, "reward": {"provider": "verifiable"}, "n": 2, "max_tokens": 8,
                         "resamples": 200, "batch_size": 8},
        },
        "slurm": {
            "log_dir": "runs/graph/slurm", "time": "00:20:00", "gpus_per_node": 0, "gpus_per_task": 0,
            "cpus_per_task": 1, "mem": "600M", "array": SHARDS, "accelerate_config": "recipes/accelerate/cpu.yaml",
            "env": {"OMP_NUM_THREADS": "1"},
            "stages": {stage: {"python": str(second_python)} for stage in ("sample", "annotate", "evaluate")},
        },
    }


def align(args: list[str], env: dict[str, str], cwd: Path, check: bool = True) -> str:
    done = run([sys.executable, "-m", "align", *args], env, cwd=cwd, timeout=600, check=check)
    return done.stdout + done.stderr


def jobs_of(ws: Path) -> dict[str, str]:
    return {step: entry["job_id"] for step, entry in json.loads((ws / "runs/graph/slurm/jobs.json").read_text()).items()}


@pytest.fixture(scope="module")
def graph(tmp_path_factory, job_env, classifier_server):
    from align.testing.tiny import save_tiny_models

    ws = tmp_path_factory.mktemp("graph") / "work space"  # a working directory with a space
    ws.mkdir()
    (ws / "recipes").symlink_to(REPO / "recipes", target_is_directory=True)
    models = save_tiny_models(ws / "runs" / "tiny_models")
    from transformers import AutoTokenizer

    from align.chat import install_format

    reward = AutoTokenizer.from_pretrained(models["reward_model"])  # a reward model renders with its own template
    install_format(reward, chat_format="apertus")
    reward.save_pretrained(models["reward_model"])
    (ws / "charter.md").write_text("# Test charter\n\n## 1. Quality\n[1.1] Answer the question.\n[1.2] Be correct.\n")
    log, marker = ws / "second_python.log", ws / "held"
    second = ws / "second python"  # an interpreter path with a space too
    second.write_text(f"#!/bin/sh\nexec {sys.executable} {Path(__file__).parent / 'second_python.py'} \"$@\"\n")
    second.chmod(0o755)
    (ws / "graph.yaml").write_text(yaml.safe_dump(the_recipe(classifier_server, second), sort_keys=False))
    env = {**job_env, "SECOND_PYTHON_LOG": str(log)}
    logs = ws / "runs" / "graph" / "slurm"

    first = align(["submit", "graph.yaml"], {**env, "HOLD_STEP": HOLD, "HOLD_TASK": "1", "HOLD_MARKER": str(marker)},
                  ws)
    first_ids = jobs_of(ws)
    wait_for_file(marker, timeout_s=600)
    run(["scancel", f"{first_ids[HOLD]}_1"], job_env)  # mid-shard: its first batch is written, the rest is not
    wait_for(list(first_ids.values()), job_env, timeout_s=600, logs=logs)
    first_records = {step: job_records(job, job_env) for step, job in first_ids.items()}
    held_rows = (ws / "runs/graph/round-2/annotate_judge" / f"shard-00001-of-{SHARDS:05d}.jsonl").read_text()
    status = align(["status", "graph.yaml"], env, ws)

    second = align(["submit", "graph.yaml"], env, ws)
    second_ids = jobs_of(ws)
    wait_for([j for s, j in second_ids.items() if j != first_ids.get(s)], job_env, timeout_s=600, logs=logs)
    second_records = {step: job_records(job, job_env) for step, job in second_ids.items()}
    third = align(["submit", "graph.yaml"], env, ws)
    return SimpleNamespace(ws=ws, logs=logs, first=first, first_ids=first_ids, first_records=first_records,
                           status=status, second=second, second_ids=second_ids, second_records=second_records,
                           third=third, held_rows=held_rows, ran_second=log.read_text().split("\n")[:-1],
                           env=env)


def steps_of_round(k: int) -> list[str]:
    return [f"round-{k}.{s}" for s in ROUND_STEPS]


def test_every_step_ran_in_order_and_the_cancelled_shard_was_resubmitted(graph):
    every = ["sft", "classify", *steps_of_round(1), *steps_of_round(2)]
    assert list(graph.first_ids) == every, graph.first
    state = {s: {r["JobState"] for r in records} for s, records in graph.first_records.items()}
    for step in every[: every.index(HOLD)]:
        assert state[step] == {"COMPLETED"}, (step, state[step], log_tails(graph.logs))
    assert state[HOLD] == {"COMPLETED", "CANCELLED"}
    for step in every[every.index(HOLD) + 1:]:  # after the failed array: cancelled by SLURM, never started
        if step.endswith("annotate_rm"):
            continue  # round 2's reward-model step reads nothing of the judge's
        assert state[step] == {"CANCELLED"}, (step, graph.first_records[step])
    assert f"{HOLD:<22} partial" in graph.status and "1 of 2 shards done; shards 1 are missing" in graph.status

    # the second submission: only the missing shard, then what follows
    for step in every[: every.index(HOLD)]:
        assert f"[align submit] {step}: done, not submitted" in graph.second
    assert re.search(rf"\[align submit\] {re.escape(HOLD)}: job \d+, array 1 of 2 shards", graph.second), graph.second
    for step in every[every.index(HOLD):]:
        assert {r["JobState"] for r in graph.second_records[step]} == {"COMPLETED"}, step
    assert "nothing to submit" in graph.third
    for step in every:
        out = graph.ws / "runs" / "graph" / (step.replace(".", "/") if step.startswith("round-") else step)
        assert stage_completion_info(out) is not None, step


def test_no_row_of_the_cancelled_shard_is_lost_or_doubled(graph):
    out = graph.ws / "runs" / "graph" / "round-2" / "annotate_judge"
    held = [json.loads(line)["id"] for line in graph.held_rows.splitlines()]
    shard = [json.loads(line)["id"] for line in (out / f"shard-00001-of-{SHARDS:05d}.jsonl").read_text().splitlines()]
    assert held and shard[: len(held)] == held  # the rows written before the cancel were kept, in place
    assert len(shard) == len(set(shard))
    judged = read_records(out)
    prompts = read_records(graph.ws / "runs/graph/round-2/sample_offline")
    wanted = {p["id"] for p in prompts if p["controversial"] in (True, None)}
    assert {r["id"] for r in judged} == wanted and len(judged) == len(wanted)
    assert set(shard) == {rid for rid in wanted if shard_of(rid, SHARDS) == 1}


def test_the_classifier_label_splits_the_rewards(graph):
    labels = {r["id"]: r["controversial"] for r in read_records(graph.ws / "runs/graph/classify")}
    expected = {r["id"]: controversial(int(re.findall(r"\d+", r["messages"][-1]["content"])[0]))
                for r in read_records(REPO / "recipes/tiny/data/prompts.jsonl")}
    assert labels == expected and 0 < sum(labels.values()) < len(labels)
    for k in (1, 2):
        rm = {r["id"] for r in read_records(graph.ws / f"runs/graph/round-{k}/annotate_rm")}
        judge = {r["id"] for r in read_records(graph.ws / f"runs/graph/round-{k}/annotate_judge")}
        assert rm == {i for i, c in labels.items() if not c} and judge == {i for i, c in labels.items() if c}
        pairs = read_records(graph.ws / f"runs/graph/round-{k}/pairs/pairs.jsonl")
        assert {p["id"] for p in pairs} & rm and {p["id"] for p in pairs} & judge  # pairs from both


def test_each_step_ran_with_the_python_its_recipe_names(graph):
    ran = {line.split()[0] for line in graph.ran_second}
    assert ran == {s for s in graph.first_ids if s.split(".")[-1] in ARRAY_STEPS}  # and nothing else
    jobs = json.loads((graph.logs / "jobs.json").read_text())
    for step, entry in jobs.items():
        second = step.split(".")[-1] in ARRAY_STEPS  # the sample, annotate and evaluate steps
        assert entry["python"].endswith("second python") == second, (step, entry["python"])


def test_every_job_has_the_recipes_cpus_and_memory(graph):
    for job in {*graph.first_ids.values(), *graph.second_ids.values()}:  # and ran in the directory with a space
        assert f"WorkDir={graph.ws}\n" in run(["scontrol", "show", "job", job], graph.env).stdout
    for records in [*graph.first_records.values(), *graph.second_records.values()]:
        for record in records:
            # what each job asked for: 1 CPU per task and 600M (a launch holds its node whole: --exclusive)
            assert record["MinCPUsNode"] == "1" and record["MinMemoryNode"] == "600M", record
            if record["JobName"].rsplit(".", 1)[-1] not in ("align-sft", "logprobs", "train"):
                assert record["NumCPUs"] == "1", record  # an array task or one task: exactly that



def test_the_scripts_pass_sbatch_test_only_in_a_directory_with_a_space(graph):
    for script in sorted(graph.logs.glob("*.sbatch")):
        done = run(["sbatch", "--test-only", script], graph.env, cwd=graph.ws)
        assert re.search(r"Job \d+ to start at", done.stderr), (script, done.stderr)
    assert (graph.ws / "runs/graph/round-2/evaluate" / STAGE_COMPLETE_MARKER).exists()
