"""Skip rows through a submitted graph, for real: 2 of the tiny recipe's 24 prompts hold a token the
Apertus format reads as structure.

Sampling cannot render those two prompts, so it writes them as skip rows with its reason.
Before, annotation refused such rows and every annotation array task failed (the prompt in
shard 0 killed shard 1 too, and resubmitting repeated it). Now the tiny recipe, with its
evaluation reading the sampled prompts, is submitted to the local cluster and every job
completes: annotation passes the two rows on, pairs and the evaluation record them in their
skipped.jsonl, each with sampling's reason word for word, and every other id is present
once in every output.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from slurm_helpers import REPO, log_tails, run, states, wait_for

from align.io import read_records, stage_completion_info

pytestmark = pytest.mark.slurm

BAD = ("Is 3 even? <s> Answer yes or no.", "Is 17 even?<|user_end|> Answer yes or no.")  # prompts 3 and 17
STEPS = ("sft", "sample", "annotate", "pairs", "logprobs", "train", "evaluate")


@pytest.fixture(scope="module")
def submitted(tmp_path_factory, job_env):
    from align.testing.tiny import save_tiny_models

    ws = tmp_path_factory.mktemp("skips")
    (ws / "recipes").symlink_to(REPO / "recipes", target_is_directory=True)
    save_tiny_models(ws / "runs" / "tiny_models")
    rows = read_records(REPO / "recipes" / "tiny" / "data" / "prompts.jsonl")
    for index, text in zip((3, 17), BAD, strict=True):
        rows[index]["messages"] = [{"role": "user", "content": text}]
    bad = {rows[3]["id"], rows[17]["id"]}
    (ws / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = yaml.safe_load((REPO / "recipes" / "tiny" / "pipeline.yaml").read_text())
    recipe["sample"]["prompts"] = "prompts.jsonl"
    recipe["evaluate"]["prompts"] = "runs/tiny/sample"  # the sampled prompts, skip rows included
    (ws / "skips.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    out = run([sys.executable, "-m", "align", "submit", "skips.yaml"], job_env, cwd=ws, timeout=300).stdout
    jobs = {step: entry["job_id"] for step, entry in
            json.loads((ws / "runs" / "tiny" / "slurm" / "jobs.json").read_text()).items()}
    wait_for(list(jobs.values()), job_env, timeout_s=600, logs=ws / "runs" / "tiny" / "slurm")
    return ws, jobs, [r["id"] for r in rows], bad, out


def test_every_job_completes(submitted, job_env):
    ws, jobs, _, _, out = submitted
    assert list(jobs) == list(STEPS), out
    for step, job in jobs.items():
        got = set(states(job, job_env).values())
        assert got == {"COMPLETED"}, f"{step}: {got}{log_tails(ws / 'runs' / 'tiny' / 'slurm')}"
        assert stage_completion_info(ws / "runs" / "tiny" / ("qrpo" if step == "train" else step)) is not None


def test_the_skips_carry_samplings_reason_through_annotation_pairs_and_evaluation(submitted):
    ws, _, ids, bad, _ = submitted
    runs = ws / "runs" / "tiny"
    sampled = {r["id"]: r for r in read_records(runs / "sample")}
    reasons = {rid: sampled[rid]["skip_reason"] for rid in bad}
    assert all("reads as structure" in reason for reason in reasons.values()), reasons

    annotated = read_records(runs / "annotate")
    assert sorted(r["id"] for r in annotated) == sorted(ids)  # every id once, the two skips passed on
    assert {r["id"]: r["skip_reason"] for r in annotated if r.get("skip_reason")} == reasons
    assert stage_completion_info(runs / "annotate")["summary"]["upstream_skipped"] == 2

    pairs = [json.loads(line) for line in (runs / "pairs" / "pairs.jsonl").read_text().splitlines()]
    skipped = [json.loads(line) for line in (runs / "pairs" / "skipped.jsonl").read_text().splitlines()]
    assert {s["id"]: s["reason"] for s in skipped if s.get("upstream")} == reasons
    assert sorted([p["id"] for p in pairs] + [s["id"] for s in skipped if not s.get("paired")]) == sorted(ids)

    left_out = [json.loads(line) for line in (runs / "evaluate" / "skipped.jsonl").read_text().splitlines()]
    assert {s["id"]: s["reason"] for s in left_out} == reasons
    evaluated = [json.loads(line)["id"] for line in (runs / "evaluate" / "eval.jsonl").read_text().splitlines()]
    assert sorted(evaluated) == sorted(set(ids) - bad)
    assert stage_completion_info(runs / "evaluate")["summary"]["skipped_prompts"] == 2
