"""SFT, the reference pass and QRPO in a model's own chat template (`chat_format=tokenizer`),
on a tiny model whose tokenizer carries Qwen3's or Llama 3's template: the trained tokens are
the hand-written ones, the template survives training, and generation stops at its end of turn."""

from __future__ import annotations

import json

import pytest
from stage_helpers import TINY_RECIPE, run_cli

from align.testing.tiny import build_causal_lm, build_template_tokenizer
from align.trainers.sft_data import encode_sft_row

CONVERSATION = {"id": "c1", "messages": [{"role": "user", "content": "Is 4 even?"},
                                         {"role": "assistant", "content": "yes"},
                                         {"role": "user", "content": "And 5?"},
                                         {"role": "assistant", "content": "no"}]}
PAIR = {"id": "p1", "messages": [{"role": "user", "content": "Is 7 even?"}], "chosen": "no", "rejected": "yes",
        "chosen_reward": 1.0, "rejected_reward": 0.0, "ref_rewards": [1.0, 0.0, 1.0, 0.0]}
# written by hand from each template: what the loss sees of CONVERSATION, run by run
TRAINED = {"qwen3": ["yes<|im_end|>", "no<|im_end|>"], "llama3": ["yes<|eot_id|>", "no<|eot_id|>"]}
TURN_END = {"qwen3": "<|im_end|>", "llama3": "<|eot_id|>"}


def _runs(tokenizer, input_ids, labels) -> list[str]:
    runs, current = [], []
    for token, label in zip(input_ids, labels):
        if label != -100:
            current.append(token)
        elif current:
            runs.append(tokenizer.decode(current))
            current = []
    return runs + ([tokenizer.decode(current)] if current else [])


@pytest.mark.parametrize("name", ["qwen3", "llama3"])
def test_sft_pass_and_qrpo_in_the_models_own_template(tmp_path, name):
    from transformers import AutoTokenizer

    tokenizer = build_template_tokenizer(name)
    base = tmp_path / "base"
    build_causal_lm(tokenizer).save_pretrained(base)
    tokenizer.save_pretrained(base)
    conversations = tmp_path / "sft.jsonl"
    conversations.write_text("".join(json.dumps({**CONVERSATION, "id": f"c{k}"}) + "\n" for k in range(4)))
    run_cli(["sft", TINY_RECIPE, f"model_name_or_path={base}", f"input={conversations}",
             f"output_dir={tmp_path / 'sft'}", "chat_format=tokenizer", "max_steps=2"])

    saved = AutoTokenizer.from_pretrained(tmp_path / "sft")
    assert saved.chat_template == tokenizer.chat_template and saved.eos_token == TURN_END[name]
    row = encode_sft_row(CONVERSATION, saved, chat_format="tokenizer")
    assert _runs(saved, row["input_ids"], row["labels"]) == TRAINED[name]

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps(PAIR) + "\n")
    run_cli(["logprobs", TINY_RECIPE, f"model_name_or_path={tmp_path / 'sft'}", f"input={pairs}",
             f"output_dir={tmp_path / 'logprobs'}", "chat_format=tokenizer"])
    run_cli(["train", TINY_RECIPE, f"model_name_or_path={tmp_path / 'sft'}", f"input={tmp_path / 'logprobs'}",
             f"output_dir={tmp_path / 'qrpo'}", "chat_format=tokenizer", "max_steps=1",
             "per_device_train_batch_size=1"])
    assert (tmp_path / "qrpo" / "config.json").is_file()
