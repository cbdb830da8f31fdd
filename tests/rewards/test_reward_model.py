"""RewardModel on a real tiny Llama sequence classifier."""

from __future__ import annotations

import copy

import pytest
import torch
from reward_cases import ANSWERS, QUESTIONS, prompt

from rewards.reward_model import RewardModel

PAIRS = [(prompt(q), a) for q in QUESTIONS for a in ANSWERS if a]


def make_rm(rm_model, tok, **kwargs) -> RewardModel:
    return RewardModel("tiny-rm", model=copy.deepcopy(rm_model), tokenizer=tok, **kwargs)


def scores(rm: RewardModel, pairs=PAIRS) -> list[float]:
    return [s.value for s in rm.score([c for c, _ in pairs], [a for _, a in pairs])]


def test_score_is_the_raw_logit_of_one_unpadded_sequence(rm_model, chat_tokenizer):
    rm = make_rm(rm_model, chat_tokenizer)
    conversation, answer = PAIRS[1]
    text = chat_tokenizer.apply_chat_template(conversation + [{"role": "assistant", "content": answer}], tokenize=False)
    ids = chat_tokenizer(text, add_special_tokens=False)["input_ids"]  # the template wrote the one BOS
    with torch.no_grad():
        expected = rm_model(input_ids=torch.tensor([ids])).logits[0][0].item()
    assert rm.score([conversation], [answer])[0].value == pytest.approx(expected, abs=1e-6)


def test_batched_scores_equal_single_example_scores(rm_model, chat_tokenizer):
    batched = scores(make_rm(rm_model, chat_tokenizer, batch_size=4))
    single = scores(make_rm(rm_model, chat_tokenizer, batch_size=1))
    assert len({round(v, 6) for v in single}) > 1  # real, distinct scores
    assert batched == pytest.approx(single, abs=1e-5)


def test_length_sorted_batches_give_the_same_scores_as_fixed_order(rm_model, chat_tokenizer):
    sorted_ = scores(make_rm(rm_model, chat_tokenizer, batch_size=3, sort_by_length=True))
    fixed = scores(make_rm(rm_model, chat_tokenizer, batch_size=3, sort_by_length=False))
    assert sorted_ == pytest.approx(fixed, abs=1e-5)


def test_bos_is_not_doubled(rm_model, chat_tokenizer):
    rm = make_rm(rm_model, chat_tokenizer)
    assert rm.render(*PAIRS[0]).startswith(chat_tokenizer.bos_token)  # the template writes it
    ids, _ = rm.encode(*PAIRS[0])
    assert ids[0] == chat_tokenizer.bos_token_id
    assert ids.count(chat_tokenizer.bos_token_id) == 1


def test_multi_turn_prompt_is_rendered_whole_without_system(rm_model, chat_tokenizer):
    rm = make_rm(rm_model, chat_tokenizer)
    conversation = [
        {"role": "system", "content": "SYSTEM-PROMPT-MARKER"},
        {"role": "user", "content": "First question."},
        {"role": "assistant", "content": "First answer."},
        {"role": "user", "content": {"parts": [{"type": "text", "text": "Second question."}]}},
    ]
    text = rm.render(conversation, "Final answer.")
    assert "SYSTEM-PROMPT-MARKER" not in text
    assert text.index("First question.") < text.index("First answer.") < text.index("Second question.") < text.index("Final answer.")


def test_truncation_is_flagged_and_scores_the_kept_tokens(rm_model, chat_tokenizer):
    rm = make_rm(rm_model, chat_tokenizer, max_length=24)
    score = rm.score([PAIRS[1][0]], [PAIRS[1][1]])[0]
    assert score.details["truncated"] is True and score.details["num_tokens"] > 24
    ids, _ = rm.encode(*PAIRS[1])
    assert len(ids) == 24
    with torch.no_grad():
        expected = rm_model(input_ids=torch.tensor([ids])).logits[0][0].item()
    assert score.value == pytest.approx(expected, abs=1e-6)
    assert make_rm(rm_model, chat_tokenizer).score([PAIRS[1][0]], [PAIRS[1][1]])[0].details["truncated"] is False


def test_empty_completion_is_a_recorded_skip(rm_model, chat_tokenizer):
    out = make_rm(rm_model, chat_tokenizer).score([prompt("Hi?"), prompt("Hi?")], ["  \n", "Hello."])
    assert out[0].value is None and out[0].reason == "empty completion"
    assert out[1].value is not None


def test_pad_equal_to_eos_is_refused(rm_model, chat_tokenizer):
    tok = copy.deepcopy(chat_tokenizer)
    tok.pad_token = tok.eos_token
    with pytest.raises(ValueError, match="pad token id .* equals the EOS id"):
        make_rm(rm_model, tok)


def test_missing_pad_is_refused(rm_model, chat_tokenizer):
    tok = copy.deepcopy(chat_tokenizer)
    tok.pad_token = None
    with pytest.raises(ValueError, match="has no pad token"):
        make_rm(rm_model, tok)


def test_text_containing_the_pad_token_is_skipped(rm_model, chat_tokenizer):
    out = make_rm(rm_model, chat_tokenizer).score([prompt("Hi?")], [f"odd {chat_tokenizer.pad_token} text"])
    assert out[0].value is None and "pad token" in out[0].reason


def test_multi_label_classifier_is_refused(chat_tokenizer):
    from transformers import LlamaConfig, LlamaForSequenceClassification

    config = LlamaConfig(vocab_size=len(chat_tokenizer), hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_labels=2, pad_token_id=chat_tokenizer.pad_token_id)
    model = LlamaForSequenceClassification(config)
    with pytest.raises(ValueError, match="one-label classifier"):
        RewardModel("two-labels", model=model, tokenizer=chat_tokenizer)


def test_loads_from_a_saved_directory(tmp_path, rm_model, chat_tokenizer):
    rm_model.save_pretrained(tmp_path)
    chat_tokenizer.save_pretrained(tmp_path)
    rm = RewardModel(tmp_path, batch_size=2)
    assert rm.dtype == torch.float32 and rm.device.type == "cpu"
    assert scores(rm) == pytest.approx(scores(make_rm(rm_model, chat_tokenizer)), abs=1e-5)
