"""`align sft` on a mixture whose message contents are plain strings in some rows and
structured blocks (thinking, tool calls) in others, with tools in some rows only.

Handed to the trainer as in-memory structs, Arrow cannot give such a column one type
("cannot mix struct and non-struct"). The rows travel as JSON text: the main process streams
the input once into a file named by the input's content (`normalize_sft_input`), which the
ranks (and a requeued run) load and tokenize through the `datasets` cache.
"""

from __future__ import annotations

import json

from stage_helpers import TINY_RECIPE, run_cli

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.",
                                            "parameters": {"type": "object", "required": ["city"],
                                                           "properties": {"city": {"type": "string"}}}}}
ROWS = [
    {"id": "plain", "messages": [{"role": "user", "content": "Is 4 even?"}, {"role": "assistant", "content": "yes"}]},
    {"id": "thinking", "enable_thinking": True, "messages": [
        {"role": "user", "content": "Is 7 even?"},
        {"role": "assistant", "content": {"blocks": [{"type": "thoughts", "text": "7 is odd."},
                                                     {"type": "response", "text": "no"}]}}]},
    {"id": "tool", "tools": [WEATHER], "messages": [
        {"role": "user", "content": "Weather in Bern?"},
        {"role": "assistant", "content": {"blocks": [
            {"type": "tool_calls", "calls": [{"name": "get_weather", "arguments": {"city": "Bern"}}]},
            {"type": "tool_outputs", "outputs": [{"output": "21"}]},
            {"type": "response", "text": "21 degrees."}]}}]},
    {"id": 7, "messages": [{"role": "user", "content": "Is 9 even?"}, {"role": "assistant", "content": "no"}]},
]


def test_mixed_message_types_train_through_align_sft(tmp_path, stage_models):
    data = tmp_path / "mixed.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    args = ["sft", TINY_RECIPE, f"model_name_or_path={stage_models['policy']}", f"input={data}",
            "max_steps=2", "per_device_train_batch_size=2", "global_batch_size=null", "save_strategy='no'"]
    run_cli([*args, f"output_dir={tmp_path / 'sft'}"])
    info = json.loads((tmp_path / "sft" / "_COMPLETE.json").read_text())
    assert info["summary"]["steps"] == 2

    # the rows were written once, named by their content, and loaded from there
    from align.trainers.sft_trainer import sft_rows_cache_dir

    files = sorted(sft_rows_cache_dir().glob("sft-input-*.jsonl"))
    written = [f for f in files if "Weather in Bern?" in f.read_text()]
    assert len(written) == 1
    first_mtime = written[0].stat().st_mtime_ns
    lines = [json.loads(line) for line in written[0].read_text().splitlines()]
    assert [row["id"] for row in lines] == ["plain", "thinking", "tool", "7"]
    assert all(isinstance(row["messages"], str) for row in lines)
    assert json.loads(lines[1]["messages"])[1]["content"]["blocks"][0] == {"type": "thoughts", "text": "7 is odd."}

    # a second run on the same rows (a requeue) finds the same file, untouched
    run_cli([*args, f"output_dir={tmp_path / 'sft2'}"])
    again = [f for f in sorted(sft_rows_cache_dir().glob("sft-input-*.jsonl")) if "Weather in Bern?" in f.read_text()]
    assert again == written and written[0].stat().st_mtime_ns == first_mtime


def test_the_json_rows_parse_back_to_the_same_token_ids(tiny_tokenizer):
    from align.chat import install_format
    from align.trainers.sft_data import encode_sft_row, sft_json_rows

    tokenizer = tiny_tokenizer
    install_format(tokenizer, None, chat_format="apertus")
    for row, encoded in zip(ROWS, sft_json_rows(ROWS)):
        assert encode_sft_row(row, tokenizer, chat_date="2026-01-01") == \
            encode_sft_row(encoded, tokenizer, chat_date="2026-01-01")
