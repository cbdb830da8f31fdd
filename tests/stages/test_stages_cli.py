"""Every CLI stage alone, on tiny data, reading the previous stage's output from disk.

The chain (sft → sample → annotate → pairs → logprobs → train) is built by the fixtures
in conftest.py, each one `align STAGE recipes/tiny/pipeline.yaml key=value ...` (pairs
through `python -m align` in a child process). These tests check what each stage wrote:
columns, counts, completion markers, and that it printed where it wrote.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from stage_helpers import TINY_DATA, TINY_RECIPE, run_cli, subprocess_env

from align.data.records import (
    COMPLETION_FIELDS,
    PAIR_FIELDS,
    REF_LOGP_FIELDS,
    validate_completions,
    validate_rewards,
)
from align.io import stage_completion_info, read_records

PROMPTS = read_records(TINY_DATA / "prompts.jsonl")
PROMPT_IDS = {r["id"] for r in PROMPTS}
N = 4  # sample.n in the tiny recipe


def marker(out: Path, stage: str) -> dict:
    info = stage_completion_info(out)
    assert info is not None, f"{out} has no completion marker"
    assert info["stage"] == stage
    return info


def by_id(rows: list[dict]) -> dict[str, dict]:
    out = {r["id"]: r for r in rows}
    assert len(out) == len(rows), "an id appears twice"
    return out


def test_sft_saves_a_chat_ready_policy_and_marks_complete(sft_run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, printed = sft_run
    assert f"[align sft] wrote {out}" in printed
    info = marker(out, "sft")
    assert info["summary"]["steps"] == 40
    assert info["config"]["chat_date"] == "2026-01-01"  # from the recipe's defaults section
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.chat_template and tokenizer.eos_token == "<|assistant_end|>"
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.get_input_embeddings().weight.shape[0] >= len(tokenizer)
    # trained: the loss fell from the random model's (~ln 512 = 6.2) to well below it
    assert info["summary"]["train_loss"] < 2.0


def test_sample_writes_n_reference_completions_per_prompt(sample_run):
    out, printed = sample_run
    assert f"[align sample] wrote {out}" in printed
    info = marker(out, "sample")
    assert info["summary"] == {"records": 24, "completions": 24 * N, "overlong": info["summary"]["overlong"],
                               "skipped_prompts": 0}
    assert sorted(p.name for p in out.glob("shard-*.json*")) == ["shard-00000-of-00001.done.json",
                                                          "shard-00000-of-00001.jsonl"]
    rows = by_id(read_records(out))
    assert set(rows) == PROMPT_IDS
    for prompt in PROMPTS:
        row = rows[prompt["id"]]
        validate_completions(row)
        assert row["answer"] == prompt["answer"] and row["messages"] == prompt["messages"]
        assert len(row["completions"]) == N
        for completion in row["completions"]:
            assert set(COMPLETION_FIELDS) <= set(completion)
            assert completion["is_reference"] is True
            assert 1 <= completion["num_tokens"] <= 8
            assert completion["finish_reason"] in ("stop", "length")


def test_annotate_verifiable_scores_every_completion(annotate_run):
    from rewards.verifiable import answers_match

    out, printed = annotate_run
    assert f"[align annotate] wrote {out}" in printed
    info = marker(out, "annotate")
    rows = by_id(read_records(out))
    assert set(rows) == PROMPT_IDS
    values = []
    for row in rows.values():
        validate_rewards(row)
        assert row["reward_provider"] == "verifiable"
        for completion, reward, skip, details in zip(row["completions"], row["rewards"], row["reward_skips"],
                                                     row["reward_details"]):
            assert skip is None
            if not completion["text"].strip():  # an empty completion gets the lowest score, with the reason
                assert reward == 0.0 and "empty_completion" in details
                values.append(reward)
                continue
            assert reward == (1.0 if answers_match(completion["text"], row["answer"]) else 0.0)
            values.append(reward)
    assert info["summary"]["scored"] == len(values)
    assert info["summary"]["scored"] + info["summary"]["skipped"] == 24 * N
    # the recipe's premise: the SFT policy answers "yes"/"no" and gets some right, some wrong
    assert 0 < sum(values) < len(values)


def test_pairs_via_python_dash_m(pairs_run, annotate_run):
    out, printed = pairs_run
    assert f"[align pairs] wrote {out}" in printed
    info = marker(out, "pairs")
    pairs = read_records(out / "pairs.jsonl")
    skipped = read_records(out / "skipped.jsonl")
    assert info["summary"]["pairs"] == len(pairs) > 0
    assert info["summary"]["skipped"] == len(skipped)
    assert len(pairs) + len(skipped) == 24
    assert {r["id"] for r in pairs} | {r["id"] for r in skipped} == PROMPT_IDS
    annotated = by_id(read_records(annotate_run[0]))
    for pair in pairs:
        assert set(PAIR_FIELDS) <= set(pair)
        assert pair["chosen_reward"] > pair["rejected_reward"]
        assert pair["num_ref_rewards"] == N
        texts = [c["text"] for c in annotated[pair["id"]]["completions"]]
        assert pair["chosen"] in texts and pair["rejected"] in texts
    for skip in skipped:
        assert skip["reason"]


def test_logprobs_adds_reference_columns_to_every_pair(logprobs_run, pairs_run):
    out, printed = logprobs_run
    assert f"[align logprobs] wrote {out}" in printed
    info = marker(out, "logprobs")
    pairs = by_id(read_records(pairs_run[0] / "pairs.jsonl"))
    rows = by_id(read_records(out))
    assert set(rows) == set(pairs) and info["summary"]["rows"] == len(pairs)
    for rid, row in rows.items():
        assert set(REF_LOGP_FIELDS) <= set(row)
        assert row["chosen"] == pairs[rid]["chosen"]
        for name in ("chosen", "rejected"):
            assert math.isfinite(row[f"ref_{name}_logps"]) and row[f"ref_{name}_logps"] < 0
            assert row[f"{name}_length"] >= 1  # end-of-turn counts


def test_train_qrpo_moves_the_weights(train_run, sft_run):
    from transformers import AutoModelForCausalLM

    out, printed = train_run
    assert f"[align train] wrote {out}" in printed
    info = marker(out, "train")
    assert info["summary"]["loss_type"] == "qrpo" and info["summary"]["steps"] == 4
    assert math.isfinite(info["summary"]["train_loss"])
    before = AutoModelForCausalLM.from_pretrained(sft_run[0]).state_dict()
    after = AutoModelForCausalLM.from_pretrained(out).state_dict()
    assert before.keys() == after.keys()
    assert any(not (before[k] == after[k]).all() for k in before)


def test_annotate_reward_model_gives_raw_logits(stage_root, sample_run, stage_models):
    out = stage_root / "annotate_rm"
    printed = run_cli(["annotate", TINY_RECIPE, f"input={sample_run[0]}", f"output_dir={out}",
                       "provider=reward_model", f"model={stage_models['reward_model']}", "device=cpu",
                       "max_length=512"])
    assert f"[align annotate] wrote {out}" in printed
    info = marker(out, "annotate")
    rows = read_records(out)
    assert {r["id"] for r in rows} == PROMPT_IDS
    values = [v for r in rows for v in r["rewards"]]
    empty = sum(not c["text"].strip() for r in rows for c in r["completions"])
    # an empty completion gets its prompt's lowest score (with the reason in reward_details)
    assert info["summary"] == {"records": 24, "provider": "reward_model", "scored": 24 * N, "skipped": 0,
                               "empty_completions": empty, "truncated_inputs": 0}
    scored = [v for v in values if v is not None]
    assert all(math.isfinite(v) for v in scored)
    assert len(set(scored)) > 1  # raw logits of different texts, not a constant


def test_annotate_judge_on_a_tiny_policy(stage_root, sample_run, sft_run):
    charter = stage_root / "charter.md"
    charter.write_text(
        "# Test charter\n\n"
        "## 1. Answers\n[1.1] Answer the question that was asked.\n[1.2] Keep short answers short.\n\n"
        "## 2. Honesty\n[2.1] Do not state guesses as facts.\n"
    )
    out = stage_root / "annotate_judge"
    printed = run_cli(["annotate", TINY_RECIPE, f"input={sample_run[0]}", f"output_dir={out}",
                       "provider=judge", "backend=transformers", f"model={sft_run[0]}", f"charter={charter}",
                       "scale=[1,9]", "top_k_pairwise=3", "device=cpu"])
    assert f"[align annotate] wrote {out}" in printed
    marker(out, "annotate")
    rows = read_records(out)
    assert {r["id"] for r in rows} == PROMPT_IDS
    for row in rows:
        assert row["reward_provider"] == "constitutional_judge"
        scored = [(v, d) for v, d in zip(row["rewards"], row["reward_details"]) if v is not None]
        for value, details in [(v, d) for v, d in scored if "empty_completion" in d]:
            assert value == 1.0  # an empty completion gets the scale minimum, never ranked pairwise
        scored = [(v, d) for v, d in scored if "empty_completion" not in d]
        for value, details in scored:
            assert 1.0 <= value <= 9.0 and 1.0 <= details["pointwise"] <= 9.0
        ranks = sorted(d["pairwise_rank"] for _, d in scored if "pairwise_rank" in d)
        if len(scored) >= 2:  # the best 3 (or all scored, if fewer) ranked pairwise
            assert ranks == list(range(1, min(3, len(scored)) + 1)), row["id"]


def test_annotate_classifier_records_failures_instead_of_guessing(stage_root, sft_run):
    out = stage_root / "annotate_classifier"
    printed = run_cli(["annotate", TINY_RECIPE, f"input={TINY_DATA / 'prompts.jsonl'}", f"output_dir={out}",
                       "provider=classifier", "backend=transformers", f"model={sft_run[0]}", "max_attempts=2",
                       "max_tokens=12", "device=cpu"])
    assert f"[align annotate] wrote {out}" in printed
    info = marker(out, "annotate")
    rows = read_records(out)
    assert {r["id"] for r in rows} == PROMPT_IDS
    # a tiny policy trained to say "yes"/"no" never writes the JSON verdict: every prompt
    # is recorded as failed, with each raw answer, and none is given a label
    assert info["summary"] == {"records": 24, "provider": "classifier", "controversial": 0, "failed": 24}
    for row in rows:
        assert row["controversy_label"] is None and row["controversial"] is None
        assert row["controversy_attempts"] == 2 and len(row["controversy_raw"]) == 2
        assert row["controversy_error"]


def test_annotate_refuses_an_unfinished_input(stage_root, sample_run):
    import shutil

    unfinished = stage_root / "sample_unfinished"
    shutil.copytree(sample_run[0], unfinished)
    (unfinished / "_COMPLETE.json").unlink()
    with pytest.raises(ValueError, match="sample_unfinished.*unfinished stage output"):
        run_cli(["annotate", TINY_RECIPE, f"input={unfinished}", f"output_dir={stage_root / 'never'}"])
    assert not (stage_root / "never").exists()


def test_logprobs_refuses_a_dataset_without_rows(stage_root, sft_run):
    empty = stage_root / "no_pairs.jsonl"  # what the pairs stage writes when no prompt gave a pair
    empty.write_text("")
    with pytest.raises(ValueError, match="no_pairs.jsonl.*holds no rows"):
        run_cli(["logprobs", TINY_RECIPE, f"model_name_or_path={sft_run[0]}", f"input={empty}",
                 f"output_dir={stage_root / 'logprobs_empty'}"])


def test_stages_refuse_directories_that_mix_kinds_of_rows(stage_root, pairs_run, sft_run):
    """A pairs output holds pairs.jsonl and skipped.jsonl: the file must be named."""
    for stage, key in (("logprobs", "input"), ("train", "input")):
        with pytest.raises(ValueError, match=f"{key}=.*pairs.jsonl"):
            run_cli([stage, TINY_RECIPE, f"model_name_or_path={sft_run[0]}", f"{key}={pairs_run[0]}",
                     f"output_dir={stage_root / ('refused_' + stage)}"])
        assert not (stage_root / ("refused_" + stage)).exists()


def test_decontaminate_via_python_dash_m(tmp_path):
    question = "Natalia sold clips to 48 of her friends in April and then half as many in May, how many in all?"
    bench = tmp_path / "bench.jsonl"
    bench.write_text(json.dumps({"question": question, "key": "b0"}) + "\n"
                     + json.dumps({"question": "Name the largest planet of the solar system, please.", "key": "b1"})
                     + "\n")
    train = tmp_path / "train.jsonl"
    rows = [
        {"id": "copied", "messages": [{"role": "user", "content": "Please solve: " + question},
                                      {"role": "assistant", "content": "72"}]},
        {"id": "clean", "messages": [{"role": "user", "content": "Is 14 an even number? Answer yes or no."},
                                     {"role": "assistant", "content": "yes"}]},
        {"id": "clean2", "messages": [{"role": "user", "content": "Write a haiku about autumn rain on a roof."},
                                      {"role": "assistant", "content": "..."}]},
    ]
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = tmp_path / "decontaminate.yaml"
    out = tmp_path / "decon"
    recipe.write_text(f"input: {train}\noutput_dir: {out}\nnum_workers: 1\nprogress: false\n"
                      f"benchmarks:\n  - {{name: bench, path: {bench}, text_field: question, id_field: key}}\n")
    done = subprocess.run([sys.executable, "-m", "align", "decontaminate", str(recipe)], check=False, capture_output=True,
                          text=True, env=subprocess_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"[align decontaminate] wrote {out}" in done.stdout
    marker(out, "decontaminate")
    assert [r["id"] for r in read_records(out / "kept.jsonl")] == ["clean", "clean2"]
    removed = read_records(out / "removed.jsonl")
    assert [r["id"] for r in removed] == ["copied"]
    assert "b0" in json.dumps(removed[0])  # names the benchmark item it matched
    # the output directory holds removed rows too: SFT on it must name kept.jsonl
    with pytest.raises(ValueError, match=r"input=.*kept\.jsonl"):
        run_cli(["sft", TINY_RECIPE, f"input={out}", f"output_dir={tmp_path / 'sft'}"])
