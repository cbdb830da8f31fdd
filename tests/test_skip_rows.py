"""Every row a stage can write, skip rows included, is one its consumers accept.

A property over the stage table's row contract: each producer below is run for real on 8
prompts built to give every kind of row it can write (normal rows; a prompt holding a token
the chat format reads as structure, and one longer than the model's context, both skip rows;
completions cut at max_tokens, kept or dropped, and a row all of whose completions were
dropped; a controversy label the classifier could not give; pairs the reference pass cannot
fit). Then every consumer whose input key reads that producer's kind of rows
(``align.stage_table``) runs on that output through the CLI, as a job would, and must end
with its output complete: every input id in it once (or in its file of skips), and every
skip row's reason carried on as it came. Never a failed task.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from align.cli import main
from align.data.records import skip_reason
from align.io import read_records, stage_completion_info
from align.stage_table import PAIRS, PROMPTS, REF_PAIRS, SAMPLES, SCORED, STAGES, reads_as

DATE = "2026-01-01"
FORMAT_TOKEN = "p6"  # its text holds the Apertus BOS
TOO_LONG = "p7"  # longer than the tiny model's context (2,048 tokens)
LONG_PAIR = 5  # its pairs exceed the reference pass's max_length (MAX_LENGTH); the others fit
MAX_LENGTH = 110


def prompts() -> list[dict]:
    rows = [{"id": f"p{i}", "messages": [{"role": "user", "content": f"Is {i} even? Answer yes or no."
                                          + " Think it over first." * (8 if i == LONG_PAIR else 0)}],
             "answer": "yes" if i % 2 == 0 else "no"} for i in range(6)]
    rows.append({"id": FORMAT_TOKEN, "messages": [{"role": "user", "content": "Strike <s>this</s> out"}],
                 "answer": "no"})
    rows.append({"id": TOO_LONG, "messages": [{"role": "user", "content": "word " * 3000}], "answer": "no"})
    return rows


def sampler(model: Path) -> list[str]:
    return ["sampler.backend=transformers", f"sampler.model={model}", "sampler.chat_format=apertus",
            f"sampler.chat_date={DATE}", "sampler.device=cpu"]


def with_template(model: Path, out: Path) -> Path:
    """The tiny policy with the Apertus template in its tokenizer: a classifier renders with the model's own."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from align.chat import install_format

    tokenizer, lm = AutoTokenizer.from_pretrained(model), AutoModelForCausalLM.from_pretrained(model)
    install_format(tokenizer, lm, chat_format="apertus")
    tokenizer.save_pretrained(out)
    lm.save_pretrained(out)
    return out


def align(*args: str) -> None:
    """``align ARGS`` in this process; a refusal raises AssertionError with the line align printed."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    assert code == 0, f"align {args[0]} exited {code}: {err.getvalue().strip()}"


@dataclass
class Made:
    """A producer's output: the path its consumers read, the kind of its rows, and the stage that wrote it."""

    path: Path
    kind: str
    stage: str


@pytest.fixture(scope="module")
def made(tmp_path_factory, tiny_dirs) -> dict[str, Made]:
    """Every producer's output, made once by its stage."""
    root = tmp_path_factory.mktemp("skips")
    policy = tiny_dirs["policy"]
    source = root / "prompts.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in prompts()))
    out = {}
    align("sample", f"prompts={source}", f"output_dir={root / 'sample'}", *sampler(policy), "n=3", "max_tokens=3",
          "batch_size=4")
    out["sample"] = Made(root / "sample", SAMPLES, "sample")
    align("sample", f"prompts={source}", f"output_dir={root / 'dropped'}", *sampler(policy), "n=2", "max_tokens=1",
          "overlong=drop", "seed=1")
    out["sample, overlong dropped"] = Made(root / "dropped", SAMPLES, "sample")
    align("sample", f"prompts={root / 'sample'}", f"output_dir={root / 'offline'}", *sampler(policy),
          "mode=offline", "n=1", "max_tokens=3", "on_unclassified=persona")
    out["offline sample"] = Made(root / "offline", SAMPLES, "sample")
    align("annotate", f"input={source}", f"output_dir={root / 'classify'}", "provider=classifier",
          "backend=transformers", f"model={with_template(policy, root / 'classifier')}", "max_attempts=1",
          "max_tokens=4", "device=cpu")
    out["classify"] = Made(root / "classify", PROMPTS, "annotate")
    align("join", f"input={root / 'sample'}", f"completions={root / 'dropped'}", f"output_dir={root / 'join'}")
    out["join"] = Made(root / "join", SAMPLES, "join")
    for name in ("sample", "join"):  # a tiny random judge: scores that differ, so prompts give pairs
        align("annotate", f"input={out[name].path}", f"output_dir={root / f'annotate-{name}'}", "provider=judge",
              "backend=transformers", f"model={root / 'classifier'}", "top_k_pairwise=0", "device=cpu")
        out[f"annotate {name}"] = Made(root / f"annotate-{name}", SCORED, "annotate")
    # the random tiny policy seldom ends a turn within 3 tokens: its cut completions are paired (and scored and
    # trained without an end-of-turn token, as pairs, logprobs and train all say)
    align("pairs", f"input={root / 'annotate-sample'}", f"output_dir={root / 'pairs'}", "num_ref_rewards=3",
          "truncated=train_without_end")
    out["pairs"] = Made(root / "pairs" / "pairs.jsonl", PAIRS, "pairs")
    align("logprobs", f"input={root / 'pairs' / 'pairs.jsonl'}", f"output_dir={root / 'logprobs'}",
          f"model_name_or_path={policy}", f"max_length={MAX_LENGTH}", f"chat_date={DATE}", "device=cpu", "batch_size=4",
          "truncated=train_without_end")
    out["logprobs"] = Made(root / "logprobs", REF_PAIRS, "logprobs")
    return out


def test_the_producers_wrote_every_kind_of_row(made):
    """The fixture's outputs hold what the property needs: skip rows with both reasons, cut completions kept
    and dropped, a row all of whose completions were dropped, unlabelled prompts, ref_skip rows."""
    sample = {r["id"]: r for r in read_records(made["sample"].path)}
    assert "structure" in skip_reason(sample[FORMAT_TOKEN]) or "<s>" in skip_reason(sample[FORMAT_TOKEN])
    assert "context length" in skip_reason(sample[TOO_LONG])
    assert any(c["finish_reason"] == "length" for r in sample.values() for c in r.get("completions") or [])
    dropped = read_records(made["sample, overlong dropped"].path)
    assert any("overlong=drop removed them" in (skip_reason(r) or "") for r in dropped)
    assert any(r.get("controversial") is None for r in read_records(made["classify"].path))
    assert any(r.get("ref_skip") for r in read_records(made["logprobs"].path))
    assert stage_completion_info(made["annotate sample"].path)["summary"]["upstream_skipped"] == 2


# --------------------------------------------------------------------------- consumers


def consume_annotate(made: Made, out: Path, policy: Path) -> Path:
    align("annotate", f"input={made.path}", f"output_dir={out}", "provider=verifiable")
    return out


def consume_sample(made: Made, out: Path, policy: Path) -> Path:
    align("sample", f"prompts={made.path}", f"output_dir={out}", *sampler(policy), "n=1", "max_tokens=2")
    return out


def consume_join(made: Made, out: Path, policy: Path) -> Path:
    """The producer's rows as π_ref's samples and a copy of them as the policy's (a file joined with itself is
    refused: it would double every prompt's completions)."""
    import shutil

    policy_samples = out.parent / f"{out.name}-policy-samples"
    shutil.copytree(made.path, policy_samples) if made.path.is_dir() else shutil.copy(made.path, policy_samples)
    align("join", f"input={made.path}", f"completions={policy_samples}", f"output_dir={out}")
    return out


def consume_split(made: Made, out: Path, policy: Path) -> Path:
    align("split", f"input={made.path}", f"output_dir={out}", "part=1", "parts=1")
    return out


def consume_pairs(made: Made, out: Path, policy: Path) -> Path:
    align("pairs", f"input={made.path}", f"output_dir={out}", "truncated=train_without_end")
    return out


def consume_evaluate(made: Made, out: Path, policy: Path) -> Path:
    """Held-out prompts read from the producer's rows, a policy sampled for real (one engine, CPU)."""
    align("evaluate", f"prompts={made.path}", f"output_dir={out}", "baseline=a", f"policies=[{{name: a, model: "
          f"{policy}}}, {{name: b, model: {policy}}}]", "sampler.backend=transformers", "sampler.chat_format=apertus",
          f"sampler.chat_date={DATE}", "sampler.device=cpu", "reward.provider=verifiable", "n=1", "max_tokens=2",
          "kl=false", "resamples=200")
    return out


def consume_logprobs(made: Made, out: Path, policy: Path) -> Path:
    align("logprobs", f"input={made.path}", f"output_dir={out}", f"model_name_or_path={policy}", f"max_length={MAX_LENGTH}",
          f"chat_date={DATE}", "device=cpu", "truncated=train_without_end")
    return out


def consume_train(made: Made, out: Path, policy: Path) -> Path:
    align("train", f"input={made.path}", f"output_dir={out}", f"model_name_or_path={policy}", f"max_length={MAX_LENGTH}",
          f"chat_date={DATE}", "use_cpu=true", "bf16=false", "report_to=[]", "max_steps=1", "save_strategy='no'",
          "per_device_train_batch_size=2", "num_ref_rewards=3", "disable_tqdm=true", "truncated=train_without_end")
    return out


CONSUMERS: dict[str, tuple[str, str, Callable[[Made, Path, Path], Path]]] = {
    # name: (stage, its input key, the runner)
    "annotate": ("annotate", "input", consume_annotate),
    "sample": ("sample", "prompts", consume_sample),
    "join": ("join", "input", consume_join),
    "split": ("split", "input", consume_split),
    "pairs": ("pairs", "input", consume_pairs),
    "evaluate": ("evaluate", "prompts", consume_evaluate),
    "logprobs": ("logprobs", "input", consume_logprobs),
    "train": ("train", "input", consume_train),
}
PRODUCERS = ("sample", "sample, overlong dropped", "offline sample", "classify", "join", "annotate sample",
             "annotate join", "pairs", "logprobs")
KINDS = {"sample": SAMPLES, "sample, overlong dropped": SAMPLES, "offline sample": SAMPLES, "classify": PROMPTS,
         "join": SAMPLES, "annotate sample": SCORED, "annotate join": SCORED, "pairs": PAIRS, "logprobs": REF_PAIRS}


def edges() -> list[tuple[str, str]]:
    """Every (producer, consumer) the row contract allows: the consumer's key reads the producer's kind."""
    found = []
    for producer in PRODUCERS:
        for consumer, (stage, key, _) in CONSUMERS.items():
            if reads_as(KINDS[producer], STAGES[stage].reads[key].kinds):
                found.append((producer, consumer))
    return found


def given_rows(path: Path) -> list[dict]:
    """The rows a consumer reads: a file's own rows, or a stage output directory's."""
    return read_records(path)


def recorded(out: Path) -> tuple[list[str], dict[str, str]]:
    """(the ids of a consumer's output rows, {id: reason} of its skip rows and of its file of skips)."""
    if (out / "eval.jsonl").exists():
        rows = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
    elif (out / "pairs.jsonl").exists():
        rows = read_records(out / "pairs.jsonl")
    elif (out / "config.json").exists():  # a trained model: its rows are the trainer's
        rows = []
    else:
        rows = read_records(out)
    skips = {r["id"]: skip_reason(r) for r in rows if skip_reason(r)}
    for name in ("skipped.jsonl", "skipped_rows.jsonl"):
        if (out / name).exists():
            skips.update({r["id"]: r["reason"] for r in map(json.loads, (out / name).read_text().splitlines())
                          if r.get("id") is not None})
    return [r["id"] for r in rows if not skip_reason(r)], skips


def test_the_edges_cover_every_producer_and_every_consumer():
    covered = edges()
    assert {p for p, _ in covered} == set(PRODUCERS) and {c for _, c in covered} == set(CONSUMERS)


@pytest.mark.parametrize(("producer", "consumer"), edges())
def test_a_consumer_passes_every_row_of_its_producer_on(producer, consumer, made, tiny_dirs, tmp_path):
    given = made[producer]
    rows = given_rows(given.path)
    in_skips = {r["id"]: skip_reason(r) for r in rows if skip_reason(r)}
    try:
        out = CONSUMERS[consumer][2](given, tmp_path / consumer, tiny_dirs["policy"])
    except AssertionError as refused:  # only where a stage before skipped every row: nothing left to work on
        assert len(in_skips) == len(rows) and "every prompt was left out" in str(refused), refused
        return
    assert stage_completion_info(out) is not None, f"{consumer} did not finish on {producer}'s rows"
    out_ids, out_skips = recorded(out)
    in_ids = [r["id"] for r in rows]
    if consumer == "train":  # a model: the rows it could not train on are counted, the others trained on
        summary = stage_completion_info(out)["summary"]
        assert summary["over_max_length_skipped"] == sum(bool(r.get("ref_skip")) for r in rows), summary
        return
    if consumer == "pairs":  # each prompt gives pairs (ids id, id#2...) or a skip record
        assert {i.split("#")[0] for i in out_ids} | set(out_skips) == set(in_ids), (producer, consumer)
    elif consumer == "logprobs":  # each pair row scored, or written with ref_skip
        assert sorted(out_ids) == sorted(in_ids), (producer, consumer)
    else:
        assert sorted(out_ids + list(out_skips)) == sorted(in_ids), (producer, consumer)  # every id once
    for rid, reason in in_skips.items():  # a skip row's reason carried on as it came
        assert reason in out_skips[rid], (producer, consumer, rid, out_skips[rid])
