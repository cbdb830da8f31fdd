"""`align sft` with the data hygiene of the Apertus report (E.1.1): identity filter and \\boxed{} stripping.

Run through the stage on the tiny policy: rows whose assistant text names another model are
dropped and counted, \\boxed{} is stripped from answers and counted, and the summary of the
completion marker records both.
"""

from __future__ import annotations

import json

from stage_helpers import DATE, TINY_DATA, TINY_RECIPE, run_cli

from align.io import stage_completion_info


def hygiene_rows() -> list[dict]:
    rows = [json.loads(line) for line in (TINY_DATA / "sft.jsonl").read_text().splitlines() if line.strip()][:16]
    rows[0]["messages"][-1]["content"] = r"The answer: \boxed{no}"
    rows[1]["messages"][-1]["content"] = r"\boxed{\text{no}}, as I said"
    rows[2]["messages"][-1]["content"] = "no. I am ChatGPT, a model trained by OpenAI."
    rows[3]["messages"][-1]["content"] = "As Claude, I say no."
    rows[4]["messages"][0]["content"] = "Is ChatGPT right that 4 is even?"  # user text: not a claim, kept
    return rows


def test_sft_stage_drops_identity_claims_and_strips_boxed_answers(tmp_path, stage_models):
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in hygiene_rows()))
    out = tmp_path / "sft"
    printed = run_cli(["sft", TINY_RECIPE, f"model_name_or_path={stage_models['policy']}", f"input={data}",
                       f"output_dir={out}", "max_steps=2", "identity_filter=true", "strip_boxed=true",
                       f"chat_date={DATE}"])
    summary = stage_completion_info(out)["summary"]
    assert summary["identity_dropped"] == 2 and summary["boxed_stripped"] == 2
    assert summary["rows"] == 16 and summary["rows_dropped"] == 0  # none lost to max_length
    assert "identity filter: dropped 2 of 16 rows" in printed
    assert "stripped \\boxed{} from the answers of 2 rows" in printed


def test_sft_data_preparation_trains_on_the_answers_without_their_box(tokenizer):
    from align.chat import install_format
    from align.io import rows_to_dataset
    from align.trainers.sft_data import prepare_sft_dataset

    install_format(tokenizer)
    rows = hygiene_rows()[:4]
    summary: dict = {}
    prepared = prepare_sft_dataset(rows_to_dataset(rows), tokenizer, chat_date=DATE, strip_boxed=True,
                                   identity_filter=True, summary=summary)
    assert summary == {"identity_dropped": 2, "boxed_stripped": 2}
    by_hand = [json.loads(json.dumps(row)) for row in rows[:2]]
    by_hand[0]["messages"][-1]["content"] = "The answer: no"
    by_hand[1]["messages"][-1]["content"] = r"\text{no}, as I said"
    expected = prepare_sft_dataset(rows_to_dataset(by_hand), tokenizer, chat_date=DATE)
    assert prepared["input_ids"] == expected["input_ids"] and prepared["labels"] == expected["labels"]
    untouched = prepare_sft_dataset(rows_to_dataset(rows), tokenizer, chat_date=DATE)
    assert len(untouched) == 4 and untouched["input_ids"][0] != expected["input_ids"][0]
