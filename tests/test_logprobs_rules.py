"""The rules of the reference log-prob pass that tests/test_logprobs.py leaves open.

What the pass records with each row (the settings it tokenized with, the columns it adds,
the reference checkpoint's fingerprint) and what the trainer says when its settings differ,
what the cache key is made of (the model's name, the dtype, the tokenizer, each field of a row), how a
cache file is read back (a bad value refused naming the record and the field, a Dataset
read like a list), what a call reports (its shard, the rows it skipped over several
batches, warnings only where they are true), that the batch layout a user asks for
(prefix sharing, padding-free rows, a row budget, block attention) is the one the model
runs, and that a rank done with its shard keeps answering the others' forwards. Each test
states one such rule as a user sees it.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import types

import pytest
import torch

from align.data.records import RecordError
from align.errors import InputError
from align.io import read_output
from align.io.fingerprint import weights_fingerprint
from align.logprobs import (
    REF_INPUT_LABELS,
    cache_fields_for,
    check_ref_tokens,
    compute_ref_logprobs,
    dataset_fingerprint,
    load_ref_logprobs,
    missing_ids,
    pass_settings,
    ref_cache_key,
    reference_fingerprint,
    row_text_hashes,
    token_hash,
    tokenizer_fingerprint,
)
from align.testing.tiny import build_causal_lm

DATE = "2025-09-01"
PAIR = ("chosen", "rejected")


def pair_row(i: int, chosen_words: int = 3, **extra) -> dict:
    """A pair row without a system message: the Apertus default system text, with the date, is rendered."""
    return {"id": f"r{i}", "messages": [{"role": "user", "content": f"Question {i}?"}],
            "chosen": " ".join(["yes"] * chosen_words), "rejected": "no", **extra}


class Unnamed(torch.nn.Linear):
    """A model held in memory with no ``name_or_path`` at all."""


@pytest.fixture(scope="module")
def model(tiny_tokenizer):
    return build_causal_lm(tiny_tokenizer)


def run(rows, model, tokenizer, directory, **kwargs):
    settings = {"chat_format": "apertus", "batch_size": 4, "max_length": 256, "chat_date": DATE}
    return compute_ref_logprobs(rows, model, tokenizer, output_dir=directory, **{**settings, **kwargs})


def forwards(monkeypatch, model) -> list[dict]:
    """Records, for every forward of ``model``, the shape of its input ids and whether it got attention pieces."""
    seen: list[dict] = []
    forward = model.forward

    def spy(*args, **kwargs):
        seen.append({"shape": tuple(kwargs["input_ids"].shape), "pieces": "attention_blocks" in kwargs})
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", spy)
    return seen


# --------------------------------------------------------------------------- what each row records


def test_each_row_records_every_setting_the_pass_tokenized_with(model, tiny_tokenizer, tmp_path):
    """ref_inputs holds each setting as given (none left at a default), and the row's text hashes."""
    rows = [pair_row(0), pair_row(1, chosen_words=200)]
    run(rows, model, tiny_tokenizer, tmp_path / "out", enable_thinking=True, max_length=120,
        over_max_length="cut", truncated="train_without_end")
    expected = {"chat_format": "apertus", "chat_date": DATE, "enable_thinking": True, "max_length": 120,
                "over_max_length": "cut", "truncated": "train_without_end",
                "tokenizer_fingerprint": tokenizer_fingerprint(tiny_tokenizer)}
    for row in load_ref_logprobs(tmp_path / "out", rows):
        assert row["ref_inputs"] == {**expected, **row_text_hashes(row, PAIR)}, row["id"]


def test_a_scored_row_gains_exactly_the_reference_columns(model, tiny_tokenizer, tmp_path):
    rows = [pair_row(0)]
    run(rows, model, tiny_tokenizer, tmp_path / "out")
    (out,) = load_ref_logprobs(tmp_path / "out", rows)
    assert set(out) - set(rows[0]) == {"ref_chosen_logps", "ref_rejected_logps", "chosen_length", "rejected_length",
                                       "ref_chosen_token_hash", "ref_rejected_token_hash", "ref_model_fingerprint",
                                       "ref_inputs"}


def test_rows_record_the_tokenizer_fingerprint_of_the_cache_fields_given(model, tiny_tokenizer, tmp_path):
    """With cache_fields given, the tokenizer is not hashed again: the rows are bound to the key's fingerprint."""
    rows = [pair_row(0)]
    fields = cache_fields_for(rows, model, tiny_tokenizer, chat_format="apertus", max_length=256, chat_date=DATE,
                              model_fingerprint="m")
    fields["tokenizer_fingerprint"] = "tokenizer-of-the-key"
    run(rows, model, tiny_tokenizer, tmp_path / "out", cache_fields=fields)
    (out,) = load_ref_logprobs(tmp_path / "out", rows)
    assert out["ref_inputs"]["tokenizer_fingerprint"] == "tokenizer-of-the-key"


def test_the_trainers_settings_hash_its_own_tokenizer(tiny_tokenizer):
    settings = pass_settings(tiny_tokenizer, chat_format="apertus", chat_date=DATE, enable_thinking=False,
                             max_length=64, truncated="exclude", over_max_length="exclude")
    assert settings["tokenizer_fingerprint"] == tokenizer_fingerprint(tiny_tokenizer)


def test_a_trainer_that_cuts_as_the_pass_did_is_not_told_over_max_length_differs(model, tiny_tokenizer, tmp_path):
    """Pass and trainer both on over_max_length=cut, only the date differs: the error names the date alone."""
    from align.trainers.preference_config import PreferenceConfig
    from align.trainers.preference_data import prepare_row

    rows = [{**pair_row(0), "chosen_quantile": 1.0, "rejected_quantile": 0.0}]
    run(rows, model, tiny_tokenizer, tmp_path / "ref", max_length=100, over_max_length="cut")
    (scored,) = load_ref_logprobs(tmp_path / "ref", rows)
    config = PreferenceConfig(output_dir=str(tmp_path / "train"), use_cpu=True, report_to="none", loss_type="qrpo",
                              max_length=100, over_max_length="cut", chat_date="2025-09-02")
    with pytest.raises(RecordError) as caught:
        prepare_row(scored, 0, tiny_tokenizer, config)
    assert "tokenizes: chat_date is '2025-09-01' in the pass, '2025-09-02' in the trainer. Rerun" in str(caught.value)


def test_the_text_hashes_keep_the_form_earlier_passes_wrote():
    """Sixteen hex digits of each hash: rows written by an earlier pass still agree with the trainer."""
    row = {"id": "r1", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}],
           "tools": [{"type": "function", "function": {"name": "add"}}], "chosen": "4", "rejected": "5"}
    assert row_text_hashes(row, PAIR) == {"system_hash": "1e84e0af96af7057", "prompt_hash": "b082f982ecf22fa1",
                                          "completion_hash": "61180fc4d135b8d0"}


def test_a_checkpoint_known_by_its_path_is_fingerprinted_by_its_weights(tiny_tokenizer, tmp_path):
    build_causal_lm(tiny_tokenizer).save_pretrained(tmp_path / "reference")
    expected = weights_fingerprint(str(tmp_path / "reference"))
    assert expected is not None
    assert reference_fingerprint(str(tmp_path / "reference")) == expected
    assert reference_fingerprint(tmp_path / "reference") == expected


@pytest.mark.parametrize("which", ["nothing", "transformers_in_memory", "plain_module"])
def test_a_model_held_only_in_memory_has_no_reference_fingerprint(which, model):
    """Nothing reliable to compare: None, not the fingerprint of an empty or made-up path."""
    given = {"nothing": None, "transformers_in_memory": model, "plain_module": Unnamed(2, 2)}[which]
    assert reference_fingerprint(given) is None


# --------------------------------------------------------------------------- the trainer's message on a mismatch

SETTINGS = {"chat_format": "apertus", "chat_date": DATE, "enable_thinking": False, "max_length": 64,
            "over_max_length": "exclude", "truncated": "exclude", "tokenizer_fingerprint": "tok-a"}
ENCODED = {"prompt_ids": [1, 2, 3], "chosen_ids": [4, 5], "rejected_ids": [6]}


def bound_row(**changes) -> dict:
    row = {"id": "r1", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}],
           "chosen": "4", "rejected": "5",
           "ref_chosen_token_hash": token_hash([1, 2, 3], [4, 5]), "ref_rejected_token_hash": token_hash([1, 2, 3], [6])}
    row["ref_inputs"] = {**SETTINGS, **row_text_hashes(row, PAIR)}
    return {**row, **changes}


def mismatch_message(row: dict, trainer: dict | None = None) -> str:
    with pytest.raises(RecordError) as caught:
        check_ref_tokens(row, {**ENCODED, "chosen_ids": [4, 99]}, "r1", lambda: {**SETTINGS, **(trainer or {})})
    return str(caught.value)


def test_a_changed_system_text_does_not_hide_the_settings_named_after_it():
    row = bound_row(messages=[{"role": "system", "content": "be verbose"}, {"role": "user", "content": "2+2?"}])
    message = mismatch_message(row, trainer={"chat_date": "2025-09-02"})
    assert (f"tokenizes: {REF_INPUT_LABELS['system_hash']} differs from the pass's; chat_date is '{DATE}' in the "
            "pass, '2025-09-02' in the trainer. Rerun") in message


def test_a_row_without_the_pass_settings_says_so_in_those_words():
    message = mismatch_message(bound_row(ref_inputs=None))
    assert "tokenizes: the token ids differ (the row does not record the pass's settings). Rerun" in message


# --------------------------------------------------------------------------- the cache key


@pytest.mark.parametrize(("which", "expected"), [
    ("path", "org/reference-model"),
    ("named", "/checkpoints/reference"),
    ("unnamed_transformers", "LlamaForCausalLM"),
    ("plain_module", "Unnamed"),
])
def test_the_key_names_the_model_by_its_path_else_its_class(which, expected, model, tiny_tokenizer):
    if which == "path":
        given = "org/reference-model"
    elif which == "named":
        given = copy.deepcopy(model)
        given.name_or_path = "/checkpoints/reference"
    elif which == "unnamed_transformers":
        given = model
        assert not model.name_or_path
    else:
        given = Unnamed(2, 2)
    fields = cache_fields_for([pair_row(0)], given, tiny_tokenizer, chat_format="apertus", max_length=64,
                              model_fingerprint="m", dtype="float32")
    assert fields["model"] == expected


def test_a_dtype_given_is_keyed_as_given_for_a_model_in_memory(model, tiny_tokenizer):
    fields = cache_fields_for([pair_row(0)], model, tiny_tokenizer, chat_format="apertus", max_length=64,
                              model_fingerprint="m", dtype="bfloat16")
    assert fields["dtype"] == "bfloat16"
    assert cache_fields_for([pair_row(0)], model, tiny_tokenizer, chat_format="apertus", max_length=64,
                            model_fingerprint="m")["dtype"] == "float32"  # else the model's own


def test_the_tokenizer_fingerprint_covers_more_than_the_vocabulary(tiny_tokenizer):
    """Same vocabulary, another normalizer (the text lowercased first): another fingerprint."""
    from tokenizers import normalizers

    lowercase = copy.deepcopy(tiny_tokenizer)
    lowercase.backend_tokenizer.normalizer = normalizers.Lowercase()
    assert lowercase.get_vocab() == tiny_tokenizer.get_vocab()
    assert tokenizer_fingerprint(lowercase) != tokenizer_fingerprint(tiny_tokenizer)


class VocabularyOnly:
    """A tokenizer with no fast backend (as a slow one): only its vocabulary to hash."""

    def __init__(self, vocab):
        self.vocab = vocab

    def get_vocab(self):
        return dict(self.vocab)


def test_a_tokenizer_without_a_backend_is_fingerprinted_by_its_vocabulary():
    same = tokenizer_fingerprint(VocabularyOnly({"a": 0, "b": 1}))
    assert same == tokenizer_fingerprint(VocabularyOnly({"b": 1, "a": 0}))  # the order read does not matter
    assert same != tokenizer_fingerprint(VocabularyOnly({"a": 0, "c": 1}))


def test_a_key_missing_a_field_is_refused_naming_it(model, tiny_tokenizer):
    fields = cache_fields_for([pair_row(0)], model, tiny_tokenizer, chat_format="apertus", max_length=64,
                              model_fingerprint="m")
    del fields["dtype"]
    with pytest.raises(ValueError, match=r"missing \['dtype'\], not part of the key \[\]"):
        ref_cache_key(fields)


@pytest.mark.parametrize(("field", "value"), [
    ("id", "other"),
    ("messages", [{"role": "user", "content": "Another question?"}]),
    ("tools", [{"type": "function", "function": {"name": "add"}}]),
    ("chosen", "other"),
    ("rejected", "other"),
    ("completion", "other"),
    ("chosen_finish_reason", "length"),
    ("rejected_finish_reason", "length"),
    ("completion_finish_reason", "length"),
])
def test_each_field_the_pass_reads_changes_the_dataset_fingerprint(field, value):
    rows = [pair_row(0), pair_row(1)]
    changed = copy.deepcopy(rows)
    changed[1][field] = value
    assert dataset_fingerprint(changed) != dataset_fingerprint(rows)


def test_over_max_length_given_to_the_pass_reaches_its_key(model, tiny_tokenizer, tmp_path):
    result = run([pair_row(0)], model, tiny_tokenizer, tmp_path / "out", over_max_length="cut",
                 model_fingerprint="m")
    assert result.cache_fields["over_max_length"] == "cut"
    assert json.loads((tmp_path / "out" / "_job.json").read_text())["over_max_length"] == "cut"


def test_the_pass_default_max_length_is_the_trainers(model, tiny_tokenizer, tmp_path):
    from align.trainers.preference_config import PreferenceConfig

    trainer_default = {f.name: f.default for f in dataclasses.fields(PreferenceConfig)}["max_length"]
    result = compute_ref_logprobs([pair_row(0)], model, tiny_tokenizer, output_dir=tmp_path / "out", chat_date=DATE,
                                  model_fingerprint="m")
    assert result.cache_fields["max_length"] == trainer_default == 4096


# --------------------------------------------------------------------------- reading a cache file back


def write_shard(directory, rows) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "shard-00000-of-00001.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def scored(rid: str, **changes) -> dict:
    return {"id": rid, "messages": [{"role": "user", "content": "q"}], "chosen": "a", "rejected": "b",
            "ref_chosen_logps": -1.5, "ref_rejected_logps": -2.5, "chosen_length": 2, "rejected_length": 3, **changes}


@pytest.mark.parametrize("column", ["ref_chosen_logps", "chosen_length", "ref_rejected_logps", "rejected_length"])
@pytest.mark.parametrize("bad", [True, math.nan, math.inf, "-1.5", None])
def test_a_cache_row_with_a_bad_value_is_refused_naming_record_and_field(column, bad, tmp_path):
    rows = [scored("r0"), scored("r1", **{column: bad})]
    write_shard(tmp_path / "out", rows)
    with pytest.raises(RecordError, match=rf"record 'r1': field '{column}'.*expected a finite number"):
        load_ref_logprobs(tmp_path / "out", rows)


def test_rows_after_a_skipped_row_are_still_checked(tmp_path):
    rows = [scored("r0"), {**pair_row(1), "ref_skip": "over_max_length: ..."}, scored("r2", chosen_length=None)]
    write_shard(tmp_path / "out", rows)
    with pytest.raises(RecordError, match=r"record 'r2': field 'chosen_length'"):
        load_ref_logprobs(tmp_path / "out", rows)


def test_a_dataset_is_read_like_a_list(tmp_path):
    from datasets import Dataset

    rows = [scored("r0"), scored("r1"), scored("r2")]
    write_shard(tmp_path / "out", rows[:2])
    records = Dataset.from_list(rows)
    assert missing_ids(tmp_path / "out", records) == ["r2"]
    with pytest.raises(InputError, match=r"1 of 3 rows missing, e.g. \['r2'\]"):
        load_ref_logprobs(tmp_path / "out", records)
    write_shard(tmp_path / "out", rows[::-1])
    assert [r["id"] for r in load_ref_logprobs(tmp_path / "out", records)] == ["r0", "r1", "r2"]


def test_every_row_is_missing_from_an_output_not_made_yet(tmp_path):
    assert missing_ids(tmp_path / "not-there", [pair_row(0), pair_row(1)]) == ["r0", "r1"]


# --------------------------------------------------------------------------- what a call reports


def test_the_result_names_the_shard_and_the_directory(model, tiny_tokenizer, tmp_path):
    rows = [pair_row(i) for i in range(6)]
    result = run(rows, model, tiny_tokenizer, tmp_path / "out", shard_index=1, num_shards=2)
    assert (result.output_dir, result.shard_index, result.num_shards) == (tmp_path / "out", 1, 2)
    assert result.num_processed == len(read_output(tmp_path / "out")) == 6 - len(missing_ids(tmp_path / "out", rows))


def test_rows_skipped_in_several_batches_are_all_counted(model, tiny_tokenizer, tmp_path):
    """Three rows over max_length, scored two rows a batch: they fall into two batches and count three."""
    rows = [pair_row(i, chosen_words=200 if i % 2 else 3) for i in range(6)]
    result = run(rows, model, tiny_tokenizer, tmp_path / "out", max_length=100, batch_size=2)
    assert result.num_over_max_length_skipped == 3
    assert sorted(r["id"] for r in read_output(tmp_path / "out") if r.get("ref_skip")) == ["r1", "r3", "r5"]


def test_rows_are_scored_and_written_longest_first(model, tiny_tokenizer, tmp_path):
    rows = [pair_row(i, chosen_words=i + 1) for i in range(5)]
    run(rows, model, tiny_tokenizer, tmp_path / "out", batch_size=2)
    assert [r["id"] for r in read_output(tmp_path / "out")] == ["r4", "r3", "r2", "r1", "r0"]


def test_a_pass_over_ended_completions_warns_of_no_truncation(model, tiny_tokenizer, tmp_path, caplog):
    with caplog.at_level("WARNING", logger="align.logprobs"):
        run([pair_row(0)], model, tiny_tokenizer, tmp_path / "out")
    assert not [r for r in caplog.records if "truncated" in r.getMessage()]


def test_a_truncated_completion_refused_is_not_announced_as_scored(model, tiny_tokenizer, tmp_path, caplog):
    rows = [pair_row(0, chosen_finish_reason="length")]
    with caplog.at_level("WARNING", logger="align.logprobs"), \
            pytest.raises(RecordError, match=r"record 'r0': field 'chosen_finish_reason'"):
        run(rows, model, tiny_tokenizer, tmp_path / "out", truncated="exclude")
    assert not [r for r in caplog.records if "without an end-of-turn" in r.getMessage()]


def test_a_tokenizer_without_a_pad_token_scores_the_same(model, tiny_tokenizer, tmp_path):
    rows = [pair_row(0), pair_row(1, chosen_words=9)]
    unpadded = copy.deepcopy(tiny_tokenizer)
    unpadded.pad_token = None
    assert unpadded.pad_token_id is None
    run(rows, model, tiny_tokenizer, tmp_path / "padded")
    run(rows, model, unpadded, tmp_path / "unpadded")
    for a, b in zip(load_ref_logprobs(tmp_path / "padded", rows), load_ref_logprobs(tmp_path / "unpadded", rows)):
        for column in ("ref_chosen_logps", "ref_rejected_logps"):
            assert a[column] == pytest.approx(b[column], abs=1e-5)


# --------------------------------------------------------------------------- the layout asked for is the one run


@pytest.mark.parametrize(("settings", "rows_per_forward"), [
    ({}, 3),                                              # prefix sharing on sdpa by default: one row per pair
    ({"prefix_sharing": False}, 6),                       # each (prompt, completion) in its own row
    ({"padding_free": True}, 2),                          # the two short pairs packed into the long one's width
    ({"padding_free": True, "max_row_tokens": 10_000}, 1),  # a budget that holds them all
])
def test_the_batch_layout_asked_for_is_the_one_the_model_runs(settings, rows_per_forward, model, tiny_tokenizer,
                                                              tmp_path, monkeypatch):
    rows = [pair_row(0), pair_row(1), pair_row(2, chosen_words=60)]
    seen = forwards(monkeypatch, model)
    run(rows, model, tiny_tokenizer, tmp_path / "out", batch_size=3, **settings)
    assert [s["shape"][0] for s in seen] == [rows_per_forward]


def test_a_row_budget_bounds_every_row(model, tiny_tokenizer, tmp_path, monkeypatch):
    """Four pairs of about 83 tokens (prompt once, both completions) in rows of at most 200: two rows of two."""
    rows = [pair_row(i) for i in range(4)]
    seen = forwards(monkeypatch, model)
    run(rows, model, tiny_tokenizer, tmp_path / "out", batch_size=4, padding_free=True, max_row_tokens=200)
    (shape,) = [s["shape"] for s in seen]
    assert shape[0] == 2 and shape[1] <= 200


@pytest.mark.parametrize(("block_attention", "pieces"), [(None, False), (False, False), (True, True)])
def test_block_attention_runs_only_when_asked(block_attention, pieces, model, tiny_tokenizer, tmp_path, monkeypatch):
    """Off by default; on, every forward gets the rows' pieces; the model is back on sdpa after the pass."""
    seen = forwards(monkeypatch, model)
    given = {} if block_attention is None else {"block_attention": block_attention}
    run([pair_row(0), pair_row(1)], model, tiny_tokenizer, tmp_path / "out", **given)
    assert seen and all(s["pieces"] is pieces for s in seen)
    assert model.config._attn_implementation == "sdpa"


class Unconfigured(torch.nn.Module):
    """A model whose config names no attention implementation (not a transformers config)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.config = types.SimpleNamespace()

    def forward(self, **kwargs):
        return self.inner(**kwargs)


def test_a_model_that_names_no_attention_is_scored_as_eager(model, tiny_tokenizer, tmp_path):
    """Eager attention takes the packed rows' 4D mask: padding-free rows work and give the padded values."""
    rows = [pair_row(0), pair_row(1, chosen_words=9)]
    run(rows, model, tiny_tokenizer, tmp_path / "padded")
    run(rows, Unconfigured(model), tiny_tokenizer, tmp_path / "packed", padding_free=True)
    for a, b in zip(load_ref_logprobs(tmp_path / "padded", rows), load_ref_logprobs(tmp_path / "packed", rows)):
        for column in ("ref_chosen_logps", "ref_rejected_logps"):
            assert a[column] == pytest.approx(b[column], abs=1e-5)


def test_a_rank_done_with_its_shard_answers_the_other_ranks_forwards(tiny_tokenizer, tmp_path, monkeypatch):
    """A partitioned model: after its last row, the pass runs dummy forwards while another rank still scores."""
    from align.scoring import sharded

    lockstep = sharded.LockstepModel(build_causal_lm(tiny_tokenizer))
    drained = iter([lockstep.lockstep_id, lockstep.lockstep_id, sharded._Coordinator.IDLE])

    def agree(wanted, device):  # one other rank: it takes this model's forwards twice more, then is done
        return wanted if wanted != sharded._Coordinator.IDLE else next(drained)

    monkeypatch.setattr(sharded._COORDINATOR, "_agree", agree)
    monkeypatch.setattr(sharded._COORDINATOR, "_device", lambda: torch.device("cpu"))
    run([pair_row(0), pair_row(1)], lockstep, tiny_tokenizer, tmp_path / "out", batch_size=1)
    assert (lockstep.real_forwards, lockstep.dummy_forwards) == (2, 2)


# --------------------------------------------------------------------------- the model's device


def test_every_tensor_of_a_batch_goes_to_the_device_of_the_model(tiny_tokenizer, monkeypatch):
    """The collator builds batches on the CPU; a model on a GPU must get them on its own device. A model
    whose parameters live on the meta device stands in for the GPU here: every tensor the forward is
    given must be there, none left behind on the CPU."""
    import align.logprobs as logprobs
    from align.scoring.collators import SequenceCollator

    class Elsewhere(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.empty(1, device="meta"))

    seen: list[tuple[str, str]] = []

    def logps(model, batch):
        seen.extend((name, value.device.type) for name, value in batch.items() if isinstance(value, torch.Tensor))
        return torch.zeros(4)  # two rows, two completions each

    monkeypatch.setattr(logprobs, "completion_logps", logps)
    scorer = logprobs._BatchScorer(Elsewhere(), tiny_tokenizer, SequenceCollator(pad_token_id=0), {
        "chat_format": "apertus", "max_length": 256, "enable_thinking": False, "chat_date": DATE,
        "truncated": "exclude", "over_max_length": "exclude"})
    rows = scorer([pair_row(0), pair_row(1)])
    assert [row["id"] for row in rows] == ["r0", "r1"]
    assert seen and {device for _, device in seen} == {"meta"}, seen
