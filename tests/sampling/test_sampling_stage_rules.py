"""The rules of sample_references / sample_offline and of the OpenAI-compatible client that
tests/sampling/test_sampling_stages.py and tests/test_servers.py leave open.

A mutation check (mutmut) on align/sampling/stages.py showed rules no test held: which settings and
seeds reach the sampler, what a skip row holds (a prompt skipped before sampling, one a server refused,
one whose every completion overlong=drop removed, one that came in skipped), how the overlong and
dropped-reference counts add up, the summary's counts, the settings a resume is checked against, and
when a context that fits no prompt is an error. A fake sampler (no model: a completion's text names the
seed it was drawn with) drives the stages end to end into a temporary output_dir. The last part holds
the client of align/sampling/openai_backend.py to what it sends a recording server (the request body,
the key) and how it reads the answers (the context length, a refusal, a model not served).
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import ClassVar

import pytest

from align.chat import install_format
from align.errors import InputError, RecordError, ServiceError
from align.io import read_output
from align.io.http import ServerError
from align.jobs.sharding import shard_of
from align.sampling.base import Completion, PromptEncoder, Sampler, derive_seed, stream_seed
from align.sampling.openai_backend import OpenAISampler
from align.sampling.stages import (
    offline_variants,
    sample_offline,
    sample_references,
    sampling_summary,
    with_system_prompt,
)
from align.sampling.system_prompts import SystemPrompt, draw_system_prompt

REFUSED = "the server refused the prompt (9 tokens) as too long: too long"


def refuse_me(conversation):
    return conversation[-1]["content"] == "Refuse me"


class FakeSampler(Sampler):
    """Draws ``n`` completions per conversation without a model. Completion k of a conversation ends as
    ``finish[k % len(finish)]`` says; a conversation ``refuse`` holds true is refused as a server refuses a
    prompt for its length. Every call's arguments are kept in ``calls``."""

    backend = "fake"

    def __init__(self, encoder, *, max_model_len=4096, finish=("stop",), refuse=lambda conversation: False):
        self.encoder, self.model_name = encoder, "fake-model"
        self._max_model_len, self.finish, self.refuse = max_model_len, finish, refuse
        self.calls, self.refusals = [], {}

    @property
    def max_model_len(self):
        return self._max_model_len

    def sample(self, conversations, n, temperature=1.0, top_p=1.0, max_tokens=4096, seed=0, tools=None):
        seeds = list(seed) if not isinstance(seed, int) else [seed] * len(conversations)
        self.calls.append({"conversations": [list(c) for c in conversations], "n": n, "temperature": temperature,
                           "top_p": top_p, "max_tokens": max_tokens, "seeds": seeds, "tools": tools})
        self.refusals, out = {}, []
        for index, (conversation, s) in enumerate(zip(conversations, seeds)):
            if self.refuse(conversation):
                self.refusals[index] = REFUSED
                out.append([])
                continue
            params = self.params(temperature, top_p, max_tokens, s)
            out.append([Completion(f"{s}/{k}", 1, self.finish[k % len(self.finish)], self.model_name, params)
                        for k in range(n)])
        return out


@pytest.fixture(scope="module")
def encoder(tiny_tokenizer):
    import copy

    tokenizer = copy.deepcopy(tiny_tokenizer)
    install_format(tokenizer, chat_format="apertus")
    return PromptEncoder(tokenizer, "apertus", chat_date="2026-01-01")


def prompt(rid, text="Name a colour.", **extra):
    return {"id": rid, "messages": [{"role": "user", "content": text}], **extra}


def rows_of(output_dir):
    return {r["id"]: r for r in read_output(output_dir)}


def length(encoder, conversation):
    return len(encoder.prompt_ids(conversation))


def ids_in_shard(shard, num_shards=2, count=2):
    return [rid for rid in (f"p{i}" for i in range(100)) if shard_of(rid, num_shards) == shard][:count]


TOOL = {"type": "function", "function": {"name": "add", "description": "Add two numbers.",
                                         "parameters": {"type": "object", "properties": {}}}}


# --- what reaches the sampler ------------------------------------------------------------


def test_reference_defaults_are_ten_draws_of_4096_tokens_seeded_by_zero_and_the_record(encoder, tmp_path):
    fake = FakeSampler(encoder)
    sample_references([prompt("a"), prompt("b", "Hi")], fake, output_dir=tmp_path)
    [call] = fake.calls
    assert (call["n"], call["temperature"], call["top_p"], call["max_tokens"]) == (10, 1.0, 1.0, 4096)
    assert sorted(call["seeds"]) == sorted([derive_seed(0, "a"), derive_seed(0, "b")])
    row = rows_of(tmp_path)["a"]
    assert [c["text"] for c in row["completions"]] == [f"{derive_seed(0, 'a')}/{k}" for k in range(10)]
    assert row["completions"][0]["source"] == (
        "model=fake-model backend=fake temperature=1.0 top_p=1.0 max_tokens=4096 seed=0")


def test_offline_defaults_are_one_draw_of_4096_tokens_per_variant_seeded_by_zero_record_and_tag(encoder,
                                                                                                  tmp_path):
    fake = FakeSampler(encoder)
    sample_offline([prompt("a")], fake, output_dir=tmp_path)
    [call] = fake.calls
    assert (call["n"], call["temperature"], call["top_p"], call["max_tokens"]) == (1, 1.0, 1.0, 4096)
    tags = [tag for tag, _ in offline_variants(prompt("a"), seed=0)]
    assert call["seeds"] == [derive_seed(0, "a", tag) for tag in tags]
    [row] = read_output(tmp_path)
    assert [c["source"] for c in row["completions"]] == [
        f"model=fake-model backend=fake temperature=1.0 top_p=1.0 max_tokens=4096 seed=0 system_prompt={tag}"
        for tag in tags]


def test_references_pass_the_settings_seeds_and_tools_to_the_sampler(encoder, tmp_path):
    fake = FakeSampler(encoder)
    sample_references([prompt("a", tools=[TOOL]), prompt("b")], fake, output_dir=tmp_path, n=2,
                      temperature=0.7, top_p=0.9, max_tokens=33, seed=5, batch_size=1)
    calls = {call["seeds"][0]: call for call in fake.calls}
    a, b = calls[derive_seed(5, "a")], calls[derive_seed(5, "b")]
    assert (a["n"], a["temperature"], a["top_p"], a["max_tokens"]) == (2, 0.7, 0.9, 33)
    assert a["tools"] == [[TOOL]] and b["tools"] == [None]
    assert rows_of(tmp_path)["a"]["completions"][1]["source"] == (
        "model=fake-model backend=fake temperature=0.7 top_p=0.9 max_tokens=33 seed=5")


def test_offline_passes_the_settings_seeds_and_tools_to_the_sampler(encoder, tmp_path):
    fake = FakeSampler(encoder)
    sample_offline([prompt("a", tools=[TOOL])], fake, output_dir=tmp_path, n=3, temperature=0.6, top_p=0.8,
                   max_tokens=21, seed=4, default_prompt=False)
    [call] = fake.calls
    [(tag, conversation)] = offline_variants(prompt("a"), seed=4, default_prompt=False)
    assert (call["n"], call["temperature"], call["top_p"], call["max_tokens"]) == (3, 0.6, 0.8, 21)
    assert call["seeds"] == [derive_seed(4, "a", tag)] and call["tools"] == [[TOOL]]
    assert call["conversations"] == [conversation]
    [row] = read_output(tmp_path)
    assert row["completions"][0]["source"] == (
        f"model=fake-model backend=fake temperature=0.6 top_p=0.8 max_tokens=21 seed=4 system_prompt={tag}")


def test_the_batch_size_is_the_number_of_prompts_per_sampler_call(encoder, tmp_path):
    records = [prompt("a"), prompt("b"), prompt("c")]
    fake = FakeSampler(encoder)
    sample_offline(records, fake, output_dir=tmp_path / "o", batch_size=2, default_prompt=False)
    assert [len(call["conversations"]) for call in fake.calls] == [2, 1]
    fake = FakeSampler(encoder)
    sample_references(records, fake, output_dir=tmp_path / "r", n=1, batch_size=2)
    assert [len(call["conversations"]) for call in fake.calls] == [2, 1]


def test_the_shortest_prompts_are_sampled_and_written_first(encoder, tmp_path):
    records = [prompt("long", "a rather longer question than the others"), prompt("short", "Hi"),
               prompt("mid", "Name a colour.")]
    fake = FakeSampler(encoder)
    sample_offline(records, fake, output_dir=tmp_path / "o", batch_size=1, default_prompt=False)
    assert [r["id"] for r in read_output(tmp_path / "o")] == ["short", "mid", "long"]
    sample_references(records, FakeSampler(encoder), output_dir=tmp_path / "r", n=1, batch_size=1)
    assert [r["id"] for r in read_output(tmp_path / "r")] == ["short", "mid", "long"]


@pytest.mark.parametrize("stage", [sample_references, sample_offline])
def test_a_stage_writes_the_shard_it_is_given(encoder, tmp_path, stage):
    records = [prompt(rid) for rid in ids_in_shard(0) + ids_in_shard(1)]
    stage(records, FakeSampler(encoder), output_dir=tmp_path, n=1, shard_index=1, num_shards=2)
    assert sorted(r["id"] for r in read_output(tmp_path)) == sorted(ids_in_shard(1))
    assert [p.name for p in tmp_path.glob("shard-*.jsonl")] == ["shard-00001-of-00002.jsonl"]


# --- the family prompt -------------------------------------------------------------------


@pytest.mark.parametrize("controversial", [False, True])
def test_the_family_prompt_is_drawn_from_the_record_id_and_the_seed(controversial):
    personas = ["a pirate", "a poet", "a plumber", "a pilot", "a painter"]
    for rid in ("a", "b", "c", "d"):
        record = prompt(rid, controversial=controversial)
        tag, conversation = offline_variants(record, seed=3, personas=personas)[0]
        drawn = draw_system_prompt(rid, controversial=controversial, seed=3, personas=personas)
        assert tag == drawn.tag and conversation[0] == {"role": "system", "content": drawn.text}
    tags = {offline_variants(prompt(r, controversial=controversial), seed=s, personas=personas)[0][0]
            for r in "abcdefgh" for s in (0, 3)}
    assert len(tags) > 2  # neither the id nor the seed is ignored


def test_a_controversial_prompt_draws_from_the_given_personas():
    [(tag, conversation)] = offline_variants(prompt("a", controversial=True), seed=0, personas=["a lighthouse keeper"])
    assert tag == "persona/0" and "a lighthouse keeper" in conversation[0]["content"]


def test_an_unclassified_record_is_an_error_by_default_in_offline_variants():
    with pytest.raises(RecordError, match=r"record 'a': field 'controversial': .*on_unclassified"):
        offline_variants(prompt("a", controversial=None), seed=0)


def test_a_flag_of_another_type_is_refused_without_the_classifier_hint(encoder, tmp_path):
    with pytest.raises(RecordError) as error:
        sample_offline([prompt("a", controversial="2")], FakeSampler(encoder), output_dir=tmp_path)
    assert str(error.value) == "record 'a': field 'controversial': expected true/false (set by the classifier), got '2'"
    with pytest.raises(RecordError) as error:
        sample_offline([prompt("a", controversial=None)], FakeSampler(encoder), output_dir=tmp_path)
    assert str(error.value) == ("record 'a': field 'controversial': expected true/false (set by the classifier), "
                                "got None (the classifier could not label it: set on_unclassified=persona|attribute)")


@pytest.mark.parametrize("flag", ["2", None])
def test_a_bad_flag_in_another_shard_is_refused_before_anything_is_written(encoder, tmp_path, flag):
    mine, other = ids_in_shard(0, count=1), ids_in_shard(1, count=1)
    records = [prompt(mine[0]), prompt(other[0], controversial=flag)]
    with pytest.raises(RecordError, match=rf"record '{other[0]}': field 'controversial'"):
        sample_offline(records, FakeSampler(encoder), output_dir=tmp_path / "o", shard_index=0, num_shards=2)
    assert not (tmp_path / "o").exists()


def test_a_skip_row_with_a_bad_flag_is_passed_on_as_it_came(encoder, tmp_path):
    skipped = prompt("s", controversial="2", skip_reason="upstream: no answer")
    sample_offline([prompt("a"), skipped], FakeSampler(encoder), output_dir=tmp_path, default_prompt=False)
    assert rows_of(tmp_path)["s"] == skipped


def test_a_system_prompt_given_as_text_mapping_follows_the_family_prompt():
    family = SystemPrompt("truthful", 0, "Be truthful.")
    user = {"role": "user", "content": "Q"}
    assert with_system_prompt([{"role": "system", "content": {"text": "House rules."}}, user], family) == [
        {"role": "system", "content": "Be truthful.\n\nHouse rules."}, user]
    assert with_system_prompt([{"role": "system", "content": "House rules."}, user], family) == [
        {"role": "system", "content": "Be truthful.\n\nHouse rules."}, user]


# --- skip rows ---------------------------------------------------------------------------


def test_a_reference_prompt_the_server_refuses_is_a_skip_row_with_no_overlong(encoder, tmp_path):
    fake = FakeSampler(encoder, refuse=refuse_me, finish=("length",))
    summary = sample_references([prompt("a"), prompt("r", "Refuse me")], fake, output_dir=tmp_path, n=2)
    rows = rows_of(tmp_path)
    assert rows["r"]["skip_reason"] == REFUSED
    assert rows["r"]["completions"] == [] and rows["r"]["num_overlong"] == 0 and rows["r"]["num_ref_dropped"] == 0
    assert rows["a"]["num_overlong"] == 2 and "skip_reason" not in rows["a"]
    assert summary == {"records": 2, "completions": 2, "overlong": 2, "skipped_prompts": 1}


def test_an_offline_variant_the_server_refuses_is_named_while_others_are_kept(encoder, tmp_path):
    """The refused variant is the plain conversation ("default"); the family one is sampled."""
    fake = FakeSampler(encoder, refuse=lambda conversation: conversation[0]["role"] != "system")
    family_tag = offline_variants(prompt("a"), seed=0)[0][0]
    summary = sample_offline([prompt("a")], fake, output_dir=tmp_path)
    [row] = read_output(tmp_path)
    assert row["skipped_variants"] == {"default": REFUSED} and "skip_reason" not in row
    assert [c["source"].split("system_prompt=")[1] for c in row["completions"]] == [family_tag]
    assert summary == {"records": 1, "completions": 1, "overlong": 0, "skipped_prompts": 0, "skipped_variants": 1}


def test_an_offline_prompt_whose_every_variant_is_refused_is_a_skip_row_with_the_first_reason(encoder, tmp_path):
    fake = FakeSampler(encoder, refuse=refuse_me)
    record = prompt("r", "Refuse me")
    tags = [tag for tag, _ in offline_variants(record, seed=0)]
    summary = sample_offline([prompt("a"), record], fake, output_dir=tmp_path)
    rows = rows_of(tmp_path)
    assert rows["r"]["skip_reason"] == f"{tags[0]}: {REFUSED}"
    assert rows["r"]["skipped_variants"] == {tag: REFUSED for tag in tags} and rows["r"]["completions"] == []
    assert "skip_reason" not in rows["a"] and "skipped_variants" not in rows["a"]
    assert summary == {"records": 2, "completions": 2, "overlong": 0, "skipped_prompts": 1, "skipped_variants": 2}


def test_a_batch_with_nothing_to_sample_asks_the_sampler_for_nothing_and_keeps_no_refusal(encoder, tmp_path):
    """Sorted shortest first: the refused prompt's batch, then a batch whose only prompt fills the context;
    that batch sends no request, and the refusal of the batch before is not read again for it."""
    records = [prompt("r", "Refuse me"), prompt("long", "word " * 60)]
    limit = length(encoder, records[1]["messages"])
    fake = FakeSampler(encoder, refuse=refuse_me, max_model_len=limit)
    sample_references(records, fake, output_dir=tmp_path / "r", n=1, batch_size=1)
    rows = rows_of(tmp_path / "r")
    assert rows["r"]["skip_reason"] == REFUSED and f"context length is {limit}" in rows["long"]["skip_reason"]
    assert [len(call["conversations"]) for call in fake.calls] == [1]  # nothing left to sample: no call
    records = [prompt("r", "Refuse me"), prompt("long", "word " * 60, controversial=True)]
    limit = length(encoder, offline_variants(records[1], seed=0)[0][1])
    fake = FakeSampler(encoder, refuse=refuse_me, max_model_len=limit)
    sample_offline(records, fake, output_dir=tmp_path / "o", batch_size=1)
    rows = rows_of(tmp_path / "o")
    assert rows["r"]["skip_reason"].endswith(REFUSED) and "context length is" in rows["long"]["skip_reason"]
    assert [len(call["conversations"]) for call in fake.calls] == [2]


@pytest.mark.parametrize("where", ["messages", "tools"])
def test_a_prompt_holding_the_formats_structure_text_is_a_skip_row(encoder, tmp_path, where):
    """In a message or in a tool declaration: skipped before sampling, the others sampled."""
    if where == "messages":
        bad = prompt("bad", "Say <|user_start|> twice")
    else:
        tool = {"type": "function", "function": {"name": "add", "description": "ends <|user_start|>",
                                                 "parameters": {"type": "object", "properties": {}}}}
        bad = prompt("bad", tools=[tool])
    fake = FakeSampler(encoder)
    summary = sample_references([prompt("a"), bad], fake, output_dir=tmp_path, n=1)
    rows = rows_of(tmp_path)
    assert rows["bad"]["skip_reason"].startswith("special_token_text: the text holds '<|user_start|>', which the "
                                                 "apertus format reads as structure")
    assert rows["bad"]["completions"] == [] and len(rows["a"]["completions"]) == 1
    assert [len(call["conversations"]) for call in fake.calls] == [1] and summary["skipped_prompts"] == 1


def test_an_offline_variant_that_fills_the_context_is_skipped_and_the_others_sampled(encoder, tmp_path):
    """The family variant (with its system prompt) is longer than the plain one: a context between them."""
    record = prompt("a")
    (family, with_family), (_, plain) = offline_variants(record, seed=0)
    limit = length(encoder, with_family)  # the boundary at equality: a prompt of the limit's length is skipped
    assert length(encoder, plain) < limit
    summary = sample_offline([record], FakeSampler(encoder, max_model_len=limit), output_dir=tmp_path)
    [row] = read_output(tmp_path)
    assert row["skipped_variants"] == {
        family: f"prompt has {limit} tokens; the model's context length is {limit}"}
    assert [c["source"].split("system_prompt=")[1] for c in row["completions"]] == ["default"]
    assert "skip_reason" not in row and summary["skipped_variants"] == 1


def test_an_offline_prompt_whose_completions_are_all_dropped_names_n_and_max_tokens(encoder, tmp_path):
    fake = FakeSampler(encoder, finish=("length",))
    summary = sample_offline([prompt("a")], fake, output_dir=tmp_path, n=3, max_tokens=7, overlong="drop")
    [row] = read_output(tmp_path)
    assert row["skip_reason"] == "all 3 completions ran past max_tokens=7 and overlong=drop removed them"
    assert row["completions"] == [] and row["num_overlong"] == 6 and "skipped_variants" not in row
    assert summary == {"records": 1, "completions": 0, "overlong": 6, "skipped_prompts": 1, "skipped_variants": 0}


def test_a_reference_prompt_whose_completions_are_all_dropped_names_n_and_max_tokens(encoder, tmp_path):
    fake = FakeSampler(encoder, finish=("length",))
    sample_references([prompt("a")], fake, output_dir=tmp_path, n=3, max_tokens=7, overlong="drop")
    [row] = read_output(tmp_path)
    assert row["skip_reason"] == "all 3 completions ran past max_tokens=7 and overlong=drop removed them"
    assert row["num_ref_dropped"] == 3 and row["num_overlong"] == 3


@pytest.mark.parametrize("stage", [sample_references, sample_offline])
def test_a_shard_of_skip_rows_only_passes_them_on(encoder, tmp_path, stage):
    upstream = prompt("s", skip_reason="upstream: no answer")
    fake = FakeSampler(encoder)
    summary = stage([upstream], fake, output_dir=tmp_path)
    assert read_output(tmp_path) == [upstream] and fake.calls == []
    assert (summary["records"], summary["skipped_prompts"], summary["completions"]) == (1, 1, 0)


# --- the counts ----------------------------------------------------------------------------


@pytest.mark.parametrize("overlong, kept", [("flag", 4), ("drop", 2)])
def test_offline_counts_overlong_completions_over_every_variant(encoder, tmp_path, overlong, kept):
    fake = FakeSampler(encoder, finish=("stop", "length"))
    summary = sample_offline([prompt("a")], fake, output_dir=tmp_path, n=2, overlong=overlong)
    [row] = read_output(tmp_path)
    assert row["num_overlong"] == 2 and len(row["completions"]) == kept
    if overlong == "drop":
        assert {c["finish_reason"] for c in row["completions"]} == {"stop"}
    assert summary["overlong"] == 2 and summary["completions"] == kept


def test_dropped_references_add_to_those_the_record_came_with(encoder, tmp_path):
    fake = FakeSampler(encoder, finish=("stop", "length", "length"))
    sample_references([prompt("a", num_ref_dropped=2), prompt("b")], fake, output_dir=tmp_path, n=3,
                      overlong="drop")
    rows = rows_of(tmp_path)
    assert rows["a"]["num_ref_dropped"] == 4 and rows["b"]["num_ref_dropped"] == 2
    assert rows["a"]["num_overlong"] == 2 and len(rows["a"]["completions"]) == 1


def test_the_summary_counts_an_upstream_skip_row_without_completions_or_counts(encoder, tmp_path):
    upstream = prompt("s", skip_reason="upstream: no answer")
    summary = sample_references([prompt("a"), upstream], FakeSampler(encoder), output_dir=tmp_path / "r", n=2)
    assert summary == {"records": 2, "completions": 2, "overlong": 0, "skipped_prompts": 1}
    assert rows_of(tmp_path / "r")["s"] == upstream
    summary = sample_offline([prompt("a"), upstream], FakeSampler(encoder), output_dir=tmp_path / "o")
    assert summary == {"records": 2, "completions": 2, "overlong": 0, "skipped_prompts": 1, "skipped_variants": 0}
    assert sampling_summary(tmp_path / "o", is_reference=True)["completions"] == 0


# --- the settings a resume is checked against --------------------------------------------


def test_offline_records_its_settings_in_the_output_dir(encoder, tmp_path):
    sample_offline([prompt("a")], FakeSampler(encoder), output_dir=tmp_path, n=2, temperature=0.5, top_p=0.9,
                   max_tokens=12, seed=3, overlong="drop", controversial_field="hot", default_prompt=False,
                   charter_persona=True, personas=["x", "y"], on_unclassified="persona")
    assert json.loads((tmp_path / "_job.json").read_text()) == {
        "stage": "sample_offline", "model": "fake-model", "backend": "fake", "chat_format": "apertus", "n": 2,
        "temperature": 0.5, "top_p": 0.9, "max_tokens": 12, "seed": 3, "overlong": "drop",
        "controversial_field": "hot", "default_prompt": False, "charter_persona": True, "num_personas": 2,
        "on_unclassified": "persona"}


def test_references_record_their_settings_in_the_output_dir(encoder, tmp_path):
    sample_references([prompt("a")], FakeSampler(encoder), output_dir=tmp_path, n=2, temperature=0.5, top_p=0.9,
                      max_tokens=12, seed=3, overlong="drop")
    assert json.loads((tmp_path / "_job.json").read_text()) == {
        "stage": "sample_references", "model": "fake-model", "backend": "fake", "chat_format": "apertus", "n": 2,
        "temperature": 0.5, "top_p": 0.9, "max_tokens": 12, "seed": 3, "overlong": "drop"}


@pytest.mark.parametrize("key, value", [
    ("n", 2), ("temperature", 0.5), ("top_p", 0.5), ("max_tokens", 12), ("seed", 3), ("overlong", "drop"),
    ("controversial_field", "hot"), ("default_prompt", False), ("charter_persona", True),
    ("on_unclassified", "persona"),
])
def test_an_offline_resume_with_another_setting_is_refused_naming_it(encoder, tmp_path, key, value):
    sample_offline([prompt("a")], FakeSampler(encoder), output_dir=tmp_path)
    with pytest.raises(InputError, match=rf"differs in \['{key}'\]"):
        sample_offline([prompt("a"), prompt("b")], FakeSampler(encoder), output_dir=tmp_path, **{key: value})


def test_an_offline_resume_with_another_persona_pool_is_refused(encoder, tmp_path):
    sample_offline([prompt("a")], FakeSampler(encoder), output_dir=tmp_path)
    with pytest.raises(InputError, match=r"differs in \['num_personas'\]"):
        sample_offline([prompt("a")], FakeSampler(encoder), output_dir=tmp_path, personas=["x"])


# --- a context that fits no prompt -------------------------------------------------------


def test_a_context_no_prompt_fits_names_the_limit_the_shortest_and_where_it_comes_from(encoder, tmp_path):
    records = [prompt("a", "word " * 20), prompt("b", "word word")]
    shortest = length(encoder, records[1]["messages"])
    with pytest.raises(InputError) as error:
        sample_references(records, FakeSampler(encoder, max_model_len=shortest), output_dir=tmp_path / "r")
    assert str(error.value).startswith(
        f"every prompt is too long for the context length of {shortest} tokens (the model's context length): "
        f"the shortest has {shortest} tokens, so nothing would be sampled")
    assert not (tmp_path / "r").exists()


def test_an_upstream_skip_row_that_would_fit_does_not_hide_a_context_too_small(encoder, tmp_path):
    records = [prompt("s", "Hi", skip_reason="upstream: no answer"), prompt("a", "word " * 20)]
    limit = length(encoder, records[1]["messages"])
    with pytest.raises(InputError, match="every prompt is too long"):
        sample_references(records, FakeSampler(encoder, max_model_len=limit), output_dir=tmp_path)


@pytest.mark.parametrize("other_length, refused", [(-1, False), (0, True)])
def test_a_shard_of_long_prompts_goes_on_only_when_another_shards_prompt_fits(encoder, tmp_path, other_length,
                                                                              refused):
    """The other shard's prompt fits only when it is shorter than the context (the boundary at equality);
    an upstream skip row before it is passed over, not taken for the end."""
    mine, other = ids_in_shard(0, count=1)[0], ids_in_shard(1, count=1)[0]
    fits = prompt(other, "word word")
    limit = length(encoder, fits["messages"]) - other_length
    records = [prompt("s", skip_reason="upstream: no answer"), prompt(mine, "word " * 20), fits]
    fake = FakeSampler(encoder, max_model_len=limit)
    if refused:
        with pytest.raises(InputError, match=rf"context length of {limit} tokens"):
            sample_references(records, fake, output_dir=tmp_path, shard_index=0, num_shards=2)
        return
    sample_references(records, fake, output_dir=tmp_path, shard_index=0, num_shards=2)
    assert "context length is" in rows_of(tmp_path)[mine]["skip_reason"]


# --- the OpenAI-compatible client: what it sends and how it reads the answer -------------


class Recorder(BaseHTTPRequestHandler):
    """A vLLM-like server that keeps every request: ``/models`` lists ``models``; ``/completions`` answers
    ``n`` choices of ``answer`` plus the first stop id, or 400 with a length code for a prompt longer than
    ``refuse_over`` tokens."""

    models: ClassVar[list] = []
    answer: ClassVar[list[int]] = []
    refuse_over: ClassVar[int] = 10**9
    seen: ClassVar[list] = []

    def do_GET(self):
        Recorder.seen.append((self.path, self.headers.get("Authorization"), None))
        if self.path != "/v1/models":
            return self._send(404, {"error": {"message": f"no route {self.path}", "type": "NotFound"}})
        self._send(200, {"data": Recorder.models})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Recorder.seen.append((self.path, self.headers.get("Authorization"), body))
        if len(body["prompt"]) > Recorder.refuse_over:
            return self._send(400, {"error": {"message": "too long", "type": "invalid_request_error",
                                              "code": "context_length_exceeded"}})
        ids = Recorder.answer + [body["stop_token_ids"][0]]
        self._send(200, {"choices": [{"index": i, "token_ids": ids, "finish_reason": "stop"}
                                     for i in range(body["n"])]})

    def _send(self, status, data):
        raw = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args):
        pass


@pytest.fixture()
def served(encoder, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    Recorder.models = [{"id": "served", "max_model_len": 300}]
    Recorder.answer = encoder.tokenizer.encode("yes", add_special_tokens=False)
    Recorder.refuse_over, Recorder.seen = 10**9, []
    httpd = HTTPServer(("127.0.0.1", 0), Recorder)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


def client(url, encoder, **keys):
    return OpenAISampler(url, "served", encoder.tokenizer, chat_date="2026-01-01", max_retries=0, **keys)


def posts():
    return [body for path, _, body in Recorder.seen if path == "/v1/completions"]


def test_the_client_sends_the_prompt_ids_and_every_setting(served, encoder):
    conversation = [{"role": "user", "content": "Name a colour."}]
    ids = encoder.prompt_ids(conversation)
    [completions] = client(served, encoder).sample([conversation], 2, temperature=0.5, top_p=0.9, max_tokens=7,
                                                   seed=[11])
    assert posts() == [{"model": "served", "prompt": ids, "n": 2, "temperature": 0.5, "top_p": 0.9, "max_tokens": 7,
                        "seed": stream_seed(11, ids), "stop_token_ids": encoder.stop_ids,
                        "skip_special_tokens": False, "return_token_ids": True}]
    answer = ("yes", "stop", len(Recorder.answer) + 1)
    assert [(c.text, c.finish_reason, c.num_tokens) for c in completions] == [answer] * 2
    assert completions[0].source() == "model=served backend=openai temperature=0.5 top_p=0.9 max_tokens=7 seed=11"


def test_the_budget_is_cut_to_the_context_but_the_source_keeps_max_tokens(served, encoder):
    conversation = [{"role": "user", "content": "Name a colour."}]
    room = 300 - len(encoder.prompt_ids(conversation))
    [[completion]] = client(served, encoder).sample([conversation], 1, max_tokens=5000, seed=3)
    assert posts()[0]["max_tokens"] == room
    assert completion.source() == "model=served backend=openai temperature=1.0 top_p=1.0 max_tokens=5000 seed=3"


def test_the_model_name_recorded_is_the_served_name_unless_given(served, encoder):
    conversation = [{"role": "user", "content": "Hi"}]
    [[completion]] = client(served, encoder).sample([conversation], 1)
    assert completion.model == "served"
    assert completion.source() == "model=served backend=openai temperature=1.0 top_p=1.0 max_tokens=4096 seed=0"
    named = client(f"{served}/", encoder, model_name="tiny-policy")
    assert named.sample([conversation], 1)[0][0].model == "tiny-policy"
    assert named.base_url == served and posts()[1]["model"] == "served"  # the trailing slash dropped


def test_a_prompt_refused_for_its_length_is_recorded_and_the_others_kept_in_order(served, encoder):
    short = [{"role": "user", "content": "Hi"}]
    long = [{"role": "user", "content": "word " * 30}]
    Recorder.refuse_over = len(encoder.prompt_ids(short))
    sampler = client(served, encoder, concurrency=3)
    results = sampler.sample([short, long, short], 1)
    tokens = len(encoder.prompt_ids(long))
    assert sampler.refusals == {1: f"the server refused the prompt ({tokens} tokens) as too long: "
                                   "HTTP 400 invalid_request_error: too long"}
    assert [len(r) for r in results] == [1, 0, 1] and results[2][0].text == "yes"


@pytest.mark.parametrize("recipe, limit, source", [
    (None, 300, "the server's max_model_len ({url}/models)"),
    (500, 300, "the server's max_model_len ({url}/models)"),
    (200, 200, "max_model_len in the recipe"),
])
def test_the_context_length_and_where_it_comes_from(served, encoder, recipe, limit, source):
    sampler = client(served, encoder, max_model_len=recipe)
    assert sampler.max_model_len == limit and sampler.context_source == source.format(url=served)


def test_a_server_that_does_not_say_its_context_needs_max_model_len(served, encoder):
    Recorder.models = [{"id": "served"}]
    with pytest.raises(ServiceError, match=rf"^{served}/models does not say the context length of 'served': set "
                                           "max_model_len$"):
        _ = client(served, encoder).max_model_len
    assert client(served, encoder, max_model_len=64).max_model_len == 64


def test_a_model_the_server_does_not_serve_is_named_with_those_it_serves(served, encoder):
    Recorder.models = [{"id": "other", "max_model_len": 300}]
    with pytest.raises(ServerError, match=rf"^{served}: model 'served' is not served here \(served: \['other'\]\)$"):
        _ = client(served, encoder).max_model_len


def test_the_api_key_is_sent_as_a_bearer_token_given_or_from_the_environment(served, encoder, monkeypatch):
    conversation = [{"role": "user", "content": "Hi"}]
    client(served, encoder, api_key="k-1", max_model_len=200).sample([conversation], 1)
    monkeypatch.setenv("OPENAI_API_KEY", "k-2")
    client(served, encoder, max_model_len=200).sample([conversation], 1)
    monkeypatch.setenv("MY_KEY", "k-3")
    client(served, encoder, api_key_env="MY_KEY", max_model_len=200).sample([conversation], 1)
    monkeypatch.delenv("OPENAI_API_KEY")
    client(served, encoder, max_model_len=200).sample([conversation], 1)
    assert [auth for path, auth, _ in Recorder.seen if path == "/v1/completions"] == [
        "Bearer k-1", "Bearer k-2", "Bearer k-3", None]


def test_a_tokenizer_path_that_cannot_be_loaded_is_named_as_the_setting(tmp_path):
    with pytest.raises(InputError, match=rf"^tokenizer={re.escape(repr(str(tmp_path)))}: cannot be loaded"):
        OpenAISampler("http://127.0.0.1:9/v1", "served", str(tmp_path))


def test_token_id_zero_is_a_token_and_a_negative_id_is_no_answer(served, encoder):
    conversation = [{"role": "user", "content": "Hi"}]
    Recorder.answer = [0]
    [[completion]] = client(served, encoder, max_model_len=200).sample([conversation], 1)
    assert completion.num_tokens == 2 and completion.finish_reason == "stop"
    Recorder.answer = [-1]
    with pytest.raises(ServerError, match=r"/completions: a choice has no list of token_ids"):
        client(served, encoder, max_model_len=200).sample([conversation], 1)


def test_the_prompt_is_rendered_with_the_tools_thinking_and_stop_tokens_given(served, encoder):
    conversation = [{"role": "user", "content": "Add two and two."}]
    thinking = PromptEncoder(encoder.tokenizer, "apertus", chat_date="2026-01-01", enable_thinking=True,
                             stop_tokens=["<|user_start|>"])
    sampler = client(served, encoder, max_model_len=300, enable_thinking=True, stop_tokens=["<|user_start|>"])
    sampler.sample([conversation], 1, tools=[[TOOL]])
    [body] = posts()
    assert body["prompt"] == thinking.prompt_ids(conversation, [TOOL]) != encoder.prompt_ids(conversation)
    assert body["stop_token_ids"] == thinking.stop_ids != encoder.stop_ids


# --- the length check before sampling counts what the sampler sends ----------------------


def test_the_length_check_counts_the_prompts_tools(encoder, tmp_path):
    """A prompt that fits without its tools but not with them is skipped as too long, with the length
    the sampler would send (tools included)."""
    bare = length(encoder, prompt("a")["messages"])
    with_tools = len(encoder.prompt_ids(prompt("a")["messages"], [TOOL]))
    assert with_tools > bare
    fake = FakeSampler(encoder, max_model_len=with_tools)
    sample_references([prompt("a", tools=[TOOL]), prompt("b")], fake, output_dir=tmp_path, n=1)
    rows = rows_of(tmp_path)
    assert rows["a"]["skip_reason"].endswith(f"prompt has {with_tools} tokens; the model's context length is "
                                             f"{with_tools}")
    assert "skip_reason" not in rows["b"]


@pytest.mark.parametrize(("change", "field"), [({"messages": [{"role": "narrator", "content": "Once"},
                                                              {"role": "user", "content": "Hi"}]}, "messages"),
                                               ({"tools": [{"type": "function"}]}, "tools")])
def test_a_prompt_the_format_cannot_render_names_its_field(encoder, tmp_path, change, field):
    with pytest.raises(RecordError) as caught:
        sample_references([{**prompt("bad"), **change}], FakeSampler(encoder), output_dir=tmp_path, n=1)
    assert (caught.value.record_id, caught.value.field) == ("bad", field)
    assert "cannot be rendered: " in str(caught.value)
    assert not (tmp_path / "_job.json").exists()
