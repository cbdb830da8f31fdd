"""`align card`: a model card from the manifests, checked on hand-made completion markers.

Each output below is a directory with the completion marker a stage writes (stage, manifest,
output id, summary); the card must follow the chain back through the output ids they record,
name an output replaced since instead of describing it, copy the evaluation's figures, and
never overwrite a README.md it did not write. The tiny pipeline's test runs it on real outputs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from align.cli import main
from align.errors import InputError


def finished(path: Path, stage: str, output_id: str, *, settings=None, inputs=None, summary=None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    manifest = {"stage": stage, "fingerprint": f"fp-{output_id}" + "0" * 16, "library": "0.1.0",
                "settings": settings or {}, "inputs": inputs or {}}
    (path / "_COMPLETE.json").write_text(json.dumps({"stage": stage, "manifest": manifest, "output_id": output_id,
                                                     "summary": summary or {}, "files": {}}))
    return path


def stage_input(path: Path, output_id: str, stage: str) -> dict:
    return {"path": str(path), "kind": "stage", "stage": stage, "fingerprint": f"fp-{output_id}", "output_id": output_id}


@pytest.fixture
def chain(tmp_path):
    """base model (hub id) -> sft -> annotate (judge with a charter) -> train (dpo), and an evaluation of train."""
    runs = tmp_path / "runs"
    sft = finished(runs / "sft", "sft", "s1", settings={"learning_rate": 2e-5, "max_length": 4096},
                   inputs={"model_name_or_path": {"path": "org/base-8b", "kind": "model", "fingerprint": "m" * 8},
                           "input": {"path": "data/sft.jsonl", "kind": "file", "fingerprint": "d" * 8}},
                   summary={"rows": 1000, "rows_dropped": 3, "train_loss": 1.23456})
    annotate = finished(runs / "annotate", "annotate", "a1", settings={"provider": "judge", "model": "org/judge"},
                        inputs={"input": {"path": "samples.jsonl", "kind": "file", "fingerprint": "q" * 8},
                                "charter": {"path": "charter/c.md", "kind": "file", "fingerprint": "c" * 8}})
    train = finished(runs / "dpo", "train", "t1", settings={"loss_type": "dpo", "beta": 0.1},
                     inputs={"model_name_or_path": stage_input(sft, "s1", "sft"),
                             "input": stage_input(annotate, "a1", "annotate")},
                     summary={"steps": 7, "train_loss": 0.5})
    evaluation = finished(runs / "eval", "evaluate", "e1",
                          settings={"policies[0].name": "sft", "policies[1].name": "mine"},
                          inputs={"policies[0].model": stage_input(sft, "s1", "sft"),
                                  "policies[1].model": stage_input(train, "t1", "train")})
    interval = {"estimate": 0.61234, "low": 0.5, "high": 0.7, "n": 40, "confidence": 0.9}
    report = {"provider": "judge", "baseline": "sft", "prompts": 40, "settings": {"confidence": 0.9},
              "overall": {"policies": {"mine": {"reward_sampled": interval, "kl": {**interval, "estimate": 2.5}},
                                       "sft": {"reward_sampled": {**interval, "estimate": 0.25}}},
                          "comparisons": {"mine": {"baseline": "sft", "reward_difference_sampled":
                                                   {**interval, "estimate": 0.125}, "verdicts": ["mine wins"]}}}}
    (evaluation / "report.json").write_text(json.dumps(report))
    return {"sft": sft, "annotate": annotate, "train": train, "eval": evaluation}


def test_the_card_states_the_chain_the_data_the_method_and_the_evaluation(chain, capsys):
    assert main(["card", str(chain["train"])]) == 0
    card = (chain["train"] / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: transformers\nbase_model: org/base-8b\ntags:\n- align\n- dpo\n---\n")
    assert "sft → annotate → train" in card
    for row in (f"| sft | `{chain['sft']}` | model_name_or_path: `org/base-8b`, input: `data/sft.jsonl` | "
                "`fp-s100000000000` | `s1` |",
                f"| train | `{chain['train']}` | model_name_or_path: sft output, input: annotate output | "
                "`fp-t100000000000` | `t1` |",
                "| sft | input | `data/sft.jsonl` | file | `dddddddd` |",
                "| annotate | charter | `charter/c.md` | file | `cccccccc` |",
                "- sft: rows 1000, rows_dropped 3, train_loss 1.235",
                "- train: steps 7, train_loss 0.5",
                "- provider **judge**, model `org/judge`, charter `charter/c.md` (fingerprint `cccccccc`)",
                "| beta | `0.1` |", "| learning_rate | `2e-05` |",
                "40 held-out prompts, reward **judge**, policy `mine` against baseline `sft`; intervals at 90%.",
                "| mean reward (sampled) | 0.6123 | 0.5 to 0.7 | 40 |",
                "| KL to the reference | 2.5 | 0.5 to 0.7 | 40 |",
                "| reward − sft (sampled) | 0.125 | 0.5 to 0.7 | 40 |", "- mine wins"):
        assert row in card, row
    assert "written by `align card`" in card


def test_an_output_replaced_since_it_was_read_is_named_not_described(chain):
    finished(chain["annotate"], "annotate", "a2", settings={"provider": "reward_model", "model": "other"})
    assert main(["card", str(chain["train"])]) == 0
    card = (chain["train"] / "README.md").read_text()
    assert f"- train `{chain['train']}`, input: {chain['annotate']}: replaced since it was read" in card
    assert "reward_model" not in card and "No annotation stage is in the chain." in card


def test_a_readme_the_card_did_not_write_is_kept(chain, capsys):
    (chain["train"] / "README.md").write_text("my notes\n")
    assert main(["card", str(chain["train"])]) == 2
    assert "did not write; set overwrite=true" in capsys.readouterr().err
    assert (chain["train"] / "README.md").read_text() == "my notes\n"
    assert main(["card", str(chain["train"]), "overwrite=true"]) == 0
    assert main(["card", str(chain["train"])]) == 0  # its own card it replaces


def test_an_evaluation_of_another_model_and_a_non_policy_are_refused(chain, capsys):
    assert main(["card", str(chain["sft"]), f"evaluation={chain['eval']}"]) == 0  # sft was scored too
    card = (chain["sft"] / "README.md").read_text()
    assert "policy `sft` against baseline `sft`" in card and "| mean reward (sampled) | 0.25 | 0.5 to 0.7 | 40 |" in card
    other = finished(chain["train"].parent / "other", "train", "t9", settings={"loss_type": "qrpo"})
    assert main(["card", str(other), f"evaluation={chain['eval']}"]) == 2
    assert "did not score" in capsys.readouterr().err
    assert main(["card", str(chain["annotate"])]) == 2
    assert "an `align annotate` output, not a trained policy" in capsys.readouterr().err
    with pytest.raises(InputError, match="not a finished stage output"):
        from align.manifests.lineage import trace

        trace(chain["train"].parent / "missing")


# --------------------------------------------------------------------------- the chain itself (align.manifests.lineage)


def test_the_chain_is_followed_through_relative_paths_data_files_and_shared_outputs(tmp_path, monkeypatch):
    """Paths a run recorded relative to where it ran are found from an ancestor of the output; an input naming
    one data file of an output (`@pairs/pairs.jsonl`) is that output; an output two steps read is walked once."""
    from align.manifests.lineage import sources, trace, walk

    work = tmp_path / "work"
    sft = finished(work / "runs" / "sft", "sft", "s1", settings={"lr": 1},
                   inputs={"model_name_or_path": {"path": "base", "kind": "model", "fingerprint": "m"}})
    pairs = finished(work / "runs" / "pairs", "pairs", "p1", inputs={"input": {"path": "a.jsonl", "kind": "file",
                                                                              "fingerprint": "a"}})
    (pairs / "pairs.jsonl").write_text("{}\n")
    relative = lambda out, oid, stage, **more: {"path": f"runs/{out}", "kind": "stage", "stage": stage,
                                                "fingerprint": "f", "output_id": oid, **more}
    logprobs = finished(work / "runs" / "logprobs", "logprobs", "l1",
                        inputs={"model_name_or_path": relative("sft", "s1", "sft"),
                                "input": relative("pairs/pairs.jsonl", "p1", "pairs", file="pairs.jsonl")})
    train = finished(work / "runs" / "train", "train", "t1", settings={"beta": 5},
                     inputs={"model_name_or_path": relative("sft", "s1", "sft"),
                             "input": relative("logprobs", "l1", "logprobs")})
    monkeypatch.chdir(tmp_path)  # not where the run ran: the paths are found from the output's ancestors
    made = trace(train)
    assert [n.stage for n in walk(made)] == ["sft", "pairs", "logprobs", "train"]
    assert made.earlier["input"].earlier["input"].path == work / "runs" / "pairs"
    assert [(node.stage, key, entry["path"]) for node, key, entry in sources(made)] == [
        ("sft", "model_name_or_path", "base"), ("pairs", "input", "a.jsonl")]
    assert made.setting("beta") == 5 and made.setting("gamma", "absent") == "absent" and made.library == "0.1.0"
    assert logprobs.exists() and sft.exists()


def test_an_input_gone_or_unfinished_is_said_so(tmp_path, monkeypatch):
    from align.manifests.lineage import locate, trace

    monkeypatch.chdir(tmp_path)
    unfinished = tmp_path / "runs" / "sample"
    unfinished.mkdir(parents=True)
    train = finished(tmp_path / "runs" / "train", "train", "t1", inputs={
        "gone": stage_input(tmp_path / "runs" / "nowhere", "x", "sft"),
        "input": stage_input(unfinished, "u", "sample")})
    made = trace(train)
    assert made.earlier["gone"] == f"{tmp_path / 'runs' / 'nowhere'}: not found from here"
    assert made.earlier["input"] == f"{unfinished}: not a finished stage output (no completion marker)"
    assert locate(str(tmp_path / "missing"), train) is None and locate("runs/train", train) == Path("runs/train")
    (unfinished / "_COMPLETE.json").write_text(json.dumps({"stage": "sample", "output_id": "u"}))
    with pytest.raises(InputError, match="holds no manifest"):
        trace(unfinished)
    (unfinished / "_COMPLETE.json").write_text(json.dumps({"stage": "sample", "output_id": "u", "manifest": {
        "stage": "sample", "fingerprint": "f", "settings": {}}}))
    with pytest.raises(InputError, match=r"the manifest in its completion marker lacks \['inputs', 'library'\]"):
        trace(unfinished)
