"""A corpus of bad inputs, each run through the CLI (`align.cli.main`, in-process).

Every entry gets one of two things:
- an error: `align STAGE: ErrorClass: message` on stderr and exit status 2, the message
  naming the file (and line), or the record id / row, and the field;
- a recorded skip: the stage finishes (exit 0) and its output records the reason.

Fixture files are written into a tmp directory by the entries themselves; the tiny models
(align.testing.tiny) are built once for the module. Most entries fail before any model
loads. docs/bad-inputs.md lists the same entries as a table.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from align.cli import main

DATE = "2026-01-01"
SFT_ROW = {"id": "s0", "messages": [{"role": "user", "content": "Is 4 even?"}, {"role": "assistant", "content": "yes"}]}
LONG_PROMPT = [{"role": "user", "content": "word " * 300}]
GOOD = "Four is even, since it is two times two. So the answer is yes."
OLD_MARKER = '{"stage": "pairs", "config": {}, "summary": {}}'  # a completion marker of an earlier version
TORN = '{"id": "b", "mess'  # a prompt cut mid-line


# ---------------------------------------------------------------------------------------
# Rows and files


def prompt(rid: str = "p0", text: str = "Is 4 even?", **extra) -> dict:
    return {"id": rid, "messages": [{"role": "user", "content": text}], **extra}


def completion(text: str = "yes", **extra) -> dict:
    return {"text": text, "num_tokens": 2, "finish_reason": "stop", "is_reference": True, "source": "policy",
            **extra}


def annotated(rid: str = "p0", rewards=(0.0, 1.0, 0.5, 0.2), **extra) -> dict:
    row = prompt(rid, answer="yes")
    row["completions"] = [completion(f"c{i}") for i in range(len(rewards))]
    row["rewards"] = list(rewards)
    row["reward_skips"] = [None] * len(rewards)
    row.update(extra)
    return row


def pair(rid: str = "p0", **extra) -> dict:
    row = prompt(rid)
    row.update(chosen="yes", rejected="no", chosen_reward=1.0, rejected_reward=0.0, chosen_quantile=1.0,
               rejected_quantile=0.0, num_ref_rewards=4, pair_fallback=None, chosen_finish_reason="stop",
               rejected_finish_reason="stop", num_ref_dropped=0)
    row.update(extra)
    return row


def with_logps(row: dict, **extra) -> dict:
    return {**row, "ref_chosen_logps": -3.0, "ref_rejected_logps": -4.0, "chosen_length": 2,
            "rejected_length": 2, **extra}


def jsonl(path: Path, rows, *, tail: str = "") -> Path:
    """Rows as JSONL (a row given as a string is written as it is), then `tail` unterminated."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
    path.write_text("".join(line + "\n" for line in lines) + tail)
    return path


# ---------------------------------------------------------------------------------------
# The workspace: tiny models, built once


@dataclass
class Workspace:
    root: Path          # this entry's own tmp directory
    policy: Path        # tiny causal LM, Apertus format installed (tokenizer with chat template)
    base: Path          # the same without a chat template (a base model)
    rm: Path            # tiny reward model with a ChatML template
    rm_plain: Path      # tiny reward model without a chat template
    rm_pad_eos: Path    # tiny reward model whose pad token is its EOS

    def file(self, name: str, rows, **kw) -> Path:
        return jsonl(self.root / name, rows, **kw)

    def out(self, name: str = "out") -> Path:
        return self.root / name


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    from align.chat import install_format
    from align.testing.tiny import save_tiny_models

    root = tmp_path_factory.mktemp("bad_input_models")
    paths = save_tiny_models(root)
    plain = root / "rm_plain"  # the tiny reward model without its chat template (a base classifier)
    shutil.copytree(paths["reward_model"], plain, ignore=shutil.ignore_patterns("chat_template.jinja"))
    settings = json.loads((plain / "tokenizer_config.json").read_text())
    settings.pop("chat_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(settings))
    assert AutoTokenizer.from_pretrained(plain).chat_template is None
    out = {"base": paths["policy"], "rm_plain": plain}
    for name, loader, fmt, src in (("policy", AutoModelForCausalLM, "apertus", paths["policy"]),
                                   ("rm", AutoModelForSequenceClassification, "chatml", paths["reward_model"])):
        tokenizer, model = AutoTokenizer.from_pretrained(src), loader.from_pretrained(src)
        install_format(tokenizer, model, chat_format=fmt)
        out[name] = root / f"{name}_{fmt}"
        model.save_pretrained(out[name])
        tokenizer.save_pretrained(out[name])
    assert AutoTokenizer.from_pretrained(out["base"]).chat_template is None
    shutil.copytree(out["rm"], root / "rm_pad_eos")
    config_path = root / "rm_pad_eos" / "config.json"
    tokenizer = AutoTokenizer.from_pretrained(root / "rm_pad_eos")
    tokenizer.pad_token = tokenizer.eos_token
    tokenizer.save_pretrained(root / "rm_pad_eos")
    config = json.loads(config_path.read_text())
    config["pad_token_id"] = tokenizer.eos_token_id
    config_path.write_text(json.dumps(config))
    out["rm_pad_eos"] = root / "rm_pad_eos"
    return out


# ---------------------------------------------------------------------------------------
# The entries


@dataclass
class Case:
    name: str
    stage: str
    make: Callable[[Workspace], list]          # the arguments after the stage name
    error: str | None = None                   # the error class; None: the stage succeeds
    needles: tuple[str, ...] = ()              # what the message names ({root}: the tmp dir)
    check: Callable[..., None] | None = None  # for a recorded skip: check(ws, stdout, stderr)
    extra: dict = field(default_factory=dict)


def _cpu_sampler(model) -> list[str]:
    return ["sampler.backend=transformers", f"sampler.model={model}", "sampler.chat_format=apertus",
            f"sampler.chat_date={DATE}", "sampler.device=cpu", "max_tokens=4", "n=2"]


def _recipe(ws: Workspace, text: str, name: str = "recipe.yaml") -> Path:
    path = ws.root / name
    path.write_text(text)
    return path


def _skips(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _annotate_rows(out: Path) -> list[dict]:
    from align.io import read_records

    return read_records(out)


def _assert_in(needle: str, text: str) -> None:
    assert needle in text, text[-3000:]


def _check_pairs_skipped(reason: str):
    def check(ws: Workspace, out: str, err: str) -> None:
        skipped = _skips(ws.out() / "skipped.jsonl")
        assert skipped and reason in skipped[0]["reason"], skipped
    return check


def _check_annotate_skip(reason: str):
    def check(ws: Workspace, out: str, err: str) -> None:
        rows = _annotate_rows(ws.out())
        assert all(r is None for r in rows[0]["rewards"]), rows[0]["rewards"]
        assert all(reason in s for s in rows[0]["reward_skips"]), rows[0]["reward_skips"]
    return check


def _deep_tool_call() -> dict:
    call = {"type": "function", "function": {"name": "f", "arguments": "[" * 5000 + "]" * 5000}}
    return {"id": "a", "messages": [{"role": "user", "content": "hi"},
                                    {"role": "assistant", "content": "", "tool_calls": [call]},
                                    {"role": "tool", "content": "1"}, {"role": "user", "content": "so?"}]}


def _sft_row(text: str) -> dict:
    return {"id": "poisoned", "messages": [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}]}


def _check_sample_skip(rid: str, reason: str):
    def check(ws: Workspace, out: str, err: str) -> None:
        rows = {r["id"]: r for r in _annotate_rows(ws.out())}
        assert reason in rows[rid]["skip_reason"] and rows[rid]["completions"] == [], rows[rid]
        assert len(rows["a"]["completions"]) == 2  # every other prompt sampled
    return check


def _check_sft_skip(ws: Workspace, out: str, err: str) -> None:
    skipped = _skips(ws.out() / "skipped_rows.jsonl")
    assert [(r["row"], r["id"]) for r in skipped] == [(4, "poisoned")] and "special_token_text" in skipped[0]["reason"]
    summary = json.loads((ws.out() / "_COMPLETE.json").read_text())["summary"]
    assert summary["special_token_text"] == 1


def _check_long_row_dropped(ws: Workspace, out: str, err: str) -> None:
    """The long row is dropped as every row past max_length is: said, and counted in the summary."""
    _assert_in("dropped 1 of 5 rows: no assistant token within max_length=128", out)
    assert json.loads((ws.out() / "_COMPLETE.json").read_text())["summary"]["rows_dropped"] == 1


def _check_train_loss(ws: Workspace, out: str, err: str) -> None:
    """No loss was logged during the one step; the summary has the loss the trainer printed at its end."""
    loss = json.loads((ws.out() / "_COMPLETE.json").read_text())["summary"]["train_loss"]
    assert isinstance(loss, float) and loss > 0, loss


def _check_passed_on(rid: str):
    """A skip row of a stage before: passed on as it came, counted, never scored."""
    def check(ws: Workspace, out: str, err: str) -> None:
        rows = {r["id"]: r for r in _annotate_rows(ws.out())}
        assert rows[rid]["skip_reason"] == "special_token_text: <s>" and "rewards" not in rows[rid], rows[rid]
        assert json.loads((ws.out() / "_COMPLETE.json").read_text())["summary"]["upstream_skipped"] == 1
    return check


def _check_pairs_upstream(rid: str):
    def check(ws: Workspace, out: str, err: str) -> None:
        skipped = {r["id"]: r for r in _skips(ws.out() / "skipped.jsonl")}
        assert skipped[rid] == {"id": rid, "reason": "special_token_text: <s>", "upstream": True}
        assert json.loads((ws.out() / "_COMPLETE.json").read_text())["summary"]["upstream_skipped"] == 1
    return check


def _graph(ws: Workspace, where: dict) -> Path:
    """classify -> sample -> rm / judge, split by the classifier's label (each ``where`` given)."""
    return _recipe(ws, f"""
output_dir: {ws.out('g')}
steps:
  classify: {{stage: annotate, input: {ws.file('p.jsonl', [prompt('a')])}, provider: classifier, model: m}}
  sample: {{stage: sample, prompts: "@classify", sampler: {{model: m}}}}
  rm: {{stage: annotate, input: "@sample", provider: verifiable, where: {json.dumps(where['rm'])}}}
  judge: {{stage: annotate, input: "@sample", provider: verifiable, where: {json.dumps(where['judge'])}}}
""")


def _aliased(ws: Workspace) -> Path:
    (ws.root / "real").mkdir()
    (ws.root / "alias").symlink_to(ws.root / "real", target_is_directory=True)
    rows = ws.file("a.jsonl", [annotated("a")])
    return _recipe(ws, f"""
steps:
  a: {{stage: pairs, input: {rows}, output_dir: {ws.root / 'real' / 'pairs'}}}
  b: {{stage: pairs, input: {rows}, output_dir: {ws.root / 'alias' / 'pairs'}}}
""")


_FIFOS: dict[Path, threading.Event] = {}  # each FIFO an entry made -> set once something opened it to read


def _check_traced(ws: Workspace, out: str, err: str) -> None:
    """The plan traced runs/x/sft through the named recipe, and opened no FIFO beside it."""
    _assert_in("via runs/x/sft <- ", out)
    assert not any(opened.is_set() for path, opened in _FIFOS.items() if path.parent == ws.root)


CASES: list[Case] = [
    # --- the recipe and the command line -------------------------------------------------
    Case("unknown key", "pairs", lambda ws: ["input=x.jsonl", "sed=1"],
         "ConfigError", ("unknown key 'sed'", "Did you mean 'seed'")),
    Case("value of the wrong type", "pairs", lambda ws: ["input=x.jsonl", "seed=abc"],
         "ConfigError", ("seed", "expected an integer", "'abc'")),
    Case("value outside a Literal", "annotate", lambda ws: ["input=x.jsonl", "provider=oracle"],
         "ConfigError", ("provider", "'oracle'", "reward_model")),
    Case("nested key of the wrong type", "sample", lambda ws: ["prompts=x.jsonl", "sampler.batch_size=many"],
         "ConfigError", ("sampler.batch_size", "expected an integer")),
    Case("renamed key (an old name)", "sample", lambda ws: ["prompts=x.jsonl", "sampler.date=2026-01-01"],
         "ConfigError", ("sampler.'date'", "Did you mean 'chat_date'?", "docs/settings.md")),
    Case("another stage's name for the input", "train", lambda ws: ["dataset=x.jsonl"],
         "ConfigError", ("unknown key 'dataset'", "Did you mean 'input'?")),
    Case("pipeline: renamed key in defaults", "pipeline",
         lambda ws: [_recipe(ws, "defaults: {date: '2026-01-01'}\n"
                                 "logprobs: {model_name_or_path: m, input: x.jsonl, output_dir: o}\n")],
         "ConfigError", ("defaults", "'date'", "known to no step", "Did you mean 'chat_date'?")),
    Case("recipe file missing", "pairs", lambda ws: [ws.root / "nope.yaml"],
         "ConfigError", ("recipe file not found", "nope.yaml")),
    Case("recipe not a mapping", "pairs", lambda ws: [_recipe(ws, "- a\n- b\n")],
         "ConfigError", ("recipe.yaml", "must be a mapping", "list")),
    Case("recipe with a YAML syntax error", "pairs", lambda ws: [_recipe(ws, "seed: 1\n  bad: [\n")],
         "ConfigError", ("recipe.yaml", "line 2", "not valid YAML")),
    Case("override value not valid YAML", "pairs", lambda ws: ["input=x.jsonl", "seed=[1"],
         "ConfigError", ("override 'seed=[1'", "not valid YAML")),
    Case("two recipe files", "pairs", lambda ws: [_recipe(ws, "seed: 1\n"), "other.yaml"],
         "ConfigError", ("unexpected argument", "other.yaml")),
    Case("override without a key", "pairs", lambda ws: ["=3"],
         "ConfigError", ("'=3'", "empty key")),
    Case("annotate reward_model without model", "annotate", lambda ws: ["input=x.jsonl", "provider=reward_model"],
         "ConfigError", ("model", "reward_model", "needs a model")),
    Case("pipeline: unknown key in a section", "pipeline",
         lambda ws: [_recipe(ws, "pairs: {input: x.jsonl, sead: 1}\n")],
         "ConfigError", ("pipeline section 'pairs'", "unknown key pairs.'sead'")),
    Case("pipeline: default no stage knows", "pipeline",
         lambda ws: [_recipe(ws, "defaults: {colour: red}\npairs: {input: x.jsonl}\n")],
         "ConfigError", ("defaults", "colour", "known to no step")),
    Case("pipeline: stop_after an unknown stage", "pipeline",
         lambda ws: [_recipe(ws, "stop_after: pares\npairs: {input: x.jsonl}\n")],
         "ConfigError", ("stop_after", "'pares'")),
    Case("evaluate: two policies with the same name", "evaluate",
         lambda ws: [f"prompts={ws.file('p.jsonl', [prompt()])}", "baseline=sft",
                     "policies=[{name: sft, model: a}, {name: sft, model: b}]"],
         "ConfigError", ("policies", "'sft' is used twice")),
    Case("evaluate: policy with model and completions", "evaluate",
         lambda ws: ["prompts=x.jsonl", "policies=[{name: a, model: m, completions: c}]"],
         "ConfigError", ("policy 'a'", "exactly one of model and completions")),
    Case("evaluate: baseline not among the policies", "evaluate",
         lambda ws: [f"prompts={ws.file('p.jsonl', [prompt()])}", "baseline=ref",
                     "policies=[{name: a, model: m}, {name: b, model: n}]"],
         "ConfigError", ("baseline", "'ref'", "not one of the policies")),
    # --- files -----------------------------------------------------------------------------
    Case("malformed JSONL line", "pairs",
         lambda ws: [f"input={ws.file('in.jsonl', [annotated('a'), '{not json', annotated('b')])}",
                     f"output_dir={ws.out()}"],
         "InputError", ("in.jsonl:2", "not valid JSON")),
    Case("truncated final line of an input file", "pairs",
         lambda ws: [f"input={ws.file('in.jsonl', [annotated('a')], tail=json.dumps(annotated('b'))[:40])}",
                     f"output_dir={ws.out()}"],
         "InputError", ("in.jsonl:2", "truncated last line")),
    Case("truncated final line of a prompts file", "sample",
         lambda ws: [f"prompts={ws.file('prompts.jsonl', [prompt('a')], tail=TORN)}",
                     f"output_dir={ws.out()}", *_cpu_sampler(ws.policy)],
         "InputError", ("prompts.jsonl:2", "truncated last line")),
    Case("a JSONL line that is not an object", "pairs",
         lambda ws: [f"input={ws.file('in.jsonl', [annotated('a'), '[1, 2]'])}", f"output_dir={ws.out()}"],
         "InputError", ("in.jsonl:2", "expected a JSON object", "list")),
    Case("input file missing", "sample",
         lambda ws: [f"prompts={ws.root / 'missing.jsonl'}", f"output_dir={ws.out()}", *_cpu_sampler(ws.policy)],
         "MissingInputError", ("prompts", "missing.jsonl", "does not exist")),
    Case("input directory without data files", "pairs",
         lambda ws: [f"input={(ws.root / 'emptydir').mkdir() or ws.root / 'emptydir'}", f"output_dir={ws.out()}"],
         "MissingInputError", ("emptydir", "no .jsonl, .json or .parquet files")),
    Case("empty dataset", "pairs",
         lambda ws: [f"input={ws.file('in.jsonl', [])}", f"output_dir={ws.out()}"],
         "InputError", ("in.jsonl", "holds no rows")),
    Case("empty prompts", "sample",
         lambda ws: [f"prompts={ws.file('prompts.jsonl', [])}", f"output_dir={ws.out()}", *_cpu_sampler(ws.policy)],
         "InputError", ("prompts.jsonl", "holds no rows")),
    Case("output directory under a regular file", "pairs",
         lambda ws: [f"input={ws.file('in.jsonl', [annotated('a')])}",
                     f"output_dir={ws.file('blocker', []) / 'out'}"],
         "InputError", ("output_dir", "blocker")),
    Case("sample output directory under a regular file", "sample",
         lambda ws: [f"prompts={ws.file('prompts.jsonl', [prompt()])}",
                     f"output_dir={ws.file('blocker', []) / 'out'}", *_cpu_sampler(ws.policy)],
         "InputError", ("output_dir", "blocker")),
    Case("JSON file that is not a list", "pairs",
         lambda ws: [f"input={_write(ws.root / 'in.json', json.dumps({'id': 'a'}))}", f"output_dir={ws.out()}"],
         "InputError", ("in.json", "expected a JSON list")),
    Case("unsupported file type", "pairs",
         lambda ws: [f"input={_write(ws.root / 'in.csv', 'id,messages')}", f"output_dir={ws.out()}"],
         "InputError", ("in.csv", "unsupported file type", "'.csv'")),
    Case("input is an unfinished stage output", "pairs",
         lambda ws: [f"input={jsonl(ws.root / 'annotate' / 'shard-00000-of-00002.jsonl', [annotated('a')]).parent}",
                     f"output_dir={ws.out()}"],
         "InputError", ("input=", "annotate", "unfinished stage output")),
    Case("logprobs: the pairs directory instead of pairs.jsonl", "logprobs",
         lambda ws: [f"input={_pairs_dir(ws)}", f"output_dir={ws.out()}", f"model_name_or_path={ws.policy}"],
         "InputError", ("input=", "pairs stage's output", "pairs.jsonl")),
    Case("train: truncated final line", "train",
         lambda ws: [f"input={ws.file('pairs.jsonl', [with_logps(pair('a'))], tail=TORN)}", f"output_dir={ws.out()}",
                     f"model_name_or_path={ws.policy}", "use_cpu=true", "report_to=[]"],
         "InputError", ("pairs.jsonl:2", "truncated last line")),
    Case("annotate: shards of another num_shards (resume refused)", "annotate",
         lambda ws: _other_shard_count(ws),
         "InputError", ("shard-00000-of-00002.jsonl", "num_shards=1", "different shard counts")),
    # --- rows: ids, types, rewards ---------------------------------------------------------
    Case("NaN reward", "pairs",
         lambda ws: [f"input={ws.file('in.jsonl', [annotated('a', rewards=[0.0, float('nan'), 1.0, 0.5])])}",
                     f"output_dir={ws.out()}"],
         "RecordError", ("record 'a'", "rewards[1]", "nan")),
    Case("infinite reward", "pairs",
         lambda ws: [f"input={ws.file('in.jsonl', [annotated('a', rewards=[0.0, 1.0, float('inf'), 0.5])])}",
                     f"output_dir={ws.out()}"],
         "RecordError", ("record 'a'", "rewards[2]", "inf")),
    Case("reward given as a string", "pairs",
         lambda ws: [f"input={ws.file('in.jsonl', [annotated('a', rewards=[0.0, '1.0', 1.0, 0.5])])}",
                     f"output_dir={ws.out()}"],
         "RecordError", ("record 'a'", "rewards[1]", "expected a float")),
    Case("null reward without a reason", "pairs",
         lambda ws: [f"input={ws.file('in.jsonl', [annotated('a', rewards=[0.0, None, 1.0, 0.5])])}",
                     f"output_dir={ws.out()}"],
         "RecordError", ("record 'a'", "rewards[1]", "without a reason")),
    Case("fewer rewards than completions", "pairs",
         lambda ws: [f"input={ws.file('in.jsonl', [annotated('a', rewards=[0.0, 1.0, 0.5, 0.2]) | {'rewards': [1.0]}])}",
                     f"output_dir={ws.out()}"],
         "RecordError", ("record 'a'", "'rewards'", "expected a list of 4")),
    Case("completion field of the wrong type", "pairs",
         lambda ws: [f"input={ws.file('in.jsonl', [annotated('a') | {'completions': [completion(num_tokens='2')] * 4}])}",
                     f"output_dir={ws.out()}"],
         "RecordError", ("record 'a'", "completions[0].num_tokens", "expected int")),
    Case("duplicate ids", "pairs",
         lambda ws: [f"input={ws.file('in.jsonl', [annotated('a'), annotated('b'), annotated('a')])}",
                     f"output_dir={ws.out()}"],
         "RecordError", ("record 'a'", "'id'", "duplicate id (in.jsonl:1 and in.jsonl:3)")),
    Case("duplicate prompt ids", "sample",
         lambda ws: [f"prompts={ws.file('prompts.jsonl', [prompt('a'), prompt('a')])}", f"output_dir={ws.out()}",
                     *_cpu_sampler(ws.policy)],
         "RecordError", ("record 'a'", "'id'", "duplicate id (prompts.jsonl:1 and prompts.jsonl:2)")),
    Case("missing id", "pairs",
         lambda ws: [f"input={ws.file('in.jsonl', [{k: v for k, v in annotated('a').items() if k != 'id'}])}",
                     f"output_dir={ws.out()}"],
         "RecordError", ("<row 0>", "'id'", "missing")),
    Case("id of the wrong type", "sample",
         lambda ws: [f"prompts={ws.file('prompts.jsonl', [prompt(7)])}", f"output_dir={ws.out()}",
                     *_cpu_sampler(ws.policy)],
         "RecordError", ("<row 0>", "'id'", "not a non-empty string")),
    Case("prompt not ending in a user turn", "sample",
         lambda ws: [f"prompts={ws.file('prompts.jsonl', [prompt('a') | {'messages': [{'role': 'user', 'content': 'q'}, {'role': 'assistant', 'content': 'a'}]}])}",
                     f"output_dir={ws.out()}", *_cpu_sampler(ws.policy)],
         "RecordError", ("record 'a'", "'messages'", "must end with a user turn", "'assistant'")),
    Case("message content not text", "sample",
         lambda ws: [f"prompts={ws.file('prompts.jsonl', [prompt('a', messages=[{'role': 'user', 'content': 5}])])}",
                     f"output_dir={ws.out()}", *_cpu_sampler(ws.policy)],
         "RecordError", ("record 'a'", "'messages'", "content must be a string")),
    Case("unknown role", "sample",
         lambda ws: [f"prompts={ws.file('prompts.jsonl', [prompt('a', messages=[{'role': 'robot', 'content': 'x'}, {'role': 'user', 'content': 'q'}])])}",
                     f"output_dir={ws.out()}", *_cpu_sampler(ws.policy)],
         "RecordError", ("record 'a'", "'messages'", "unknown role 'robot'")),
    Case("tools not a list", "sample",
         lambda ws: [f"prompts={ws.file('prompts.jsonl', [prompt('a', tools='calculator')])}",
                     f"output_dir={ws.out()}", *_cpu_sampler(ws.policy)],
         "RecordError", ("record 'a'", "'tools'", "must be a list")),
    Case("sample: prompt longer than the model's context (skip)", "sample",
         lambda ws: [f"prompts={ws.file('prompts.jsonl', [prompt('a'), prompt('b', 'word ' * 800)])}",
                     f"output_dir={ws.out()}", *_cpu_sampler(ws.policy)],
         None, check=lambda ws, out, err: _assert_in(
             "context length is 2048", json.dumps([r for r in _annotate_rows(ws.out()) if r["id"] == "b"]))),
    Case("message without content", "pairs",
         lambda ws: [f"input={ws.file('in.jsonl', [annotated('a') | {'messages': [{'role': 'user'}]}])}",
                     f"output_dir={ws.out()}"],
         "RecordError", ("record 'a'", "messages[0]", "'role' and 'content'")),
    Case("annotated row without completions", "annotate",
         lambda ws: [f"input={ws.file('in.jsonl', [prompt('a', answer='yes')])}", f"output_dir={ws.out()}",
                     "provider=verifiable"],
         "RecordError", ("record 'a'", "'completions'", "missing")),
    Case("verifiable reward without answer", "annotate",
         lambda ws: [f"input={ws.file('in.jsonl', [{k: v for k, v in annotated('a').items() if k not in ('rewards', 'reward_skips', 'answer')}])}",
                     f"output_dir={ws.out()}", "provider=verifiable"],
         "RecordError", ("record 'a'", "'answer'", "verifiable")),
    Case("verifiable answer of the wrong type", "annotate",
         lambda ws: [f"input={ws.file('in.jsonl', [annotated('a', answer={'value': 4})])}", f"output_dir={ws.out()}",
                     "provider=verifiable"],
         "RecordError", ("record 'a'", "'answer'", "expected a string, a number or a list")),
    Case("pairs: fewer references than num_ref_rewards", "pairs",
         lambda ws: [f"input={ws.file('in.jsonl', [annotated('a')])}", f"output_dir={ws.out()}",
                     "num_ref_rewards=10"],
         "RecordError", ("record 'a'", "'completions'", "4 reference completions", "num_ref_rewards=10")),
    Case("pairs: references without a reward (skip)", "pairs",
         lambda ws: [f"input={ws.file('in.jsonl', [annotated('a', rewards=[None, None, 1.0, 0.5], reward_skips=['judge unreadable', 'judge unreadable', None, None])])}",
                     f"output_dir={ws.out()}"],
         None, check=_check_pairs_skipped("only 2 of 4 reference rewards scored")),
    Case("pairs: every reward equal (skip)", "pairs",
         lambda ws: [f"input={ws.file('in.jsonl', [annotated('a', rewards=[1.0] * 4)])}", f"output_dir={ws.out()}"],
         None, check=_check_pairs_skipped("")),
    # --- logprobs and train ------------------------------------------------------------------
    Case("pair row without rejected", "logprobs",
         lambda ws: [f"input={ws.file('pairs.jsonl', [{k: v for k, v in pair('a').items() if k != 'rejected'}])}",
                     f"output_dir={ws.out()}", f"model_name_or_path={ws.policy}", f"chat_date={DATE}"],
         "RecordError", ("record 'a'", "'rejected'", "expected a completion string")),
    Case("logprobs: model path missing", "logprobs",
         lambda ws: [f"input={ws.file('pairs.jsonl', [pair('a')])}", f"output_dir={ws.out()}",
                     f"model_name_or_path={ws.root / 'no_model'}"],
         "MissingInputError", ("model_name_or_path", "no_model", "does not exist")),
    Case("train: pairs without reference log-probs", "train",
         lambda ws: [f"input={ws.file('pairs.jsonl', [pair('a')])}", f"output_dir={ws.out()}",
                     f"model_name_or_path={ws.policy}", "use_cpu=true", "report_to=[]"],
         "RecordError", ("record 'a'", "ref_chosen_logps", "`align logprobs`, or align.compute_ref_logprobs",
                          'reference="model"')),
    Case("train: NaN reference log-prob", "train",
         lambda ws: [f"input={ws.file('pairs.jsonl', [with_logps(pair('a'), ref_rejected_logps=float('nan'))])}",
                     f"output_dir={ws.out()}", f"model_name_or_path={ws.policy}", "use_cpu=true", "report_to=[]"],
         "RecordError", ("record 'a'", "ref_rejected_logps", "finite")),
    Case("train: model path missing", "train",
         lambda ws: [f"input={ws.file('pairs.jsonl', [with_logps(pair('a'))])}", f"output_dir={ws.out()}",
                     f"model_name_or_path={ws.root / 'no_model'}", "use_cpu=true", "report_to=[]"],
         "MissingInputError", ("model_name_or_path", "no_model", "does not exist")),
    Case("train: input missing", "train",
         lambda ws: [f"input={ws.root / 'nothing.jsonl'}", f"output_dir={ws.out()}",
                     f"model_name_or_path={ws.policy}", "use_cpu=true", "report_to=[]"],
         "MissingInputError", ("input", "nothing.jsonl", "does not exist")),
    Case("logprobs: prompt longer than max_length (skip)", "logprobs",
         lambda ws: [f"input={ws.file('pairs.jsonl', [pair('a'), pair('b', messages=LONG_PROMPT)])}",
                     f"output_dir={ws.out()}", f"model_name_or_path={ws.policy}", f"chat_date={DATE}",
                     "max_length=128", "device=cpu", "dtype=float32"],
         None, check=lambda ws, out, err: (
             _assert_in("1 of 2 rows exceed max_length=128 and are not scored", out),
             _assert_in('"over_max_length_skipped": 1', (ws.out() / "_COMPLETE.json").read_text()))),
    Case("train: reference log-probs written by hand", "train",
         lambda ws: [f"input={ws.file('pairs.jsonl', [with_logps(pair('a')), with_logps(pair('b'))])}",
                     f"output_dir={ws.out()}", f"model_name_or_path={ws.policy}", "use_cpu=true", "report_to=[]",
                     f"chat_date={DATE}", "max_length=128", "max_steps=1",
                     "per_device_train_batch_size=2", "num_ref_rewards=4"],
         "RecordError", ("record 'a'", "ref_chosen_token_hash", "rerun `align logprobs`")),
    Case("YAML no read as false for a string key", "sft",
         lambda ws: ["input=x.jsonl", "save_strategy=no"],
         "ConfigError", ("save_strategy", "False", "quote it")),
    Case("sft: conversation longer than max_length (skip)", "sft",
         lambda ws: [f"input={ws.file('sft.jsonl', [SFT_ROW, {**SFT_ROW, 'id': 's1', 'messages': LONG_PROMPT + [{'role': 'assistant', 'content': 'yes'}]}])}",
                     f"output_dir={ws.out()}", f"model_name_or_path={ws.policy}", "use_cpu=true", "report_to=[]",
                     f"chat_date={DATE}", "max_length=128", "max_steps=1", "save_strategy='no'"],
         None, check=lambda ws, out, err: (
             _assert_in("dropped 1 of 2 rows: no assistant token within max_length=128", out),
             _assert_in('"rows_dropped": 1', (ws.out() / "_COMPLETE.json").read_text()))),
    # --- sft -----------------------------------------------------------------------------
    Case("sft: empty dataset", "sft",
         lambda ws: [f"input={ws.file('sft.jsonl', [])}", f"output_dir={ws.out()}",
                     f"model_name_or_path={ws.policy}", "use_cpu=true", "report_to=[]"],
         "InputError", ("sft.jsonl", "holds no rows")),
    Case("sft: model path missing", "sft",
         lambda ws: [f"input={ws.file('sft.jsonl', [prompt('a')])}", f"output_dir={ws.out()}",
                     f"model_name_or_path={ws.root / 'no_model'}", "use_cpu=true", "report_to=[]"],
         "MissingInputError", ("model_name_or_path", "no_model", "does not exist")),
    Case("sft: messages not a list", "sft",
         lambda ws: [f"input={ws.file('sft.jsonl', [{'id': 'a', 'messages': 'hello'}])}", f"output_dir={ws.out()}",
                     f"model_name_or_path={ws.policy}", "use_cpu=true", "report_to=[]"],
         "RecordError", ("record 'a'", "'messages'", "JSON text that does not parse")),
    Case("sft: conversation without an assistant turn", "sft",
         lambda ws: [f"input={ws.file('sft.jsonl', [prompt('a')])}", f"output_dir={ws.out()}",
                     f"model_name_or_path={ws.policy}", "use_cpu=true", "report_to=[]"],
         "RecordError", ("record 'a'", "'messages'", "no assistant message")),
    Case("sft: output directory under a regular file", "sft",
         lambda ws: [f"input={ws.file('sft.jsonl', [SFT_ROW])}", f"output_dir={ws.file('blocker', []) / 'out'}",
                     f"model_name_or_path={ws.policy}", "use_cpu=true", "report_to=[]"],
         "InputError", ("output_dir", "blocker")),
    # --- models and tokenizers -------------------------------------------------------------
    Case("sample: model path missing", "sample",
         lambda ws: [f"prompts={ws.file('prompts.jsonl', [prompt()])}", f"output_dir={ws.out()}",
                     *_cpu_sampler(ws.root / 'no_model')],
         "MissingInputError", ("sampler.model", "no_model", "does not exist")),
    Case("sample: tokenizer without a chat template", "sample",
         lambda ws: [f"prompts={ws.file('prompts.jsonl', [prompt()])}", f"output_dir={ws.out()}",
                     *_cpu_sampler(ws.base), "sampler.chat_format=tokenizer"],
         "ConfigError", ("/policy'", "has no chat_template", "apertus")),
    Case("sample: shards written with other settings (resume refused)", "sample",
         lambda ws: _other_settings(ws),
         "StaleOutputError", ("holds a partial output made from other settings or inputs", "sample.n: 2 → 3",
                              "use another output_dir, or overwrite=true")),
    Case("annotate: reward model path missing", "annotate",
         lambda ws: [f"input={ws.file('in.jsonl', [annotated('a')])}", f"output_dir={ws.out()}",
                     "provider=reward_model", f"model={ws.root / 'no_rm'}", "device=cpu"],
         "MissingInputError", ("model", "no_rm", "does not exist")),
    Case("annotate: reward model without a chat template", "annotate",
         lambda ws: [f"input={ws.file('in.jsonl', [annotated('a')])}", f"output_dir={ws.out()}",
                     "provider=reward_model", f"model={ws.rm_plain}", "device=cpu"],
         "InputError", ("chat template",)),
    Case("annotate: reward model with pad equal to EOS", "annotate",
         lambda ws: [f"input={ws.file('in.jsonl', [annotated('a')])}", f"output_dir={ws.out()}",
                     "provider=reward_model", f"model={ws.rm_pad_eos}", "device=cpu"],
         "InputError", ("pad", "EOS")),
    Case("annotate: prompt longer than max_length (skip)", "annotate",
         lambda ws: [f"input={ws.file('in.jsonl', [annotated('a', messages=[{'role': 'user', 'content': 'word ' * 200}])])}",
                     f"output_dir={ws.out()}",
                     "provider=reward_model", f"model={ws.rm}", "device=cpu", "max_length=32"],
         None, check=_check_annotate_skip("max_length")),
    # --- evaluate, decontaminate, judge-validate -------------------------------------------
    Case("evaluate: prompts missing", "evaluate",
         lambda ws: [f"prompts={ws.root / 'held_out.jsonl'}", "baseline=a",
                     "policies=[{name: a, model: m}, {name: b, model: n}]"],
         "MissingInputError", ("prompts", "held_out.jsonl", "does not exist")),
    Case("evaluate: policy model missing", "evaluate",
         lambda ws: [f"prompts={ws.file('p.jsonl', [prompt('a', answer='yes')])}", "baseline=a",
                     f"output_dir={ws.out()}",
                     f"policies=[{{name: a, model: {ws.policy}}}, {{name: b, model: {ws.root / 'gone'}}}]"],
         "MissingInputError", ("policies[1]", "'b'", "gone", "does not exist")),
    Case("evaluate: verifiable reward without answer", "evaluate",
         lambda ws: [f"prompts={ws.file('p.jsonl', [prompt('a')])}", "baseline=a", f"output_dir={ws.out()}",
                     f"policies=[{{name: a, model: {ws.policy}}}, {{name: b, model: {ws.policy}}}]"],
         "RecordError", ("record 'a'", "'answer'")),
    Case("evaluate: duplicate prompt ids", "evaluate",
         lambda ws: [f"prompts={ws.file('p.jsonl', [prompt('a', answer='y'), prompt('a', answer='n')])}",
                     "baseline=a", f"output_dir={ws.out()}",
                     f"policies=[{{name: a, model: {ws.policy}}}, {{name: b, model: {ws.policy}}}]"],
         "RecordError", ("record 'a'", "'id'", "duplicate id (p.jsonl:1 and p.jsonl:2)")),
    Case("decontaminate: benchmark file missing", "decontaminate",
         lambda ws: [f"input={ws.file('train.jsonl', [prompt('a')])}", f"output_dir={ws.out()}",
                     f"benchmarks=[{{name: b, path: {ws.root / 'bench.jsonl'}}}]"],
         "MissingInputError", ("bench.jsonl", "not found")),
    Case("decontaminate: benchmark without the text field", "decontaminate",
         lambda ws: [f"input={ws.file('train.jsonl', [prompt('a')])}", f"output_dir={ws.out()}",
                     f"benchmarks=[{{name: b, path: {ws.file('bench.jsonl', [{'question': 'q'}])}}}]"],
         "RecordError", ("bench.jsonl", "'prompt'")),
    Case("decontaminate: malformed training file", "decontaminate",
         lambda ws: [f"input={ws.file('train.jsonl', [prompt('a'), '{oops'])}", f"output_dir={ws.out()}",
                     f"benchmarks=[{{name: b, path: {ws.file('bench.jsonl', [{'prompt': 'q'}])}}}]"],
         "InputError", ("train.jsonl", "line 2", "not valid JSON")),
    Case("decontaminate: empty benchmark", "decontaminate",
         lambda ws: [f"input={ws.file('train.jsonl', [prompt('a')])}", f"output_dir={ws.out()}",
                     f"benchmarks=[{{name: b, path: {ws.file('bench.jsonl', [])}}}]"],
         "InputError", ("bench.jsonl", "benchmark 'b'", "empty")),
    Case("evaluate: policy completions missing", "evaluate",
         lambda ws: [f"prompts={ws.file('p.jsonl', [prompt('a', answer='yes')])}", "baseline=a",
                     f"output_dir={ws.out()}",
                     f"policies=[{{name: a, model: {ws.policy}}}, {{name: b, completions: {ws.root / 'old'}}}]"],
         "MissingInputError", ("policies[1]", "'b'", "completions=", "does not exist")),
    Case("judge-validate: a prompt without a good completion (skip)", "judge-validate",
         lambda ws: [f"input={ws.file('in.jsonl', [prompt('a'), prompt('b', completion=GOOD)])}",
                     f"output_dir={ws.out()}", f"model={ws.policy}", "device=cpu", "pairwise=false",
                     "resamples=200", "steps=2"],
         None, check=lambda ws, out, err: _assert_in(
             "'a'", repr([(s["id"], s["reason"]) for s in json.loads((ws.out() / "report.json").read_text())["skipped"]
                         if "no good completion" in s["reason"]]))),
    Case("judge-validate: no judge model", "judge-validate",
         lambda ws: [f"input={ws.file('in.jsonl', [prompt('a', completion='yes')])}", f"output_dir={ws.out()}"],
         "ConfigError", ("judge-validate: set model", "the judge")),
    Case("judge-validate: input missing", "judge-validate",
         lambda ws: [f"input={ws.root / 'ladders.jsonl'}", f"output_dir={ws.out()}", f"model={ws.policy}"],
         "MissingInputError", ("input", "ladders.jsonl", "does not exist")),
    # --- input directories and paths: one reading rule --------------------------------------
    Case("input directory holding a file that is not data", "pairs",
         lambda ws: [f"input={_data_dir(ws, 'notes.txt')}", f"output_dir={ws.out()}"],
         "InputError", ("notes.txt", "not a data file", "move it out")),
    Case("input directory holding an unknown marker-like file", "pairs",
         lambda ws: [f"input={_data_dir(ws, '_extra.jsonl')}", f"output_dir={ws.out()}"],
         "InputError", ("_extra.jsonl", "named like one of the library's markers")),
    Case("input directory holding a subdirectory", "pairs",
         lambda ws: [f"input={_data_dir(ws, 'more/b.jsonl')}", f"output_dir={ws.out()}"],
         "InputError", ("more", "a subdirectory inside an input directory")),
    Case("input directory with .json and upper-case .JSONL files (read)", "pairs",
         lambda ws: [f"input={_data_dir(ws, 'b.JSONL', 'c.json')}", f"output_dir={ws.out()}"],
         None, check=lambda ws, out, err: _assert_in(
             "['a', 'b', 'c']", repr(sorted(r["id"] for r in _skips(ws.out() / "pairs.jsonl"))))),
    Case("empty input path", "pairs", lambda ws: ["input=", f"output_dir={ws.out()}"],
         "ConfigError", ("pairs: set input", "never read as the current directory")),
    Case("missing input with an upper-case suffix (no hub lookup)", "pairs",
         lambda ws: ["input=gone.JSONL", f"output_dir={ws.out()}"],
         "MissingInputError", ("pairs: input='gone.JSONL' does not exist",)),
    # --- recipes: a key given twice ---------------------------------------------------------
    Case("recipe with a key given twice", "pairs",
         lambda ws: [_recipe(ws, "seed: 1\ninput: x.jsonl\nseed: 2\n")],
         "ConfigError", ("recipe.yaml", "key 'seed' is given twice (lines 1 and 3)")),
    Case("pipeline: two train sections", "pipeline",
         lambda ws: [_recipe(ws, "train: {beta: 1}\npairs: {input: x.jsonl}\ntrain: {beta: 5}\n")],
         "ConfigError", ("recipe.yaml", "key 'train' is given twice (lines 1 and 3)")),
    # --- outputs: never written through a symlink -------------------------------------------
    Case("annotate: output shard that is a symlink", "annotate",
         lambda ws: _linked(ws, "shard-00001-of-00002.jsonl"),
         "InputError", ("shard-00001-of-00002.jsonl is a symlink", "remove the link")),
    Case("annotate: shard lock file that is a symlink", "annotate",
         lambda ws: _linked(ws, "shard-00001-of-00002.lock"),
         "InputError", ("shard-00001-of-00002.lock is a symlink",)),
    # --- the verifiable reward: model text is untrusted ---------------------------------------
    Case("annotate: completion with a ten-million-digit exponent (scored)", "annotate",
         lambda ws: [_verifiable_input(ws, "1e10000000", "\\boxed{1e5000}", "\\boxed{4}"),
                     f"output_dir={ws.out()}", "provider=verifiable"],
         None, check=lambda ws, out, err: _assert_in("[0.0, 0.0, 1.0]", repr(_annotate_rows(ws.out())[0]["rewards"]))),
    Case("annotate: completion of 100,000 digits (scored)", "annotate",
         lambda ws: [_verifiable_input(ws, "9" * 100_000, "\\boxed{" + "9" * 100_000 + "}", "4"),
                     f"output_dir={ws.out()}", "provider=verifiable"],
         None, check=lambda ws, out, err: _assert_in("[0.0, 0.0, 1.0]", repr(_annotate_rows(ws.out())[0]["rewards"]))),
    Case("annotate: empty reference answer", "annotate",
         lambda ws: [f"input={ws.file('in.jsonl', [annotated('a', answer='')])}", f"output_dir={ws.out()}",
                     "provider=verifiable"],
         "RecordError", ("record 'a'", "'answer'", "empty reference answer", "it would match an empty")),
    Case("annotate: reference answer too long to compare", "annotate",
         lambda ws: [f"input={ws.file('in.jsonl', [annotated('a', answer='7' * 1001)])}", f"output_dir={ws.out()}",
                     "provider=verifiable"],
         "RecordError", ("record 'a'", "'answer'", "1001 characters (over 1000)")),
    Case("evaluate: empty reference answer", "evaluate",
         lambda ws: [f"prompts={ws.file('p.jsonl', [prompt('a', answer='  ')])}", "baseline=a", f"output_dir={ws.out()}",
                     f"policies=[{{name: a, model: {ws.policy}}}, {{name: b, model: {ws.policy}}}]"],
         "RecordError", ("record 'a'", "'answer'", "empty reference answer")),
    # --- OpenAI-compatible servers: the API key and a server that is down ---------------------
    Case("annotate: judge server down", "annotate",
         lambda ws: [*_judge_openai(ws, _closed_url()), "max_retries=2"],
         "ServerError", ("/v1/models: request failed after 3 tries",)),
    Case("annotate: judge server demands an API key, none set", "annotate",
         lambda ws: [*_judge_openai(ws, _keyed_url())],
         "ServerError", ("/v1/models: HTTP 401", "no API key was sent", "api_key_env")),
    Case("annotate: api_key_env names an unset variable", "annotate",
         lambda ws: [*_judge_openai(ws, _keyed_url()), "api_key_env=ALIGN_NO_SUCH_KEY_VAR"],
         "ConfigError", ("api_key_env='ALIGN_NO_SUCH_KEY_VAR'", "$ALIGN_NO_SUCH_KEY_VAR is not set")),
    Case("annotate: api_key_env holding the key itself", "annotate",
         lambda ws: ["input=x.jsonl", "provider=verifiable", "api_key_env=sk-live-0123"],
         "ConfigError", ("api_key_env: must be the name of an environment variable", "not the key itself")),
    Case("sample: server down", "sample",
         lambda ws: [f"prompts={ws.file('prompts.jsonl', [prompt()])}", f"output_dir={ws.out()}",
                     *_openai_sampler(ws, _closed_url()), "sampler.max_retries=2"],
         "ServerError", ("/v1/models: request failed after 3 tries",)),
    Case("sample: server refuses the API key", "sample",
         lambda ws: [f"prompts={ws.file('prompts.jsonl', [prompt()])}", f"output_dir={ws.out()}",
                     *_openai_sampler(ws, _keyed_url()), "sampler.api_key_env=ALIGN_BAD_INPUTS_KEY"],
         "ServerError", ("/v1/models: HTTP 401", "the API key sent was refused"),
         extra={"env": {"ALIGN_BAD_INPUTS_KEY": "not-the-key"}}),
    # --- the judge's charter ------------------------------------------------------------------
    Case("annotate: judge charter path missing", "annotate",
         lambda ws: [f"input={ws.file('in.jsonl', [annotated('a')])}", f"output_dir={ws.out()}", "provider=judge",
                     f"model={ws.policy}", "device=cpu", f"charter={ws.root / 'mine' / 'default.md'}"],
         "MissingInputError", ("no charter", "mine/default.md", "file not found")),
    Case("annotate: judge charter name unknown", "annotate",
         lambda ws: [f"input={ws.file('in.jsonl', [annotated('a')])}", f"output_dir={ws.out()}", "provider=judge",
                     f"model={ws.policy}", "device=cpu", "charter=defualt"],
         "MissingInputError", ("no charter 'defualt'", "not one of the bundled charters", "default.md")),
    # --- chat turn order ----------------------------------------------------------------------
    Case("sft: two assistant messages in a row", "sft",
         lambda ws: [f"input={ws.file('sft.jsonl', [{'id': 'a', 'messages': SFT_ROW['messages'] + [{'role': 'assistant', 'content': 'sure'}]}])}",
                     f"output_dir={ws.out()}", f"model_name_or_path={ws.policy}", "use_cpu=true", "report_to=[]",
                     f"chat_date={DATE}"],
         "RecordError", ("record 'a'", "'messages'", "message 2 (assistant): follows assistant message 1")),
    Case("sft: tool call answered without its output", "sft",
         lambda ws: [f"input={ws.file('sft.jsonl', [{'id': 'a', 'messages': [SFT_ROW['messages'][0], {'role': 'assistant', 'content': None, 'tool_calls': [{'function': {'name': 'calc', 'arguments': '{}'}}]}, {'role': 'assistant', 'content': '4'}]}])}",
                     f"output_dir={ws.out()}", f"model_name_or_path={ws.policy}", "use_cpu=true", "report_to=[]",
                     f"chat_date={DATE}"],
         "RecordError", ("record 'a'", "message 2 (assistant): follows assistant message 1", "tool outputs")),
    Case("sample: prompt opening with an assistant message", "sample",
         lambda ws: [f"prompts={ws.file('prompts.jsonl', [prompt('a', messages=[{'role': 'assistant', 'content': 'Hi!'}, {'role': 'user', 'content': 'q'}])])}",
                     f"output_dir={ws.out()}", *_cpu_sampler(ws.policy)],
         "RecordError", ("record 'a'", "'messages'", "message 0 (assistant): the conversation opens with an assistant")),
    # --- evaluate: given completions are checked against the prompts -------------------------
    Case("evaluate: given completions answering another prompt", "evaluate",
         lambda ws: _given(ws, [prompt('a', 'Is 5 even?', answer='no') | {'completions': [completion('no')] * 2}]),
         "RecordError", ("record 'a'", "'messages'", "answered another prompt")),
    Case("evaluate: given completions without their prompt", "evaluate",
         lambda ws: _given(ws, [{'id': 'a', 'completions': [completion('yes')] * 2}]),
         "RecordError", ("record 'a'", "'messages'", "must carry the prompt they answered")),
    Case("evaluate: given completions with an id twice", "evaluate",
         lambda ws: _given(ws, [prompt('a', answer='yes') | {'completions': [completion('yes')] * 2}] * 2),
         "RecordError", ("record 'a'", "'id'", "duplicate id (", "given.jsonl")),
    Case("evaluate: fewer given completions than n", "evaluate",
         lambda ws: _given(ws, [prompt('a', answer='yes') | {'completions': [completion('yes')]}]),
         "InputError", ("every prompt was left out", "1 completions, n=2 are evaluated", "smaller n")),
    # --- reruns: what an output was made from (docs/bad-inputs.md, "Reruns and manifests") ---------
    Case("rerun: pairs with another setting", "pairs",
         lambda ws: [*_done_pairs(ws), "seed=1"],
         "StaleOutputError", ("holds an output made from other settings or inputs", "pairs.seed: 0 → 1",
                              "use another output_dir, or overwrite=true")),
    Case("rerun: pairs after an input row changed", "pairs",
         lambda ws: _done_pairs(ws, change=lambda rows: [rows[0] | {"rewards": [1.0, 0.0, 0.5, 0.2]}, *rows[1:],
                                                          annotated("added")]),
         "StaleOutputError", ("pairs.input ({root}/in.jsonl): content changed (1 row differs, 1 added)",)),
    Case("rerun: an output written without a manifest", "pairs",
         lambda ws: [f"input={ws.file('in.jsonl', [annotated('a')])}",
                     f"output_dir={_write(ws.out() / '_COMPLETE.json', OLD_MARKER).parent}"],
         "StaleOutputError", ("written without a manifest", "what it was made from, and which of its files the "
                                                             "stage wrote, are unknown", "remove it yourself")),
    Case("rerun: output_dir holds another stage's output", "pairs",
         lambda ws: [f"input={ws.file('in.jsonl', [annotated('a')])}", f"output_dir={_done_annotate(ws)}"],
         "StaleOutputError", ("holds the annotate stage's output; choose another output_dir",
                              "overwrite=true never removes another stage's output")),
    Case("rerun: an earlier stage's output changed", "pairs",
         lambda ws: _upstream_changed(ws),
         "StaleOutputError", ("pairs.input (", "made from other settings or inputs (the annotate stage's "
                                                "manifest changed)")),
    Case("rerun: partial job from other inputs", "annotate",
         lambda ws: _partial_annotate_other_rows(ws),
         "StaleOutputError", ("holds a partial output made from other settings or inputs",
                              "annotate.input ({root}/in.jsonl): content changed (1 row differs)")),
    Case("rerun: the base model's weights changed", "sft",
         lambda ws: _sft_weights_changed(ws),
         "StaleOutputError", ("sft.model_name_or_path (", "other weights")),
    Case("rerun: a judge's charter changed", "annotate",
         lambda ws: _judge_charter_changed(ws),
         "StaleOutputError", ("annotate.charter (", "other charter text")),
    Case("rerun: a key that changes nothing is not a difference", "pairs",
         lambda ws: [*_done_pairs(ws), "overwrite=false"],
         check=lambda ws, out, err: _assert_in("is already complete; skipping", out)),
    Case("pipeline: an early stage made from other settings stops it", "pipeline",
         lambda ws: _pipeline_stale(ws),
         "StaleOutputError", ("pairs: ", "pairs.low_threshold: 0.2 → 0.3")),
    Case("demo: output_dir holding other files", "demo",
         lambda ws: [f"output_dir={_write(ws.out() / 'thesis.tex', 'mine').parent}", "preset=ci"],
         "InputError", ("holds files that no demo run wrote (thesis.tex)", "choose a new or empty output_dir")),
    Case("demo: output_dir is a file", "demo",
         lambda ws: [f"output_dir={_write(ws.root / 'report.txt', 'x')}", "preset=ci"],
         "InputError", ("output_dir=", "report.txt", "is a file, not a directory")),

    # --- real data at scale: the red team's cases (docs/bad-inputs.md, "Real data at scale") ------------
    Case("a pairs output edited after it was made", "logprobs", lambda ws: _edited_pairs(ws),
         "InputError", ("changed since it was made", "pairs.jsonl")),
    Case("a stage output copied, then filtered", "pairs", lambda ws: _copied_and_filtered(ws),
         "InputError", ("changed since it was made", "copy the data files")),
    Case("a shard file of a killed job named as input", "pairs", lambda ws: _killed_shard_file(ws),
         "InputError", ("a file of an unfinished stage output",)),
    Case("a JSONL row with a key twice", "pairs", lambda ws: _raw_row(ws, "twice.jsonl", _TWICE),
         "InputError", ("twice.jsonl:1", "the key 'id' is given twice")),
    Case("a lone surrogate in a row", "pairs", lambda ws: _raw_row(ws, "half.jsonl", _HALF),
         "InputError", ("half.jsonl:1", "lone UTF-16 surrogate")),
    Case("JSON nested 5,000 deep in a row", "pairs", lambda ws: _raw_row(ws, "deep.jsonl", _DEEP),
         "InputError", ("deep.jsonl:1", "nested deeper than 64 levels")),
    Case("JSON nested 5,000 deep in tool-call arguments", "sample", lambda ws: [
        f"prompts={ws.file('p.jsonl', [_deep_tool_call()])}", f"output_dir={ws.out()}", *_cpu_sampler(ws.policy)],
         "RecordError", ("record 'a'", "field 'messages'", "not valid JSON", "recursion")),
    Case("a completion marker of the wrong shape", "pairs", lambda ws: _wrong_marker(ws),
         "InputError", ("_COMPLETE.json", "not a completion marker")),
    Case("beta = inf", "train", lambda ws: ["input=x.jsonl", "beta=.inf"],
         "ConfigError", ("beta", "not a finite number")),
    Case("learning_rate = inf", "train", lambda ws: ["input=x.jsonl", "learning_rate=.inf"],
         "ConfigError", ("learning_rate", "not a finite number")),
    Case("temperature = nan", "sample", lambda ws: ["prompts=x.jsonl", "temperature=.nan"],
         "ConfigError", ("temperature", "not a finite number")),
    Case("an SFT learning rate that diverges", "sft", lambda ws: [
        f"input={ws.file('sft.jsonl', [dict(SFT_ROW, id=f's{i}') for i in range(8)])}", f"output_dir={ws.out()}", f"model_name_or_path={ws.policy}",
        "use_cpu=true", "bf16=false", "report_to=[]", "max_steps=4", "learning_rate=1e8", "optimizer=adamw",
        "per_device_train_batch_size=4", "save_strategy='no'", "disable_tqdm=true"],
         "TrainingDivergedError", ("the loss is nan at step", "no checkpoint was saved yet", "Nothing is marked complete")),
    Case("one resample", "evaluate", lambda ws: ["prompts=x.jsonl", "resamples=1"],
         "ConfigError", ("resamples=1", "at least 200 resamples")),
    Case("no resamples", "evaluate", lambda ws: ["prompts=x.jsonl", "resamples=0"],
         "ConfigError", ("resamples=0", "at least 200 resamples")),
    Case("output_dir = its own input", "decontaminate", lambda ws: _decontaminate_into_its_input(ws),
         "ConfigError", ("holds its input",)),
    Case("output_dir = . (holding the input)", "pairs", lambda ws: [
        f"input={ws.file('in.jsonl', [annotated('a')])}", f"output_dir={ws.root}"],
         "ConfigError", ("holds its input input=",)),
    Case("sft output_dir = the base model", "sft", lambda ws: _sft_into_its_model(ws),
         "ConfigError", ("output_dir=", "is its input model_name_or_path=")),
    Case("an output inside its input directory", "annotate", lambda ws: [
        f"input={_data_dir(ws)}", f"output_dir={ws.root / 'data' / 'out'}", "provider=verifiable"],
         "ConfigError", ("is inside its input input=",)),
    Case("a dangling symlink as output_dir", "pairs", lambda ws: _dangling_output(ws),
         "InputError", ("a symbolic link to nothing",)),
    Case("$SCRATCH unset in a path", "pairs", lambda ws: ["input=$SCRATCH_NOT_SET/in.jsonl", "output_dir=x"],
         "ConfigError", ("$SCRATCH_NOT_SET is not set",)),
    Case("join rows without an id", "join", lambda ws: [
        f"input={ws.file('a.jsonl', [{'messages': []}])}", f"completions={ws.file('b.jsonl', [prompt('b')])}",
        f"output_dir={ws.out()}"], "RecordError", ("<input row 0>", "field 'id'")),
    Case("join rows with a list id", "join", lambda ws: [
        f"input={ws.file('a.jsonl', [prompt('a')])}", f"completions={ws.file('b.jsonl', [{'id': ['b']}])}",
        f"output_dir={ws.out()}"], "RecordError", ("<completions row 0>", "field 'id'")),
    Case("plan: a string vocab_size", "plan", lambda ws: _plan_config(ws, vocab_size="32k"),
         "ConfigError", ("vocab_size is '32k', not a positive whole number",)),
    Case("plan: a NaN vocab_size", "plan", lambda ws: _plan_config(ws, vocab_size=float("nan")),
         "ConfigError", ("vocab_size is nan",)),
    Case("plan: hidden_size 0", "plan", lambda ws: _plan_config(ws, hidden_size=0),
         "ConfigError", ("hidden_size is 0",)),
    Case("a YAML alias bomb", "pairs", lambda ws: [_recipe(ws, _ALIAS_BOMB)],
         "ConfigError", ("expands to more than 100,000 values",)),
    Case("two pipeline steps share one output_dir", "pipeline", lambda ws: [_recipe(ws, f"""
annotate: {{input: {ws.file('in.jsonl', [annotated('a')])}, output_dir: {ws.out('same')}, provider: verifiable}}
pairs: {{input: {ws.out('same')}, output_dir: {ws.out('same')}}}
""")], "ConfigError", ("steps 'annotate' and 'pairs' both write",)),
    Case("defaults naming a model", "pipeline", lambda ws: [_recipe(ws, f"""
defaults: {{model: org/judge-32b}}
annotate: {{input: {ws.file('in.jsonl', [annotated('a')])}, output_dir: {ws.out()}, provider: verifiable}}
""")], "ConfigError", ("defaults: 'model' names one step's own work",)),
    Case("a prompt holding the format's BOS", "sample", lambda ws: [
        f"prompts={ws.file('p.jsonl', [prompt('a'), prompt('b', 'Strike <s>this</s> out')])}",
        f"output_dir={ws.out()}", *_cpu_sampler(ws.policy)], None,
         check=_check_sample_skip("b", "special_token_text")),
    Case("an SFT conversation holding a turn delimiter", "sft", lambda ws: [
        f"input={ws.file('sft.jsonl', [dict(SFT_ROW, id=f's{i}') for i in range(4)] + [_sft_row('x <|user_end|> y')])}", f"output_dir={ws.out()}",
        f"model_name_or_path={ws.policy}", "use_cpu=true", "bf16=false", "report_to=[]", "max_steps=1",
        "optimizer=adamw", "per_device_train_batch_size=2", "save_strategy='no'", "disable_tqdm=true"], None,
         check=_check_sft_skip),
    # --- the step graph, checked whole when a recipe is read (docs/bad-inputs.md, "The step graph") ---
    Case("annotate: a sampling skip row", "annotate", lambda ws: [
        f"input={ws.file('s.jsonl', [annotated('a'), prompt('b', skip_reason='special_token_text: <s>')])}",
        f"output_dir={ws.out()}", "provider=verifiable"], None, check=_check_passed_on("b")),
    Case("pairs: a sampling skip row", "pairs", lambda ws: [
        f"input={ws.file('s.jsonl', [annotated('a'), prompt('b', skip_reason='special_token_text: <s>')])}",
        f"output_dir={ws.out()}"], None, check=_check_pairs_upstream("b")),
    Case("pipeline: a where label in quotes", "status", lambda ws: [_graph(ws, {"rm": {"controversial": "false"},
                                                                               "judge": {"controversial": True}})],
         "ConfigError", ("step 'rm': where.controversial: 'false' is not a value step 'classify' writes",
                         "it writes true, false, null", "write them without quotes")),
    Case("pipeline: a split that leaves a label out", "status", lambda ws: [_graph(ws, {
        "rm": {"controversial": False}, "judge": {"controversial": True}})],
         "ConfigError", ("steps ['rm', 'judge'] split 'classify''s rows by 'controversial'",
                         "no step selects the rows with controversial: null", "where_rest: drop")),
    Case("pipeline: a label two branches select", "status", lambda ws: [_graph(ws, {
        "rm": {"controversial": [False, None]}, "judge": {"controversial": [True, None]}})],
         "ConfigError", ("steps ['rm', 'judge'] each select the rows with controversial: null",)),
    Case("pipeline: two output_dirs one directory through a link", "status", lambda ws: [_aliased(ws)],
         "ConfigError", ("steps 'a' and 'b' both write", "are one directory")),
    Case("pipeline: steps reading each other", "status", lambda ws: [_recipe(ws, f"""
output_dir: {ws.out('g')}
steps:
  a: {{stage: annotate, input: "@b", provider: verifiable}}
  b: {{stage: annotate, input: "@a", provider: verifiable}}
""")], "ConfigError", ("steps read each other's outputs in a cycle (a reads b reads a)",)),
    Case("pipeline: a step named --help", "status", lambda ws: [_recipe(ws, f"""
output_dir: {ws.out('g')}
steps:
  --help: {{stage: pairs, input: x.jsonl}}
""")], "ConfigError", ("steps: '--help' is not a step name", "a command-line argument of the step's job")),
    Case("pipeline: a step named x=1", "status", lambda ws: [_recipe(ws, f"""
output_dir: {ws.out('g')}
steps:
  x=1: {{stage: pairs, input: x.jsonl}}
""")], "ConfigError", ("steps: 'x=1' is not a step name",)),
    Case("pipeline: a stage's name where a step is meant", "status", lambda ws: [_graph(ws, {
        "rm": {"controversial": False}, "judge": {"controversial": [True, None]}}), "annotate.batch_size=4"],
         "ConfigError", ("annotate.batch_size=...: this recipe is a step graph, where annotate is a stage",
                         "its annotate steps are ['classify', 'rm', 'judge']", "set classify.batch_size=...")),
    Case("pipeline: a misspelt step in an override", "status", lambda ws: [_graph(ws, {
        "rm": {"controversial": False}, "judge": {"controversial": [True, None]}}), "jugde.batch_size=4"],
         "ConfigError", ("'jugde' names no step of this recipe; did you mean judge.batch_size?",)),
    Case("pipeline: the pass and training cut rows apart", "status", lambda ws: [_recipe(ws, f"""
output_dir: {ws.out('g')}
steps:
  logprobs: {{stage: logprobs, input: {ws.file('p.jsonl', [])}, model_name_or_path: m, max_length: 2048}}
  train: {{stage: train, input: "@logprobs", model_name_or_path: m, max_length: 4096, use_cpu: true}}
""")], "ConfigError", ("steps 'logprobs' and 'train': max_length is 2048 in the reference pass and 4096 in training",)),
    Case("pipeline: a pairs directory read whole", "status", lambda ws: [_recipe(ws, f"""
output_dir: {ws.out('g')}
steps:
  pairs: {{stage: pairs, input: {ws.file('a.jsonl', [annotated('a')])}}}
  logprobs: {{stage: logprobs, input: "@pairs", model_name_or_path: m}}
""")], "ConfigError", ("step 'logprobs': input=", "name its data file: input=@pairs/pairs.jsonl")),
    Case("pipeline: a key reading another kind of rows", "status", lambda ws: [_recipe(ws, f"""
output_dir: {ws.out('g')}
steps:
  annotate: {{stage: annotate, input: {ws.file('a.jsonl', [annotated('a')])}, provider: verifiable}}
  logprobs: {{stage: logprobs, input: "@annotate", model_name_or_path: m}}
""")], "ConfigError", ("step 'logprobs': input=", "is step 'annotate''s output (annotate: scored samples), but input "
                       "reads pairs")),
    Case("step: a name the recipe does not hold", "step", lambda ws: [_recipe(ws, f"""
annotate: {{input: {ws.file('in.jsonl', [annotated('a')])}, output_dir: {ws.out()}, provider: verifiable}}
"""), "anotate"], "ConfigError", ("no step 'anotate' in", "steps: ['annotate']")),
    Case("sample: server answers 400 n exceeds max_num_seqs", "sample",
         lambda ws: [*_sample_one(ws), *_openai_sampler(ws, _failing_url("refuse"))],
         "ServerError", ("/refuse/v1/completions: HTTP 400 BadRequestError: n=2 exceeds max_num_seqs (1)",)),
    Case("annotate: judge server answers 400 without a length code", "annotate",
         lambda ws: [*_judge_openai(ws, _failing_url("refuse")), "max_retries=0"],
         "ServerError", ("/refuse/v1/completions: HTTP 400 BadRequestError: n=2 exceeds max_num_seqs (1)",)),
    Case("sample: server drips its answer a byte at a time", "sample",
         lambda ws: [*_sample_one(ws), *_openai_sampler(ws, _failing_url("drip")), "sampler.timeout_s=1",
                     "sampler.max_retries=0"],
         "ServerError", ("/drip/v1/models: request failed after 1 tries (timeout 1 s each): no whole answer",)),
    Case("sample: server aborts every completion", "sample",
         lambda ws: [*_sample_one(ws), *_openai_sampler(ws, _failing_url("abort")), "sampler.max_retries=1"],
         "ServerError", ("/abort/v1/completions: the server aborted 2 of 2 choices (finish_reason 'abort')",
                         "after 2 tries")),
    Case("sample: server answer shorter than its Content-Length", "sample",
         lambda ws: [*_sample_one(ws), *_openai_sampler(ws, _failing_url("short")), "sampler.max_retries=1"],
         "ServerError", ("/short/v1/completions: the answer was cut short after 2 tries (", " bytes of ")),
    Case("sample: /models answers a JSON list", "sample",
         lambda ws: [*_sample_one(ws), *_openai_sampler(ws, _failing_url("listmodels"))],
         "ServerError", ("/listmodels/v1/models: answer is a JSON list, not an object",)),
    Case("annotate: judge /models answers a JSON list", "annotate",
         lambda ws: _judge_openai(ws, _failing_url("listmodels")),
         "ServerError", ("/listmodels/v1/models: answer is a JSON list, not an object",)),
    Case("sample: server max_model_len below every prompt", "sample",
         lambda ws: [*_sample_one(ws), *_openai_sampler(ws, _failing_url("small"))],
         "InputError", ("every prompt is too long for the context length of 8 tokens (the server's max_model_len (",
                        "/small/v1/models)): the shortest has ", "vllm serve --max-model-len")),
    Case("sample: timeout_s=1e12", "sample", lambda ws: ["prompts=p.jsonl", "sampler.timeout_s=1e12"],
         "ConfigError", ("sampler: timeout_s: must be a number of seconds in (0, 604800] (a week), got 1e+12",)),
    Case("sample: max_retries=-1", "sample", lambda ws: ["prompts=p.jsonl", "sampler.max_retries=-1"],
         "ConfigError", ("sampler: max_retries: must be an integer in [0, 100], got -1",)),
    Case("annotate: max_retries=1000", "annotate", lambda ws: ["input=x.jsonl", "provider=verifiable",
                                                               "max_retries=1000"],
         "ConfigError", ("max_retries: must be an integer in [0, 100], got 1000",)),
    Case("sample: concurrency=0", "sample", lambda ws: ["prompts=p.jsonl", "sampler.concurrency=0"],
         "ConfigError", ("sampler: concurrency: must be an integer in [1, 1024], got 0",)),
    Case("sample: base_url names an unset $VAR", "sample",
         lambda ws: ["prompts=p.jsonl", "sampler.backend=openai", "sampler.model=m",
                     "sampler.base_url=$ALIGN_NO_SUCH_URL"],
         "ConfigError", ("sampler: base_url='$ALIGN_NO_SUCH_URL': $ALIGN_NO_SUCH_URL is not set",)),
    Case("sample: base_url from $VAR (sampled)", "sample",
         lambda ws: [*_sample_one(ws), *_openai_sampler(ws, "$ALIGN_BAD_INPUTS_URL")],
         None, check=lambda ws, out, err: _check_sampled_without(ws, out, err, ()),
         extra={"env": {"ALIGN_BAD_INPUTS_URL": lambda: _failing_url("ok")}}),
    Case("sample: user:password@ in base_url (sent as a header, sampled)", "sample",
         lambda ws: [*_sample_one(ws), *_openai_sampler(ws, _failing_url("keyed", userinfo=True))],
         None, check=lambda ws, out, err: _check_sampled_without(ws, out, err, _URL_SECRETS)),
    Case("sample: ?api_key= in base_url (sent as a header, sampled)", "sample",
         lambda ws: [*_sample_one(ws), *_openai_sampler(ws, _failing_url("keyed", query=True))],
         None, check=lambda ws, out, err: _check_sampled_without(ws, out, err, _URL_SECRETS)),
    Case("sample: base_url with credentials and api_key_env", "sample",
         lambda ws: ["prompts=p.jsonl", "sampler.backend=openai", "sampler.model=m",
                     "sampler.base_url=http://node17:8000/v1?api_key=k-2718", "sampler.api_key_env=MY_KEY"],
         "ConfigError", ("sampler: base_url='http://node17:8000/v1?api_key=' carries credentials",
                         "api_key_env names $MY_KEY: keep one")),
    # --- servers: the openai backend (entries above this line) ------------------------------
    Case("sft: own template without a generation prompt", "sft",
         lambda ws: [f"input={ws.file('sft.jsonl', [SFT_ROW])}", f"output_dir={ws.out()}", "chat_format=tokenizer",
                     f"model_name_or_path={_own_model(ws, NO_GENERATION_PROMPT)}", "use_cpu=true", "report_to=[]"],
         "ConfigError", ("chat template of '{root}/own'", "has no generation prompt", "'<|assistant_start|>'")),
    Case("sample: own template without a generation prompt", "sample",
         lambda ws: [f"prompts={ws.file('prompts.jsonl', [prompt()])}", f"output_dir={ws.out()}",
                     *_cpu_sampler(ws.policy), "sampler.chat_format=tokenizer",
                     f"sampler.tokenizer={_own_tokenizer(ws, NO_GENERATION_PROMPT)}"],
         "ConfigError", ("chat template of '{root}/own_tokenizer'", "has no generation prompt",
                         "write it into every completion")),
    Case("sft: own template rendering every role the same way", "sft",
         lambda ws: [f"input={ws.file('sft.jsonl', [SFT_ROW])}", f"output_dir={ws.out()}", "chat_format=tokenizer",
                     f"model_name_or_path={_own_model(ws, EVERY_ROLE_AS_USER)}", "use_cpu=true", "report_to=[]"],
         "ConfigError", ("chat template of '{root}/own'", "renders a user message and an assistant message",
                         "the same way")),
    Case("sample: own template raising ZeroDivisionError", "sample",
         lambda ws: [f"prompts={ws.file('prompts.jsonl', [prompt()])}", f"output_dir={ws.out()}",
                     *_cpu_sampler(ws.policy), "sampler.chat_format=tokenizer",
                     f"sampler.tokenizer={_own_tokenizer(ws, '{{ 1 / 0 }}')}"],
         "ConfigError", ("chat template of '{root}/own_tokenizer'", "ZeroDivisionError: division by zero")),
    Case("sft: own template dropping earlier turns' thinking", "sft",
         lambda ws: [f"input={ws.file('sft.jsonl', _thinking_rows())}", f"output_dir={ws.out()}",
                     "chat_format=tokenizer", f"model_name_or_path={_own_model(ws, like='qwen3')}", "use_cpu=true",
                     "report_to=[]"],
         "ConfigError", ("record 't0'", "chat template of '{root}/own'", "leaves out the reasoning",
                         "('reasoning_content') of assistant message 1", "set thinking_turns=last_turn")),
    Case("sft: own template dropping earlier turns' thinking, thinking_turns=last_turn (trained)", "sft",
         lambda ws: [f"input={ws.file('sft.jsonl', _thinking_rows())}", f"output_dir={ws.out()}",
                     "chat_format=tokenizer", "thinking_turns=last_turn",
                     f"model_name_or_path={_own_model(ws, like='qwen3')}", "use_cpu=true", "bf16=false", "report_to=[]", "max_steps=1", "optimizer=adamw",
                     "per_device_train_batch_size=2", "save_strategy='no'", "disable_tqdm=true"],
         None, check=lambda ws, out, err: _assert_in('"steps": 1', (ws.out() / "_COMPLETE.json").read_text())),
    Case("sft: own template rendering no reasoning", "sft",
         lambda ws: [f"input={ws.file('sft.jsonl', _thinking_rows())}", f"output_dir={ws.out()}",
                     "chat_format=tokenizer", f"model_name_or_path={_own_model(ws, like='llama3')}", "use_cpu=true",
                     "report_to=[]"],
         "ConfigError", ("record 't0'", "assistant message 3 has reasoning in 'reasoning_content'",
                         "does not render in any assistant turn")),
    Case("sft: thinking_turns=last_turn with an align format", "sft",
         lambda ws: [f"input={ws.file('sft.jsonl', [SFT_ROW])}", f"output_dir={ws.out()}", "thinking_turns=last_turn",
                     f"model_name_or_path={ws.policy}", "use_cpu=true", "report_to=[]"],
         "ConfigError", ("thinking_turns=last_turn applies to chat_format=tokenizer only",)),
    # --- a model's own chat template (entries above this line) ------------------------------
    Case("a Latin-1 recipe", "pairs", lambda ws: [_latin1(ws, "recipe.yaml", "# café\nseed: 1\n")],
         "ConfigError", ("recipe.yaml: not UTF-8 text: byte 5 (line 1) is b'\\xe9'", "save it as UTF-8")),
    Case("a Latin-1 from: file", "status", lambda ws: [_recipe(ws, f"""
output_dir: {ws.out('g')}
steps:
  pairs: {{stage: pairs, from: {_latin1(ws, 'pairs.yaml', 'seed: 1  # café')}}}
""")], "ConfigError", ("steps.pairs.from: ", "pairs.yaml: not UTF-8 text: byte 14 (line 1)")),
    Case("a Latin-1 judge charter", "annotate", lambda ws: [
        *_judge_openai(ws, _closed_url()), "charter=" + str(_latin1(ws, "mine.md", "# Charter\n\nBe fair, café.\n"))],
         "InputError", ("charter ", "mine.md: not UTF-8 text: byte 23 (line 3)",)),
    Case("a Latin-1 personas file", "sample", lambda ws: [
        f"prompts={ws.file('p.jsonl', [prompt('a')])}", f"output_dir={ws.out()}", "mode=offline",
        "on_unclassified=persona", "personas_file=" + str(_latin1(ws, "personas.txt", "a café owner\n")),
        *_cpu_sampler(ws.policy)],
         "InputError", ("personas file ", "personas.txt: not UTF-8 text: byte 5 (line 1)",)),
    Case("a Latin-1 JSONL input", "pairs", lambda ws: [
        "input=" + str(_latin1(ws, "in.jsonl", json.dumps(annotated("a")) + "\n" + '{"id": "café"}\n')),
        f"output_dir={ws.out()}"],
         "InputError", ("in.jsonl:2: not UTF-8 text: byte ", "is b'\\xe9'", "JSONL is read as UTF-8")),
    Case("a Latin-1 .json input", "pairs", lambda ws: [
        "input=" + str(_latin1(ws, "in.json", '[{"id": "café"}]')), f"output_dir={ws.out()}"],
         "InputError", ("in.json: not UTF-8 text: byte 12 (line 1) is b'\\xe9'",)),
    Case("a FIFO as the recipe", "pairs", lambda ws: [_fifo(ws, "recipe.yaml")],
         "ConfigError", ("recipe.yaml: not a regular file (a FIFO, a device or a directory)",)),
    Case("plan: a Latin-1 notes.yaml beside the recipe (not read)", "plan",
         lambda ws: _plan_beside(ws, _latin1(ws, "notes.yaml", "owner: José\n")), None, check=_check_traced),
    Case("plan: a FIFO named queue.yaml beside the recipe (not read)", "plan",
         lambda ws: _plan_beside(ws, _fifo(ws, "queue.yaml")), None, check=_check_traced),
    Case("plan: a lineage file that is not UTF-8", "plan",
         lambda ws: _plan_beside(ws, None, lineage=_latin1(ws, "sft.yaml", "output_dir: runs/x/sft  # café\n")),
         "ConfigError", ("lineage ", "sft.yaml: not UTF-8 text: byte 29 (line 1)")),
    Case("a writer lock that is a directory", "pairs", lambda ws: _odd_lock(ws, ".align-writer.lock", "directory"),
         "InputError", (".align-writer.lock is a directory, not a lock file this library writes", "remove it")),
    Case("a writer lock that is a symbolic link", "pairs", lambda ws: _odd_lock(ws, ".align-writer.lock", "link"),
         "InputError", (".align-writer.lock is a symbolic link, not a lock file", "remove the link")),
    Case("a stage lock that is a directory", "pairs", lambda ws: _odd_lock(ws, ".align-stage.lock", "directory"),
         "InputError", (".align-stage.lock is a directory, not a lock file this library writes", "remove it")),
    Case("a stage lock that is a symbolic link", "pairs", lambda ws: _odd_lock(ws, ".align-stage.lock", "link"),
         "InputError", (".align-stage.lock is a symbolic link, not a lock file", "remove the link")),
    # --- disks and files (entries above this line) ------------------------------------------
    Case("sft: a conversation of 300,000 characters past max_length", "sft", lambda ws: [
        f"input={ws.file('sft.jsonl', [dict(SFT_ROW, id=f's{i}') for i in range(4)] + [_sft_row('word ' * 60_000)])}",
        *_sft_one_step(ws), "max_length=128"], None, check=_check_long_row_dropped),
    Case("sft: max_steps below logging_steps", "sft", lambda ws: [
        f"input={ws.file('sft.jsonl', [dict(SFT_ROW, id=f's{i}') for i in range(4)])}", *_sft_one_step(ws),
        "logging_steps=10"], None, check=_check_train_loss),
    Case("evaluate: a negative seed", "evaluate", lambda ws: ["prompts=x.jsonl", "seed=-1"],
         "ConfigError", ("seed: must be from 0 to 4294967295", "got -1")),
    Case("sft: a seed past 2**32 - 1", "sft", lambda ws: ["input=x.jsonl", "use_cpu=true", "data_seed=4294967296"],
         "ConfigError", ("data_seed: must be from 0 to 4294967295", "got 4294967296")),
    Case("evaluate: top_p = 0", "evaluate", lambda ws: ["prompts=x.jsonl", "top_p=0"],
         "ConfigError", ("top_p: must be above 0 and at most 1", "got 0.0")),
    Case("demo: a length bias that makes the reward inf", "demo",
         lambda ws: [f"output_dir={ws.out()}", "reward_length_bias=1e306"],
         "ConfigError", ("reward_length_bias: must be from 0 to 1e+300", "got 1e+306")),
    Case("join: a file joined with itself", "join", lambda ws: [
        f"input={ws.file('s.jsonl', [annotated('a')])}", f"completions={ws.root / 's.jsonl'}", f"output_dir={ws.out()}"],
         "InputError", ("join: input=", "give the same data twice ({root}/s.jsonl)", "would be doubled")),
    Case("join: a file and a symlink to it", "join", lambda ws: _join_through_link(ws),
         "InputError", ("completions=", "link.jsonl", "give the same data twice ({root}/s.jsonl)")),
    Case("rerun: a truncated manifest on a partial output", "annotate", lambda ws: _truncated_manifest(ws),
         "StaleOutputError", ("holds a partial output whose manifest (_manifest.json) is truncated or not valid JSON",
                              "rerun with overwrite=true")),
    Case("rerun: the input now a plain copy of an earlier stage's output", "pairs", lambda ws: _plain_copy(ws),
         "StaleOutputError", ("pairs.input ({root}/copy.jsonl): the input file's content changed: a plain file now, "
                              "no earlier stage's output (it was the annotate stage's output; the same rows)",)),
    # --- data (entries above this line) -----------------------------------------------------
]


def _other_settings(ws: Workspace) -> list:
    """Shard 0 of 2 sampled with n=2; shard 1 started with n=3 into the same directory is refused."""
    prompts = ws.file("prompts.jsonl", [prompt(f"p{i}") for i in range(4)])
    args = [f"prompts={prompts}", f"output_dir={ws.out()}", *_cpu_sampler(ws.policy), "num_shards=2"]
    rc, _, err = run_main(["sample", *args, "shard_index=0"])
    assert rc == 0, err
    return [*args, "shard_index=1", "n=3"]


def _other_shard_count(ws: Workspace) -> list:
    """Shard 0 of 2 annotated, then the same settings with num_shards=1 (the manifest ignores the
    shard layout, the job's shard check does not)."""
    args = [f"input={ws.file('in.jsonl', [annotated(f'a{i}') for i in range(4)])}", f"output_dir={ws.out()}",
            "provider=verifiable"]
    rc, _, err = run_main(["annotate", *args, "num_shards=2", "shard_index=0"])
    assert rc == 0, err
    return [*args, "num_shards=1", "shard_index=0"]


def _done_pairs(ws: Workspace, change=None) -> list:
    """A finished pairs output from in.jsonl; with ``change``, in.jsonl rewritten by it afterwards."""
    rows = [annotated(f"a{i}") for i in range(3)]
    args = [f"input={ws.file('in.jsonl', rows)}", f"output_dir={ws.out()}"]
    rc, _, err = run_main(["pairs", *args])
    assert rc == 0, err
    if change is not None:
        ws.file("in.jsonl", change(rows))
    return args


def _done_annotate(ws: Workspace) -> Path:
    out = ws.out("annotated")
    rc, _, err = run_main(["annotate", f"input={ws.file('done.jsonl', [annotated('z')])}", f"output_dir={out}",
                           "provider=verifiable"])
    assert rc == 0, err
    return out


def _sft_one_step(ws: Workspace) -> list:
    return [f"output_dir={ws.out()}", f"model_name_or_path={ws.policy}", "use_cpu=true", "bf16=false",
            "report_to=[]", "max_steps=1", "optimizer=adamw", "per_device_train_batch_size=2", "save_strategy='no'",
            "disable_tqdm=true"]


def _join_through_link(ws: Workspace) -> list:
    (ws.root / "link.jsonl").symlink_to(ws.file("s.jsonl", [annotated("a")]))
    return [f"input={ws.root / 's.jsonl'}", f"completions={ws.root / 'link.jsonl'}", f"output_dir={ws.out()}"]


def _truncated_manifest(ws: Workspace) -> list:
    """Shard 0 of 2 annotated (a partial output), then its manifest cut in half."""
    args = [f"input={ws.file('in.jsonl', [annotated(f'a{i}') for i in range(4)])}", f"output_dir={ws.out()}",
            "provider=verifiable", "num_shards=2"]
    rc, _, err = run_main(["annotate", *args, "shard_index=0"])
    assert rc == 0, err
    manifest = ws.out() / "_manifest.json"
    manifest.write_text(manifest.read_text()[:100])
    return [*args, "shard_index=1"]


def _plain_copy(ws: Workspace) -> list:
    """pairs made from an annotate output, then run again on a plain copy of that output's rows."""
    upstream = _done_annotate(ws)
    rc, _, err = run_main(["pairs", f"input={upstream}", f"output_dir={ws.out()}"])
    assert rc == 0, err
    shutil.copy(upstream / "shard-00000-of-00001.jsonl", ws.root / "copy.jsonl")
    return [f"input={ws.root / 'copy.jsonl'}", f"output_dir={ws.out()}"]


def _upstream_changed(ws: Workspace) -> list:
    """pairs made from an annotate output; annotate then redone from other rows (overwrite)."""
    upstream = _done_annotate(ws)
    args = [f"input={upstream}", f"output_dir={ws.out()}"]
    rc, _, err = run_main(["pairs", *args])
    assert rc == 0, err
    rc, _, err = run_main(["annotate", f"input={ws.file('done.jsonl', [annotated('y')])}",
                           f"output_dir={upstream}", "provider=verifiable", "overwrite=true"])
    assert rc == 0, err
    return args


def _partial_annotate_other_rows(ws: Workspace) -> list:
    """Shard 0 of 2 annotated, then shard 1 started after a row of the input changed."""
    rows = [annotated(f"a{i}") for i in range(4)]
    args = [f"input={ws.file('in.jsonl', rows)}", f"output_dir={ws.out()}", "provider=verifiable", "num_shards=2"]
    rc, _, err = run_main(["annotate", *args, "shard_index=0"])
    assert rc == 0, err
    ws.file("in.jsonl", [rows[0] | {"answer": "no"}, *rows[1:]])
    return [*args, "shard_index=1"]


def _fake_done(stage: str, config, out: Path) -> None:
    """A completion marker with the manifest this config gives (as a finished run leaves it)."""
    from align.io import mark_stage_complete
    from align.manifests import build_manifest

    manifest = build_manifest(stage, config)
    out.mkdir(parents=True, exist_ok=True)
    mark_stage_complete(out, stage=stage, config={}, summary={}, manifest=manifest.as_json(),
                        manifest_fingerprint=manifest.fingerprint)


def _sft_weights_changed(ws: Workspace) -> list:
    """An sft output recorded for a base model whose weights then changed (one byte)."""
    from align.config import load_config
    from align.stages.sft import Config

    base = ws.root / "base"
    shutil.copytree(ws.policy, base)
    args = [f"input={ws.file('sft.jsonl', [SFT_ROW])}", f"output_dir={ws.out()}", f"model_name_or_path={base}",
            "use_cpu=true", "bf16=false", "report_to=[]"]
    _fake_done("sft", load_config(Config, None, args), ws.out())
    weights = base / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    return args


def _judge_charter_changed(ws: Workspace) -> list:
    """An annotate output recorded with one charter file; the charter then edited."""
    from align.config import load_config
    from align.stages.annotate import Config

    charter = _write(ws.root / "charter.md", "# Charter\n\n## 1. Honesty\n\n[1.1] Say what is true.\n")
    args = [f"input={ws.file('in.jsonl', [annotated('a')])}", f"output_dir={ws.out()}", "provider=judge",
            f"model={ws.policy}", f"charter={charter}", "device=cpu"]
    _fake_done("annotate", load_config(Config, None, args), ws.out())
    _write(charter, "# Charter\n\n## 1. Honesty\n\n[1.1] Say what is true, always.\n")
    return args


def _pipeline_stale(ws: Workspace) -> list:
    """A pipeline of annotate and pairs run once, then rerun with another pairs setting."""
    rows = ws.file("in.jsonl", [annotated(f"a{i}") for i in range(3)])
    recipe = _recipe(ws, f"""
annotate: {{input: {rows}, output_dir: {ws.out('ann')}, provider: verifiable}}
pairs: {{input: {ws.out('ann')}, output_dir: {ws.out('pairs')}}}
""")
    rc, _, err = run_main(["pipeline", recipe])
    assert rc == 0, err
    return [recipe, "pairs.low_threshold=0.3"]



_TWICE = '{"id": "a", "id": "b"}'
_HALF = '{"id": "a", "messages": "\\ud800"}'
_DEEP = '{"id": "a", "x": ' + "[" * 5000 + "]" * 5000 + "}"


def _raw_row(ws: Workspace, name: str, line: str) -> list:
    return [f"input={jsonl(ws.root / name, [line])}", f"output_dir={ws.out()}"]


_ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + k)}: &{chr(98 + k)} [{', '.join(['*' + chr(97 + k)] * 10)}]\n" for k in range(8)) + "seed: *i\n"


def _edited_pairs(ws: Workspace) -> list:
    args = _done_pairs(ws)
    pairs = ws.out() / "pairs.jsonl"
    pairs.write_text(pairs.read_text().splitlines()[0] + "\n")  # a row removed by hand
    return [f"input={pairs}", f"output_dir={ws.out('logprobs')}", f"model_name_or_path={ws.policy}"]


def _copied_and_filtered(ws: Workspace) -> list:
    done = _done_annotate(ws)
    copy = ws.root / "copy"
    shutil.copytree(done, copy)  # cp -a: the marker comes along
    for shard in copy.glob("shard-*.jsonl"):
        shard.write_text("")  # every row filtered out
    return [f"input={copy}", f"output_dir={ws.out()}"]


def _killed_shard_file(ws: Workspace) -> list:
    done = _done_annotate(ws)
    (done / "_COMPLETE.json").unlink()  # as a killed job leaves it
    return [f"input={next(done.glob('shard-*.jsonl'))}", f"output_dir={ws.out()}"]


def _wrong_marker(ws: Workspace) -> list:
    done = _done_annotate(ws)
    (done / "_COMPLETE.json").write_text('["a list, not a marker"]')
    return [f"input={done}", f"output_dir={ws.out()}"]


def _decontaminate_into_its_input(ws: Workspace) -> list:
    folder = ws.root / "d"
    kept = jsonl(folder / "kept.jsonl", [SFT_ROW])
    bench = jsonl(ws.root / "bench.jsonl", [{"prompt": "an unrelated benchmark question about something else"}])
    return [f"input={kept}", f"output_dir={folder}", f"benchmarks=[{{name: b, path: {bench}, text_field: prompt}}]"]


def _sft_into_its_model(ws: Workspace) -> list:
    model = ws.root / "model"
    shutil.copytree(ws.policy, model)
    return [f"input={ws.file('sft.jsonl', [SFT_ROW])}", f"output_dir={model}", f"model_name_or_path={model}",
            "use_cpu=true", "bf16=false", "report_to=[]"]


def _dangling_output(ws: Workspace) -> list:
    link = ws.root / "dangling"
    link.symlink_to(ws.root / "nowhere")
    return [f"input={ws.file('in.jsonl', [annotated('a')])}", f"output_dir={link}"]


def _plan_config(ws: Workspace, **changes) -> list:
    config = json.loads((ws.policy / "config.json").read_text())
    config.update(changes)
    path = _write(ws.root / "bad_model" / "config.json", json.dumps(config))
    recipe = _recipe(ws, f"# align sample x\nprompts: p.jsonl\nsampler: {{model: {path.parent}, backend: "
                         "transformers}\n")
    return [recipe]

def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _latin1(ws: Workspace, name: str, text: str) -> Path:
    """A text file saved in Latin-1 (an editor's default on some systems), not UTF-8."""
    path = ws.root / name
    path.write_bytes(text.encode("latin-1"))
    return path


def _fifo(ws: Workspace, name: str) -> Path:
    """A FIFO named like a file align reads. For a minute a watcher opens it for writing (then closes it)
    as soon as anything opens it to read: a reader gets an empty file instead of blocking forever, and
    ``_FIFOS`` says it was read."""
    path = ws.root / name
    os.mkfifo(path)
    opened = _FIFOS[path] = threading.Event()

    def watch() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO while no one reads it
            except OSError:
                time.sleep(0.05)
                continue
            os.close(fd)
            opened.set()
            return

    threading.Thread(target=watch, daemon=True).start()
    return path


def _plan_beside(ws: Workspace, beside: Path | None, lineage: Path | None = None) -> list:
    """A train recipe whose model is another recipe's output (its `# lineage:` line names that recipe),
    with ``beside`` in the same directory, named by nothing."""
    if lineage is None:
        lineage = _write(ws.root / "sft.yaml", f"output_dir: runs/x/sft\nmodel_name_or_path: {ws.policy}\n")
    recipe = _recipe(ws, f"# align train train.yaml\n# lineage: {lineage.name}\nmodel_name_or_path: runs/x/sft\n"
                         "input: pairs\noutput_dir: runs/x/qrpo\n", name="train.yaml")
    return [recipe]


def _odd_lock(ws: Workspace, name: str, kind: str) -> list:
    """An output directory whose lock file ``name`` is a directory, or a symbolic link (to nothing)."""
    out = ws.out()
    out.mkdir(parents=True)
    if kind == "directory":
        (out / name).mkdir()
    else:
        (out / name).symlink_to(ws.root / "elsewhere")
    return [f"input={ws.file('in.jsonl', [annotated('a')])}", f"output_dir={out}"]


def _pairs_dir(ws: Workspace) -> Path:
    """A finished pairs output: pairs.jsonl and skipped.jsonl side by side."""
    out = ws.root / "pairs"
    jsonl(out / "pairs.jsonl", [pair("a")])
    jsonl(out / "skipped.jsonl", [{"id": "b", "reason": "no pair"}])
    (out / "_COMPLETE.json").write_text(json.dumps({"stage": "pairs"}))
    return out


def _data_dir(ws: Workspace, *extra: str) -> Path:
    """A plain data directory: a.jsonl (row 'a') plus the named files (rows named by their stem)."""
    folder = ws.root / "data"
    jsonl(folder / "a.jsonl", [annotated("a")])
    for name in extra:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        stem = path.name.split(".")[0]
        if path.suffix == ".json":
            path.write_text(json.dumps([annotated(stem)]))
        elif path.suffix.lower() == ".jsonl":
            jsonl(path, [annotated(stem)])
        else:
            path.write_text("notes\n")
    return folder


def _linked(ws: Workspace, name: str) -> list:
    """Shard 0 of 2 annotated; then shard 1's file `name` is a symlink to a file outside the
    output directory, and shard 1 is started."""
    args = [f"input={ws.file('in.jsonl', [annotated(f'p{i}') for i in range(4)])}", f"output_dir={ws.out()}",
            "provider=verifiable", "num_shards=2"]
    rc, _, err = run_main(["annotate", *args, "shard_index=0"])
    assert rc == 0, err
    outside = ws.root / "outside.jsonl"
    outside.write_text("")
    (ws.out() / name).symlink_to(outside)
    return [*args, "shard_index=1"]


def _verifiable_input(ws: Workspace, *texts: str) -> str:
    """input= a row 'a' (answer "4") with these completions, to be annotated."""
    row = prompt("a", answer="4", completions=[completion(t) for t in texts])
    return f"input={ws.file('in.jsonl', [row])}"


def _given(ws: Workspace, rows: list[dict]) -> list:
    """evaluate with policy 'b' given as completions (first, so it is checked before any model runs)."""
    given = ws.file("given.jsonl", rows)
    return [f"prompts={ws.file('p.jsonl', [prompt('a', answer='yes')])}", "baseline=a", f"output_dir={ws.out()}",
            "n=2", "sampler.device=cpu", "max_tokens=4",
            f"policies=[{{name: b, completions: {given}}}, {{name: a, model: {ws.policy}}}]"]


class _KeyedHandler(BaseHTTPRequestHandler):
    """An OpenAI-compatible server on 127.0.0.1 that accepts no request without its key."""

    def _refuse(self) -> None:
        payload = b'{"error": {"message": "invalid api key"}}'
        self.send_response(401)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self):
        self._refuse()

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._refuse()

    def log_message(self, *args):
        pass


_SERVER: list[HTTPServer] = []


def _keyed_url() -> str:
    if not _SERVER:
        server = HTTPServer(("127.0.0.1", 0), _KeyedHandler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        _SERVER.append(server)
    return f"http://127.0.0.1:{_SERVER[0].server_address[1]}/v1"


def _closed_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def _judge_openai(ws: Workspace, url: str) -> list:
    return [f"input={ws.file('in.jsonl', [annotated('a')])}", f"output_dir={ws.out()}", "provider=judge",
            "backend=openai", f"base_url={url}", "model=served", f"tokenizer={ws.policy}", "top_k_pairwise=0"]


def _openai_sampler(ws: Workspace, url: str) -> list[str]:
    return ["sampler.backend=openai", f"sampler.base_url={url}", "sampler.model=served",
            f"sampler.tokenizer={ws.policy}", f"sampler.chat_date={DATE}", "max_tokens=4", "n=2"]


_URL_SECRETS = ("pw-1618", "k-2718")  # the password and the key a base_url carries in the cases above


class _FailingHandler(BaseHTTPRequestHandler):
    """An OpenAI-compatible server on 127.0.0.1 that answers like vLLM, or fails as servers do, by the first
    segment of its path (``http://127.0.0.1:PORT/MODE/v1``): ``ok``; ``keyed`` (only with the credentials of
    ``_URL_SECRETS``, as a header); ``refuse`` (every completion a 400 whose structured error has no length
    code); ``drip`` (a byte every 0.2 s); ``abort`` (every choice aborted); ``short`` (an answer 100 bytes short
    of its Content-Length); ``listmodels`` (``/models`` a JSON list); ``small`` (``max_model_len`` 8)."""

    def do_GET(self):
        mode = self._mode()
        if mode is None:
            return
        models = [{"id": "served", "max_model_len": 8 if mode == "small" else 65536}]
        self._send(200, models if mode == "listmodels" else {"data": models}, drip=mode == "drip")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        mode = self._mode()
        if mode is None:
            return
        if mode == "refuse":
            return self._send(400, {"error": {"message": "n=2 exceeds max_num_seqs (1)", "type": "BadRequestError",
                                              "param": None, "code": 400}})
        reason = "abort" if mode == "abort" else "stop"
        if "stop_token_ids" in body:  # the sampler: the stop token alone
            choices = [{"index": i, "token_ids": [body["stop_token_ids"][0]], "finish_reason": reason}
                       for i in range(body["n"])]
        else:  # the judge: the first position's top log-probs
            choices = [{"index": i, "text": "7", "finish_reason": "length" if reason == "stop" else reason,
                        "logprobs": {"top_logprobs": [{"7": -0.1}]}} for i in range(len(body["prompt"]))]
        self._send(200, {"choices": choices}, short=mode == "short")

    def _mode(self) -> str | None:
        """The mode the path names; a keyed request without its credentials (or with them in the URL) is
        answered 401 here (None)."""
        mode = self.path.split("/")[1]
        sent = self.headers.get("Authorization")
        basic = "Basic " + base64.b64encode(f"ana:{_URL_SECRETS[0]}".encode()).decode()
        if mode == "keyed" and (sent not in (basic, f"Bearer {_URL_SECRETS[1]}") or _URL_SECRETS[1] in self.path):
            self._send(401, {"error": {"message": "invalid api key", "type": "AuthenticationError"}})
            return None
        return mode

    def _send(self, status: int, data, *, drip: bool = False, short: bool = False) -> None:
        raw = json.dumps(data).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw) + 100 * short))
            self.end_headers()
            for start in range(0, len(raw), 1 if drip else len(raw)):
                self.wfile.write(raw[start : start + (1 if drip else len(raw))])
                self.wfile.flush()
                if drip:
                    time.sleep(0.2)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (its deadline passed)

    def log_message(self, *args):
        pass


_FAILING: list[HTTPServer] = []


def _failing_url(mode: str, *, userinfo: bool = False, query: bool = False) -> str:
    """The base_url of ``_FailingHandler``'s ``mode`` (with the password in it, or the key in its query)."""
    if not _FAILING:
        server = HTTPServer(("127.0.0.1", 0), _FailingHandler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        _FAILING.append(server)
    user = f"ana:{_URL_SECRETS[0]}@" if userinfo else ""
    return f"http://{user}127.0.0.1:{_FAILING[0].server_address[1]}/{mode}/v1" + \
        (f"?api_key={_URL_SECRETS[1]}" if query else "")


def _sample_one(ws: Workspace) -> list[str]:
    return [f"prompts={ws.file('prompts.jsonl', [prompt('a')])}", f"output_dir={ws.out()}"]


def _check_sampled_without(ws: Workspace, out: str, err: str, secrets: tuple[str, ...]) -> None:
    """Sampled (two completions), and no secret in what the stage printed or wrote."""
    rows = _annotate_rows(ws.out())
    assert len(rows[0]["completions"]) == 2, rows
    written = "".join(p.read_text(errors="replace") for p in ws.out().rglob("*") if p.is_file())
    assert not [s for s in secrets if s in out + err + written]


# A model's own chat template: each role opens and closes with its own tokens (the tiny tokenizer's
# Apertus tokens), less what each bad template leaves out.
OWN_TEMPLATE = ("{% for m in messages %}<|{{ m.role }}_start|>{{ m.content }}<|{{ m.role }}_end|>{% endfor %}"
                "{% if add_generation_prompt %}<|assistant_start|>{% endif %}")
NO_GENERATION_PROMPT = OWN_TEMPLATE.split("{% if")[0]
EVERY_ROLE_AS_USER = ("{% for m in messages %}<|user_start|>{{ m.content }}<|user_end|>{% endfor %}"
                      "{% if add_generation_prompt %}<|user_start|>{% endif %}")


def _templated(ws: Workspace, template: str | None, like: str | None):
    """The tiny tokenizer with `template` as its chat template, or a real model's (`like`: qwen3, llama3)."""
    from transformers import AutoTokenizer

    from align.testing.tiny import build_template_tokenizer

    if like is not None:
        return build_template_tokenizer(like)
    tokenizer = AutoTokenizer.from_pretrained(ws.base)
    tokenizer.chat_template = template
    return tokenizer


def _own_tokenizer(ws: Workspace, template: str) -> Path:
    """A tokenizer directory (no model) whose own chat template is `template`."""
    _templated(ws, template, None).save_pretrained(ws.root / "own_tokenizer")
    return ws.root / "own_tokenizer"


def _own_model(ws: Workspace, template: str | None = None, *, like: str | None = None) -> Path:
    """The tiny base model, its tokenizer carrying `template` (or a real model's, `like`)."""
    shutil.copytree(ws.base, ws.root / "own")
    _templated(ws, template, like).save_pretrained(ws.root / "own")
    return ws.root / "own"


def _thinking_rows() -> list[dict]:
    """Two conversations whose assistant turns both reason (`reasoning_content`), thinking on."""
    def row(rid: str) -> dict:
        return {"id": rid, "enable_thinking": True, "messages": [
            {"role": "user", "content": "Is 4 even?"},
            {"role": "assistant", "content": "yes", "reasoning_content": "4 is two twos."},
            {"role": "user", "content": "And 5?"},
            {"role": "assistant", "content": "no", "reasoning_content": "5 is odd."}]}
    return [row("t0"), row("t1")]


def run_main(args: list) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in args])
    return rc, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input(case: Case, models, tmp_path, monkeypatch):
    import torch

    monkeypatch.delenv("ALIGN_TRACEBACK", raising=False)
    for var in ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "RANK", "WORLD_SIZE", "OPENAI_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    for var, value in case.extra.get("env", {}).items():
        monkeypatch.setenv(var, value() if callable(value) else value)  # a callable: a value known when it runs
    monkeypatch.chdir(tmp_path)
    ws = Workspace(root=tmp_path, **models)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rc, out, err = run_main([case.stage, *case.make(ws)])
    finally:
        torch.set_num_threads(threads)
    if case.error is None:
        assert rc == 0, err
        case.check(ws, out, err)
        return
    assert rc == 2, f"exit {rc}\nstdout: {out[-2000:]}\nstderr: {err[-2000:]}"
    lines = [line for line in err.splitlines() if line.startswith(f"align {case.stage}: ")]
    assert len(lines) == 1, err
    message = lines[0][len(f"align {case.stage}: "):]
    assert message.startswith(f"{case.error}: "), message
    for needle in case.needles:
        assert needle.format(root=tmp_path) in message, f"{needle!r} not in {message!r}"


def test_corpus_size_and_doc_table():
    """At least 110 entries, and docs/bad-inputs.md has a row for each."""
    assert len(CASES) >= 165
    assert len({c.name for c in CASES}) == len(CASES)
    doc = (Path(__file__).resolve().parents[1] / "docs" / "bad-inputs.md").read_text()
    missing = [c.name for c in CASES if f"| {c.name} |" not in doc]
    assert not missing, missing


def test_nested_override_keeps_the_field_default():
    """`sampler.device=cpu` on evaluate keeps its sampler's transformers backend (not a fresh
    SamplerConfig's vllm): one nested key changes one key."""
    from align.config import load_config
    from align.stages.evaluate import Config

    config = load_config(Config, None, ["sampler.device=cpu", "prompts=p.jsonl"])
    assert (config.sampler.backend, config.sampler.device) == ("transformers", "cpu")


def test_torn_last_line_is_tolerated_in_job_shards_only(tmp_path):
    """A job shard's half-written last line is skipped (the job redoes it); in an input file
    the same line is an error naming file:line; a last line that parses is read either way."""
    from align.io import read_records

    torn = json.dumps(prompt("a")) + "\n" + TORN
    shard = tmp_path / "job" / "shard-00000-of-00001.jsonl"
    shard.parent.mkdir()
    shard.write_text(torn)
    assert [r["id"] for r in read_records(shard.parent)] == ["a"]
    assert [r["id"] for r in read_records(shard)] == ["a"]
    (tmp_path / "input.jsonl").write_text(torn)
    with pytest.raises(ValueError, match=r"input\.jsonl:2: truncated last line"):
        read_records(tmp_path / "input.jsonl")
    (tmp_path / "no_newline.jsonl").write_text(json.dumps(prompt("a")) + "\n" + json.dumps(prompt("b")))
    assert [r["id"] for r in read_records(tmp_path / "no_newline.jsonl")] == ["a", "b"]
