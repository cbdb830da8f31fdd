"""`align demo reward=graded` end to end with the quick CI preset (fewer examples, prompts and steps), in two rounds.

The preset checks that every stage runs on the graded reward, that both measures (exact
accuracy and the graded reward) are reported for the same answers, that QRPO and DPO each
start from a grid of the same size (3 betas x 3 learning rates, the defaults' grids, over 8
steps a point, grown past an edge by the same rule) and
chosen on validation prompts that are none of the held-out prompts, and that the report is
complete and well formed; it is too small to show a reliable gain, so no test asserts one
(nor any timing, nor which method wins). The statistics themselves are tested on fixed data
in tests/eval/, the sweep on the tiny model in tests/test_sweep.py. One run with ``rounds=2``
covers round 1 (the default demo) and a later round."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# The trained policies the held-out evaluation compares with SFT: round 1's chosen points and round 2's.
POLICIES = ("qrpo", "dpo", "qrpo-round-2", "dpo-round-2")
COMMAND = ("preset=ci", "rounds=2", "reward=graded")


@pytest.fixture(scope="module")
def demo_report(tmp_path_factory) -> tuple[Path, dict, str]:
    out = tmp_path_factory.mktemp("demo")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "align", "demo", *COMMAND, f"output_dir={out}"],
        capture_output=True, text=True, env=env, timeout=1500, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, json.loads((out / "report.json").read_text()), proc.stdout


def _without_timings(value):
    if isinstance(value, dict):
        return {k: _without_timings(v) for k, v in value.items() if not (k == "seconds" or k.endswith("_seconds"))}
    if isinstance(value, list):
        return [_without_timings(v) for v in value]
    return value


def _comparable(report: dict, out: Path) -> str:
    """The report as it must repeat: its timings (at any depth) left out, its own directory spelled <out>."""
    return json.dumps(_without_timings(report), sort_keys=True).replace(str(out), "<out>")


def test_the_same_command_gives_the_same_report(demo_report, tmp_path):
    """What the README relies on: the demo run again, in the same environment, reports the same
    figures to the last digit (the thread count is fixed and the kernels pinned: report.json's
    environment names them)."""
    out, first, _ = demo_report
    again = tmp_path / "again"
    proc = subprocess.run(
        [sys.executable, "-m", "align", "demo", *COMMAND, f"output_dir={again}"],
        capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}, timeout=1500, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    second = json.loads((again / "report.json").read_text())
    assert _comparable(second, again) == _comparable(first, out)
    environment = first["environment"]
    assert environment["torch_threads"] == 2 and environment["versions"]["torch"]
    assert set(environment) >= {"cpu", "blas", "torch_cpu_capability", "pinned_kernels", "python"}
    if "avx2" in environment["cpu_vector_flags"]:  # x86 with AVX2: the kernels every such CPU runs
        from align.demo.environment import PINNED_KERNELS

        assert environment["pinned_kernels"] == PINNED_KERNELS and environment["torch_cpu_capability"] == "AVX2"


def _interval(value: dict) -> None:
    assert set(value) >= {"estimate", "low", "high", "n"}
    assert value["low"] <= value["estimate"] <= value["high"]


def _other_choices(report: dict) -> list[str]:
    """The points the graded reward alone would have chosen where they differ from the chosen ones."""
    return [f"{m}_by_{o['by']}" for m, o in report["other_choice"].items() if not o["same_as_chosen"]]


def test_demo_runs_every_stage_and_reports_numbers(demo_report):
    out, report, stdout = demo_report
    for stage in ("SFT", "sample references", "annotate (reward)", "judge (tiny model, path check)",
                  "pairs", "reference log-probs", "QRPO sweep", "DPO sweep", "round 2", "evaluate (align.evaluate)"):
        assert stage in report["seconds"], stage
    assert report["pairs"] > 0 and report["sft_steps"] > 0 and report["steps"] == {"qrpo": 8, "dpo": 8}
    assert report["judge"]["scored"] > 0
    others = _other_choices(report)
    assert set(report["accuracy"]) == {"sft", *POLICIES, *others} and set(report["gains"]) == {*POLICIES, *others}
    assert set(report["accuracy_other_choices"]) == set(others)
    for name in others:  # a chosen point against the one the graded reward alone would have chosen, paired
        method = name.split("_by_")[0]
        delta = report["accuracy"][method]["sampled"]["estimate"] - report["accuracy"][name]["sampled"]["estimate"]
        assert report["accuracy_other_choices"][name]["sampled"]["estimate"] == pytest.approx(delta)
    for name, values in report["accuracy"].items():
        for kind in ("sampled", "greedy"):
            _interval(values[kind])
            assert 0.0 <= values[kind]["low"] and values[kind]["high"] <= 1.0
            assert values[kind]["n"] == report["held_out_prompts"] == 100
        if name != "sft":
            _interval(values["kl"])
    for name, gain in report["gains"].items():
        _interval(gain["sampled"])
        delta = report["accuracy"][name]["sampled"]["estimate"] - report["accuracy"]["sft"]["sampled"]["estimate"]
        assert gain["sampled"]["estimate"] == pytest.approx(delta)
        assert gain["verdicts"][0].startswith(f"{name} − sft, mean sampled reward")
        assert report["improved"][name] == (gain["sampled"]["low"] > 0)
    head = report["qrpo_vs_dpo"]
    for kind in ("sampled", "greedy"):
        _interval(head[kind])
        delta = report["accuracy"]["qrpo"][kind]["estimate"] - report["accuracy"]["dpo"][kind]["estimate"]
        assert head[kind]["estimate"] == pytest.approx(delta)  # paired over the same prompts
    assert head["verdicts"][0].startswith("qrpo − dpo, mean sampled reward")
    assert not any("decline" in v or "improvement" in v for v in head["verdicts"]), head["verdicts"]
    assert "sampled accuracy (T=1)" in stdout and "QRPO - DPO" in stdout and "QRPO:" in stdout and "Report:" in stdout


def test_demo_writes_the_evaluation_and_readable_plots(demo_report):
    out, report, _ = demo_report
    for name in ("eval.jsonl", "report.json", "report.md"):
        assert (out / "evaluate" / name).stat().st_size > 0
    rows = [json.loads(line) for line in (out / "evaluate" / "eval.jsonl").read_text().splitlines()]
    assert len(rows) == 100 and set(rows[0]["policies"]) == {"sft", *POLICIES, *_other_choices(report)}
    assert len(report["plots"]) == 6 and {"validation_grid.png", "reward_vs_accuracy.png"} <= set(report["plots"])
    for name in report["plots"]:
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name


def test_report_describes_the_pairs(demo_report):
    _, report, _ = demo_report
    assert report["config"]["preset"] == "ci"
    assert 0 <= report["pair_fallbacks"] <= report["pairs"]
    assert sum(report["pair_fallback_kinds"].values()) == report["pair_fallbacks"]
    if report["pair_fallbacks"]:
        assert f"{report['pair_fallbacks']} of the {report['pairs']} pairs are fallbacks (" in demo_report[2]
        assert "every pair still prefers the higher reward" in demo_report[2]
    assert 0.0 <= report["mean_rejected_quantile"] < report["mean_chosen_quantile"] <= 1.0


def test_the_fallback_note_counts_each_kind_most_common_first():
    from align.demo.report import fallback_note

    note = fallback_note(5, 9, {"rejected:middle": 1, "chosen:middle": 4})
    assert note.startswith("(5 of the 9 pairs are fallbacks (4 chosen:middle, 1 rejected:middle): ")


def test_both_methods_are_tuned_on_grids_of_the_same_size_and_chosen_by_validation(demo_report):
    out, report, _ = demo_report
    grids, search = report["grids"], report["search"]
    assert [search["qrpo"]["start_grid"], search["dpo"]["start_grid"]] == [
        {"beta": [0.25, 1.0, 4.0], "learning_rate": [3e-05, 1e-04, 3e-04]},
        {"beta": [4.0, 16.0, 64.0], "learning_rate": [3e-05, 1e-04, 3e-04]}]
    points = {}
    for name in ("qrpo", "dpo"):
        added = search[name]["added"]
        assert len(added) <= 2  # search_points: the same for both methods
        points[name] = 9 + len(added)
        trained = [p["settings"] for p in report["sweeps"][name]["points"]]
        assert trained[9:] == added and all(a in trained for a in added)
        for key in ("beta", "learning_rate"):  # the grid reported: each key's values trained
            assert grids[name][key] == sorted({s[key] for s in trained})
        if len(added) < 2:  # the search stopped on its own: every neighbour of the chosen point was trained
            assert search[name]["untrained_neighbours"] == []
            assert report["chosen_at_grid_edge"][name] == {"beta": False, "learning_rate": False}
    assert report["tuning"] == {"metric": "reward_sampled", "steps_per_point": 8, "batch_pairs": 16,
                                "points_per_method": points}
    for name in ("qrpo", "dpo"):
        sweep = report["sweeps"][name]
        assert sweep == json.loads((out / name / "sweep.json").read_text())
        assert len(sweep["points"]) == points[name] and {p["steps"] for p in sweep["points"]} == {8}
        assert all(p["settings"]["beta"] in grids[name]["beta"] for p in sweep["points"])
        scores = [p["score"] for p in sweep["points"]]
        assert None not in scores and sweep["chosen"]["score"] == max(scores)
        # chosen on exact accuracy (the goal) while trained on the graded reward, which is reported beside
        assert sweep["select_on"] == "exact" and report["select_on"][name] == "exact"
        assert scores == [p["measures"]["exact"]["metrics"]["reward_sampled"]["estimate"] for p in sweep["points"]]
        by_reward = [p["reward_score"] for p in sweep["points"]]
        assert by_reward == [p["metrics"]["reward_sampled"]["estimate"] for p in sweep["points"]]
        assert sweep["reward_would_choose"]["name"] == sweep["points"][by_reward.index(max(by_reward))]["name"]
        assert report["other_choice"][name] == {"by": "reward", "settings": sweep["reward_would_choose"]["settings"],
                                                "same_as_chosen": sweep["reward_would_choose"]["name"]
                                                == sweep["chosen"]["name"]}
        assert sweep["chosen"]["name"] == sweep["points"][scores.index(max(scores))]["name"]
        assert report["chosen"][name] == sweep["chosen"]["settings"]
        for point in sweep["points"]:  # each scored on every validation prompt, beside the SFT model
            assert point["metrics"]["reward_sampled"]["n"] == report["validation_prompts"] == 100
            assert point["start"] == sweep["start"]
    assert (out / "validation_grid.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_points_are_chosen_on_validation_prompts_and_none_of_them_is_held_out(demo_report):
    out, report, _ = demo_report
    validation = [json.loads(line) for line in (out / "data" / "validation.jsonl").read_text().splitlines()]
    held_out = [json.loads(line) for line in (out / "data" / "held_out.jsonl").read_text().splitlines()]
    validation_ids, held_out_ids = {r["id"] for r in validation}, {r["id"] for r in held_out}
    assert len(validation_ids) == report["validation_prompts"] and len(held_out_ids) == report["held_out_prompts"]
    assert not validation_ids & held_out_ids
    assert not {r["answer"] + r["messages"][-1]["content"] for r in validation} & \
        {r["answer"] + r["messages"][-1]["content"] for r in held_out}  # not the same problem under another id
    for name in ("qrpo", "dpo"):
        for point in report["sweeps"][name]["points"]:
            scored = {json.loads(line)["id"] for line in (Path(point["validation_dir"]) / "eval.jsonl").read_text()
                      .splitlines()}
            assert scored == validation_ids, point["name"]
    evaluated = {json.loads(line)["id"] for line in (out / "evaluate" / "eval.jsonl").read_text().splitlines()}
    assert evaluated == held_out_ids


def test_round_two_starts_from_round_one_and_is_compared_with_it(demo_report):
    out, report, stdout = demo_report
    assert report["rounds"] == 2 and set(report["later_rounds"]) == {"qrpo", "dpo"}
    for method in ("qrpo", "dpo"):
        (later,) = report["later_rounds"][method]
        assert later["round"] == 2 and later["against"] == method
        assert later["start"] == report["sweeps"][method]["chosen"]["model_dir"]  # π_1: round 1's chosen point
        assert later["trained"] and later["settings"] == report["chosen"][method] and later["steps"] == 8
        assert later["policy"] == str(out / "round-2" / method / "train" / "points" /
                                      report["sweeps"][method]["chosen"]["name"])
        pairs = [json.loads(line) for line in (out / "round-2" / method / "pairs" / "pairs.jsonl").read_text()
                 .splitlines()]
        assert len(pairs) == later["pairs"] > 0
        prompts = {json.loads(line)["id"] for line in (out / "data" / "prompts.jsonl").read_text().splitlines()}
        assert {p["id"] for p in pairs} <= prompts  # the training prompts, none of the held-out ones
        job = json.loads((out / "round-2" / method / "sample" / "_job.json").read_text())
        assert job["model"] == f"demo-{method}" and job["n"] == report["config"]["n"]  # drawn from π_1
        for kind in ("sampled", "greedy"):  # paired over the same prompts and samples
            _interval(later[kind])
            delta = (report["accuracy"][f"{method}-round-2"][kind]["estimate"]
                     - report["accuracy"][method][kind]["estimate"])
            assert later[kind]["estimate"] == pytest.approx(delta)
        assert later["verdicts"][0].startswith(f"{method}-round-2 − {method}, mean sampled reward")
        assert f"{method.upper()} round 2 - 1" in stdout
    assert json.loads((out / "_demo.json").read_text())["outputs"][-1] == "round-2"


def test_both_measures_are_reported_for_the_same_answers(demo_report):
    """Exact accuracy recomputed by hand from eval.jsonl's texts, and the graded reward read from
    its scores (the run's reward), equal the report's figures; the reward's agreement with
    accuracy on the SFT samples and each point's checks along training are there."""
    out, report, stdout = demo_report
    assert report["reward"] == "graded"
    rows = [json.loads(line) for line in (out / "evaluate" / "eval.jsonl").read_text().splitlines()]
    answers = {json.loads(line)["id"]: json.loads(line)["answer"]
               for line in (out / "data" / "held_out.jsonl").read_text().splitlines()}
    for name in ("sft", *POLICIES):
        right = [sum(s["text"].strip() == answers[r["id"]] for s in r["policies"][name]["samples"])
                 / len(r["policies"][name]["samples"]) for r in rows]
        assert report["accuracy"][name]["sampled"]["estimate"] == pytest.approx(sum(right) / len(right))
        graded = [sum(s["score"] for s in r["policies"][name]["samples"]) / len(r["policies"][name]["samples"])
                  for r in rows]
        assert report["graded_reward"]["policies"][name]["sampled"]["estimate"] == pytest.approx(
            sum(graded) / len(graded))
        assert report["graded_reward"]["policies"][name]["kl"] == report["accuracy"][name]["kl"]
    head = report["graded_reward"]["qrpo_vs_dpo"]["sampled"]["estimate"]
    assert head == pytest.approx(report["graded_reward"]["policies"]["qrpo"]["sampled"]["estimate"]
                                 - report["graded_reward"]["policies"]["dpo"]["sampled"]["estimate"])
    assert set(report["graded_reward"]["later_rounds"]) == {"qrpo", "dpo"}
    agreement = report["reward_agreement"]
    assert agreement["samples"] == report["prompts"] * report["config"]["n"]
    assert -1.0 <= agreement["pearson"] <= 1.0 and 0.0 <= agreement["pair_order"] <= 1.0
    for name in ("qrpo", "dpo"):
        along = report["along_training"][name]
        assert len(along) == report["tuning"]["points_per_method"][name] and sum(p["chosen"] for p in along) == 1
        for point in along:  # the start and every 2 of the 8 steps (along_training_checks=4)
            assert [c["step"] for c in point["checks"]] == [0, 2, 4, 6, 8]
            assert all(0.0 <= c["exact"] <= 1.0 for c in point["checks"])
        starts = {json.dumps(p["checks"][0], sort_keys=True) for p in along}
        assert len(starts) == 1  # every point starts from the same SFT answers
        over = report["over_optimisation"][name]
        assert over["change"]["exact"] == pytest.approx(over["end"]["exact"] - over["start"]["exact"])
    held = {json.loads(line)["id"]: len(json.loads(line)["messages"][-1]["content"])
            for line in (out / "data" / "held_out.jsonl").read_text().splitlines()}
    for name in ("sft", *POLICIES):  # the length bias's exploit, counted by hand
        texts = [(r["id"], s["text"]) for r in rows for s in r["policies"][name]["samples"]]
        longer = sum(sum(c in "0123456789" for c in t) > held[i] for i, t in texts) / len(texts)
        assert report["answer_digits"][name]["longer"] == pytest.approx(longer)
    assert "Held-out answers with more digits than the prompt" in stdout
    assert "The same answers under the graded reward (the proxy):" in stdout and "QRPO grid (" in stdout and "added by the search): beta " in stdout
