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


def test_truncated_input_is_scored_on_its_kept_tokens_when_told_to(rm_model, chat_tokenizer):
    rm = make_rm(rm_model, chat_tokenizer, max_length=24, on_truncation="score")
    score = rm.score([PAIRS[1][0]], [PAIRS[1][1]])[0]
    assert score.details["truncated"] is True and score.details["num_tokens"] > 24
    ids, _ = rm.encode(*PAIRS[1])
    assert len(ids) == 24
    with torch.no_grad():
        expected = rm_model(input_ids=torch.tensor([ids])).logits[0][0].item()
    assert score.value == pytest.approx(expected, abs=1e-6)
    assert make_rm(rm_model, chat_tokenizer).score([PAIRS[1][0]], [PAIRS[1][1]])[0].details["truncated"] is False


def test_truncated_input_is_a_recorded_skip_by_default(rm_model, chat_tokenizer):
    limit = len(make_rm(rm_model, chat_tokenizer).encode(prompt("Hi?"), "Hello.")[0])
    rm = make_rm(rm_model, chat_tokenizer, max_length=limit)
    long, short = rm.score([PAIRS[1][0], prompt("Hi?")], [PAIRS[1][1], "Hello."])
    assert long.value is None and f"over max_length={limit}" in long.reason and "on_truncation=skip" in long.reason
    assert long.details["truncated"] is True and long.details["num_tokens"] > limit
    assert short.value is not None and short.details["truncated"] is False
    with pytest.raises(ValueError, match="on_truncation"):
        make_rm(rm_model, chat_tokenizer, on_truncation="cut")


def test_empty_completion_gets_the_lowest_score_of_its_prompt(rm_model, chat_tokenizer):
    rm = make_rm(rm_model, chat_tokenizer)
    groups = [["Paris.", "  \n", "I am not sure.", "It is Paris."], ["7", ""]]
    conversations = [prompt(QUESTIONS[0]), prompt(QUESTIONS[2])]
    first, second = rm.score_groups(conversations, groups)
    assert first[1].value == min(first[i].value for i in (0, 2, 3))
    assert "lowest score of the prompt's 3 scored non-empty" in first[1].details["empty_completion"]
    assert second[1].value == second[0].value  # its own prompt's lowest, not the other prompt's
    assert all("empty_completion" not in first[i].details for i in (0, 2, 3))
    # the flat interface applies the rule over the pairs that share a conversation
    flat = rm.score([conversations[0]] * 4 + [conversations[1]] * 2, groups[0] + groups[1])
    assert [s.value for s in flat] == pytest.approx([s.value for s in first + second])


def test_empty_completion_takes_a_configured_empty_score(rm_model, chat_tokenizer):
    rm = make_rm(rm_model, chat_tokenizer, empty_score=-7.5)
    out = rm.score_groups([prompt("Hi?")], [["", "Hello."]])[0]
    assert out[0].value == -7.5 and "configured empty_score" in out[0].details["empty_completion"]
    with pytest.raises(ValueError, match="empty_score"):
        make_rm(rm_model, chat_tokenizer, empty_score=float("nan"))


def test_empty_completion_without_a_scored_neighbour_is_a_recorded_skip(rm_model, chat_tokenizer):
    out = make_rm(rm_model, chat_tokenizer).score_groups([prompt("Hi?")], [["", " "]])[0]
    assert all(s.value is None and "no other completion" in s.reason for s in out)


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
