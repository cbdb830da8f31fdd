"""Benchmark decontamination: the paper's rule on hand-made cases, inputs, outputs, workers."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from align.config import load_config
from align.data.decontaminate import BenchmarkPrompts, decontaminate
from align.data.ngram_index import (
    NgramIndex,
    RegexTokenizer,
    build_tokenizer,
    is_contaminated,
    matched_tokens,
)
from align.data.records import RecordError
from align.stages.decontaminate import (
    BenchmarkSpec,
    DecontaminationConfig,
    decontaminate_files,
    load_benchmark,
    run,
)

REPO = Path(__file__).resolve().parents[1]


def words(start: int, stop: int, prefix: str = "w") -> list[str]:
    """Distinct one-token words w<start> … w<stop-1>."""
    return [f"{prefix}{i}" for i in range(start, stop)]


def text(tokens: list[str]) -> str:
    return " ".join(tokens)


def chat(rid: str, *user_texts: str) -> dict:
    """A record in the library schema, one assistant reply after each user turn."""
    messages = []
    for t in user_texts:
        messages += [{"role": "user", "content": t}, {"role": "assistant", "content": "ok"}]
    return {"id": rid, "messages": messages}


def run_one(train: list[dict], bench: dict[str, list[str]], **settings):
    config = DecontaminationConfig(num_workers=1, progress=False, **settings)
    return decontaminate(train, bench, config)


def removed_ids(removed: list[dict]) -> list[str]:
    return [row["id"] for row in removed]


BENCH = text(words(0, 30))  # a 30-token benchmark prompt


# ----------------------------------------------------------------------- the rule


def test_matched_tokens_drops_blocks_under_min_block():
    train = list(range(10))
    bench = [0, 1, 2, 3, 4, 99, 6, 7, 8, 9]  # blocks of 5 and 4 tokens
    assert matched_tokens(train, bench, min_block=5) == 5
    assert matched_tokens(train, bench, min_block=4) == 9


def test_exact_copy_is_removed_with_ratio_one():
    _, removed, _ = run_one(
        [chat("copy", BENCH), chat("other", text(words(100, 140)))], {"b": [BENCH]}
    )
    assert removed_ids(removed) == ["copy"]
    (match,) = removed[0]["matches"]
    assert match["overlap_ratio"] == 1.0
    assert (match["matched_tokens"], match["bench_tokens"]) == (30, 30)
    assert match["bench_text"] == BENCH and match["bench_index"] == 0


def test_copy_with_one_word_changed_is_removed():
    edited = words(0, 30)
    edited[11] = "different"
    _, removed, _ = run_one([chat("edit", text(edited))], {"b": [BENCH]})
    assert removed_ids(removed) == ["edit"]
    # blocks w0..w10 (11) and w12..w29 (18): 29 of 30 tokens
    assert removed[0]["matches"][0]["matched_tokens"] == 29


def test_copy_inside_a_longer_instruction_is_removed():
    wrapped = "Please solve the following problem carefully: " + BENCH + " Explain every step."
    _, removed, _ = run_one([chat("wrapped", wrapped)], {"b": [BENCH]})
    assert removed_ids(removed) == ["wrapped"]


def test_loose_paraphrase_sharing_an_ngram_is_kept():
    # Keeps w0..w9 verbatim (passes the 8-gram prefilter), rewrites the rest: 10/30 ≤ half.
    paraphrase = text(words(0, 10) + words(200, 215))
    tokenize = build_tokenizer("regex")
    index = NgramIndex([tokenize(BENCH)], ngram=8, min_block=5, ratio=0.5)
    assert index.candidates(tokenize(paraphrase)) == {0}  # the SequenceMatcher stage decides
    kept, removed, _ = run_one([chat("para", paraphrase)], {"b": [BENCH]})
    assert removed == [] and [r["id"] for r in kept] == ["para"]


def test_generic_pieces_under_min_block_do_not_count():
    # One 8-token block (counted) plus six 4-token pieces in order (dropped): 8 counted
    # of 40; with all pieces counted it would be 32 of 40.
    bench = text(words(0, 40))
    pieces = words(0, 8)
    for start in (10, 15, 20, 25, 30, 35):
        pieces += ["filler"] + words(start, start + 4)
    _, removed, _ = run_one([chat("generic", text(pieces))], {"b": [bench]})
    assert removed == []
    _, removed, _ = run_one([chat("generic", text(pieces))], {"b": [bench]}, min_block=4)
    assert removed[0]["matches"][0]["matched_tokens"] == 32


def test_exactly_half_is_not_more_than_half():
    # Scattered single bench words lift the multiset overlap above half, so the pair
    # reaches SequenceMatcher; only the 10- or 11-token block counts.
    bench = text(words(0, 20))
    scattered = ["x", "w19", "x", "w17", "x", "w15", "x", "w13"]
    half = text(words(0, 10) + scattered)
    over = text(words(0, 11) + scattered)
    _, removed, _ = run_one([chat("half", half), chat("over", over)], {"b": [bench]})
    assert removed_ids(removed) == ["over"]


def test_prompt_matching_two_benchmark_items_reports_both():
    gsm, mmlu = text(words(0, 20)), text(words(0, 20, prefix="q"))
    other = text(words(50, 70))
    both = gsm + " and then " + mmlu
    _, removed, summary = run_one([chat("both", both)], {"gsm": [other, gsm], "mmlu": [mmlu]})
    got = [(m["benchmark"], m["bench_index"], m["overlap_ratio"]) for m in removed[0]["matches"]]
    assert got == [("gsm", 1, 1.0), ("mmlu", 0, 1.0)]
    assert summary["benchmarks"]["gsm"]["removed_records"] == 1
    assert summary["benchmarks"]["mmlu"]["removed_records"] == 1
    assert summary["train"] == {"records": 1, "prompts_checked": 1, "kept": 0, "removed": 1}


def test_same_prompt_twice_in_a_benchmark_reports_both_items():
    _, removed, summary = run_one([chat("dup", BENCH)], {"b": [BENCH, BENCH]})
    assert [m["bench_index"] for m in removed[0]["matches"]] == [0, 1]
    assert summary["benchmarks"]["b"]["matched_items"] == 2


def test_index_agrees_with_the_unindexed_rule_on_every_candidate_pair():
    # A small vocabulary makes many pairs share grams, so the pruning bound and the
    # per-item matcher cache are exercised against the plain rule.
    rng = random.Random(7)
    vocab = list(range(3))
    bench = [rng.choices(vocab, k=rng.randint(3, 30)) for _ in range(60)]
    train = [rng.choices(vocab, k=rng.randint(5, 50)) for _ in range(150)]
    for t in train[:40]:
        source = rng.choice(bench)
        t[3:3] = source[: rng.randint(len(source) // 2, len(source))]
    index = NgramIndex(bench, ngram=8, min_block=5, ratio=0.5)
    flagged = rejected = 0
    for t in train:
        candidates = sorted(index.candidates(t))
        expect = [j for j in candidates if is_contaminated(t, bench[j], 5, 0.5)]
        assert [m.bench for m in index.match(t)] == expect
        flagged, rejected = flagged + len(expect), rejected + len(candidates) - len(expect)
    assert flagged > 100 and rejected > 50  # both outcomes occur


# ------------------------------------------------------------ short benchmark prompts


def test_benchmark_prompt_shorter_than_ngram_is_matched_by_the_same_rule():
    short = "What is 12 + 30?"  # 6 tokens: what is 12 + 30 ?
    train = [
        chat("verbatim", "Quick one. What is 12 + 30? Thanks!"),
        chat("last_token_changed", "what is 12 + 30 !"),  # block of 5 > 3: counted
        chat("middle_changed", "what is 13 + 30 ?"),  # blocks 2 + 3, both under 5
    ]
    _, removed, summary = run_one(train, {"arith": [short]})
    assert removed_ids(removed) == ["verbatim", "last_token_changed"]
    assert summary["benchmarks"]["arith"]["short_indexed"] == 1


def test_benchmark_prompt_shorter_than_min_block_never_matches():
    _, removed, summary = run_one(
        [chat("hi", "hi there friend, how are you")], {"b": ["Hi there friend"]}
    )
    assert removed == []
    assert summary["benchmarks"]["b"]["too_short"] == 1


# ------------------------------------------------------------ training data modes


def test_every_user_turn_is_checked_unless_turns_first():
    record = chat("multi", "hello, a harmless opening question", BENCH)
    _, removed, summary = run_one([record], {"b": [BENCH]})
    assert removed[0]["matches"][0]["message_index"] == 2
    assert summary["benchmarks"]["b"]["examples"][0]["train_text"] == BENCH
    _, removed, _ = run_one([record], {"b": [BENCH]}, turns="first")
    assert removed == []


def test_user_parts_content_is_read():
    record = {
        "id": "parts",
        "messages": [
            {"role": "system", "content": {"text": "be brief"}},
            {
                "role": "user",
                "content": {
                    "parts": [{"type": "image", "url": "x.png"}, {"type": "text", "text": BENCH}]
                },
            },
        ],
    }
    _, removed, _ = run_one([record], {"b": [BENCH]})
    assert removed_ids(removed) == ["parts"] and removed[0]["record"] == record


def test_raw_prompt_field_mode():
    rows = [{"prompt": BENCH}, {"prompt": "nothing to see here at all today"}]
    kept, removed, _ = run_one(rows, {"b": [BENCH]}, text_field="prompt")
    assert [r["index"] for r in removed] == [0] and removed[0]["id"] is None
    assert kept == [rows[1]]


def test_dataset_in_dataset_out():
    import datasets

    ds = datasets.Dataset.from_list(
        [{"id": "a", "prompt": BENCH}, {"id": "b", "prompt": "fresh text"}]
    )
    kept, removed, _ = run_one(ds, {"b": [BENCH]}, text_field="prompt")
    assert isinstance(kept, datasets.Dataset) and kept["id"] == ["b"]
    assert removed_ids(removed) == ["a"]


def test_regex_tokenizer_lowercases_and_splits_punctuation_and_cjk():
    assert RegexTokenizer().words("What's 2+2? 你好吗") == [
        "what",
        "'",
        "s",
        "2",
        "+",
        "2",
        "?",
        "你",
        "好",
        "吗",
    ]
    assert RegexTokenizer()("Hello WORLD") == RegexTokenizer()("hello world")


def test_hf_tokenizer_by_path(tiny_tokenizer, tmp_path):
    tiny_tokenizer.save_pretrained(tmp_path / "tok")
    bench = "The quick brown fox jumps over the lazy dog near the river bank today."
    _, removed, summary = run_one(
        [chat("copy", bench), chat("no", "Completely unrelated words.")],
        {"b": [bench]},
        tokenizer=str(tmp_path / "tok"),
    )
    assert removed_ids(removed) == ["copy"]
    assert summary["settings"]["tokenizer"] == str(tmp_path / "tok")


def split_on_spaces(s: str) -> list[str]:
    """A module-level (picklable) custom tokenizer: case-sensitive words."""
    return s.split()


def test_callable_tokenizer_in_worker_processes():
    train = [chat("copy", BENCH), chat("case", BENCH.upper())] + [
        chat(f"n{i}", f"n {i}") for i in range(7)
    ]
    config = DecontaminationConfig(
        tokenizer=split_on_spaces, num_workers=2, chunk_size=3, progress=False
    )
    _, removed, _ = decontaminate(train, {"b": [BENCH]}, config)
    assert removed_ids(removed) == ["copy"]  # case-sensitive: the upper-cased copy differs


# ------------------------------------------------------------ workers


def synthetic(seed: int, n_train: int, n_bench: int, planted: int):
    rng = random.Random(seed)
    vocab = [f"v{i}" for i in range(400)]

    def sentence(lo: int, hi: int) -> str:
        return " ".join(rng.choices(vocab, k=rng.randint(lo, hi)))

    bench = [sentence(3, 40) for _ in range(n_bench)]
    train = [chat(f"r{i}", sentence(5, 60), sentence(5, 30)) for i in range(n_train)]
    for i in rng.sample(range(n_train), planted):
        source = rng.choice(bench).split()
        source[rng.randrange(len(source))] = "edited"
        train[i]["messages"][2 * rng.randrange(2)]["content"] = " ".join(source)
    return train, {"one": bench[: n_bench // 2], "two": bench[n_bench // 2 :]}


def test_worker_processes_give_the_single_process_result():
    train, bench = synthetic(seed=3, n_train=600, n_bench=300, planted=60)
    single = decontaminate(train, bench, DecontaminationConfig(num_workers=1, progress=False))
    pooled = decontaminate(
        train, bench, DecontaminationConfig(num_workers=2, chunk_size=50, progress=False)
    )
    assert len(single[1]) >= 50  # the planted edits (and short items) really match
    assert single[0] == pooled[0] and single[1] == pooled[1]
    for summary in (single[2], pooled[2]):
        del summary["seconds"]
    assert single[2] == pooled[2]


# ------------------------------------------------------------ files, recipe


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_decontaminate_files_writes_kept_removed_and_summary(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    train = write_jsonl(
        tmp_path / "train.jsonl",
        [
            chat("a", BENCH),
            chat("b", "a fresh question about cats"),
            chat("c", "what is 12 + 30 ?"),
        ],
    )
    gsm = write_jsonl(tmp_path / "gsm.jsonl", [{"question": "What is 12 + 30?", "uid": "g-7"}])
    mmlu = str(tmp_path / "mmlu.parquet")
    pq.write_table(pa.table({"prompt": [BENCH, "unrelated benchmark text here"]}), mmlu)
    config = DecontaminationConfig(
        input=train,
        benchmarks=[
            {"name": "gsm", "path": gsm, "text_field": "question", "id_field": "uid"},
            {"name": "mmlu", "path": mmlu},
        ],
        output_dir=str(tmp_path / "out"),
        num_workers=1,
        progress=False,
    )
    summary = run(config)
    out = tmp_path / "out"
    kept = [json.loads(line) for line in (out / "kept.jsonl").read_text().splitlines()]
    removed = [json.loads(line) for line in (out / "removed.jsonl").read_text().splitlines()]
    assert [r["id"] for r in kept] == ["b"]
    assert [
        (r["id"], r["matches"][0]["benchmark"], r["matches"][0]["bench_id"]) for r in removed
    ] == [("a", "mmlu", None), ("c", "gsm", "g-7")]
    assert json.loads((out / "summary.json").read_text()) == json.loads(json.dumps(summary))
    assert summary["benchmarks"]["gsm"]["examples"][0]["train_id"] == "c"
    assert summary["benchmarks"]["mmlu"]["prompts"] == 2
    assert summary["train"]["source"] == train


def test_benchmark_from_a_load_dataset_source(tmp_path):
    (tmp_path / "bench").mkdir()
    write_jsonl(tmp_path / "bench" / "test.jsonl", [{"problem": BENCH}])
    loaded = load_benchmark(
        BenchmarkSpec(name="b", path=str(tmp_path / "bench"), split="test", text_field="problem")
    )
    assert loaded.texts == [BENCH]


def test_sample_recipe_loads():
    config = load_config(DecontaminationConfig, REPO / "recipes" / "decontaminate.yaml")
    assert (config.ngram, config.min_block, config.ratio) == (8, 5, 0.5)
    assert config.benchmarks and all(isinstance(b, BenchmarkSpec) for b in config.benchmarks)


# ------------------------------------------------------------ bad input


def test_empty_benchmark_names_the_file(tmp_path):
    path = write_jsonl(tmp_path / "empty.jsonl", [])
    with pytest.raises(ValueError, match=r"empty\.jsonl.*'ifeval' is empty"):
        load_benchmark(BenchmarkSpec(name="ifeval", path=path))


def test_missing_text_field_names_file_row_and_field(tmp_path):
    path = write_jsonl(tmp_path / "b.jsonl", [{"prompt": "ok"}, {"question": "no prompt here"}])
    with pytest.raises(RecordError, match=r"b\.jsonl row 1.*field 'prompt'.*missing"):
        load_benchmark(BenchmarkSpec(name="b", path=path))


def test_missing_parquet_column_names_file_and_field(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = str(tmp_path / "b.parquet")
    pq.write_table(pa.table({"question": ["x"]}), path)
    with pytest.raises(ValueError, match=r"b\.parquet row 0.*field 'prompt'"):
        load_benchmark(BenchmarkSpec(name="b", path=path))


def test_non_string_text_names_file_row_and_field(tmp_path):
    path = write_jsonl(tmp_path / "b.jsonl", [{"prompt": "ok"}, {"prompt": 42}])
    with pytest.raises(
        ValueError, match=r"b\.jsonl row 1.*field 'prompt'.*expected a string, got int"
    ):
        load_benchmark(BenchmarkSpec(name="b", path=path))


def test_bad_training_record_names_file_row_and_field(tmp_path):
    bad = {
        "id": "x",
        "messages": [{"role": "user", "content": {"parts": [{"type": "text", "text": 3}]}}],
    }
    path = write_jsonl(tmp_path / "train.jsonl", [chat("fine", "hello"), bad])
    bench = write_jsonl(tmp_path / "b.jsonl", [{"prompt": BENCH}])
    config = DecontaminationConfig(
        input=path,
        benchmarks=[{"name": "b", "path": bench}],
        output_dir=str(tmp_path / "out"),
        num_workers=1,
        progress=False,
    )
    with pytest.raises(
        ValueError, match=r"train\.jsonl row 1 \(id 'x'\).*messages\[0\]\.content\.parts\[0\]\.text"
    ):
        decontaminate_files(config)


def test_training_record_without_id_is_rejected_in_messages_mode():
    with pytest.raises(RecordError, match=r"row 0.*field 'id'"):
        run_one([{"messages": [{"role": "user", "content": BENCH}]}], {"b": [BENCH]})


def test_in_memory_benchmark_with_non_string_prompt_is_rejected():
    with pytest.raises(RecordError, match=r"row 1.*expected a string, got NoneType"):
        BenchmarkPrompts("b", ["fine", None])


def test_invalid_jsonl_line_names_file_and_line(tmp_path):
    path = tmp_path / "b.jsonl"
    path.write_text('{"prompt": "ok"}\n{"prompt": \n')
    with pytest.raises(ValueError, match=r"b\.jsonl: line 2: not valid JSON"):
        load_benchmark(BenchmarkSpec(name="b", path=str(path)))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"ratio": 1.0}, "ratio"),
        ({"ratio": 0}, "ratio"),
        ({"ngram": 0}, "ngram"),
        ({"turns": "last"}, "turns"),
        ({"num_workers": 0}, "num_workers"),
        ({"benchmarks": [{"name": "a", "path": "x"}, {"name": "a", "path": "y"}]}, "unique"),
        ({"benchmarks": [{"name": "a", "path": "x", "field": "q"}]}, r"unknown keys \['field'\]"),
    ],
)
def test_config_rejects_bad_settings(settings, message):
    with pytest.raises(ValueError, match=message):
        DecontaminationConfig(**settings)


def test_recipe_with_unknown_key_is_rejected(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("input: t.jsonl\nngrams: 8\n")
    with pytest.raises(ValueError, match=r"unknown key 'ngrams'"):
        load_config(DecontaminationConfig, path)


def test_file_run_needs_paths():
    with pytest.raises(ValueError, match="input, output_dir must be set"):
        decontaminate_files(DecontaminationConfig())
