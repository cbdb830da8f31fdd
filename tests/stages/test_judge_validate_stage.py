"""`align judge-validate`: ladders, judge, report and verdicts from the command line."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from stage_helpers import run_cli

from align.io import stage_completion_info


def _load_module(path: Path):
    """A helper module of another test folder, loaded from its file (no sys.path change)."""
    spec = importlib.util.spec_from_file_location(f"_cases_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


records = _load_module(Path(__file__).resolve().parents[1] / "rewards" / "validation_cases.py").records


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory):
    """A tiny random-weight judge with the Apertus chat template, saved."""
    from align.chat import install_format
    from align.testing.tiny import build_causal_lm, build_tokenizer

    tok = build_tokenizer()
    install_format(tok, chat_format="apertus")
    path = tmp_path_factory.mktemp("judge")
    build_causal_lm(tok, seed=3).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_judge_validate_stage_writes_report_plot_and_verdicts(judge_dir, tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records()))
    out = tmp_path / "validate"
    args = ["judge-validate", f"input={data}", f"output_dir={out}", f"model={judge_dir}",
            "charter=charter/example_de.md", "steps=2", "resamples=200", "device=cpu",
            "model_batch_size=16", "min_kendall_tau=0.5", "single_order=skip"]
    printed = run_cli(args)
    assert f"[align judge-validate] wrote {out}" in printed
    assert "[align judge-validate] en: NOT qualified" in printed and "[align judge-validate] de: NOT qualified" in printed
    info = stage_completion_info(out)
    assert info["stage"] == "judge-validate" and info["summary"]["ladders"] == len(records())
    assert info["summary"]["qualified"] == {"en": False, "de": False, "all": False}
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["steps"] == 2 and report["judge"]["single_order"] == "skip"
    assert report["degrader"]["degrader"] == "rules"
    assert {"en", "de"} == set(report["languages"])
    assert (out / "score_by_step.png").stat().st_size > 1000 and (out / "report.md").exists()
    assert "already complete" in run_cli(args)
    with pytest.raises(ValueError, match=r"judge-validate\.charter \(default\): other charter text"):
        run_cli(args[:4])  # the defaults: another charter, steps, resamples...


def test_judge_validate_with_an_llm_degrader(judge_dir, tmp_path):
    """The LLM degrader through the transformers generation backend (a random tiny model
    writes nonsense, but every rewrite that differs is a step)."""
    data = tmp_path / "prompts.jsonl"
    import torch

    data.write_text("".join(json.dumps(r) + "\n" for r in records(("en",))[:3]))
    out = tmp_path / "validate_llm"
    torch.manual_seed(0)  # sampled rewrites (greedy ones from a random model are all end-of-turn)
    run_cli(["judge-validate", f"input={data}", f"output_dir={out}", f"model={judge_dir}", "degrader=llm",
             f"generator.model={judge_dir}", "generator.max_tokens=12", "generator.temperature=1.0", "generator.device=cpu", "steps=2", "kinds=[factual_accuracy,faulty_reasoning]",
             "pairwise=false", "resamples=200", "device=cpu", "require_significant=false"])
    report = json.loads((out / "report.json").read_text())
    assert report["degrader"]["degrader"] == "llm" and report["degrader"]["model"] == str(judge_dir)
    assert report["ladders"] + len(report["skipped"]) == 3
    rows = [json.loads(line) for line in (out / "ladders.jsonl").read_text().splitlines()]
    for row in rows:
        assert sorted(row["flaws"]) == ["factual_accuracy", "faulty_reasoning"] and len(set(row["texts"])) == 3
    assert "pairwise" not in report["all"]["kendall_tau"]
