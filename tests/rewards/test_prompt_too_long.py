"""Judge and classifier prompts are measured against ``max_model_len`` before they are sent.

A pairwise judge prompt is the charter, the question and two completions; one prompt over
the engine's context length makes vLLM (or a server) refuse the whole ``generate`` call,
and a resumed job dies at the same batch. Each prompt is measured first; one that does not
fit is a recorded skip (``prompt_too_long``, with its length and the limit) for that rating
or comparison only, and the rest of the batch is judged as before. The tiny judge runs on
the transformers backend with a small ``max_model_len``.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from align.sampling.hf import TransformersSampler
from rewards.classifier import ControversyClassifier
from rewards.config import RewardProviderConfig, build_judge_backend
from rewards.generation import Generator
from rewards.judge import ConstitutionalJudge
from rewards.judge_backends.hf import TransformersJudgeBackend
from rewards.judge_backends.vllm_backend import VLLMJudgeBackend

CONV = [{"role": "user", "content": "Name a prime number."}]
SHORT, LONG = "Seven.", "Seven is prime, " * 60


def judge(lm, tok, charter, max_model_len):
    backend = TransformersJudgeBackend(lm, tok, batch_size=4, show_progress=False, max_model_len=max_model_len)
    return ConstitutionalJudge(backend, charter, top_k_pairwise=0)


@pytest.fixture
def limit(judge_lm, chat_tokenizer, short_charter):
    """A max_model_len between the short and the long completion's pointwise prompts."""
    probe = judge(judge_lm, chat_tokenizer, short_charter, None)
    short = probe.backend.prompt_length(probe.pointwise_prompt(CONV, SHORT))
    long = probe.backend.prompt_length(probe.pointwise_prompt(CONV, LONG))
    assert long > short + 50
    return short + 20, long


def test_a_pointwise_prompt_over_the_limit_is_a_recorded_skip(judge_lm, chat_tokenizer, short_charter, limit):
    max_model_len, long_length = limit
    scored = judge(judge_lm, chat_tokenizer, short_charter, max_model_len).score([CONV] * 3, [SHORT, LONG, SHORT])
    free = judge(judge_lm, chat_tokenizer, short_charter, None).score([CONV], [SHORT])[0]
    assert scored[0].value == pytest.approx(free.value) and scored[2].value == pytest.approx(free.value)
    assert scored[1].value is None
    assert scored[1].reason == (f"prompt_too_long: the prompt has {long_length} tokens, max_model_len is "
                                f"{max_model_len} (the prompt and one answer token must fit)")


def test_a_pairwise_comparison_over_the_limit_is_undecided_with_the_reason(judge_lm, chat_tokenizer, short_charter,
                                                                           limit):
    max_model_len, _ = limit
    the_judge = judge(judge_lm, chat_tokenizer, short_charter, max_model_len + 40)
    pair_len = the_judge.backend.prompt_length(the_judge.pairwise_prompt(CONV, SHORT, "Two."))
    assert pair_len < max_model_len + 40  # the short pair fits, the pair with the long completion does not
    short_pair, long_pair = the_judge.compare_pairs([(CONV, SHORT, "Two."), (CONV, LONG, SHORT)])
    assert short_pair.orders_used == 2 and short_pair.note is None
    assert long_pair.first_wins == 0.5 and long_pair.orders_used == 0
    assert re.fullmatch(r"prompt_too_long: the prompt has \d+ tokens, max_model_len is \d+ \(.*\)", long_pair.note)


def test_the_judge_config_carries_max_model_len_to_the_transformers_backend(tmp_path, judge_lm, chat_tokenizer):
    judge_lm.save_pretrained(tmp_path), chat_tokenizer.save_pretrained(tmp_path)
    config = RewardProviderConfig(provider="judge", model=str(tmp_path), max_model_len=64)
    assert build_judge_backend(config).max_model_len == 64
    with pytest.raises(ValueError, match="disagree"):
        RewardProviderConfig(provider="judge", backend="vllm", model="m", max_model_len=64,
                             engine_kwargs={"max_model_len": 128})
    with pytest.raises(ValueError, match="max_length"):
        RewardProviderConfig(provider="reward_model", model="m", max_model_len=64)


def test_the_vllm_backend_reads_the_engine_length(chat_tokenizer):
    engine = SimpleNamespace(get_tokenizer=lambda: chat_tokenizer,
                             llm_engine=SimpleNamespace(model_config=SimpleNamespace(max_model_len=16384)))
    assert VLLMJudgeBackend("judge", llm=engine).max_model_len == 16384


def test_a_classifier_prompt_over_the_limit_is_a_recorded_failure_not_asked(judge_lm, chat_tokenizer):
    def generator(max_model_len):
        sampler = TransformersSampler(judge_lm, chat_tokenizer, chat_format="tokenizer", max_model_len=max_model_len)
        return Generator(sampler, max_tokens=8)

    probe = generator(10_000)
    classifier = ControversyClassifier(probe, max_attempts=1)
    short = classifier.conversation(CONV)
    long_prompt = [{"role": "user", "content": "Is this fine? " * 200}]
    short_len, long_len = probe.prompt_length(short), probe.prompt_length(classifier.conversation(long_prompt))
    limit = (short_len + long_len) // 2
    inner, asked = generator(limit), []

    class Counting:  # the generator, counting the prompts sent
        prompt_length, max_model_len, max_tokens = inner.prompt_length, inner.max_model_len, inner.max_tokens

        def __call__(self, conversations, seed=0):
            asked.append(len(conversations))
            return inner(conversations, seed=seed)

    classifier.generate = Counting()
    verdicts = classifier.classify([CONV, long_prompt])
    assert asked == [1]  # only the prompt that fits was sent
    assert verdicts[1].label is None and verdicts[1].attempts == 0 and verdicts[1].raw == []
    assert verdicts[1].error == (f"prompt_too_long: the prompt has {long_len} tokens, max_model_len is "
                                 f"{limit} (the prompt and max_tokens=8 answer tokens must fit)")
    assert verdicts[0].attempts == 1
