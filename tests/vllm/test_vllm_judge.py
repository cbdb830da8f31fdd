"""The judge's vLLM path for real: top-20 logprobs on a tiny saved model, prefix caching on.

Runs in the vLLM environment (`bash .ci/setup_vllm_env.sh`, then
`.venv-vllm/bin/python -m pytest tests/vllm`); skipped only when vllm is not importable.

A random-weight model spreads its next-token probability over the whole vocabulary, so
its top-20 would rarely hold the scale digits. The test model is therefore a tiny Llama
whose output rows for "1".."5", "A" and "B" point along the mean answer-position hidden
state (large logits: always in the top-20) and whose rows for "6".."9" point against it
(never in the top-20), each with a part orthogonal to the mean so that the scores still
move with the prompt. Then vLLM's top-20 score must equal the full-logit score of the
transformers backend for scales it covers, and a scale it cannot see is a recorded skip.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

vllm = pytest.importorskip("vllm", reason="vllm is not installed (CI runs this in .venv-vllm, see .ci/setup_vllm_env.sh)")
if not hasattr(vllm, "LLM"):  # `tests/vllm` itself, imported as a namespace package: no real vllm
    pytest.skip("vllm is not installed (only the tests/vllm folder resolves as `vllm`); "
                "CI runs this in .venv-vllm, see .ci/setup_vllm_env.sh", allow_module_level=True)

import torch

from rewards.charter import parse_charter
from rewards.judge import ConstitutionalJudge
from rewards.judge_backends import TransformersJudgeBackend, VLLMJudgeBackend

pytestmark = pytest.mark.vllm

CHARTER = parse_charter(
    "# Test charter\n\n## 1. Quality\n[1.1] Answer the question asked.\n[1.2] Be correct and clear.\n\n"
    "## 2. Care\n[2.1] Avoid harm.\n[2.2] Respect the person.\n",
    "vllm-test-charter",
)
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "How can a town reduce traffic?"}],
    [{"role": "user", "content": "Name a prime number."}],
    [{"role": "user", "content": "Is it ever right to lie?"}],
]
RESPONSES = ["Paris.", "Fewer cars in the centre, more buses and bike lanes.", "7", "It depends on the harm a lie prevents."]
TARGET_LOGITS = {"1": 8.0, "2": 9.5, "3": 10.0, "4": 9.0, "5": 8.5, "A": 8.8, "B": 9.2}
HIDDEN_LOGITS = {str(k): -10.0 for k in range(6, 10)}
# the tiny vocabulary also spells each digit " k" ("Ġk"); the judge adds those up, so keep
# them far below (tests/vllm/test_vllm_judge_labels.py gives them mass on purpose)
HIDDEN_LOGITS |= {f"\u0120{k}": -10.0 for k in range(1, 10)}


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory):
    """Tiny judge model + chat tokenizer, saved for vLLM and transformers alike."""
    from align.chat import install_format
    from align.testing.tiny import build_causal_lm, build_tokenizer

    tok = build_tokenizer()
    install_format(tok, chat_format="apertus")
    model = build_causal_lm(tok, seed=5, tie_word_embeddings=False)
    plain = ConstitutionalJudge(TransformersJudgeBackend(model, tok, show_progress=False), CHARTER)
    prompts = [plain.pointwise_prompt(c, r) for c, r in zip(CONVERSATIONS, RESPONSES)]
    prompts += [plain.pairwise_prompt(CONVERSATIONS[0], RESPONSES[0], "Lyon.")]
    with torch.no_grad():
        states = [model.model(input_ids=torch.tensor([tok(p, add_special_tokens=False)["input_ids"]])).last_hidden_state[0, -1]
                  for p in prompts]
        mean = torch.stack(states).mean(0)
        direction = mean / mean.dot(mean)
        generator = torch.Generator().manual_seed(0)
        for label, logit in {**TARGET_LOGITS, **HIDDEN_LOGITS}.items():
            # plus a part orthogonal to the mean, so the logits move with the prompt (by ~±1)
            spread = torch.randn(mean.shape, generator=generator)
            spread -= spread.dot(mean) * direction
            model.lm_head.weight[tok.convert_tokens_to_ids(label)] = logit * direction + 15 * spread / spread.norm()
    path = tmp_path_factory.mktemp("vllm_judge")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def llm(judge_dir):
    engine = vllm.LLM(model=str(judge_dir), enable_prefix_caching=True, dtype="float32", max_model_len=2048,
                      disable_log_stats=False, seed=0)
    yield engine
    del engine


@pytest.fixture(scope="module")
def hf_backend(judge_dir):
    return TransformersJudgeBackend(str(judge_dir), dtype="float32", show_progress=False)


def test_prefix_caching_is_on(llm):
    assert llm.llm_engine.vllm_config.cache_config.enable_prefix_caching


@pytest.mark.parametrize("scale", [(1, 5), (1, 9)])
def test_vllm_top20_score_matches_full_logits(llm, hf_backend, scale):
    via_vllm = ConstitutionalJudge(VLLMJudgeBackend(llm=llm, show_progress=False), CHARTER, scale=scale)
    via_hf = ConstitutionalJudge(hf_backend, CHARTER, scale=scale)
    got = via_vllm.score(CONVERSATIONS, RESPONSES)
    want = via_hf.score(CONVERSATIONS, RESPONSES)
    for g, w in zip(got, want):
        # labels 6-9 sit ~20 nats below the rest: outside vLLM's top-20, negligible in full logits
        assert g.value == pytest.approx(w.value, abs=1e-4)
        assert g.details["scale_mass"] == pytest.approx(w.details["scale_mass"], abs=1e-4)
    values = [s.value for s in want]
    assert max(values) - min(values) > 0.05  # the scores really depend on the prompt


def test_scale_outside_the_top20_is_a_recorded_skip(llm):
    judge = ConstitutionalJudge(VLLMJudgeBackend(llm=llm, show_progress=False), CHARTER, scale=(6, 9))
    for score in judge.score(CONVERSATIONS[:2], RESPONSES[:2]):
        assert score.value is None and "no scale token (6-9)" in score.reason


def test_pairwise_comparison_matches_full_logits(llm, hf_backend):
    pairs = [(CONVERSATIONS[0], RESPONSES[0], "Lyon."), (CONVERSATIONS[1], RESPONSES[1], "")]
    got = ConstitutionalJudge(VLLMJudgeBackend(llm=llm, show_progress=False), CHARTER).compare_pairs(pairs)
    want = ConstitutionalJudge(hf_backend, CHARTER).compare_pairs(pairs)
    assert got[0].first_wins == pytest.approx(want[0].first_wins, abs=1e-4)
    assert got[0].p_first_as_a == pytest.approx(want[0].p_first_as_a, abs=1e-4)
    assert got[1].first_wins == 1.0 and got[1].note == "empty completion loses"


def test_second_pass_hits_the_prefix_cache(llm):
    judge = ConstitutionalJudge(VLLMJudgeBackend(llm=llm, show_progress=False), CHARTER)
    judge.score(CONVERSATIONS, RESPONSES)
    before = _prefix_hits(llm)
    judge.score([[{"role": "user", "content": "A question never asked before?"}]], ["An answer."])
    assert _prefix_hits(llm) > before  # the charter prefix came from the cache


def _prefix_hits(llm) -> float:
    for metric in llm.get_metrics():
        if metric.name == "vllm:prefix_cache_hits":
            return float(getattr(metric, "value", 0.0))
    pytest.fail(f"no prefix-cache metric among {[m.name for m in llm.get_metrics()]}")
