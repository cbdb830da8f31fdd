"""`align.evaluate` and `align evaluate` on tiny models: outputs, comparisons, resume, bad input."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from align.data.records import RecordError
from align.eval.evaluate import EvalPolicy, EvalSettings, evaluate
from align.eval.report import PLOTS

REPO = Path(__file__).resolve().parents[2]
DATE = "2026-01-01"
SETTINGS = {"n": 3, "max_tokens": 6, "resamples": 300, "batch_size": 4}

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # the samplers run in these tests


def prompts(count: int = 8) -> list[dict]:
    return [{"id": f"p{i:02d}", "messages": [{"role": "user", "content": f"what is {i} + 1"}],
             "answer": str(i + 1), "language": "en" if i % 2 else "de", "category": "math"} for i in range(count)]


@pytest.fixture(scope="module")
def samplers():
    from align.sampling.hf import TransformersSampler
    from align.testing.tiny import build_causal_lm, build_tokenizer

    tokenizer = build_tokenizer()
    return {name: TransformersSampler(build_causal_lm(tokenizer, seed=seed), tokenizer, chat_date=DATE, model_name=name)
            for name, seed in (("sft", 0), ("qrpo", 1))}


class OracleVerifier:
    """A verifiable reward that knows the answer is "right" when the text has an even length.

    Deterministic and readable, so win rates can be counted by hand from eval.jsonl.
    """

    name = "length_parity"
    reference_field = None

    def score_groups(self, conversations, groups, *, references=None):
        from rewards.base import Score

        return [[Score(float(len(text) % 2 == 0)) for text in group] for group in groups]

    def fingerprint(self):
        return {"provider": self.name}


class PositionBiasedJudge(OracleVerifier):
    """A 'judge' that prefers the longer text; for texts of equal length the two orders disagree."""

    name = "fake_judge"

    def compare_pairs(self, pairs):
        from rewards.pairwise import Comparison

        out = []
        for _, first, second in pairs:
            if len(first) == len(second):
                out.append(Comparison(0.5, 0.9, 0.1, False))  # each order prefers what it shows first
            else:
                p = 1.0 if len(first) > len(second) else 0.0
                out.append(Comparison(p, p, p, True))
        return out


def test_evaluate_writes_every_output_with_intervals(samplers, tmp_path):
    from rewards.verifiable import VerifiableReward

    policies = [EvalPolicy(name, sampler=s) for name, s in samplers.items()]
    report = evaluate(prompts(), policies, VerifiableReward(), tmp_path, baseline="sft",
                      settings=EvalSettings(**SETTINGS))
    for name in ("eval.jsonl", "report.json", "report.md", *PLOTS):
        assert (tmp_path / name).stat().st_size > 0, name
    rows = [json.loads(line) for line in (tmp_path / "eval.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == [p["id"] for p in prompts()]
    for row in rows:
        assert set(row["policies"]) == {"sft", "qrpo"}
        assert len(row["policies"]["qrpo"]["samples"]) == 3 and "greedy" in row["policies"]["qrpo"]
        assert len(row["policies"]["qrpo"]["kl_logratios"]) == 3
    overall = report["overall"]
    for name in ("sft", "qrpo"):
        for key in ("reward_greedy", "reward_sampled", "length"):
            ci = overall["policies"][name][key]
            assert ci["low"] <= ci["estimate"] <= ci["high"] and ci["n"] == 8
    assert "kl" in overall["policies"]["qrpo"] and "kl" not in overall["policies"]["sft"]
    comparison = overall["comparisons"]["qrpo"]
    assert comparison["win_rate_reward_sampled"]["comparisons"] + comparison["win_rate_reward_sampled"]["missing"] == 24
    assert set(comparison["win_rate_reward_by_length"]) == {"shorter", "same", "longer"}
    assert len(comparison["verdicts"]) == 4
    assert set(report["breakdowns"]["language"]) == {"de", "en"}
    assert report["breakdowns"]["language"]["en"]["policies"]["qrpo"]["prompts"] == 4
    markdown = (tmp_path / "report.md").read_text()
    assert "| qrpo |" in markdown and "## language: de" in markdown and "## category: math" in markdown
    assert json.loads((tmp_path / "report.json").read_text())["plots"] == list(PLOTS)


def test_win_rates_and_order_agreement_match_a_hand_count(samplers, tmp_path):
    policies = [EvalPolicy(name, sampler=s) for name, s in samplers.items()]
    report = evaluate(prompts(), policies, PositionBiasedJudge(), tmp_path, baseline="sft",
                      settings=EvalSettings(**SETTINGS, pairwise_samples=2, kl=False))
    rows = [json.loads(line) for line in (tmp_path / "eval.jsonl").read_text().splitlines()]
    wins = ties = losses = agree = judged = 0
    reward_points = []
    for row in rows:
        mine, theirs = row["policies"]["qrpo"], row["policies"]["sft"]
        for a, b in zip(mine["samples"][:2], theirs["samples"][:2]):
            judged += 1
            if len(a["text"]) == len(b["text"]):
                ties += 1
            else:
                agree += 1
                wins += len(a["text"]) > len(b["text"])
                losses += len(a["text"]) < len(b["text"])
        for a, b in zip(mine["samples"], theirs["samples"]):
            reward_points.append(1.0 if a["score"] > b["score"] else 0.5 if a["score"] == b["score"] else 0.0)
    comparison = report["overall"]["comparisons"]["qrpo"]
    judge = comparison["win_rate_judge_sampled"]
    assert (judge["wins"], judge["ties"], judge["losses"]) == (wins, ties, losses)
    assert judge["rate"]["estimate"] == pytest.approx((wins + ties / 2) / judged)
    assert comparison["judge_orders_agree_sampled"] == pytest.approx(agree / judged)
    assert comparison["win_rate_reward_sampled"]["rate"]["estimate"] == pytest.approx(sum(reward_points) / len(reward_points))


def test_completions_given_in_place_of_a_policy(samplers, tmp_path):
    given = [{"id": p["id"], "messages": p["messages"],
              "completions": [{"text": p["answer"], "num_tokens": 2, "finish_reason": "stop"}] * SETTINGS["n"]}
             for p in prompts()]
    from rewards.verifiable import VerifiableReward

    policies = [EvalPolicy("sft", sampler=samplers["sft"]), EvalPolicy("oracle", completions=given)]
    report = evaluate(prompts(), policies, VerifiableReward(), tmp_path, baseline="sft",
                      settings=EvalSettings(**SETTINGS))
    oracle = report["overall"]["policies"]["oracle"]
    assert oracle["reward_sampled"]["estimate"] == 1.0 and oracle["reward_greedy"] is None
    assert "oracle" in report["kl_notes"]


def test_bad_inputs_are_named(samplers, tmp_path):
    from rewards.verifiable import VerifiableReward

    policies = [EvalPolicy(name, sampler=s) for name, s in samplers.items()]
    bad = prompts()
    bad[3]["messages"].append({"role": "assistant", "content": "4"})
    with pytest.raises(RecordError, match=r"record 'p03': field 'messages'.*prompts, row 3"):
        evaluate(bad, policies, VerifiableReward(), tmp_path, baseline="sft", settings=EvalSettings(**SETTINGS))
    bad = prompts()
    del bad[5]["answer"]
    with pytest.raises(RecordError, match=r"record 'p05': field 'answer'.*row 5"):
        evaluate(bad, policies, VerifiableReward(), tmp_path, baseline="sft", settings=EvalSettings(**SETTINGS))
    twice = [EvalPolicy("sft", sampler=samplers["sft"]), EvalPolicy("sft", sampler=samplers["qrpo"])]
    with pytest.raises(ValueError, match="'sft' is used twice"):
        evaluate(prompts(), twice, VerifiableReward(), tmp_path, baseline="sft", settings=EvalSettings(**SETTINGS))
    with pytest.raises(ValueError, match="baseline: 'base' is not one of"):
        evaluate(prompts(), policies, VerifiableReward(), tmp_path, baseline="base", settings=EvalSettings(**SETTINGS))
    missing = [{"id": "p00", "completions": [{"text": "1"}]}]
    with pytest.raises(RecordError, match="record 'p01': field 'completions': no completions"):
        evaluate(prompts(), [policies[0], EvalPolicy("given", completions=missing)], VerifiableReward(), tmp_path,
                 baseline="sft", settings=EvalSettings(**SETTINGS))


# --------------------------------------------------------------------------- the CLI stage


@pytest.fixture(scope="module")
def stage_inputs(tmp_path_factory):
    from align.io import write_jsonl
    from align.testing.tiny import build_causal_lm, build_tokenizer

    root = tmp_path_factory.mktemp("evaluate_stage")
    tokenizer = build_tokenizer()
    for name, seed in (("sft", 0), ("qrpo", 1)):
        build_causal_lm(tokenizer, seed=seed).save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    write_jsonl(root / "prompts.jsonl", prompts(24))
    recipe = root / "evaluate.yaml"
    recipe.write_text(
        f"prompts: {root / 'prompts.jsonl'}\nbaseline: sft\n"
        f"policies:\n  - {{name: sft, model: {root / 'sft'}}}\n  - {{name: qrpo, model: {root / 'qrpo'}}}\n"
        f"sampler: {{backend: transformers, chat_date: '{DATE}', batch_size: 8}}\n"
        "reward: {provider: verifiable}\nn: 2\nmax_tokens: 6\nresamples: 200\nbatch_size: 1\n")
    return root, recipe


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE"))}
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", TRANSFORMERS_VERBOSITY="error",
               PYTHONUNBUFFERED="1")
    return env


def _align(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "align", *args], env=_env(), capture_output=True, text=True, check=False,
                          timeout=300, **kwargs)


def _outputs(out: Path) -> tuple[str, dict]:
    report = json.loads((out / "report.json").read_text())
    return (out / "eval.jsonl").read_text(), report


def test_killed_evaluation_resumes_to_the_same_output(stage_inputs, tmp_path):
    _root, recipe = stage_inputs
    once = _align("evaluate", str(recipe), f"output_dir={tmp_path / 'once'}")
    assert once.returncode == 0, once.stderr[-3000:]
    assert "[align evaluate] qrpo − sft, mean sampled reward" in once.stdout

    out = tmp_path / "killed"
    shard = out / "generations" / "qrpo" / "shard-00000-of-00001.jsonl"
    first = subprocess.Popen([sys.executable, "-m", "align", "evaluate", str(recipe), f"output_dir={out}"],
                             env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while first.poll() is None and time.monotonic() < deadline:
            if shard.exists() and shard.read_bytes().count(b"\n") >= 2:
                break
            time.sleep(0.01)
        os.killpg(first.pid, signal.SIGKILL)
    finally:
        first.wait(timeout=60)
    assert first.returncode == -signal.SIGKILL
    written = shard.read_bytes().count(b"\n")
    assert 2 <= written < 24, f"the kill should land inside the second policy's generation ({written} of 24)"
    assert not (out / "report.json").exists()
    again = _align("evaluate", str(recipe), f"output_dir={out}")
    assert again.returncode == 0, again.stderr[-3000:]
    rows_once, report_once = _outputs(tmp_path / "once")
    rows_again, report_again = _outputs(out)
    assert rows_again == rows_once
    assert report_again == report_once
    ids = [json.loads(line)["id"] for line in shard.read_text().splitlines()]
    assert sorted(ids) == sorted(p["id"] for p in prompts(24))  # each prompt once: none lost, none twice


def test_stage_errors_name_the_bad_setting(stage_inputs, tmp_path):
    root, recipe = stage_inputs
    result = _align("evaluate", str(recipe), f"output_dir={tmp_path}",
                    f"policies=[{{name: sft, model: {root / 'sft'}}}, {{name: qrpo, model: {root / 'nope'}}}]")
    assert result.returncode != 0
    assert "policies[1] ('qrpo'): model=" in result.stderr and "does not exist" in result.stderr
    result = _align("evaluate", str(recipe), f"output_dir={tmp_path}",
                    f"policies=[{{name: sft, model: {root / 'sft'}}}, {{name: sft, model: {root / 'qrpo'}}}]")
    assert result.returncode != 0 and "'sft' is used twice" in result.stderr


# --------------------------------------------------------------------------- the gain interval is paired over prompts


def _shared_difficulty_completions(count: int, n: int, seed: int = 0) -> tuple[list[dict], dict[str, list[dict]]]:
    """Prompts whose difficulty both policies share, so per-prompt accuracy spans 0 to 1 for both,
    while the tuned policy gets at most one more of its n samples right on each prompt. Paired
    over prompts the gain is small with a narrow interval; resampled apart, the spread of
    difficulty dominates and the interval is wide."""
    rng = random.Random(seed)
    prompt_rows, given = [], {"base": [], "tuned": []}
    for i in range(count):
        answer = str(100 + i)
        prompt_rows.append({"id": f"q{i:02d}", "messages": [{"role": "user", "content": f"say {answer}"}],
                            "answer": answer})
        right = {"base": rng.randint(0, n)}
        right["tuned"] = min(n, right["base"] + rng.choice([0, 1]))
        for name, k in right.items():
            texts = [f"\\boxed{{{answer}}}"] * k + ["\\boxed{-1}"] * (n - k)
            rng.shuffle(texts)
            given[name].append({"id": f"q{i:02d}", "messages": prompt_rows[-1]["messages"],
                                "completions": [{"text": t, "num_tokens": 4, "finish_reason": "stop"} for t in texts]})
    return prompt_rows, given


def _percentile_interval(replicates: np.ndarray) -> tuple[float, float]:
    low, high = np.quantile(replicates, [0.025, 0.975])
    return float(low), float(high)


def test_gain_interval_of_align_evaluate_is_a_paired_bootstrap_over_prompts(tmp_path):
    """`align evaluate` on given completions: the report's sampled gain interval is recomputed from
    eval.jsonl with a paired bootstrap over prompts (the library's documented resampling: seeded
    numpy ``integers`` draws of prompt indices, percentile interval), and an unpaired bootstrap
    of the same rows gives a visibly wider interval, so a report with an unpaired interval fails."""
    from align.io import write_jsonl

    n, count, resamples, seed = 8, 60, 1000, 7
    prompt_rows, given = _shared_difficulty_completions(count, n)
    write_jsonl(tmp_path / "prompts.jsonl", prompt_rows)
    for name, rows in given.items():
        write_jsonl(tmp_path / f"{name}.jsonl", rows)
    recipe = tmp_path / "evaluate.yaml"
    recipe.write_text(
        f"prompts: {tmp_path / 'prompts.jsonl'}\nbaseline: base\n"
        f"policies:\n  - {{name: base, completions: {tmp_path / 'base.jsonl'}}}\n"
        f"  - {{name: tuned, completions: {tmp_path / 'tuned.jsonl'}}}\n"
        f"reward: {{provider: verifiable}}\nn: {n}\nkl: false\nplots: false\nresamples: {resamples}\nseed: {seed}\n")
    out = tmp_path / "out"
    done = _align("evaluate", str(recipe), f"output_dir={out}")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert (report["settings"]["resamples"], report["settings"]["seed"]) == (resamples, seed)
    gain = report["overall"]["comparisons"]["tuned"]["reward_difference_sampled"]

    # per prompt: each policy's mean sample score, read back from eval.jsonl
    rows = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == [p["id"] for p in prompt_rows]
    means = {name: np.array([np.mean([s["score"] for s in r["policies"][name]["samples"]]) for r in rows])
             for name in ("base", "tuned")}
    expected_means = {name: np.array([sum("\\boxed{-1}" not in c["text"] for c in g["completions"]) / n
                                      for g in given[name]]) for name in given}
    for name, values in means.items():  # the verifier scored what was built
        np.testing.assert_allclose(values, expected_means[name], atol=1e-12)
    deltas = means["tuned"] - means["base"]
    assert gain["n"] == count and gain["estimate"] == pytest.approx(deltas.mean(), abs=1e-12)

    # paired: one draw of prompt indices per resample, both policies' values move together
    draws = np.random.default_rng(seed).integers(0, count, size=(resamples, count))
    paired = _percentile_interval(deltas[draws].mean(axis=1))
    assert (gain["low"], gain["high"]) == pytest.approx(paired, abs=1e-12)

    # unpaired: each policy's prompts resampled on their own; on these rows far wider
    other = np.random.default_rng(seed + 1).integers(0, count, size=(resamples, count))
    unpaired = _percentile_interval(means["tuned"][draws].mean(axis=1) - means["base"][other].mean(axis=1))
    paired_width, unpaired_width = paired[1] - paired[0], unpaired[1] - unpaired[0]
    assert unpaired_width > 4 * paired_width, (paired, unpaired)
    assert gain["high"] - gain["low"] < 2 * paired_width < unpaired_width
    assert gain["low"] > 0  # paired, the gain is clear of zero; unpaired it would not be
    assert unpaired[0] < 0
