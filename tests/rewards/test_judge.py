"""ConstitutionalJudge on a real tiny causal LM (transformers backend, full logits)."""

from __future__ import annotations

import copy

import pytest
import torch
from reward_cases import ANSWERS, QUESTIONS, prompt

from rewards.judge import ConstitutionalJudge, expected_score
from rewards.judge_backends import TransformersJudgeBackend


def make_judge(lm, tok, charter, *, reuse_prefix=True, batch_size=3, **kwargs) -> ConstitutionalJudge:
    backend = TransformersJudgeBackend(lm, tok, batch_size=batch_size, reuse_prefix=reuse_prefix, show_progress=False)
    return ConstitutionalJudge(backend, charter, **kwargs)


def reference_score(lm, tok, text: str, scale=(1, 9)) -> float:
    """Σ k·p(k) / Σ p(k) straight from the model's logits over the unpadded prompt, p(k) the
    sum over the label's spellings in the tiny byte-level vocabulary: "k" and "Ġk" (" k")."""
    ids = tok(text, add_special_tokens=False)["input_ids"]  # the template wrote the one BOS
    assert ids.count(tok.bos_token_id) == 1
    with torch.no_grad():
        probs = torch.softmax(lm(input_ids=torch.tensor([ids])).logits[0, -1].double(), dim=-1)
    ks = range(scale[0], scale[1] + 1)
    vocab = tok.get_vocab()
    p = [sum(probs[vocab[s]].item() for s in (str(k), "Ġ" + str(k)) if s in vocab) for k in ks]
    return sum(k * pk for k, pk in zip(ks, p)) / sum(p)


def test_pointwise_score_is_the_probability_weighted_mean(judge_lm, chat_tokenizer, short_charter):
    judge = make_judge(judge_lm, chat_tokenizer, short_charter)
    conversations = [prompt(q) for q in QUESTIONS]
    scores = judge.score(conversations, ANSWERS[: len(QUESTIONS)])
    for conversation, answer, score in zip(conversations, ANSWERS, scores):
        expected = reference_score(judge_lm, chat_tokenizer, judge.pointwise_prompt(conversation, answer))
        assert score.value == pytest.approx(expected, abs=1e-5)
        assert 0 < score.details["scale_mass"] < 1
    assert len({round(s.value, 8) for s in scores}) == len(scores)


def test_prompt_carries_charter_question_response_and_no_thinking(judge_lm, chat_tokenizer, short_charter):
    judge = make_judge(judge_lm, chat_tokenizer, short_charter)
    text = judge.pointwise_prompt(prompt("Why is the sky blue?"), "Rayleigh scattering.")
    assert text.index("[1.1] Answer the question.") < text.index("QUESTION: Why is the sky blue?") < text.index(
        "RESPONSE: Rayleigh scattering."
    )
    assert "Deliberation: disabled" in text and text.endswith("<|assistant_start|>")
    assert text.startswith(judge.shared_prefix("pointwise"))
    assert judge.shared_prefix("pointwise").endswith("QUESTION: ")


@pytest.mark.parametrize("charter_kind", ["short", "default"])
def test_prefix_reuse_gives_the_plain_scores(judge_lm, chat_tokenizer, short_charter, charter_kind):
    charter = short_charter if charter_kind == "short" else None
    # the default charter is ~7,000 tokens of the tiny tokenizer: two prompts are enough there
    conversations = [prompt(q) for q in QUESTIONS for _ in range(2)][: 6 if charter_kind == "short" else 2]
    answers = (ANSWERS * 2)[: len(conversations)]
    reused = make_judge(judge_lm, chat_tokenizer, charter, reuse_prefix=True)
    plain = make_judge(judge_lm, chat_tokenizer, charter, reuse_prefix=False)
    with_prefix = [s.value for s in reused.score(conversations, answers)]
    without = [s.value for s in plain.score(conversations, answers)]
    assert with_prefix == pytest.approx(without, abs=1e-4)
    asked = sum(1 for a in answers if a.strip())  # an empty answer gets the scale minimum unasked
    assert reused.backend.stats["rows_with_prefix"] == asked
    assert reused.backend.stats["prefix_forwards"] == 1
    assert plain.backend.stats["rows_in_full"] == asked
    reused.score(conversations[:2], answers[:2])  # a second call reuses the stored prefix
    assert reused.backend.stats["prefix_forwards"] == 1


def test_prompts_not_starting_with_the_prefix_run_in_full(judge_lm, chat_tokenizer, short_charter):
    judge = make_judge(judge_lm, chat_tokenizer, short_charter)
    prompts = [judge.pointwise_prompt(prompt(q), "Yes.") for q in QUESTIONS]
    labels = [str(k) for k in range(1, 10)]
    backend = judge.backend
    odd = backend.label_logprobs(prompts, labels, shared_prefix="<s>something else entirely")
    plain = backend.label_logprobs(prompts, labels, shared_prefix=None)
    assert backend.stats["rows_with_prefix"] == 0 and backend.stats["rows_in_full"] == 2 * len(prompts)
    for a, b in zip(odd, plain):
        assert a == pytest.approx(b, abs=1e-6)


def test_cached_prefix_is_not_mutated_by_batches(judge_lm, chat_tokenizer, short_charter):
    # transformers caches grow in place; each batch must get its own copy of the prefix
    judge = make_judge(judge_lm, chat_tokenizer, short_charter, batch_size=1)
    conversations = [prompt(q) for q in QUESTIONS]
    first = [s.value for s in judge.score(conversations, ["A reply."] * 3)]
    again = [s.value for s in judge.score(conversations, ["A reply."] * 3)]
    assert first == again
    prefix_len = next(iter(judge.backend._prefixes.values()))[0][0].shape[-2]
    assert prefix_len == len(next(iter(judge.backend._prefixes)))


def test_scale_is_a_setting(judge_lm, chat_tokenizer, short_charter):
    judge = make_judge(judge_lm, chat_tokenizer, short_charter, scale=(1, 5))
    text = judge.pointwise_prompt(prompt("Hi?"), "Hello.")
    assert "from 1 to 5" in text
    score = judge.score([prompt("Hi?")], ["Hello."])[0]
    assert score.value == pytest.approx(reference_score(judge_lm, chat_tokenizer, text, (1, 5)), abs=1e-5)
    assert 1 <= score.value <= 5


def test_multi_token_scale_labels_are_refused_when_the_judge_is_built(judge_lm, chat_tokenizer, short_charter):
    assert len(chat_tokenizer("1000", add_special_tokens=False)["input_ids"]) > 1
    with pytest.raises(ValueError, match=r"answer labels \['998', '999', '1000', '1001', '1002'\] are not a single token"):
        make_judge(judge_lm, chat_tokenizer, short_charter, scale=(998, 1002))


def test_expected_score_uses_only_visible_labels():
    import math

    logprobs = {"7": math.log(0.3), "8": math.log(0.1), "x": math.log(0.5)}
    value, mass = expected_score(logprobs, [str(k) for k in range(1, 10)])
    assert value == pytest.approx((7 * 0.3 + 8 * 0.1) / 0.4)
    assert mass == pytest.approx(0.4)
    assert expected_score({"x": 0.0}, ["1", "2"]) is None


def test_both_orders_make_comparisons_antisymmetric(judge_lm, chat_tokenizer, short_charter):
    judge = make_judge(judge_lm, chat_tokenizer, short_charter)
    conversation = prompt(QUESTIONS[1])
    forward, backward = judge.compare_pairs([(conversation, ANSWERS[1], ANSWERS[3]), (conversation, ANSWERS[3], ANSWERS[1])])
    assert forward.first_wins == pytest.approx(1 - backward.first_wins, abs=1e-6)
    assert forward.p_first_as_a == pytest.approx(1 - backward.p_first_as_b, abs=1e-6)
    assert forward.orders_agree == ((forward.p_first_as_a > 0.5) == (forward.p_first_as_b > 0.5))
    assert forward.note is None


def test_pairwise_probability_comes_from_the_a_and_b_tokens(judge_lm, chat_tokenizer, short_charter):
    judge = make_judge(judge_lm, chat_tokenizer, short_charter)
    conversation = prompt(QUESTIONS[0])
    comparison = judge.compare_pairs([(conversation, "Paris.", "Lyon.")])[0]
    for text, expected_first in [
        (judge.pairwise_prompt(conversation, "Paris.", "Lyon."), comparison.p_first_as_a),
        (judge.pairwise_prompt(conversation, "Lyon.", "Paris."), 1 - comparison.p_first_as_b),
    ]:
        ids = chat_tokenizer(text, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = judge_lm(input_ids=torch.tensor([ids])).logits[0, -1]
        a, b = chat_tokenizer.convert_tokens_to_ids(["A", "B"])
        assert torch.softmax(logits[[a, b]], dim=-1)[0].item() == pytest.approx(expected_first, abs=1e-5)


def test_pairwise_ranking_reorders_the_top_k_only(judge_lm, chat_tokenizer, short_charter):
    judge = make_judge(judge_lm, chat_tokenizer, short_charter, top_k_pairwise=3)
    group = ["Paris.", "It is Paris.", "Paris, on the Seine.", "Lyon.", "Marseille.", "Nice."]
    conversation = prompt(QUESTIONS[0])
    pointwise = judge.score([conversation] * len(group), group)
    final = judge.score_groups([conversation], [group])[0]
    top = sorted(range(len(group)), key=lambda i: -pointwise[i].value)[:3]
    rest = [i for i in range(len(group)) if i not in top]
    assert sorted(final[i].value for i in top) == pytest.approx(sorted(pointwise[i].value for i in top))
    for i in rest:
        assert final[i].value == pointwise[i].value and "pairwise_rank" not in final[i].details
    by_rank = sorted(top, key=lambda i: final[i].details["pairwise_rank"])
    assert [final[i].value for i in by_rank] == sorted((final[i].value for i in top), reverse=True)
    assert min(final[i].value for i in top) >= max(final[i].value for i in rest)
    for i in top:
        details = final[i].details
        assert details["pointwise"] == pytest.approx(pointwise[i].value)
        assert 1 <= details["pairwise_comparisons"] <= 2
        assert details["pairwise_orders_read"] == details["pairwise_comparisons"]
        assert 0 <= details["pairwise_orders_agree"] <= details["pairwise_orders_read"]


def test_empty_completion_never_enters_the_pairwise_top_k(judge_lm, chat_tokenizer, short_charter):
    judge = make_judge(judge_lm, chat_tokenizer, short_charter, top_k_pairwise=4)
    group = ["", "Paris.", "Lyon.", "It is Paris, of course."]
    final = judge.score_groups([prompt(QUESTIONS[0])], [group])[0]
    assert final[0].value is not None
    assert "pairwise_rank" not in final[0].details  # never compared
    assert sorted(final[i].details["pairwise_rank"] for i in (1, 2, 3)) == [1, 2, 3]
    assert final[0].value < min(s.value for s in final[1:])  # ranked last


def test_pairwise_off_keeps_pointwise(judge_lm, chat_tokenizer, short_charter):
    judge = make_judge(judge_lm, chat_tokenizer, short_charter, top_k_pairwise=0)
    group = ["Paris.", "Lyon."]
    final = judge.score_groups([prompt(QUESTIONS[0])], [group])[0]
    assert [s.value for s in final] == [s.value for s in judge.score([prompt(QUESTIONS[0])] * 2, group)]


def test_template_must_start_with_the_charter(judge_lm, chat_tokenizer, short_charter, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("Rate this.\n$charter\n$question\n$response\n")
    with pytest.raises(ValueError, match="must start with \\$charter"):
        make_judge(judge_lm, chat_tokenizer, short_charter, pointwise_template=str(bad))
    missing = tmp_path / "missing.txt"
    missing.write_text("$charter\n$question\n")
    with pytest.raises(ValueError, match="lacks the placeholders \\['\\$response'\\]"):
        make_judge(judge_lm, chat_tokenizer, short_charter, pointwise_template=str(missing))


def test_tokenizer_without_chat_template_is_refused(judge_lm, chat_tokenizer, short_charter):
    tok = copy.deepcopy(chat_tokenizer)
    tok.chat_template = None
    judge = make_judge(judge_lm, tok, short_charter)
    with pytest.raises(ValueError, match="no chat template"):
        judge.score([prompt("Hi?")], ["Hello."])


def test_fingerprint_changes_with_charter_and_scale(judge_lm, chat_tokenizer, short_charter):
    a = make_judge(judge_lm, chat_tokenizer, short_charter).fingerprint()
    b = make_judge(judge_lm, chat_tokenizer, None).fingerprint()
    c = make_judge(judge_lm, chat_tokenizer, short_charter, scale=(1, 5)).fingerprint()
    assert a["charter"] != b["charter"] and a["scale"] != c["scale"]
    assert a == make_judge(judge_lm, chat_tokenizer, short_charter).fingerprint()
