"""The offline reference log-prob pass: exact values, batch/order independence, resume, shards, cache key."""

from __future__ import annotations

import copy
import functools
import json
import os
import random
import subprocess

import pytest
import torch
from ports import torchrun

from align.data.records import RecordError
from align.logprobs import (
    CACHE_KEY_FIELDS,
    cache_fields_for,
    compute_ref_logprobs,
    load_ref_logprobs,
    missing_ids,
    ref_cache_key,
)
from align.scoring import encode_record
from align.stages.logprobs import LogprobsConfig, run_pass
from align.testing.tiny import build_causal_lm, corpus_text

DATE = "2025-09-01"


def make_rows(count: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    words = corpus_text().split()

    def text(lo: int, hi: int) -> str:
        return " ".join(rng.choice(words) for _ in range(rng.randint(lo, hi)))

    return [{"id": f"r{i}", "messages": [{"role": "system", "content": "Be brief."},
                                         {"role": "user", "content": text(2, 10)}],
             "chosen": text(1, 30), "rejected": text(1, 30), "chosen_quantile": 1.0, "rejected_quantile": 0.0}
            for i in range(count)]


@pytest.fixture(scope="module")
def model(tiny_tokenizer):
    return build_causal_lm(tiny_tokenizer)


@pytest.fixture(scope="module")
def rows():
    return make_rows(12)


def compute(rows, model, tokenizer, directory, **kwargs) -> list[dict]:
    settings = {"chat_format": "apertus", "batch_size": 4, "max_length": 256, "chat_date": DATE}
    settings.update(kwargs)
    compute_ref_logprobs(rows, model, tokenizer, output_dir=directory, **settings)
    return load_ref_logprobs(directory, rows)


def naive_logps(model, tokenizer, row, name) -> float:
    """Σ log softmax over the full unbatched sequence: the definition, written the obvious way."""
    encoded = encode_record(tokenizer, row, max_length=256, chat_date=DATE)
    prompt, completion = encoded["prompt_ids"], encoded[f"{name}_ids"]
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logps = torch.log_softmax(model(ids).logits[0].double(), -1)
    return sum(logps[len(prompt) - 1 + t, tok].item() for t, tok in enumerate(completion))


def test_logps_equal_the_definition(rows, model, tiny_tokenizer, tmp_path):
    out = compute(rows, model, tiny_tokenizer, tmp_path / "out")
    for row, result in zip(rows[:4], out[:4]):
        for name in ("chosen", "rejected"):
            assert result[f"ref_{name}_logps"] == pytest.approx(naive_logps(model, tiny_tokenizer, row, name),
                                                                abs=1e-4)
            expected_length = len(encode_record(tiny_tokenizer, row, max_length=256, chat_date=DATE)[f"{name}_ids"])
            assert result[f"{name}_length"] == expected_length
    assert out[0]["messages"] == rows[0]["messages"]  # the input row is carried through


def test_results_do_not_depend_on_batch_size_order_or_layout(rows, model, tiny_tokenizer, tmp_path):
    reference = compute(rows, model, tiny_tokenizer, tmp_path / "b1", batch_size=1)
    variants = {
        "b5_reversed": compute(rows[::-1], model, tiny_tokenizer, tmp_path / "b5", batch_size=5),
        "b12_padding_free": compute(rows, model, tiny_tokenizer, tmp_path / "pf", batch_size=12, padding_free=True),
        "b7_rows_of_64": compute(rows, model, tiny_tokenizer, tmp_path / "r64", batch_size=7, padding_free=True,
                                 max_row_tokens=64),
    }
    expected = {r["id"]: r for r in reference}
    for name, out in variants.items():
        for row in out:
            for column in ("ref_chosen_logps", "ref_rejected_logps"):
                assert abs(row[column] - expected[row["id"]][column]) <= 1e-5, (name, row["id"], column)
            assert row["chosen_length"] == expected[row["id"]]["chosen_length"]


def test_resume_after_interruption_equals_an_uninterrupted_run(rows, model, tiny_tokenizer, tmp_path):
    uninterrupted = compute(rows, model, tiny_tokenizer, tmp_path / "full")
    flaky = copy.deepcopy(model)
    calls = {"n": 0}
    forward = flaky.forward

    @functools.wraps(forward)
    def failing_forward(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("killed")
        return forward(*args, **kwargs)

    flaky.forward = failing_forward
    with pytest.raises(KeyboardInterrupt):
        compute_ref_logprobs(rows, flaky, tiny_tokenizer, chat_format="apertus", batch_size=4, max_length=256,
                             chat_date=DATE, output_dir=tmp_path / "resumed", model_fingerprint="m")
    assert len(missing_ids(tmp_path / "resumed", rows)) == 4  # two batches of 4 were written
    result = compute_ref_logprobs(rows, flaky, tiny_tokenizer, chat_format="apertus", batch_size=4, max_length=256,
                                  chat_date=DATE, output_dir=tmp_path / "resumed", model_fingerprint="m")
    assert (result.num_already_done, result.num_processed) == (8, 4)
    resumed = load_ref_logprobs(tmp_path / "resumed", rows)
    for a, b in zip(uninterrupted, resumed):
        assert a["id"] == b["id"]
        assert a["ref_chosen_logps"] == pytest.approx(b["ref_chosen_logps"], abs=1e-5)
        assert a["ref_rejected_logps"] == pytest.approx(b["ref_rejected_logps"], abs=1e-5)


def test_shards_merge_and_missing_ids_are_listed(rows, model, tiny_tokenizer, tmp_path):
    single = compute(rows, model, tiny_tokenizer, tmp_path / "single")
    out = tmp_path / "sharded"
    kwargs = {"chat_format": "apertus", "batch_size": 4, "max_length": 256, "chat_date": DATE, "output_dir": out, "num_shards": 2}
    compute_ref_logprobs(rows, model, tiny_tokenizer, shard_index=0, **kwargs)
    missing = missing_ids(out, rows)
    assert 0 < len(missing) < len(rows)
    with pytest.raises(ValueError, match=rf"incomplete: {len(missing)} of {len(rows)} rows missing.*{missing[0]}"):
        load_ref_logprobs(out, rows)
    compute_ref_logprobs(rows, model, tiny_tokenizer, shard_index=1, **kwargs)
    merged = load_ref_logprobs(out, rows)
    assert [r["id"] for r in merged] == [r["id"] for r in rows]
    for a, b in zip(single, merged):
        assert a["ref_chosen_logps"] == pytest.approx(b["ref_chosen_logps"], abs=1e-5)


def test_single_completion_rows_and_truncation(model, tiny_tokenizer, tmp_path):
    row = {"id": "s0", "messages": [{"role": "user", "content": "hi"}], "completion": " ".join(["word"] * 40)}
    prompt = encode_record(tiny_tokenizer, row, max_length=None, chat_date=DATE)["prompt_ids"]
    out = compute([row], model, tiny_tokenizer, tmp_path / "s", max_length=len(prompt) + 5, over_max_length="cut")
    assert out[0]["completion_length"] == 5
    assert out[0]["ref_completion_logps"] < 0


def test_a_bad_row_is_named(model, tiny_tokenizer, tmp_path):
    bad = make_rows(3)
    del bad[2]["rejected"]
    with pytest.raises(RecordError, match=r"record 'r2': field 'rejected'"):
        compute(bad, model, tiny_tokenizer, tmp_path / "bad")


# --------------------------------------------------------------------------- cache key


def test_cache_key_changes_with_exactly_the_fields_that_change_logps(rows, model, tiny_tokenizer):
    fields = cache_fields_for(rows, model, tiny_tokenizer, chat_format="apertus", max_length=256, chat_date=DATE)
    assert set(fields) == set(CACHE_KEY_FIELDS)
    key = ref_cache_key(fields)
    changed = {"model": "other/model", "model_fingerprint": "x", "tokenizer_fingerprint": "y",
               "chat_format": "chatml", "enable_thinking": True, "chat_date": "2025-09-02", "max_length": 512,
               "over_max_length": "cut", "dtype": "bfloat16", "dataset_fingerprint": "z"}
    assert set(changed) == set(CACHE_KEY_FIELDS)
    for name, value in changed.items():
        assert ref_cache_key({**fields, name: value}) != key, name


def test_cache_key_follows_weights_and_data_content_not_row_order(rows, model, tiny_tokenizer):
    def key(records, m):
        return ref_cache_key(cache_fields_for(records, m, tiny_tokenizer, chat_format="apertus", max_length=256,
                                              chat_date=DATE))

    base = key(rows, model)
    assert key(rows[::-1], model) == base
    edited = copy.deepcopy(rows)
    edited[3]["chosen"] += " more"
    assert key(edited, model) != base
    moved = copy.deepcopy(model)
    with torch.no_grad():
        moved.model.norm.weight[0] += 1e-3
    assert key(rows, moved) != base


def test_ref_cache_key_ignores_beta_batch_size_and_sharding(rows, model, tiny_tokenizer, tmp_path):
    with pytest.raises(ValueError, match=r"not part of the key \['beta'\]"):
        ref_cache_key({**cache_fields_for(rows, model, tiny_tokenizer, chat_format="apertus", max_length=256), "beta": 5})
    common = {"chat_format": "apertus", "max_length": 256, "chat_date": DATE}
    a = compute_ref_logprobs(rows, model, tiny_tokenizer, batch_size=3, output_dir=tmp_path / "a", **common)
    b = compute_ref_logprobs(rows, model, tiny_tokenizer, batch_size=6, output_dir=tmp_path / "b", num_shards=2,
                             padding_free=True, **common)
    assert a.cache_key == b.cache_key
    stored = json.loads((tmp_path / "a" / "_job.json").read_text())
    assert stored["cache_key"] == a.cache_key and stored["max_length"] == 256


def test_resuming_with_other_settings_is_refused(rows, model, tiny_tokenizer, tmp_path):
    compute(rows[:2], model, tiny_tokenizer, tmp_path / "o")
    with pytest.raises(ValueError, match="other settings.*max_length"):
        compute(rows[:2], model, tiny_tokenizer, tmp_path / "o", max_length=200)


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_run_reuses_a_finished_output_by_its_cache_key(tiny_dirs, tmp_path, monkeypatch):
    rows = make_rows(4)
    data = write_jsonl(tmp_path / "pairs.jsonl", rows)
    config = LogprobsConfig(model_name_or_path=str(tiny_dirs["policy"]), input=data, cache_dir=str(tmp_path / "c"),
                            max_length=256, chat_date=DATE, batch_size=2)
    first = run_pass(config)
    assert first.parent == tmp_path / "c" and first.name.startswith("ref_logps-")
    assert len(load_ref_logprobs(first, rows)) == 4
    # a real second pass with another max_length: its own key, hence its own directory
    other_config = LogprobsConfig(**{**config.__dict__, "max_length": 128})
    other = run_pass(other_config)
    assert other.parent == first.parent and other != first
    keys = {d: json.loads((d / "_job.json").read_text())["cache_key"] for d in (first, other)}
    assert keys[first] != keys[other]
    for directory, key in keys.items():
        assert directory.name == f"ref_logps-{key[:16]}"  # the directory is named by the key it holds
    assert [json.loads((d / "_job.json").read_text())["max_length"] for d in (first, other)] == [256, 128]
    assert len(load_ref_logprobs(other, rows)) == 4
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == sorted([first.name, other.name])

    import transformers

    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded although the output is complete")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_loading)
    assert run_pass(config) == first
    assert run_pass(other_config) == other


# --------------------------------------------------------------------------- the key's fields, traced from the call

# Each setting of the pass that is part of the key, with a value other than the base call's.
# Every one of them changes what is scored (checked below), so an output under the same key
# would be wrong to reuse.
KEY_SETTINGS = {"chat_date": "2025-09-02", "enable_thinking": True, "max_length": 96, "dtype": "bfloat16",
                "chat_format": "chatml"}


def dated_rows(count: int) -> list[dict]:
    """Rows without a system message: the Apertus default system text, with the date, is rendered."""
    rows = make_rows(count, seed=3)
    for row in rows:
        row["messages"] = row["messages"][1:]
    return rows


@pytest.fixture(scope="module")
def two_format_policy(tmp_path_factory):
    """A saved tiny policy whose tokenizer holds the Apertus and the ChatML tokens, so one
    checkpoint runs in either format and the chat format is the only thing that differs."""
    from align.chat import install_format
    from align.testing.tiny import build_tokenizer

    tokenizer = build_tokenizer()
    model = build_causal_lm(tokenizer)
    install_format(tokenizer, model, "chatml")
    path = tmp_path_factory.mktemp("two_format_policy")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _stored(directory) -> dict:
    return json.loads((directory / "_job.json").read_text())


def test_each_key_setting_given_to_run_pass_reaches_the_key_and_the_directory(two_format_policy, tmp_path,
                                                                                monkeypatch):
    rows = dated_rows(4)
    data = write_jsonl(tmp_path / "pairs.jsonl", rows)
    base = LogprobsConfig(model_name_or_path=str(two_format_policy), input=data, cache_dir=str(tmp_path / "c"),
                          chat_format="apertus", max_length=256, enable_thinking=False, chat_date=DATE,
                          dtype="float32", batch_size=2)
    base_dir = run_pass(base)
    base_rows = load_ref_logprobs(base_dir, rows)
    directories = {"base": base_dir}
    for name, value in KEY_SETTINGS.items():
        # a shorter max_length changes the scores of rows it cuts (the default leaves them unscored)
        cut = {"over_max_length": "cut"} if name == "max_length" else {}
        directory = run_pass(LogprobsConfig(**{**base.__dict__, name: value, **cut}))
        stored = _stored(directory)
        assert stored.get(name) == value, f"{name}={value!r} given to run_pass, {stored.get(name)!r} in the key"
        assert stored["cache_key"] != _stored(base_dir)["cache_key"], name
        assert directory.parent == base_dir.parent and directory.name == f"ref_logps-{stored['cache_key'][:16]}"
        assert directory not in directories.values(), f"{name}: reused {directory}"
        directories[name] = directory
        # the setting really changes what was scored: a shared key would hand back wrong numbers
        scored = load_ref_logprobs(directory, rows)
        assert any(a["ref_chosen_logps"] != b["ref_chosen_logps"] for a, b in zip(scored, base_rows)), name

    import transformers

    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded although an output for the same key is complete")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_loading)
    # batch size and layout are not part of the key: the base output is reused
    assert run_pass(LogprobsConfig(**{**base.__dict__, "batch_size": 3, "padding_free": True})) == base_dir
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == sorted(d.name for d in directories.values())


def test_each_key_setting_given_to_the_pass_reaches_its_key(two_format_policy, rows, tmp_path):
    """compute_ref_logprobs and cache_fields_for: what the call is given is what is keyed (the
    weights fingerprint pinned, so a bfloat16 copy differs from the float32 model only in dtype)."""
    from transformers import AutoTokenizer

    rows = dated_rows(4)
    tokenizer = AutoTokenizer.from_pretrained(two_format_policy)
    model = build_causal_lm_from(two_format_policy)
    settings = {"chat_format": "apertus", "max_length": 256, "enable_thinking": False, "chat_date": DATE}

    def run(name, model=model, batch_size=2, **changes):
        call = {**settings, **changes}
        result = compute_ref_logprobs(rows, model, tokenizer, batch_size=batch_size, model_fingerprint="pinned",
                                      output_dir=tmp_path / name, **call)
        fields = cache_fields_for(rows, model, tokenizer, model_fingerprint="pinned", **call)
        assert ref_cache_key(fields) == result.cache_key, f"{name}: the two entry points key differently"
        assert _stored(tmp_path / name)["cache_key"] == result.cache_key
        return result

    base = run("base")
    assert base.cache_fields["dtype"] == "float32"
    for name, value in KEY_SETTINGS.items():
        if name == "dtype":
            result = run(name, model=copy.deepcopy(model).to(torch.bfloat16))
        else:
            result = run(name, **{name: value})
        assert result.cache_fields.get(name) == value, f"{name}={value!r} given, {result.cache_fields.get(name)!r} keyed"
        assert result.cache_key != base.cache_key, name
    assert run("batch_size", batch_size=3).cache_key == base.cache_key


@pytest.mark.distributed
def test_two_processes_take_one_shard_each_and_check_the_merge(tiny_dirs, tmp_path):
    rows = make_rows(8)
    data = write_jsonl(tmp_path / "pairs.jsonl", rows)
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [*torchrun(2), "-m", "align", "logprobs", f"model_name_or_path={tiny_dirs['policy']}", f"input={data}", f"output_dir={out}",
               "max_length=256", f"chat_date={DATE}", "batch_size=2"]
    subprocess.run(command, check=True, env=env, cwd=tmp_path, timeout=300, capture_output=True)
    assert sorted(p.name for p in out.glob("shard-*.jsonl")) == ["shard-00000-of-00002.jsonl",
                                                                 "shard-00001-of-00002.jsonl"]
    merged = load_ref_logprobs(out, rows)
    model = build_causal_lm_from(tiny_dirs["policy"])
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_dirs["policy"])
    single = compute(rows, model, tokenizer, tmp_path / "single")
    for a, b in zip(single, merged):
        assert a["ref_chosen_logps"] == pytest.approx(b["ref_chosen_logps"], abs=1e-5)


def build_causal_lm_from(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def test_tiled_head_gives_the_models_log_probs_and_gradients(rows, tiny_tokenizer):
    """The tiled projection (no (K, V) logits held) equals the model's own head, values and gradients."""
    from align.scoring import SequenceCollator, completion_logps, tiled_head

    model = build_causal_lm(tiny_tokenizer)
    assert tiled_head(model) is model.lm_head
    encoded = [encode_record(tiny_tokenizer, row, max_length=256, chat_date=DATE) for row in rows[:6]]
    batch = SequenceCollator(tiny_tokenizer.pad_token_id, padding_free=True).collate(
        [(e["prompt_ids"], e[name]) for e in encoded for name in ("chosen_ids", "rejected_ids")])
    results = []
    for tiled in (True, False):
        model.zero_grad()
        logps = completion_logps(model, batch, tiled=tiled)
        (logps * torch.linspace(-1, 1, logps.numel(), dtype=logps.dtype)).sum().backward()
        results.append((logps.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (a, grads_a), (b, grads_b) = results
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=1e-4, atol=1e-6)


def test_tiled_head_under_mixed_precision_outputs(rows, tiny_tokenizer):
    """A bf16 model whose forward returns float32 outputs, as accelerate makes it under bf16 mixed
    precision (the preference trainer on a GPU): the tiled head casts the hidden states to its own
    dtype instead of failing on float32 x bf16, and matches the model's own head."""
    from accelerate.utils import convert_outputs_to_fp32

    from align.scoring import SequenceCollator, completion_logps

    model = build_causal_lm(tiny_tokenizer).to(torch.bfloat16)
    model.forward = convert_outputs_to_fp32(model.forward)
    encoded = [encode_record(tiny_tokenizer, row, max_length=256, chat_date=DATE) for row in rows[:4]]
    batch = SequenceCollator(tiny_tokenizer.pad_token_id, padding_free=True).collate(
        [(e["prompt_ids"], e[name]) for e in encoded for name in ("chosen_ids", "rejected_ids")])
    assert model(**{k: v for k, v in batch.items() if k in ("input_ids", "position_ids")},
                 output_hidden_states=True).hidden_states[-1].dtype == torch.float32
    tiled = completion_logps(model, batch, tiled=True)
    plain = completion_logps(model, batch, tiled=False)
    tiled.sum().backward()  # gradients flow through the cast
    assert all(p.grad is not None for p in model.lm_head.parameters())
    torch.testing.assert_close(tiled.detach(), plain.detach(), rtol=0, atol=0.05)


def test_tiles_smaller_than_the_batch_give_the_same_values(rows, model, tiny_tokenizer):
    from align.scoring import tiled_token_logps

    hidden = torch.randn(50, model.config.hidden_size, requires_grad=True)
    targets = torch.randint(0, model.config.vocab_size, (50,))
    whole = tiled_token_logps(hidden, model.lm_head, targets)
    tiles = tiled_token_logps(hidden, model.lm_head, targets, tile_bytes=7 * 4 * model.config.vocab_size)
    torch.testing.assert_close(whole, tiles)
    (grad_whole,) = torch.autograd.grad(whole.sum(), hidden)
    (grad_tiles,) = torch.autograd.grad(tiles.sum(), hidden)
    torch.testing.assert_close(grad_whole, grad_tiles)


# --------------------------------------------------------------------------- truncated completions


def cut_row() -> dict:
    row = make_rows(1, seed=3)[0]
    return {**row, "id": "cut", "chosen_finish_reason": "length", "rejected_finish_reason": "stop"}


def test_truncated_completion_is_encoded_without_the_end_of_turn_token(tiny_tokenizer):
    row = cut_row()
    whole = encode_record(tiny_tokenizer, {**row, "chosen_finish_reason": "stop"}, chat_date=DATE)
    cut = encode_record(tiny_tokenizer, row, chat_date=DATE, truncated="train_without_end")
    end = tiny_tokenizer.convert_tokens_to_ids("<|assistant_end|>")
    assert whole["chosen_ids"][-1] == end and cut["chosen_ids"] == whole["chosen_ids"][:-1]
    assert cut["rejected_ids"] == whole["rejected_ids"] and cut["rejected_ids"][-1] == end
    assert cut["prompt_ids"] == whole["prompt_ids"]


def test_truncated_completion_is_refused_unless_told_to_train_it_without_end(tiny_tokenizer):
    with pytest.raises(RecordError, match=r"record 'cut': field 'chosen_finish_reason'.*train_without_end"):
        encode_record(tiny_tokenizer, cut_row(), chat_date=DATE)
    with pytest.raises(ValueError, match="truncated"):
        encode_record(tiny_tokenizer, cut_row(), chat_date=DATE, truncated="keep")
    with pytest.raises(ValueError, match="truncated"):
        LogprobsConfig(model_name_or_path="m", input="d", output_dir="o", truncated="keep")


def test_empty_truncated_completion_is_an_error_naming_the_field(tiny_tokenizer):
    row = {**cut_row(), "chosen": ""}
    with pytest.raises(RecordError, match=r"record 'cut': field 'chosen'.*empty"):
        encode_record(tiny_tokenizer, row, chat_date=DATE, truncated="train_without_end")


def test_pass_scores_truncated_completions_without_end_and_warns_once(model, tiny_tokenizer, tmp_path, caplog):
    rows = [cut_row(), *make_rows(2)]
    with caplog.at_level("WARNING", logger="align.logprobs"):
        out = compute(rows, model, tiny_tokenizer, tmp_path / "cut", truncated="train_without_end")
    warnings = [r.getMessage() for r in caplog.records if "truncated" in r.getMessage()]
    assert len(warnings) == 1 and "1 truncated completions" in warnings[0]
    whole = encode_record(tiny_tokenizer, {**rows[0], "chosen_finish_reason": "stop"}, max_length=256, chat_date=DATE)
    assert out[0]["chosen_length"] == len(whole["chosen_ids"]) - 1
    cut = encode_record(tiny_tokenizer, rows[0], max_length=256, chat_date=DATE, truncated="train_without_end")
    ids = torch.tensor([cut["prompt_ids"] + cut["chosen_ids"]])
    with torch.no_grad():
        logps = torch.log_softmax(model(ids).logits[0].double(), -1)
    expected = sum(logps[len(cut["prompt_ids"]) - 1 + t, tok].item() for t, tok in enumerate(cut["chosen_ids"]))
    assert out[0]["ref_chosen_logps"] == pytest.approx(expected, abs=1e-4)


def test_a_truncated_completion_changes_the_dataset_fingerprint_an_ended_one_does_not(rows):
    from align.logprobs import dataset_fingerprint

    stop = [{**r, "chosen_finish_reason": "stop", "rejected_finish_reason": "stop"} for r in rows]
    cut = [{**r, "chosen_finish_reason": "length"} for r in rows]
    assert dataset_fingerprint(rows) == dataset_fingerprint(stop) != dataset_fingerprint(cut)
