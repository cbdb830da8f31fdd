"""Rows over ``max_length``: excluded by default, alike in the log-prob pass and the trainer.

A completion cut to fit ``max_length`` loses its end-of-turn token while R_q and β/|y|
still describe the whole text. By default (``over_max_length=exclude``) such a row is not
scored by the pass (written with ``ref_skip``, the reason) and is left out of training,
counted; ``over_max_length=cut`` is the opt-in that trains on the completion's head.
"""

from __future__ import annotations

import pytest

from align.logprobs import compute_ref_logprobs, load_ref_logprobs
from align.scoring import OverMaxLengthError, encode_record
from align.testing.tiny import build_causal_lm
from align.trainers.preference_config import PreferenceConfig
from align.trainers.preference_data import prepare_dataset

DATE = "2025-09-01"


def rows() -> list[dict]:
    short = {"chosen": "yes", "rejected": "no"}
    out = [{"id": f"r{i}", "messages": [{"role": "user", "content": f"Question {i}?"}], **short,
            "chosen_quantile": 1.0, "rejected_quantile": 0.0} for i in range(3)]
    out[1]["chosen"] = "a long answer " * 40  # far over the 100 tokens allowed below
    return out


@pytest.fixture(scope="module")
def model(tiny_tokenizer):
    return build_causal_lm(tiny_tokenizer)


def _lengths(tokenizer, row):
    full = encode_record(tokenizer, row, chat_date=DATE)
    return len(full["prompt_ids"]), len(full["chosen_ids"])


def test_encode_record_refuses_an_over_long_row_by_default_and_cuts_on_opt_in(tiny_tokenizer):
    row = rows()[1]
    prompt, completion = _lengths(tiny_tokenizer, row)
    assert prompt + completion > 100
    with pytest.raises(OverMaxLengthError, match=r"record 'r1': field 'chosen': over_max_length: prompt \d+ \+ "
                                                 r"chosen \d+ tokens > max_length=100"):
        encode_record(tiny_tokenizer, row, max_length=100, chat_date=DATE)
    cut: list[str] = []
    encoded = encode_record(tiny_tokenizer, row, max_length=100, chat_date=DATE, over_max_length="cut", cut_names=cut)
    assert cut == ["chosen"] and len(encoded["prompt_ids"]) + len(encoded["chosen_ids"]) == 100
    with pytest.raises(ValueError, match="over_max_length='keep'"):
        encode_record(tiny_tokenizer, row, max_length=100, chat_date=DATE, over_max_length="keep")


def _config(tmp_path, **kwargs) -> PreferenceConfig:
    settings = {"max_length": 100, **kwargs}
    return PreferenceConfig(output_dir=str(tmp_path / "train"), use_cpu=True, report_to="none", chat_date=DATE,
                            loss_type="qrpo", **settings)


def test_the_pass_and_the_trainer_exclude_the_same_row(model, tiny_tokenizer, tmp_path):
    data = rows()
    result = compute_ref_logprobs(data, model, tiny_tokenizer, output_dir=tmp_path / "ref", max_length=100,
                                  chat_date=DATE, batch_size=2)
    assert result.num_over_max_length_skipped == 1 and result.num_over_max_length_cut == 0
    scored = load_ref_logprobs(tmp_path / "ref", data)
    skipped = [r for r in scored if r.get("ref_skip")]
    assert [r["id"] for r in skipped] == ["r1"]
    assert skipped[0]["ref_skip"].startswith("over_max_length: prompt ") and "max_length=100" in skipped[0]["ref_skip"]
    assert "ref_chosen_logps" not in skipped[0]

    summary: dict = {}
    prepared = prepare_dataset(scored, tiny_tokenizer, _config(tmp_path), model, summary)
    assert prepared["id"] == ["r0", "r2"]
    assert summary == {"over_max_length_skipped": 1, "over_max_length_cut": 0}


def test_cut_is_the_opt_in_and_agrees_between_pass_and_trainer(model, tiny_tokenizer, tmp_path):
    data = rows()
    result = compute_ref_logprobs(data, model, tiny_tokenizer, output_dir=tmp_path / "ref", max_length=100,
                                  chat_date=DATE, batch_size=2, over_max_length="cut")
    assert result.num_over_max_length_cut == 1 and result.num_over_max_length_skipped == 0
    scored = load_ref_logprobs(tmp_path / "ref", data)
    assert not any(r.get("ref_skip") for r in scored)
    summary: dict = {}
    prepared = prepare_dataset(scored, tiny_tokenizer, _config(tmp_path, over_max_length="cut"), model, summary)
    assert prepared["id"] == ["r0", "r1", "r2"]  # the token hashes of the cut row agree
    assert summary == {"over_max_length_skipped": 0, "over_max_length_cut": 1}
    assert len(prepared[1]["prompt_ids"]) + len(prepared[1]["chosen_ids"]) == 100


def test_a_trainer_that_fits_a_row_the_pass_skipped_names_the_row(model, tiny_tokenizer, tmp_path):
    data = rows()
    compute_ref_logprobs(data, model, tiny_tokenizer, output_dir=tmp_path / "ref", max_length=100, chat_date=DATE)
    scored = load_ref_logprobs(tmp_path / "ref", data)
    from align.data.records import RecordError

    with pytest.raises(RecordError, match=r"record 'r1': field 'ref_skip'.*max_length"):
        prepare_dataset(scored, tiny_tokenizer, _config(tmp_path, max_length=None), model)


def test_a_row_the_pass_skipped_records_which_pass_skipped_it(tiny_tokenizer, tmp_path):
    """The skip row carries the pass's model fingerprint and settings as a scored row does, so the row
    says which pass (model, max_length, format) decided to leave it out."""
    data = rows()
    saved = build_causal_lm(tiny_tokenizer)  # known by its path, so the pass records its weights' fingerprint
    saved.save_pretrained(tmp_path / "reference")
    saved.name_or_path = str(tmp_path / "reference")
    compute_ref_logprobs(data, saved, tiny_tokenizer, output_dir=tmp_path / "ref", max_length=100, chat_date=DATE)
    scored = {r["id"]: r for r in load_ref_logprobs(tmp_path / "ref", data)}
    skipped, kept = scored["r1"], scored["r0"]
    assert "ref_skip" in skipped and "ref_skip" not in kept
    assert isinstance(kept["ref_model_fingerprint"], str)
    assert skipped["ref_model_fingerprint"] == kept["ref_model_fingerprint"]
    settings = {k: v for k, v in kept["ref_inputs"].items() if not k.endswith("_hash")}
    assert skipped["ref_inputs"] == settings and settings["max_length"] == 100
