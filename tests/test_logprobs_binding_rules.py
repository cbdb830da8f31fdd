"""What a trainer says when the reference pass scored other token ids than it trains on.

The pass writes, per completion, a hash of the exact token ids it scored, and per row the
settings and texts those ids came from (``ref_inputs``). The trainer recomputes the hash;
on a mismatch its error names every recorded input that differs, in a fixed order, each
once: a user reads there which setting to align (a date, a format, the tokenizer) or that
the data itself changed. These tests hold each rule of that message on its own.
"""

from __future__ import annotations

import pytest

from align.errors import RecordError
from align.logprobs import REF_INPUT_LABELS, check_ref_tokens, row_text_hashes, token_hash

NAMES = ("chosen", "rejected")
ENCODED = {"prompt_ids": [1, 2, 3], "chosen_ids": [4, 5], "rejected_ids": [6]}
SETTINGS = {"chat_format": "apertus", "chat_date": "2026-01-01", "enable_thinking": False, "max_length": 64,
            "over_max_length": "exclude", "truncated": "exclude", "tokenizer_fingerprint": "tok-a"}


def row(**changes) -> dict:
    """A pass's row whose hashes match ``ENCODED`` and whose ``ref_inputs`` match ``SETTINGS``."""
    base = {"id": "r1", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}],
            "chosen": "4", "rejected": "5",
            "ref_chosen_token_hash": token_hash(ENCODED["prompt_ids"], ENCODED["chosen_ids"]),
            "ref_rejected_token_hash": token_hash(ENCODED["prompt_ids"], ENCODED["rejected_ids"])}
    base["ref_inputs"] = {**SETTINGS, **row_text_hashes(base, NAMES)}
    base.update(changes)
    return base


def mismatch(given: dict, trainer: dict | None = None, encoded: dict | None = None) -> RecordError:
    """The trainer's error for ``given`` when its tokens differ from the pass's (the chosen side's by default)."""
    encoded = encoded or {**ENCODED, "chosen_ids": [4, 99]}
    with pytest.raises(RecordError) as caught:
        check_ref_tokens(given, encoded, given["id"], lambda: {**SETTINGS, **(trainer or {})})
    return caught.value


def test_matching_tokens_pass_without_asking_for_the_trainer_settings():
    def never():
        raise AssertionError("the trainer's settings are read only on a mismatch")

    check_ref_tokens(row(), ENCODED, "r1", never)


@pytest.mark.parametrize("side", NAMES)
def test_each_side_is_checked_on_its_own(side):
    encoded = {**ENCODED, f"{side}_ids": ENCODED[f"{side}_ids"] + [7]}
    error = mismatch(row(), encoded=encoded)
    assert (error.record_id, error.field) == ("r1", f"ref_{side}_token_hash")


@pytest.mark.parametrize("stored", [None, ""])
def test_a_row_without_a_token_hash_is_refused_naming_the_column(stored):
    with pytest.raises(RecordError) as caught:
        check_ref_tokens(row(ref_rejected_token_hash=stored), ENCODED, "r1", lambda: SETTINGS)
    assert caught.value.field == "ref_rejected_token_hash" and "missing" in str(caught.value)


def test_a_row_that_records_no_settings_says_so():
    error = mismatch(row(ref_inputs=None))
    assert "the token ids differ (the row does not record the pass's settings)" in str(error)


@pytest.mark.parametrize(("key", "trainer_value", "said"), [
    ("chat_format", "qwen3", "chat_format is 'apertus' in the pass, 'qwen3' in the trainer"),
    ("chat_date", "2026-02-02", "chat_date is '2026-01-01' in the pass, '2026-02-02' in the trainer"),
    ("enable_thinking", True, "enable_thinking is False in the pass, True in the trainer"),
    ("max_length", 32, "max_length is 64 in the pass, 32 in the trainer"),
    ("over_max_length", "cut", "over_max_length is 'exclude' in the pass, 'cut' in the trainer"),
    ("truncated", "include", "truncated is 'exclude' in the pass, 'include' in the trainer"),
    ("tokenizer_fingerprint", "tok-b", "the tokenizer differs from the pass's"),
])
def test_each_setting_that_differs_is_named_alone(key, trainer_value, said):
    message = str(mismatch(row(), trainer={key: trainer_value}))
    assert f"tokenizes: {said}. Rerun" in message


def test_a_changed_system_text_is_named_once_not_again_as_the_prompt():
    given = row()
    given["messages"] = [{"role": "system", "content": "be verbose"}, given["messages"][1]]
    message = str(mismatch(given))
    assert f"tokenizes: {REF_INPUT_LABELS['system_hash']} differs from the pass's. Rerun" in message


def test_a_developer_turn_counts_as_system_text():
    given = row(messages=[{"role": "developer", "content": "be brief"}, {"role": "user", "content": "2+2?"}])
    given["ref_inputs"] = row()["ref_inputs"]
    message = str(mismatch(given))
    assert REF_INPUT_LABELS["system_hash"] not in message  # the same system text, in another role
    assert f"tokenizes: {REF_INPUT_LABELS['prompt_hash']} differs from the pass's. Rerun" in message


@pytest.mark.parametrize("change", [{"messages": [{"role": "system", "content": "be brief"},
                                                  {"role": "user", "content": "3+3?"}]},
                                    {"tools": [{"type": "function", "function": {"name": "add"}}]}])
def test_other_user_turns_or_tools_name_the_prompt(change):
    message = str(mismatch(row(**change)))
    assert f"tokenizes: {REF_INPUT_LABELS['prompt_hash']} differs from the pass's. Rerun" in message


@pytest.mark.parametrize("side", NAMES)
def test_other_completion_texts_are_named(side):
    message = str(mismatch(row(**{side: "22"})))
    assert f"tokenizes: {REF_INPUT_LABELS['completion_hash']} differs from the pass's. Rerun" in message


def test_several_differences_are_named_in_order_joined():
    message = str(mismatch(row(chosen="22"), trainer={"truncated": "include", "chat_date": "2026-02-02"}))
    assert ("tokenizes: the text of the completions differs from the pass's; chat_date is '2026-01-01' in the pass, "
            "'2026-02-02' in the trainer; truncated is 'exclude' in the pass, 'include' in the trainer. Rerun") \
        in message


def test_a_setting_the_pass_did_not_record_is_not_named():
    given = row()
    del given["ref_inputs"]["chat_date"]
    message = str(mismatch(given, trainer={"chat_date": "2026-02-02"}))
    assert "chat_date" not in message and "every recorded setting agrees" in message


def test_every_recorded_setting_agreeing_points_at_the_versions():
    message = str(mismatch(row()))
    assert "tokenizes: the token ids differ, though every recorded setting agrees (another tokenizers or " \
           "chat-template version?). Rerun" in message
