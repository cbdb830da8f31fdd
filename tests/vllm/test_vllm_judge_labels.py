"""vLLM judge: a label's probability is the sum over every token that spells it.

Runs in the vLLM environment (`bash .ci/setup_vllm_env.sh`, then
`.venv-vllm/bin/python -m pytest tests/vllm`); skipped only when vllm is not importable.

The tiny byte-level vocabulary spells each digit two ways, "k" and "Ġk" (" k"). The test
model's output rows for both spellings of 1..5 point along the mean answer-position hidden
state (large logits, so all ten are in vLLM's top-20) and the rows of 6..9 against it.
vLLM's score must then equal Σ k·p(k) / Σ p(k) computed by hand from the full logits with
p(k) = p("k") + p("Ġk"), and differ clearly from the score of the plain spellings alone.
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

CHARTER = parse_charter("# Labels\n\n## 1. Quality\n[1.1] Answer the question asked.\n", "vllm-label-charter")
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Name a prime number."}],
    [{"role": "user", "content": "How can a town reduce traffic?"}],
]
RESPONSES = ["Paris.", "7", "More buses and bike lanes."]
# both spellings in the top-20, with different weights so the sum is not a rescaling
VISIBLE = {"1": 8.0, "2": 9.0, "3": 10.0, "4": 9.0, "5": 8.0,
           "\u01201": 10.5, "\u01202": 8.5, "\u01203": 8.0, "\u01204": 9.5, "\u01205": 10.0}
HIDDEN = {s: -10.0 for k in range(6, 10) for s in (str(k), f"\u0120{k}")}


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory):
    from align.chat import install_format
    from align.testing.tiny import build_causal_lm, build_tokenizer

    tok = build_tokenizer()
    install_format(tok, chat_format="apertus")
    model = build_causal_lm(tok, seed=6, tie_word_embeddings=False)
    plain = ConstitutionalJudge(TransformersJudgeBackend(model, tok, show_progress=False), CHARTER, top_k_pairwise=0)
    prompts = [plain.pointwise_prompt(c, r) for c, r in zip(CONVERSATIONS, RESPONSES)]
    with torch.no_grad():
        states = [model.model(input_ids=torch.tensor([tok(p, add_special_tokens=False)["input_ids"]])).last_hidden_state[0, -1]
                  for p in prompts]
        mean = torch.stack(states).mean(0)
        direction = mean / mean.dot(mean)
        generator = torch.Generator().manual_seed(1)
        for token, logit in {**VISIBLE, **HIDDEN}.items():
            spread = torch.randn(mean.shape, generator=generator)
            spread -= spread.dot(mean) * direction
            model.lm_head.weight[tok.convert_tokens_to_ids(token)] = logit * direction + 10 * spread / spread.norm()
    path = tmp_path_factory.mktemp("vllm_judge_labels")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_vllm_score_sums_both_spellings(judge_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    llm = vllm.LLM(model=str(judge_dir), enable_prefix_caching=True, dtype="float32", max_model_len=2048, seed=0,
                   enforce_eager=True)
    judge = ConstitutionalJudge(VLLMJudgeBackend(llm=llm, show_progress=False), CHARTER, scale=(1, 5), top_k_pairwise=0)
    tok = AutoTokenizer.from_pretrained(judge_dir)
    model = AutoModelForCausalLM.from_pretrained(judge_dir, dtype=torch.float32).eval()
    vocab = tok.get_vocab()
    scores = judge.score(CONVERSATIONS, RESPONSES)
    for conversation, response, score in zip(CONVERSATIONS, RESPONSES, scores):
        ids = tok(judge.pointwise_prompt(conversation, response), add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            probs = torch.softmax(model(input_ids=torch.tensor([ids])).logits[0, -1].double(), dim=-1)
        p = {k: probs[vocab[str(k)]].item() + probs[vocab[f"\u0120{k}"]].item() for k in range(1, 6)}
        by_hand = sum(k * pk for k, pk in p.items()) / sum(p.values())
        plain = {k: probs[vocab[str(k)]].item() for k in range(1, 6)}
        plain_only = sum(k * pk for k, pk in plain.items()) / sum(plain.values())
        assert score.value == pytest.approx(by_hand, abs=1e-4)
        assert score.details["scale_mass"] == pytest.approx(sum(p.values()), abs=1e-4)
        assert abs(plain_only - by_hand) > 0.05
    del llm
