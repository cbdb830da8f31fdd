"""The rules of SFT data (``align.trainers.sft_data``) that the end-to-end SFT tests leave open.

A mutation check on the module found changes no fast test noticed: a label kept off the loss
mask, a row named by the wrong id in its error, a setting (format, date, thinking, tools,
max_length) not passed on, the truncation boundary moved by one, the hygiene counts lost, a
JSON column written as a list, an id left an int, a rows file named or read back wrongly, a
skipped row without its reason, the input read whole instead of streamed. Each test here
states one such rule as a user sees it: an error naming the row and the field, the ids and
labels of a conversation, the rows kept, the counts, the file written.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datasets import Dataset

from align.chat import install_format
from align.errors import ConfigError, InputError, MissingInputError, RecordError
from align.trainers.sft_data import (
    IGNORE_INDEX,
    NormalizedRows,
    clean_sft_dataset,
    encode_sft_row,
    iter_input_rows,
    labels_from_mask,
    load_sft_dataset,
    normalize_sft_input,
    prepare_sft_dataset,
    sft_json_rows,
    sft_rows_file,
    tokenize_sft_dataset,
    truncate_sft_dataset,
)

DATE = "2025-03-04"
X = IGNORE_INDEX
HI = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]
TOOL = {"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}
# "hi" / "ok" in ChatML with the tiny tokenizer: 20 tokens; "o", "k", "<|im_end|>" (16-18) are
# the assistant's and trained, the newline after its end of turn (19) is not.
CHATML_HI = [512, 480, 318, 214, 87, 88, 513, 214, 512, 80, 360, 359, 99, 374, 99, 214, 94, 90, 513, 214]
CHATML_HI_LABELS = [X] * 16 + [94, 90, 513, X]


@pytest.fixture(scope="module")
def chatml(tiny_tokenizer):
    """The tiny tokenizer with the ChatML tokens only (not Apertus's)."""
    tok = copy.deepcopy(tiny_tokenizer)
    install_format(tok, chat_format="chatml")
    return tok


@pytest.fixture(scope="module")
def apertus(tiny_tokenizer):
    """The tiny tokenizer with the Apertus tokens only (the default format)."""
    tok = copy.deepcopy(tiny_tokenizer)
    install_format(tok)
    return tok


@contextlib.contextmanager
def refused(record_id: str, field: str):
    """A `RecordError` naming this row and this field."""
    with pytest.raises(RecordError) as err:
        yield err
    assert (err.value.record_id, err.value.field) == (record_id, field), err.value


def chat(user: str = "hi", answer: str = "ok") -> list[dict]:
    return [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]


def trained_text(tokenizer, out: dict) -> str:
    """The text of the tokens that carry a label."""
    return tokenizer.decode([t for t, label in zip(out["input_ids"], out["labels"]) if label != X])


# --- labels from the loss mask ---------------------------------------------------------------


def test_a_label_is_the_token_on_the_mask_and_ignored_off_it():
    assert labels_from_mask([5, 6, 7, 8], [0, 1, 1, 0]) == [X, 6, 7, X]


def test_ids_and_a_mask_of_different_lengths_are_an_error():
    with pytest.raises(RuntimeError):
        labels_from_mask([5, 6, 7], [0, 1])


# --- one conversation: ids and labels --------------------------------------------------------


@pytest.mark.parametrize("as_text", [False, True])
def test_a_conversation_trains_on_the_assistant_answer_and_its_end_of_turn(chatml, as_text):
    """The messages as a list or as JSON text: the same ids; labels only on "ok<|im_end|>"."""
    row = {"messages": json.dumps(HI) if as_text else HI}
    out = encode_sft_row(row, chatml, chat_format="chatml")
    assert out == {"input_ids": CHATML_HI, "labels": CHATML_HI_LABELS}
    assert chatml.convert_ids_to_tokens(CHATML_HI[16:19]) == ["o", "k", "<|im_end|>"]


def test_the_default_format_is_apertus_with_its_date(apertus):
    out = encode_sft_row({"messages": HI}, apertus, chat_date=DATE)
    text = apertus.decode(out["input_ids"])
    assert text.startswith("<s><|system_start|>") and f"Current date: {DATE}" in text
    assert trained_text(apertus, out) == "ok<|assistant_end|>"


def test_enable_thinking_turns_deliberation_on(apertus):
    text = apertus.decode(encode_sft_row({"messages": HI, "enable_thinking": True}, apertus,
                                         chat_date=DATE)["input_ids"])
    assert "Deliberation: enabled" in text


@pytest.mark.parametrize("as_text", [False, True])
def test_the_rows_tools_are_declared(apertus, as_text):
    row = {"messages": HI, "tools": json.dumps([TOOL]) if as_text else [TOOL]}
    text = apertus.decode(encode_sft_row(row, apertus, chat_date=DATE)["input_ids"])
    assert "type calculator = () => any;" in text


def test_max_length_keeps_the_first_tokens_only(chatml):
    out = encode_sft_row({"messages": HI}, chatml, chat_format="chatml", max_length=18)
    assert out == {"input_ids": CHATML_HI[:18], "labels": CHATML_HI_LABELS[:18]}


@pytest.mark.parametrize("max_length", [10, 16])
def test_a_row_whose_trained_tokens_all_lie_past_max_length_comes_back_unlabelled(chatml, max_length):
    """Cut before the answer (16 tokens: exactly up to it): no label, not an error; the truncation
    stage drops it."""
    out = encode_sft_row({"messages": HI}, chatml, chat_format="chatml", max_length=max_length)
    assert out == {"input_ids": CHATML_HI[:max_length], "labels": [X] * max_length}


def test_a_whole_conversation_with_no_trained_token_is_refused(chatml, monkeypatch):
    """A loss mask all zeros that no max_length cut explains: the row is refused, never trained on
    prompt tokens alone."""
    from align.chat.encode import EncodedChat
    from align.trainers import sft_data

    monkeypatch.setattr(sft_data, "encode", lambda *a, **k: EncodedChat([1, 2, 3], [0, 0, 0], []))
    with refused("z", "messages"):
        encode_sft_row({"id": "z", "messages": HI}, chatml, chat_format="chatml")
    with refused("z", "messages"):
        encode_sft_row({"id": "z", "messages": HI}, chatml, chat_format="chatml", max_length=4)
    cut = encode_sft_row({"messages": HI}, chatml, chat_format="chatml", max_length=3)  # 3 tokens: cut there
    assert cut["labels"] == [X] * 3


# --- one conversation: what is refused -------------------------------------------------------


@pytest.mark.parametrize("row, field", [
    ({"messages": None}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": "[not json"}, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}]}, "messages"),
    ({"messages": ["the role is user", *HI]}, "messages[0]"),
    ({"messages": [HI[0], {"content": "ok"}]}, "messages[1]"),
    ({"messages": HI, "tools": "[not json"}, "tools"),
    ({"messages": HI, "enable_thinking": "yes"}, "enable_thinking"),
    ({"messages": HI, "enable_thinking": 1}, "enable_thinking"),
])
@pytest.mark.parametrize("rid", ["r7", None])
def test_a_bad_row_is_refused_naming_its_id_else_its_index(chatml, row, field, rid):
    row = dict(row, **({"id": rid} if rid else {}))
    with refused(rid or "<row 3>", field):
        encode_sft_row(row, chatml, index=3, chat_format="chatml")


def test_a_conversation_without_an_assistant_message_is_refused_for_that(chatml):
    with pytest.raises(RecordError, match="no assistant message"):
        encode_sft_row({"messages": [{"role": "user", "content": "hi"}]}, chatml, chat_format="chatml")


def test_a_conversation_the_format_cannot_render_is_refused_naming_the_row(chatml):
    with refused("r1", "messages"):
        encode_sft_row({"id": "r1", "messages": HI[::-1]}, chatml, chat_format="chatml")


# --- a dataset of conversations -----------------------------------------------------------------


def test_tokenizing_leaves_ids_and_labels_only(chatml):
    data = Dataset.from_list([{"id": "a", "messages": json.dumps(HI), "note": "x"}])
    out = tokenize_sft_dataset(data, chatml, chat_format="chatml")
    assert out.column_names == ["input_ids", "labels"]
    assert out.to_list() == [{"input_ids": CHATML_HI, "labels": CHATML_HI_LABELS}]


def test_tokenizing_passes_on_the_format_date_and_max_length(apertus):
    data = Dataset.from_list([{"messages": json.dumps(HI)}])
    out = tokenize_sft_dataset(data, apertus, chat_date=DATE, max_length=60)
    assert len(out[0]["input_ids"]) == 60
    assert f"Current date: {DATE}" in apertus.decode(out[0]["input_ids"])


def test_tokenizing_names_a_bad_row_by_its_index(chatml):
    data = Dataset.from_list([{"messages": json.dumps(HI)}, {"messages": json.dumps(HI[:1])}])
    with refused("<row 1>", "messages"):
        tokenize_sft_dataset(data, chatml, chat_format="chatml")


def pretokenized(*labels: list[int]) -> Dataset:
    return Dataset.from_list([{"input_ids": [10 + k for k in range(len(x))], "labels": x} for x in labels])


def test_truncation_cuts_ids_and_labels_to_max_length():
    out = truncate_sft_dataset(pretokenized([X, 11, 12, 13, 14]), 3)
    assert out.to_list() == [{"input_ids": [10, 11, 12], "labels": [X, 11, 12]}]


def test_no_max_length_leaves_the_dataset_as_it_is():
    data = pretokenized([X, X, X], [X, 11])
    assert truncate_sft_dataset(data, None) is data


def test_a_row_is_kept_when_a_label_past_the_first_token_is_left():
    """The first token is never a prediction target: a row trained only there is dropped; one
    trained at the second token is kept."""
    out = truncate_sft_dataset(pretokenized([X, 11, X, X], [10, X, X, X], [X, X, X, 13], [X, X, X, X]), 3)
    assert out["labels"] == [[X, 11, X]]


def test_truncation_drops_are_logged_and_nothing_else(caplog):
    with caplog.at_level("WARNING", logger="align.trainers.sft_data"):
        truncate_sft_dataset(pretokenized([X, 11]), 2)
    assert caplog.text == ""
    with caplog.at_level("WARNING", logger="align.trainers.sft_data"):
        truncate_sft_dataset(pretokenized([X, 11], [X, X, 12]), 2)
    assert "dropped 1 of 2 rows" in caplog.text


@pytest.mark.parametrize("max_length", [1, 0, -3])
def test_max_length_under_two_is_refused(max_length):
    with pytest.raises(ConfigError, match="max_length"):
        truncate_sft_dataset(pretokenized([X, 11]), max_length)


def test_max_length_two_holds_one_prediction_target(chatml):
    out = truncate_sft_dataset(pretokenized([X, 11, 12]), 2)
    assert out.to_list() == [{"input_ids": [10, 11], "labels": [X, 11]}]
    data = Dataset.from_list([{"messages": json.dumps(HI)}])
    assert len(prepare_sft_dataset(data, chatml, chat_format="chatml", max_length=2)) == 0


# --- hygiene: identity filter and \boxed{} ---------------------------------------------------


def rows_of(*answers: str, ids: bool = True, as_text: bool = True) -> Dataset:
    rows = [dict(**({"id": f"r{i}"} if ids else {}),
                 messages=json.dumps(chat(answer=a)) if as_text else chat(answer=a)) for i, a in enumerate(answers)]
    return Dataset.from_list(rows)


def answers(data: Dataset) -> list[str]:
    return [(json.loads(m) if isinstance(m, str) else m)[1]["content"] for m in data["messages"]]


def test_no_hygiene_leaves_the_dataset_untouched():
    """Off by default; a pre-tokenized dataset (no messages) passes too."""
    data = rows_of("I am ChatGPT", "\\boxed{4}")
    assert clean_sft_dataset(data) is data
    tokens = pretokenized([X, 11])
    assert clean_sft_dataset(tokens, summary={}) is tokens


@pytest.mark.parametrize("setting", ["strip_boxed", "identity_filter"])
def test_hygiene_needs_conversation_rows(setting):
    with pytest.raises(InputError):
        clean_sft_dataset(pretokenized([X, 11]), **{setting: True})


def test_the_identity_filter_drops_and_counts_rows_naming_another_model(caplog):
    """Dropped rows are counted, and logged with the reason of the first three."""
    summary = {}
    with caplog.at_level("WARNING", logger="align.trainers.sft_data"):
        out = clean_sft_dataset(rows_of("I am ChatGPT", "fine", "Claude here", "Gemini", "ok", "Qwen"),
                                identity_filter=True, summary=summary)
    assert out["id"] == ["r1", "r4"] and summary == {"identity_dropped": 4}
    reason = "messages[1].content names another model or its maker"
    assert (f"dropped 4 of 6 rows, e.g. row 0: {reason}: 'ChatGPT'; row 2: {reason}: 'Claude'; "
            f"row 3: {reason}: 'Gemini'\n") in caplog.text


def test_the_identity_filter_uses_the_keywords_given():
    summary = {}
    out = clean_sft_dataset(rows_of("I am Zorblax", "I am ChatGPT"), identity_filter=True,
                            identity_keywords=["Zorblax"], summary=summary)
    assert out["id"] == ["r1"] and summary == {"identity_dropped": 1}


def test_a_summary_is_not_needed():
    out = clean_sft_dataset(rows_of("I am ChatGPT", "\\boxed{4}"), identity_filter=True, strip_boxed=True)
    assert answers(out) == ["4"]


@pytest.mark.parametrize("as_text", [True, False])
def test_boxed_answers_are_stripped_and_counted_keeping_the_rows_form(as_text):
    """JSON text stays JSON text and a list a list; only rows that changed are counted."""
    summary = {}
    out = clean_sft_dataset(rows_of("\\boxed{4}", "plain", "also plain", as_text=as_text), strip_boxed=True,
                            summary=summary)
    assert answers(out) == ["4", "plain", "also plain"] and summary == {"boxed_stripped": 1}
    assert isinstance(out[0]["messages"], str) is as_text
    assert out.column_names == ["id", "messages"]


def test_a_row_without_messages_passes_boxed_stripping_for_the_tokenizer_to_refuse():
    summary = {}
    data = Dataset.from_list([{"messages": ""}, {"messages": json.dumps(chat(answer="\\boxed{4}"))}])
    out = clean_sft_dataset(data, strip_boxed=True, summary=summary)
    assert out.column_names == ["messages"] and out[0]["messages"] == "" and answers(out.select([1])) == ["4"]
    assert summary == {"boxed_stripped": 1}


@pytest.mark.parametrize("messages", ["[not json", json.dumps(chat(answer="\\boxed{4"))])
@pytest.mark.parametrize("ids", [True, False])
def test_boxed_stripping_names_a_bad_row(messages, ids):
    field = "messages" if messages == "[not json" else "messages[1].content"
    data = Dataset.from_list([{**({"id": "r0"} if ids else {}), "messages": json.dumps(HI)},
                              {**({"id": "bad"} if ids else {}), "messages": messages}])
    with refused("bad" if ids else "<row 1>", field):
        clean_sft_dataset(data, strip_boxed=True)


# --- prepare: clean, tokenize, truncate ------------------------------------------------------


def test_prepare_tokenizes_conversations_with_the_default_format(apertus):
    out = prepare_sft_dataset(rows_of("ok"), apertus, chat_date=DATE)
    assert out.column_names == ["input_ids", "labels"] and len(out) == 1
    assert f"Current date: {DATE}" in apertus.decode(out[0]["input_ids"])


def test_prepare_passes_on_the_format(chatml):
    out = prepare_sft_dataset(rows_of("ok"), chatml, chat_format="chatml")
    assert out.to_list() == [{"input_ids": CHATML_HI, "labels": CHATML_HI_LABELS}]


def test_prepare_truncates_and_drops_rows_left_untrained(chatml):
    data = Dataset.from_list([{"messages": json.dumps(HI)}, {"messages": json.dumps(chat(user="a much longer "
                                                                                              "question"))}])
    out = prepare_sft_dataset(data, chatml, chat_format="chatml", max_length=18)
    assert out.to_list() == [{"input_ids": CHATML_HI[:18], "labels": CHATML_HI_LABELS[:18]}]


def test_prepare_tokenizes_only_a_prefix_of_a_long_row(chatml, monkeypatch):
    """With max_length a long conversation is tokenized only as far as it needs (align.chat.encode)."""
    encode_module = importlib.import_module("align.chat.encode")  # `align.chat.encode` the name is the function
    lengths = []
    real = encode_module.tokenize
    monkeypatch.setattr(encode_module, "tokenize", lambda tok, text: lengths.append(len(text)) or real(tok, text))
    data = Dataset.from_list([{"messages": json.dumps(chat(answer="lorem ipsum " * 5000))}])
    out = prepare_sft_dataset(data, chatml, chat_format="chatml", max_length=32)
    assert len(out[0]["input_ids"]) == 32 and max(lengths) < 4 * 32 * 8


def test_prepare_applies_the_hygiene_and_fills_the_summary(chatml):
    summary = {}
    out = prepare_sft_dataset(rows_of("I am Zorblax", "\\boxed{ok}", "I am ChatGPT"), chatml, chat_format="chatml",
                              strip_boxed=True, identity_filter=True, identity_keywords=["Zorblax"], summary=summary)
    assert summary == {"identity_dropped": 1, "boxed_stripped": 1}
    assert len(out) == 2 and trained_text(chatml, out[0]) == "ok<|im_end|>"


def test_prepare_refuses_a_dataset_the_identity_filter_emptied(chatml):
    with pytest.raises(InputError):
        prepare_sft_dataset(rows_of("I am ChatGPT"), chatml, chat_format="chatml", identity_filter=True)


def test_prepare_refuses_a_bad_max_length_before_tokenizing_any_row(chatml):
    data = Dataset.from_list([{"messages": json.dumps(HI[:1])}])
    with pytest.raises(ConfigError, match="max_length"):
        prepare_sft_dataset(data, chatml, chat_format="chatml", max_length=1)


def test_prepare_takes_pretokenized_rows_as_they_are_then_truncates():
    data = Dataset.from_list([{"id": "a", "input_ids": [1, 2, 3], "labels": [X, 2, 3]}])
    assert prepare_sft_dataset(data, None).to_list() == [{"input_ids": [1, 2, 3], "labels": [X, 2, 3]}]
    assert prepare_sft_dataset(data, None, max_length=2).to_list() == [{"input_ids": [1, 2], "labels": [X, 2]}]
    with pytest.raises(ConfigError, match="max_length"):
        prepare_sft_dataset(data, None, max_length=1)


@pytest.mark.parametrize("setting", ["strip_boxed", "identity_filter"])
def test_prepare_refuses_hygiene_on_pretokenized_rows(setting):
    with pytest.raises(ConfigError):
        prepare_sft_dataset(pretokenized([X, 11]), None, **{setting: True})


def test_prepare_refuses_input_ids_without_labels():
    with pytest.raises(InputError):
        prepare_sft_dataset(Dataset.from_list([{"input_ids": [1, 2]}]), None)


def test_prepare_refuses_rows_with_neither_messages_nor_input_ids():
    with pytest.raises(InputError):
        prepare_sft_dataset(Dataset.from_list([{"text": "hi"}]), None)


# --- conversation rows as JSON text ----------------------------------------------------------


def test_json_rows_encode_messages_and_tools_and_leave_the_rest():
    rows = [{"id": 7, "messages": HI, "tools": [TOOL], "enable_thinking": True, "other": 1},
            {"messages": json.dumps(HI), "tools": None, "enable_thinking": False, "id": None}]
    assert sft_json_rows(rows) == [
        {"id": "7", "messages": json.dumps(HI), "tools": json.dumps([TOOL]), "enable_thinking": True},
        {"id": None, "messages": json.dumps(HI), "tools": None, "enable_thinking": False},
    ]


def test_json_rows_keep_text_as_written():
    """Non-ASCII text stays as it is in the JSON text, not \\u-escaped."""
    (row,) = sft_json_rows([{"messages": chat(answer="café 東京")}])
    assert "café 東京" in row["messages"]


def test_rows_file_is_named_by_content_and_made_once(tmp_path):
    cache = tmp_path / "a" / "b"
    rows = [{"id": 1, "messages": chat(answer="café")}, {"messages": HI, "tools": [TOOL]}]
    path = sft_rows_file(rows, cache)
    assert path.parent == cache and path.name.startswith("sft-rows-") and path.suffix == ".jsonl"
    text = path.read_text(encoding="utf-8")
    assert "café" in text
    assert [json.loads(line) for line in text.splitlines()] == sft_json_rows(rows)
    assert sft_rows_file(rows, cache) == path  # found again
    assert sorted(p.name for p in cache.iterdir()) == [path.name]  # no temporary file left
    other = sft_rows_file(rows[:1], cache)
    assert other != path and sorted(p.name for p in cache.iterdir()) == sorted([path.name, other.name])


def test_rows_file_is_written_to_a_hidden_temporary_file_in_cache_dir(tmp_path):
    seen = []

    def rows():
        yield {"messages": HI}
        seen.extend(p.name for p in tmp_path.iterdir())
        yield {"messages": HI}

    sft_rows_file(rows(), tmp_path)
    assert len(seen) == 1 and seen[0].startswith(".sft-rows-") and seen[0].endswith(".tmp")


def test_rows_file_left_half_written_is_removed_and_the_error_raised(tmp_path):
    def rows():
        yield {"messages": HI}
        raise ValueError("reading the rows failed")

    with pytest.raises(ValueError, match="reading the rows failed"):
        sft_rows_file(rows(), tmp_path)
    assert list(tmp_path.iterdir()) == []


# --- loading --------------------------------------------------------------------------------


def test_a_dataset_is_taken_as_it_is():
    data = pretokenized([X, 11])
    assert load_sft_dataset(data) is data


def test_conversation_rows_become_json_text_in_memory():
    data = load_sft_dataset([{"id": "a", "messages": HI}])
    assert data.to_list() == [{"id": "a", "messages": json.dumps(HI)}] and data.cache_files == []


def test_pretokenized_rows_are_kept_as_they_are():
    data = load_sft_dataset([{"input_ids": [1, 2], "labels": [X, 2], "extra": "x"}])
    assert data.to_list() == [{"input_ids": [1, 2], "labels": [X, 2], "extra": "x"}]


def test_with_cache_dir_the_rows_are_file_backed_under_the_main_process_first(tmp_path):
    entered = []

    @contextlib.contextmanager
    def main_first():
        entered.append(True)
        yield

    data = load_sft_dataset([{"id": "a", "messages": HI}], cache_dir=tmp_path, main_process_first=main_first())
    assert entered == [True] and isinstance(data, Dataset)
    assert data.to_list() == [{"id": "a", "messages": json.dumps(HI)}]
    (made,) = tmp_path.iterdir()
    assert made.name.startswith("sft-rows-") and data.cache_files != []
    assert json.loads(made.read_text()) == {"id": "a", "messages": json.dumps(HI)}
    assert load_sft_dataset([{"messages": HI}], cache_dir=tmp_path / "b").to_list() == [{"messages": json.dumps(HI)}]


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet", ".PARQUET"])
@pytest.mark.parametrize("as_path", [False, True])
def test_a_file_is_loaded_as_its_kind_whether_text_or_path(tmp_path, suffix, as_path):
    rows = [{"id": "a", "messages": json.dumps(HI)}, {"id": "b", "messages": json.dumps(HI)}]
    file = tmp_path / f"rows{suffix}"
    if suffix == ".jsonl":
        file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif suffix == ".json":
        file.write_text(json.dumps(rows))
    else:
        pq.write_table(pa.Table.from_pylist(rows), file)
    data = load_sft_dataset(file if as_path else str(file))
    assert isinstance(data, Dataset) and data.to_list() == rows
    assert load_sft_dataset(file if as_path else str(file), split="train[:1]").to_list() == rows[:1]


@pytest.mark.parametrize("as_path", [False, True])
def test_a_missing_file_is_an_error_naming_the_input(tmp_path, as_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(MissingInputError, match=r"^input='[^']*nope\.jsonl'"):
        load_sft_dataset(missing if as_path else str(missing))


# --- reading an input, streamed ---------------------------------------------------------------


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def numbered(n: int, start: int = 0) -> list[dict]:
    return [{"id": f"r{start + k}", "messages": chat(user=str(start + k))} for k in range(n)]


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet"])
def test_an_input_file_gives_its_rows_with_their_index(tmp_path, suffix):
    rows = numbered(3)
    file = tmp_path / f"in{suffix}"
    if suffix == ".jsonl":
        write_jsonl(file, rows)
    elif suffix == ".json":
        file.write_text(json.dumps(rows))
    else:
        pq.write_table(pa.Table.from_pylist(rows), file)
    assert list(iter_input_rows(file)) == list(enumerate(rows))


def test_a_directory_is_read_file_by_file_counting_on(tmp_path, monkeypatch):
    """A relative directory name (no slash, no suffix) is the local directory, its files streamed
    one after the other (never read whole), the index counting on across them."""
    (tmp_path / "inputs").mkdir()
    write_jsonl(tmp_path / "inputs" / "a.jsonl", numbered(2))
    write_jsonl(tmp_path / "inputs" / "b.jsonl", numbered(1, start=2))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("datasets.load_dataset", lambda *a, **k: pytest.fail("read from the hub"))
    monkeypatch.setattr("align.io.read_records", lambda *a, **k: pytest.fail("read whole"))
    assert list(iter_input_rows("inputs")) == list(enumerate(numbered(3)))


def test_jsonl_and_parquet_inputs_are_streamed_not_read_whole(tmp_path, monkeypatch):
    """Each row comes out as it is read: never through the whole-file reader, and a bad line
    further on is met only when reached."""
    monkeypatch.setattr("align.io.read_records", lambda *a, **k: pytest.fail("read whole"))
    pq.write_table(pa.Table.from_pylist(numbered(2)), tmp_path / "a.parquet")
    assert [i for i, _ in iter_input_rows(tmp_path / "a.parquet")] == [0, 1]
    file = write_jsonl(tmp_path / "b.jsonl", numbered(2))
    with file.open("a") as handle:
        handle.write("{not json\n")
    rows = iter_input_rows(file)
    assert next(rows) == (0, numbered(1)[0])
    with pytest.raises(InputError):
        list(rows)


def test_a_missing_local_file_is_not_looked_up_on_the_hub(tmp_path, monkeypatch):
    monkeypatch.setattr("datasets.load_dataset", lambda *a, **k: pytest.fail("looked up on the hub"))
    with pytest.raises(FileNotFoundError):
        list(iter_input_rows(tmp_path / "nope.jsonl"))


def test_a_hub_name_is_loaded_by_datasets_as_its_train_split(monkeypatch):
    calls = []

    def load_dataset(name, split=None):
        calls.append((name, split))
        return Dataset.from_list(numbered(3))

    monkeypatch.setattr("datasets.load_dataset", load_dataset)
    assert list(iter_input_rows("org/sft-mixture")) == list(enumerate(numbered(3)))
    assert calls == [("org/sft-mixture", "train")]


def test_a_hub_name_that_does_not_load_is_an_error_naming_the_input(monkeypatch):
    def load_dataset(name, split=None):
        raise FileNotFoundError(name)

    monkeypatch.setattr("datasets.load_dataset", load_dataset)
    with pytest.raises(MissingInputError, match=r"^input='org/nope'"):
        list(iter_input_rows("org/nope"))


# --- normalizing an input into the rows file ------------------------------------------------------


KEY = "0123456789abcdef" * 3  # 48 characters: the file is named by the first 32


def normalize(source, cache, **kwargs) -> NormalizedRows:
    return normalize_sft_input(source, cache, chat_format="chatml", key=kwargs.pop("key", KEY), **kwargs)


def file_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_normalized_rows_are_json_encoded_counted_and_named_by_the_key(tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", [{"id": 5, "messages": chat(answer="café"), "x": 1},
                                                 {"input_ids": [1, 2], "labels": [X, 2]}])
    cache = tmp_path / "cache" / "sft"
    rows = normalize(source, cache)
    path = cache / f"sft-input-{KEY[:32]}.jsonl"
    assert rows == NormalizedRows(path, 2, 2, [])
    assert "café" in path.read_text(encoding="utf-8")
    assert file_rows(path) == [{"id": "5", "messages": json.dumps(chat(answer="café"), ensure_ascii=False)},
                               {"input_ids": [1, 2], "labels": [X, 2]}]
    assert sorted(p.name for p in cache.iterdir()) == [f"sft-input-{KEY[:32]}.json", path.name]


def test_normalizing_again_finds_the_file_made_without_reading_the_input(tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", numbered(3))
    first = normalize(source, tmp_path / "c", skip=lambda m, t: "one" if m[0]["content"] == "1" else None)
    source.unlink()
    again = normalize(source, tmp_path / "c")
    assert again == first == NormalizedRows(first.path, 3, 2, [{"row": 1, "id": "r1", "reason": "one"}])


def test_a_rows_file_without_its_record_is_made_again(tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", numbered(2))
    first = normalize(source, tmp_path / "c")
    (tmp_path / "c" / f"sft-input-{KEY[:32]}.json").unlink()
    assert normalize(source, tmp_path / "c") == first


def test_another_key_makes_another_file_in_the_same_directory(tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", numbered(1))
    one = normalize(source, tmp_path, key="a" * 40)
    two = normalize(source, tmp_path, key="b" * 40)
    assert one.path.name == f"sft-input-{'a' * 32}.jsonl" and two.path.name == f"sft-input-{'b' * 32}.jsonl"


def test_normalizing_writes_a_hidden_temporary_file_in_the_cache_dir(tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", numbered(1))
    seen = []
    normalize(source, tmp_path / "c", check=lambda rid, row, messages: seen.extend(p.name for p in
                                                                                   (tmp_path / "c").iterdir()))
    assert len(seen) == 1 and seen[0].startswith(".sft-input-") and seen[0].endswith(".tmp")


def test_skip_leaves_a_row_out_with_its_reason_and_reads_on(tmp_path):
    rows = [{"id": "a", "messages": HI}, {"messages": json.dumps(HI), "tools": json.dumps([TOOL])},
            {"id": "c", "messages": HI}]
    source = write_jsonl(tmp_path / "in.jsonl", rows)
    got = []

    def skip(messages, tools):
        got.append((messages, tools))
        return "has tools" if tools else None

    out = normalize(source, tmp_path / "c", skip=skip)
    assert got == [(HI, None), (HI, [TOOL]), (HI, None)]
    assert (out.rows, out.kept, out.skipped) == (3, 2, [{"row": 1, "id": None, "reason": "has tools"}])
    assert [r.get("id") for r in file_rows(out.path)] == ["a", "c"]


def test_check_sees_each_row_named_by_its_id_else_its_index(tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "messages": HI}, {"messages": json.dumps(HI)}])
    got = []
    normalize(source, tmp_path / "c", check=lambda rid, row, messages: got.append((rid, row, messages)))
    assert got == [("a", {"id": "a", "messages": HI}, HI), ("<row 1>", {"messages": json.dumps(HI)}, HI)]


@pytest.mark.parametrize("bad, field", [({"messages": []}, "messages"), ({"messages": "[oops"}, "messages"),
                                        ({"messages": HI, "tools": "[oops"}, "tools")])
@pytest.mark.parametrize("rid", ["b", None])
def test_a_bad_row_stops_normalizing_naming_it_and_leaves_no_file(tmp_path, bad, field, rid):
    source = write_jsonl(tmp_path / "in.jsonl", [{"messages": HI}, {**bad, **({"id": rid} if rid else {})}])
    with refused(rid or "<row 1>", field):
        normalize(source, tmp_path / "c", skip=lambda messages, tools: None)
    assert list((tmp_path / "c").iterdir()) == []


def test_a_duplicate_id_stops_normalizing_naming_it(tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "messages": HI}, {"id": 3, "messages": HI},
                                                 {"id": 3, "messages": HI}, {"id": "a", "messages": HI}])
    with refused("a", "id"):
        normalize(source, tmp_path / "c")
    assert list((tmp_path / "c").iterdir()) == []


def test_a_single_row_is_enough_and_no_row_is_an_error(tmp_path):
    assert normalize(write_jsonl(tmp_path / "one.jsonl", numbered(1)), tmp_path / "c").kept == 1
    with pytest.raises(InputError):
        normalize(write_jsonl(tmp_path / "none.jsonl", []), tmp_path / "d")
    assert list((tmp_path / "d").iterdir()) == []
