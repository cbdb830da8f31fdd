"""The layout keys of the sharded passes, in one process: what is refused (naming the key), and the
KL step on its own (`kl_only`) with whole models loaded from the policies' paths.

The 2-rank ZeRO-3 runs are in test_zero3_sharded.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from dist_utils import run_cli

from align.errors import ConfigError, InputError

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "recipes" / "tiny"


def test_an_unknown_layout_is_refused_naming_the_key():
    from align.eval.evaluate import EvalSettings
    from align.stages.logprobs import LogprobsConfig

    with pytest.raises(ConfigError, match=r"sharding='tensor'.*replicate.*zero3"):
        LogprobsConfig(model_name_or_path="m", input="i", output_dir="o", sharding="tensor")
    with pytest.raises(ConfigError, match=r"kl_sharding='tp'"):
        EvalSettings(kl_sharding="tp")


def test_zero3_takes_no_device_and_kl_only_needs_kl():
    from align.eval.evaluate import EvalSettings
    from align.stages.logprobs import LogprobsConfig

    with pytest.raises(ConfigError, match=r"device='cuda:0'.*sharding=zero3.*LOCAL_RANK"):
        LogprobsConfig(model_name_or_path="m", input="i", output_dir="o", sharding="zero3", device="cuda:0")
    with pytest.raises(ConfigError, match=r"kl_only=true.*kl=false"):
        EvalSettings(kl_only=True, kl=False)


def test_zero3_outside_a_launch_says_how_to_launch(tiny_dirs, monkeypatch):
    from align.scoring.sharded import load_scoring_model

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert not (torch.distributed.is_available() and torch.distributed.is_initialized())
    with pytest.raises(ConfigError, match=r"kl_sharding=zero3.*accelerate launch --config_file "
                                          r"recipes/accelerate/zero3.yaml"):
        load_scoring_model(str(tiny_dirs["policy"]), dtype="float32", sharding="zero3", key="kl_sharding")


def evaluate_args(tiny_dirs, other, out) -> list:
    return ["evaluate", TINY / "pipeline.yaml", f"prompts={TINY / 'data' / 'held_out.jsonl'}", "plots=false",
            "resamples=200", "baseline=base", "batch_size=8", "kl_batch_size=5", f"output_dir={out}",
            f"policies=[{{name: base, model: {tiny_dirs['policy']}}}, {{name: other, model: {other}}}]"]


@pytest.fixture(scope="module")
def other_policy(tiny_dirs, tmp_path_factory):
    """The tiny policy with its weights moved a little (so KL is not 0), with the same tokenizer."""
    import shutil

    from transformers import AutoModelForCausalLM

    out = tmp_path_factory.mktemp("other") / "policy"
    shutil.copytree(tiny_dirs["policy"], out)
    model = AutoModelForCausalLM.from_pretrained(out)
    torch.manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.02 * torch.randn_like(param))
    model.save_pretrained(out)
    return out


def test_kl_only_before_the_generations_is_refused(tiny_dirs, other_policy, tmp_path):
    with pytest.raises(InputError, match=r"kl_only: the generations of policy 'base' .* are not complete"):
        run_cli([*evaluate_args(tiny_dirs, other_policy, tmp_path / "eval"), "kl_only=true"])


def test_kl_on_its_own_with_whole_models_from_paths_equals_the_inline_kl(tiny_dirs, other_policy, tmp_path):
    """kl_sharding=zero3 leaves KL to its own run; kl_only with replicate computes it there from the
    policies' paths; the evaluation run again writes the report: the KL equals the sampler-model KL."""
    from align.io import read_output

    run_cli(evaluate_args(tiny_dirs, other_policy, tmp_path / "inline"))
    out = tmp_path / "apart"
    first = run_cli([*evaluate_args(tiny_dirs, other_policy, out), "kl_sharding=zero3"])
    assert "kl_only=true" in first and not (out / "report.json").exists()
    done = run_cli([*evaluate_args(tiny_dirs, other_policy, out), "kl_only=true"])  # replicate: whole models
    assert "KL done for other" in done and not (out / "report.json").exists()
    run_cli([*evaluate_args(tiny_dirs, other_policy, out), "kl_sharding=zero3"])  # every job done: the report

    want = {r["id"]: r["logratios"] for r in read_output(tmp_path / "inline" / "kl" / "other")}
    got = {r["id"]: r["logratios"] for r in read_output(out / "kl" / "other")}
    assert set(got) == set(want) and len(want) == 16
    for rid, values in want.items():
        assert got[rid] == pytest.approx(values, abs=1e-6), rid
    jobs = [json.loads((d / "kl" / "other" / "_job.json").read_text()) for d in (tmp_path / "inline", out)]
    assert jobs[0] == jobs[1]  # the same weights' fingerprint, loaded by the sampler or from the path
    kl = [json.loads((d / "report.json").read_text())["overall"]["policies"]["other"]["kl"]
          for d in (tmp_path / "inline", out)]
    assert kl[1] == pytest.approx(kl[0], abs=1e-9) and kl[0]["estimate"] > 0.01
    manifests = [json.loads((d / "_COMPLETE.json").read_text())["manifest_fingerprint"]
                 for d in (tmp_path / "inline", out)]
    assert manifests[0] == manifests[1]  # kl_sharding and kl_only are neutral keys
