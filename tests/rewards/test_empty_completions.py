"""Empty completions get a defined, lowest reward from every provider, so one empty
reference no longer costs its prompt the pair (the pairs stage needs every reference scored),
and an empty completion can be picked as the rejected sample."""

from __future__ import annotations

import copy
import math

import pytest
from judge_fakes import ScriptedBackend, response_of
from reward_cases import prompt

from align.data.pairs import make_pairs
from align.data.records import validate_rewards
from rewards.annotate import score_records
from rewards.judge import ConstitutionalJudge


def test_judge_gives_an_empty_completion_the_scale_minimum_without_asking(chat_tokenizer, short_charter):
    backend = ScriptedBackend(chat_tokenizer, lambda text, labels: {"6": math.log(0.5), "7": math.log(0.5)})
    judge = ConstitutionalJudge(backend, short_charter, scale=(1, 9), top_k_pairwise=0)
    scores = judge.score([prompt("Hi?")] * 3, ["A reply.", "", " \n"])
    assert len(backend.prompts) == 1 and response_of(backend.prompts[0]) == "A reply."
    assert scores[0].value == pytest.approx(6.5)
    for score in scores[1:]:
        assert score.value == 1.0 and score.reason is None
        assert score.details["empty_completion"] == "empty completion: given the scale minimum 1"


def test_judge_that_reads_no_scale_token_still_scores_an_empty_completion(chat_tokenizer, short_charter):
    judge = ConstitutionalJudge(ScriptedBackend(chat_tokenizer, lambda text, labels: {}), short_charter,
                                scale=(0, 5), top_k_pairwise=0)
    empty, other = judge.score([prompt("Hi?")] * 2, ["", "Hello."])
    assert empty.value == 0.0 and other.value is None


def record(rid: str, texts: list[str], answer: str = "4") -> dict:
    return {"id": rid, "messages": prompt("What is 2 + 2?"), "answer": answer,
            "completions": [{"text": t, "num_tokens": max(1, len(t.split())), "finish_reason": "stop",
                             "is_reference": True, "source": "policy"} for t in texts]}


def test_an_empty_reference_no_longer_drops_the_prompt_and_can_be_rejected():
    from rewards import VerifiableReward

    annotated = score_records([record("p", ["\\boxed{4}", "\\boxed{4}", "", "\\boxed{4}"])], VerifiableReward())
    validate_rewards(annotated[0])
    assert annotated[0]["rewards"] == [1.0, 1.0, 0.0, 1.0]
    pairs, skips = make_pairs(annotated, seed=0)
    assert skips == [] and pairs[0]["rejected"] == "" and pairs[0]["rejected_reward"] == 0.0


def test_reward_model_annotation_scores_an_empty_reference_with_its_prompts_lowest(rm_model, chat_tokenizer):
    from rewards import RewardModel

    rm = RewardModel("tiny-rm", model=copy.deepcopy(rm_model), tokenizer=chat_tokenizer, batch_size=2)
    annotated = score_records([record("p", ["Four.", "", "It is 4.", "2 + 2 = 4"])], rm)[0]
    validate_rewards(annotated)
    others = [annotated["rewards"][i] for i in (0, 2, 3)]
    assert annotated["rewards"][1] == min(others) and annotated["reward_skips"][1] is None
    assert "empty completion" in annotated["reward_details"][1]["empty_completion"]
    pairs, skips = make_pairs([annotated], seed=0)
    assert skips == [] and len(pairs) == 1
