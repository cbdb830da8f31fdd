"""Clients of an OpenAI-compatible server as a cluster has one: its own context length, a prompt it refuses
for its length, a server slow or busy under 16 array tasks. Against a local server that answers like vLLM's."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import ClassVar

import pytest

from align.errors import ServiceError


class Server(BaseHTTPRequestHandler):
    """``/v1/models`` says the context length; ``/v1/completions`` answers each prompt with a few token ids, or
    400 for a prompt longer than ``refuse_over`` tokens, or first sleeps / answers 429 ``slow`` / ``busy``
    times."""

    max_model_len: ClassVar[int] = 4096
    refuse_over: ClassVar[int] = 10**9
    slow: ClassVar[int] = 0
    busy: ClassVar[int] = 0
    delay: ClassVar[float] = 0.0
    answer: ClassVar[list[int]] = []
    requests: ClassVar[list[str]] = []

    def do_GET(self):
        Server.requests.append(self.path)
        self._send(200, {"data": [{"id": "served", "max_model_len": Server.max_model_len}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Server.requests.append(self.path)
        if Server.slow > 0:
            Server.slow -= 1
            time.sleep(Server.delay)
        if Server.busy > 0:
            Server.busy -= 1
            return self._send(429, {"error": "too many requests"})
        prompts = body["prompt"] if isinstance(body["prompt"][0], (list, str)) else [body["prompt"]]
        if any(len(p) > Server.refuse_over for p in prompts):
            return self._send(400, {"object": "error", "message": "This model's maximum context length is "
                                    f"{Server.refuse_over} tokens. However, you requested more tokens."})
        if "stop_token_ids" in body:  # the sampler: token ids, ended by a stop token
            ids = Server.answer + [body["stop_token_ids"][0]]
            choices = [{"index": i, "token_ids": ids, "finish_reason": "stop"} for i in range(body["n"])]
        else:  # the judge: the first position's top log-probs
            choices = [{"index": i, "text": "7", "finish_reason": "length",
                        "logprobs": {"top_logprobs": [{"7": -0.1, "3": -2.5}]}} for i in range(len(prompts))]
        self._send(200, {"choices": choices})

    def _send(self, status, data):
        raw = json.dumps(data).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up waiting (a timeout test)

    def log_message(self, *args):
        pass


@pytest.fixture()
def server(tiny_dirs):
    from transformers import AutoTokenizer

    Server.max_model_len, Server.refuse_over, Server.slow, Server.busy, Server.delay = 4096, 10**9, 0, 0, 0.0
    Server.requests = []
    Server.answer = AutoTokenizer.from_pretrained(tiny_dirs["policy"]).encode("yes", add_special_tokens=False)
    httpd = HTTPServer(("127.0.0.1", 0), Server)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def chat_policy(tmp_path_factory, tiny_dirs):
    """The tiny policy's tokenizer with the Apertus template (what a served model's tokenizer is)."""
    from transformers import AutoTokenizer

    from align.chat import install_format

    tokenizer = AutoTokenizer.from_pretrained(tiny_dirs["policy"])
    install_format(tokenizer, chat_format="apertus")
    path = tmp_path_factory.mktemp("served")
    tokenizer.save_pretrained(path)
    return path


def sampler(url, tokenizer, **keys):
    from align.sampling.config import SamplerConfig, build_sampler

    return build_sampler(SamplerConfig(backend="openai", base_url=url, model="served", tokenizer=str(tokenizer),
                                       chat_date="2026-01-01", **keys))


def prompt(rid: str, words: int = 3) -> dict:
    return {"id": rid, "messages": [{"role": "user", "content": " ".join(["word"] * words)}]}


def test_the_context_length_is_the_smaller_of_the_servers_and_the_recipes(server, chat_policy):
    Server.max_model_len = 300
    assert sampler(server, chat_policy).max_model_len == 300  # the recipe says nothing: the server's
    assert sampler(server, chat_policy, max_model_len=4096).max_model_len == 300  # a larger recipe: the server's
    assert sampler(server, chat_policy, engine_kwargs={"max_model_len": 200}).max_model_len == 200


def test_a_prompt_over_the_servers_context_is_skipped_before_it_is_sent(server, chat_policy, tmp_path):
    from align.sampling.stages import sample_references

    Server.max_model_len = 120
    rows = [prompt("short"), prompt("long", words=400)]
    sample_references(rows, sampler(server, chat_policy, max_model_len=4096), output_dir=tmp_path / "s", n=2,
                      max_tokens=4)
    out = {json.loads(line)["id"]: json.loads(line) for line in (tmp_path / "s").glob("shard-*.jsonl")
           .__next__().read_text().splitlines()}
    assert "the model's context length is 120" in out["long"]["skip_reason"] and out["long"]["completions"] == []
    assert len(out["short"]["completions"]) == 2
    assert sum(path == "/v1/completions" for path in Server.requests) == 1  # the long prompt was never sent


def test_a_prompt_the_server_refuses_for_its_length_is_a_recorded_skip(server, chat_policy, tmp_path):
    from align.sampling.stages import sample_references

    rows = [prompt("short"), prompt("long", words=60), prompt("other")]
    client = sampler(server, chat_policy)
    Server.refuse_over = len(client.encoder.prompt_ids(rows[0]["messages"])) + 20  # it tokenizes otherwise
    sample_references(rows, client, output_dir=tmp_path / "s", n=1, max_tokens=4)
    out = {r["id"]: r for line_file in (tmp_path / "s").glob("shard-*.jsonl")
           for r in map(json.loads, line_file.read_text().splitlines())}
    assert "the server refused the prompt" in out["long"]["skip_reason"]
    assert f"maximum context length is {Server.refuse_over}" in out["long"]["skip_reason"]
    assert out["long"]["completions"] == []
    assert len(out["short"]["completions"]) == len(out["other"]["completions"]) == 1  # the task went on


def test_a_slow_server_is_waited_for_and_asked_again(server, chat_policy):
    Server.slow, Server.delay = 1, 1.5  # the first request takes longer than the timeout
    client = sampler(server, chat_policy, max_model_len=512, timeout_s=0.5, max_retries=2)
    assert client.sample([prompt("a")["messages"]], 1, max_tokens=2)[0][0].text == "yes"
    Server.slow, Server.delay = 5, 1.5
    with pytest.raises(ServiceError, match=r"/completions: request failed after 2 tries \(timeout 0.5 s each\)"):
        sampler(server, chat_policy, max_model_len=512, timeout_s=0.5, max_retries=1).sample(
            [prompt("a")["messages"]], 1, max_tokens=2)


def test_a_busy_server_answering_429_is_asked_again(server, chat_policy):
    Server.busy = 2
    client = sampler(server, chat_policy, max_model_len=512, max_retries=3)
    assert client.sample([prompt("a")["messages"]], 1, max_tokens=2)[0][0].text == "yes"


def test_the_timeout_and_retries_are_recipe_settings(chat_policy):
    from align.config import ConfigError, load_config
    from align.stages.annotate import Config as Annotate
    from align.stages.sample import Config as Sample

    sample = load_config(Sample, None, ["prompts=p.jsonl", "sampler.timeout_s=3600", "sampler.max_retries=8"])
    assert (sample.sampler.timeout_s, sample.sampler.max_retries) == (3600.0, 8)
    judge = load_config(Annotate, None, ["input=a.jsonl", "provider=judge", "model=m", "backend=openai",
                                         "base_url=http://x/v1", "timeout_s=900"])
    assert (judge.timeout_s, judge.max_retries) == (900.0, 5)  # the default sized for a shared server
    with pytest.raises(ConfigError, match="timeout_s: must be > 0"):
        load_config(Sample, None, ["prompts=p.jsonl", "sampler.timeout_s=0"])


def test_the_judge_uses_the_servers_length_and_skips_a_refused_rating(server, chat_policy):
    from rewards.judge import ConstitutionalJudge
    from rewards.judge_backends import OpenAIJudgeBackend

    Server.max_model_len = 100000
    backend = OpenAIJudgeBackend(server, "served", str(chat_policy), max_model_len=8192, max_retries=0)
    assert backend.max_model_len == 8192  # the smaller
    Server.max_model_len = 900
    backend = OpenAIJudgeBackend(server, "served", str(chat_policy), max_model_len=8192, max_retries=0,
                                 batch_size=4)
    assert backend.max_model_len == 900
    Server.refuse_over = 10**9
    from rewards.charter import parse_charter

    charter = parse_charter("# C\n\n## 1. Q\n[1.1] Answer well.\n", "c")
    judge = ConstitutionalJudge(backend, charter, top_k_pairwise=0)
    conversation = [{"role": "user", "content": "Is 4 even?"}]
    Server.refuse_over = len(judge.pointwise_prompt(conversation, "yes")) + 20  # characters: the long one only
    scores = judge.score([conversation, conversation], ["yes", "yes " * 40])
    assert scores[0].value is not None
    assert scores[1].value is None and "prompt_too_long: the server refused the prompt as too long" in scores[1].reason
