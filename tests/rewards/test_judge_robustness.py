"""What can distort a judge's scores without any error: label spellings, one readable
order, empty completions, a vLLM engine without prefix caching."""

from __future__ import annotations

import copy
import math
import types
import warnings

import pytest
import torch
from judge_fakes import ScriptedBackend, response_of, responses_ab
from reward_cases import QUESTIONS, prompt

from rewards.judge import ConstitutionalJudge
from rewards.judge_backends import TransformersJudgeBackend, label_token_ids
from rewards.judge_backends.openai import labels_from_top
from rewards.pairwise import combine_orders

LABELS = [str(k) for k in range(1, 10)]


@pytest.fixture(scope="module")
def marker_tokenizer(chat_tokenizer):
    """The chat tokenizer plus SentencePiece-style "▁1".."▁9": each digit now has three
    spellings, "k", "Ġk" (byte-level " k") and "▁k"."""
    tok = copy.deepcopy(chat_tokenizer)
    tok.add_tokens([f"\u2581{k}" for k in range(1, 10)])
    return tok


@pytest.fixture(scope="module")
def marker_lm(marker_tokenizer, short_charter):
    """A tiny LM whose "▁k" rows carry real mass at the answer position (logit ~ k/2 + 2),
    so a judge that ignored the marker spellings would be visibly off."""
    from align.testing.tiny import build_causal_lm

    model = build_causal_lm(marker_tokenizer, seed=11, tie_word_embeddings=False)
    judge = ConstitutionalJudge(TransformersJudgeBackend(model, marker_tokenizer, show_progress=False), short_charter)
    text = judge.pointwise_prompt(prompt(QUESTIONS[0]), "Paris.")
    with torch.no_grad():
        ids = marker_tokenizer(text, add_special_tokens=False)["input_ids"]
        hidden = model.model(input_ids=torch.tensor([ids])).last_hidden_state[0, -1]
        for k in range(1, 10):
            row = marker_tokenizer.convert_tokens_to_ids(f"\u2581{k}")
            model.lm_head.weight[row] = (k / 2 + 2) * hidden / hidden.dot(hidden)
    return model


def test_every_spelling_of_a_label_is_found(marker_tokenizer):
    groups = label_token_ids(marker_tokenizer, LABELS)
    for k in LABELS:
        assert sorted(marker_tokenizer.convert_ids_to_tokens(groups[k])) == sorted([k, "Ġ" + k, "\u2581" + k])


def test_score_sums_the_label_spellings(marker_lm, marker_tokenizer, short_charter):
    judge = ConstitutionalJudge(TransformersJudgeBackend(marker_lm, marker_tokenizer, show_progress=False), short_charter)
    conversations = [prompt(q) for q in QUESTIONS]
    answers = ["Paris.", "Because of scattering.", "Seven."][: len(conversations)]
    scores = judge.score(conversations, answers)
    vocab = marker_tokenizer.get_vocab()
    for conversation, answer, score in zip(conversations, answers, scores):
        ids = marker_tokenizer(judge.pointwise_prompt(conversation, answer), add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            probs = torch.softmax(marker_lm(input_ids=torch.tensor([ids])).logits[0, -1].double(), dim=-1)
        p = {k: sum(probs[vocab[s]].item() for s in (str(k), "Ġ" + str(k), "\u2581" + str(k))) for k in range(1, 10)}
        by_hand = sum(k * pk for k, pk in p.items()) / sum(p.values())
        assert score.value == pytest.approx(by_hand, abs=1e-5)
        assert score.details["scale_mass"] == pytest.approx(sum(p.values()), rel=1e-4)
        plain_only = sum(k * probs[vocab[str(k)]].item() for k in range(1, 10)) / sum(
            probs[vocab[str(k)]].item() for k in range(1, 10))
        assert abs(plain_only - by_hand) > 0.05  # the marker spellings matter here


def test_openai_top_tokens_are_summed_by_label():
    top = {"9": math.log(0.2), " 9": math.log(0.1), "\u25819": math.log(0.05), "8": math.log(0.3), "x": math.log(0.3)}
    got = labels_from_top(top, LABELS)
    assert set(got) == {"8", "9"}
    assert math.exp(got["9"]) == pytest.approx(0.35)
    assert math.exp(got["8"]) == pytest.approx(0.3)


def test_one_readable_order_is_recorded_and_a_setting():
    used = combine_orders(None, 0.2)
    assert used.first_wins == pytest.approx(0.2) and used.orders_used == 1 and "only one order" in used.note
    skipped = combine_orders(0.9, None, single_order="skip")
    assert skipped.first_wins == 0.5 and skipped.orders_used == 0 and "skipped" in skipped.note
    assert combine_orders(0.8, 0.6).orders_used == 2
    assert used.flipped().orders_used == 1


def _one_order_answer(text, labels):
    """A judge that answers A/B only when the longer response is shown first."""
    if "RESPONSE A:" not in text:
        return {"5": 0.0}
    a, b = responses_ab(text)
    return {"A": math.log(0.9), "B": math.log(0.1)} if len(a) > len(b) else {"yes": 0.0}


@pytest.mark.parametrize("single_order", ["score", "skip"])
def test_judge_with_one_readable_order(chat_tokenizer, short_charter, single_order):
    judge = ConstitutionalJudge(ScriptedBackend(chat_tokenizer, _one_order_answer), short_charter,
                                single_order=single_order, top_k_pairwise=2)
    comparison = judge.compare_pairs([(prompt("Hi?"), "Hi", "Hello there")])[0]
    assert comparison.p_first_as_a is None and comparison.p_first_as_b == pytest.approx(0.1)
    group = judge.score_groups([prompt("Hi?")], [["Hi", "Hello there"]])[0]
    if single_order == "score":
        assert comparison.orders_used == 1 and comparison.first_wins == pytest.approx(0.1)
        assert [s.details["pairwise_rank"] for s in group] == [2, 1]
        assert [s.details["pairwise_single_order"] for s in group] == [1, 1]
    else:
        assert comparison.orders_used == 0 and comparison.first_wins == 0.5
        assert [s.details["pairwise_rank"] for s in group] == [1, 2]  # undecided: pointwise order kept
        assert [s.details["pairwise_single_order"] for s in group] == [0, 0]
    assert judge.fingerprint()["single_order"] == single_order


def test_empty_completion_with_the_best_pointwise_score_is_ranked_last(chat_tokenizer, short_charter):
    def answer(text, labels):
        if "RESPONSE A:" in text:
            a, b = responses_ab(text)
            assert a.strip() and b.strip(), "an empty completion reached the pairwise judge"
            return {"A": math.log(0.7), "B": math.log(0.3)}
        return {"9": 0.0} if not response_of(text).strip() else {"6": math.log(0.5), "7": math.log(0.5)}

    judge = ConstitutionalJudge(ScriptedBackend(chat_tokenizer, answer), short_charter, top_k_pairwise=5)
    group = ["A reply.", "", "Another reply.", "  ", "A third reply."]
    pointwise = judge.score([prompt("Hi?")] * len(group), group)
    final = judge.score_groups([prompt("Hi?")], [group])[0]
    for i in (1, 3):
        assert "pairwise_rank" not in final[i].details
        assert final[i].value < min(final[j].value for j in (0, 2, 4))
        assert final[i].value <= pointwise[i].value
    assert sorted(final[j].details["pairwise_rank"] for j in (0, 2, 4)) == [1, 2, 3]


def _fake_llm(tokenizer, caching):
    cache_config = types.SimpleNamespace(enable_prefix_caching=caching)
    engine = types.SimpleNamespace(vllm_config=types.SimpleNamespace(cache_config=cache_config))
    return types.SimpleNamespace(llm_engine=engine, get_tokenizer=lambda: tokenizer)


def test_ready_made_vllm_engine_without_prefix_caching_warns(chat_tokenizer):
    from rewards.judge_backends.vllm_backend import VLLMJudgeBackend

    with pytest.warns(UserWarning, match=r"prefix caching off.*recomputed for every prompt"):
        VLLMJudgeBackend(llm=_fake_llm(chat_tokenizer, False))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        VLLMJudgeBackend(llm=_fake_llm(chat_tokenizer, True))


@pytest.fixture(scope="module")
def metaspace_tokenizer():
    """A SentencePiece-style tokenizer (Metaspace "▁" word marker): "A" encodes as ["▁", "A"]."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from align.testing.tiny import corpus_text

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>", "<pad>"], show_progress=False)
    tok.train_from_iterator(corpus_text().splitlines(), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>")


def test_sentencepiece_split_labels_are_read_from_their_tokens(metaspace_tokenizer):
    from align.testing.tiny import build_causal_lm
    from rewards.judge_backends import single_token_ids

    tok = metaspace_tokenizer
    assert tok.convert_ids_to_tokens(tok("A", add_special_tokens=False)["input_ids"]) == ["\u2581", "A"]
    with pytest.raises(ValueError, match="is 2 tokens"):  # the plain spelling check refuses it
        single_token_ids(tok, ["A", "B"])
    labels = ["A", "B", *LABELS]
    groups = label_token_ids(tok, labels)
    for label in labels:
        spellings = set(tok.convert_ids_to_tokens(groups[label]))
        assert label in spellings and spellings <= {label, "\u2581" + label}
    model = build_causal_lm(tok, seed=2)
    backend = TransformersJudgeBackend(model, tok, show_progress=False)
    text = "Rate this answer from 1 to 9: Paris is the capital of France."
    got = backend.label_logprobs([text], labels)[0]
    ids = tok(text, add_special_tokens=True)["input_ids"]
    with torch.no_grad():
        probs = torch.softmax(model(input_ids=torch.tensor([ids])).logits[0, -1].double(), dim=-1)
    vocab = tok.get_vocab()
    for label in labels:
        by_hand = sum(probs[vocab[s]].item() for s in (label, "\u2581" + label) if s in vocab)
        assert math.exp(got[label]) == pytest.approx(by_hand, rel=1e-4)
