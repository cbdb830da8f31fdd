"""Clients of an OpenAI-compatible server as a cluster has one: its own context length, a prompt it refuses
for its length, a server slow or busy under 16 array tasks, and one that fails as servers do (drips its answer,
aborts a request, cuts an answer short, answers in another shape, refuses the settings). Against a local server
that answers like vLLM's."""

from __future__ import annotations

import base64
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import ClassVar

import pytest

from align.errors import ServiceError
from align.io.http import ServerError


class Server(BaseHTTPRequestHandler):
    """``/v1/models`` says the context length; ``/v1/completions`` answers each prompt with a few token ids, or
    400 for a prompt longer than ``refuse_over`` tokens (with OpenAI's ``context_length_exceeded`` code when
    ``length_code``, else as vLLM says it: a message only), or first sleeps / answers 429 ``slow`` / ``busy``
    times. Failing as servers do: ``drip`` answers a byte at a time, ``aborts`` answers have every choice
    aborted, ``short`` answers end before their Content-Length, ``models`` replaces the ``/models`` answer,
    ``refusal`` answers every completion with that 400 error body, ``reply`` with that answer."""

    max_model_len: ClassVar[int] = 4096
    refuse_over: ClassVar[int] = 10**9
    length_code: ClassVar[bool] = True
    slow: ClassVar[int] = 0
    busy: ClassVar[int] = 0
    delay: ClassVar[float] = 0.0
    drip: ClassVar[bool] = False
    aborts: ClassVar[int] = 0
    short: ClassVar[int] = 0
    models: ClassVar[object] = None
    refusal: ClassVar[dict | None] = None
    reply: ClassVar[object] = None
    answer: ClassVar[list[int]] = []
    requests: ClassVar[list[str]] = []
    auth: ClassVar[list[str | None]] = []

    def do_GET(self):
        Server.requests.append(self.path)
        Server.auth.append(self.headers.get("Authorization"))
        models = {"data": [{"id": "served", "max_model_len": Server.max_model_len}]}
        self._send(200, models if Server.models is None else Server.models)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Server.requests.append(self.path)
        Server.auth.append(self.headers.get("Authorization"))
        if Server.slow > 0:
            Server.slow -= 1
            time.sleep(Server.delay)
        if Server.busy > 0:
            Server.busy -= 1
            return self._send(429, {"error": "too many requests"})
        if Server.refusal is not None:
            return self._send(400, Server.refusal)
        if Server.reply is not None:
            return self._send(200, Server.reply)
        prompts = body["prompt"] if isinstance(body["prompt"][0], (list, str)) else [body["prompt"]]
        if any(len(p) > Server.refuse_over for p in prompts):
            message = f"This model's maximum context length is {Server.refuse_over} tokens. However, you requested " \
                      "more tokens."
            if Server.length_code:
                return self._send(400, {"error": {"message": message, "type": "invalid_request_error",
                                                  "param": "messages", "code": "context_length_exceeded"}})
            return self._send(400, {"error": {"message": message, "type": "BadRequestError", "param": None,
                                              "code": 400}})
        reason = "stop"
        if Server.aborts > 0:
            Server.aborts -= 1
            reason = "abort"
        if "stop_token_ids" in body:  # the sampler: token ids, ended by a stop token
            ids = Server.answer + [body["stop_token_ids"][0]]
            choices = [{"index": i, "token_ids": ids, "finish_reason": reason} for i in range(body["n"])]
        else:  # the judge: the first position's top log-probs
            choices = [{"index": i, "text": "7", "finish_reason": "length" if reason == "stop" else reason,
                        "logprobs": {"top_logprobs": [{"7": -0.1, "3": -2.5}]}} for i in range(len(prompts))]
        self._send(200, {"choices": choices})

    def _send(self, status, data):
        raw = json.dumps(data).encode()
        cut = Server.short > 0 and status == 200 and self.command == "POST"
        Server.short -= cut
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw) + 100 * cut))  # a cut answer: 100 bytes never come
            self.end_headers()
            if not Server.drip:
                self.wfile.write(raw)
                return
            for byte in raw:  # a server that drips: a byte every 0.2 s, each read well inside any timeout
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(0.2)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up waiting (a timeout test)

    def log_message(self, *args):
        pass


@pytest.fixture()
def server(tiny_dirs):
    from transformers import AutoTokenizer

    Server.max_model_len, Server.refuse_over, Server.slow, Server.busy, Server.delay = 4096, 10**9, 0, 0, 0.0
    Server.length_code, Server.drip, Server.aborts, Server.short, Server.models = True, False, 0, 0, None
    Server.refusal, Server.reply = None, None
    Server.requests, Server.auth = [], []
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
    with pytest.raises(ConfigError, match=r"timeout_s: must be a number of seconds in \(0, 604800\]"):
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


# --------------------------------------------------------------------------- servers failing as servers do


def _sample(client, rows, out, **keys):
    from align.sampling.stages import sample_references

    return sample_references(rows, client, output_dir=out, n=keys.pop("n", 1), max_tokens=4, **keys)


def _completion_requests() -> int:
    return sum(path == "/v1/completions" for path in Server.requests)


def test_vllms_length_refusal_without_a_code_is_a_server_error_naming_url_status_and_message(
        server, chat_policy, tmp_path):
    """vLLM says a prompt is too long only in words (type BadRequestError, no code): no words are read, so it
    fails the job rather than being recorded as a skip (the preflight against /models skips such a prompt)."""
    rows = [prompt("short"), prompt("long", words=60)]
    client = sampler(server, chat_policy, max_retries=0)
    Server.refuse_over, Server.length_code = len(client.encoder.prompt_ids(rows[0]["messages"])) + 20, False
    with pytest.raises(ServerError, match=rf"^{server}/completions: HTTP 400 BadRequestError: This model's maximum "
                                          "context length is"):
        _sample(client, rows, tmp_path / "s")


def test_a_400_about_the_settings_is_an_error_not_a_too_long_skip(server, chat_policy, tmp_path):
    Server.refusal = {"error": {"message": "n=4 exceeds the server's max_num_seqs (2); the prompt is too long "
                                "for nothing", "type": "BadRequestError", "param": None, "code": 400}}
    with pytest.raises(ServerError, match=rf"^{server}/completions: HTTP 400 BadRequestError: n=4 exceeds the "
                                          r"server's max_num_seqs \(2\)") as error:
        _sample(sampler(server, chat_policy), [prompt("a")], tmp_path / "s", n=4)
    assert error.value.status == 400 and _completion_requests() == 1  # a refusal is not asked again
    assert not list((tmp_path / "s").glob("_COMPLETE*"))


def test_the_older_vllm_error_body_is_read_too():
    from align.io.http import error_body

    body = error_body(b'{"object": "error", "message": "bad  n", "type": "BadRequestError", "code": 400}')
    assert (body.message, body.type, body.code) == ("bad n", "BadRequestError", None)
    assert error_body(b'{"detail": [{"loc": ["body", "n"]}]}').message == '[{"loc": ["body", "n"]}]'
    assert error_body(b"<html>Bad Gateway</html>").message == "<html>Bad Gateway</html>"


def test_a_server_that_drips_its_answer_is_cut_at_the_deadline(server, chat_policy):
    """One byte every 0.2 s: each socket read is well inside a 1 s timeout, the whole answer is not."""
    Server.drip = True
    client = sampler(server, chat_policy, timeout_s=1, max_retries=0)
    with pytest.raises(ServerError, match=rf"^{server}/models: request failed after 1 tries \(timeout 1 s each\): "
                                          r"no whole answer within 1 s$"):
        _ = client.max_model_len


def test_an_aborted_answer_is_asked_again(server, chat_policy, tmp_path):
    Server.aborts = 1
    _sample(sampler(server, chat_policy, max_retries=1), [prompt("a")], tmp_path / "s", n=2)
    assert _completion_requests() == 2
    Server.aborts = 10
    with pytest.raises(ServerError, match=rf"^{server}/completions: the server aborted 2 of 2 choices "
                                          r"\(finish_reason 'abort'\) after 2 tries$"):
        sampler(server, chat_policy, max_retries=1).sample([prompt("a")["messages"]], 2, max_tokens=2)


def test_an_answer_cut_short_is_asked_again(server, chat_policy):
    Server.short = 1
    client = sampler(server, chat_policy, max_retries=1)
    assert client.sample([prompt("a")["messages"]], 1, max_tokens=2)[0][0].text == "yes"
    assert _completion_requests() == 2
    Server.short = 10
    with pytest.raises(ServerError, match=rf"^{server}/completions: the answer was cut short after 1 tries "
                                          r"\(\d+ bytes of \d+\)$"):
        sampler(server, chat_policy, max_retries=0).sample([prompt("a")["messages"]], 1, max_tokens=2)


def test_the_judge_asks_again_for_an_aborted_or_cut_answer(server, chat_policy):
    from rewards.judge_backends import OpenAIJudgeBackend

    backend = OpenAIJudgeBackend(server, "served", str(chat_policy), max_retries=1)
    for failure in ("aborts", "short"):
        Server.requests = []
        setattr(Server, failure, 1)
        assert backend.label_logprobs(["prompt"], ["7"])[0]["7"] == pytest.approx(-0.1)
        assert _completion_requests() == 2


@pytest.mark.parametrize(("models", "problem"), [
    ([{"id": "served", "max_model_len": 4096}], "answer is a JSON list, not an object"),
    ({"data": {"served": 4096}}, "the answer has no list of models"),
    ({"data": [{"name": "served"}]}, "the answer has no list of models"),
])
def test_a_models_answer_of_another_shape_names_the_url(server, chat_policy, models, problem):
    from rewards.judge_backends import OpenAIJudgeBackend

    Server.models = models
    with pytest.raises(ServerError, match=rf"^{server}/models: {problem}"):
        _ = sampler(server, chat_policy).max_model_len
    with pytest.raises(ServerError, match=rf"^{server}/models: {problem}"):
        _ = OpenAIJudgeBackend(server, "served", str(chat_policy)).max_model_len


def test_a_model_the_server_does_not_hold_is_named():
    from align.io.http import served_model

    reply = {"data": [{"id": "other", "max_model_len": 8}]}
    assert served_model(reply, "served", "http://h/v1/models") is None
    assert served_model(reply, "other", "http://h/v1/models") == reply["data"][0]


@pytest.mark.parametrize(("reply", "problem"), [
    ({"choices": {"0": {}}}, "the answer has no list of choices"),
    ({"choices": [{"index": 3, "token_ids": [1], "finish_reason": "stop"}]}, r"expected 1 choices indexed 0\.\.0"),
    ({"choices": [{"index": 0, "token_ids": "1 2", "finish_reason": "stop"}]}, "a choice has no list of token_ids"),
    ({"choices": [{"index": 0, "token_ids": [5], "finish_reason": "stop"}]},
     "the server finished with 'stop' but the generated ids say 'length'"),
])
def test_a_completions_answer_of_another_shape_names_the_url(server, chat_policy, reply, problem):
    """The choices of a sampler's request checked before they become completions (no KeyError, no RuntimeError)."""
    from align.io.http import check_choices

    Server.reply = reply
    with pytest.raises(ServerError, match=rf"^{server}/completions: {problem}"):
        sampler(server, chat_policy, max_model_len=512).sample([prompt("a")["messages"]], 1, max_tokens=2)
    assert check_choices({"choices": [{"index": 1}, {"index": 0}]}, 2, "u") == [{"index": 0}, {"index": 1}]


# --------------------------------------------------------------------------- the recipe's connection settings


def test_credentials_in_the_url_are_sent_as_the_authorization_header(server, chat_policy, tmp_path, monkeypatch):
    from rewards.judge_backends import OpenAIJudgeBackend

    monkeypatch.setenv("OPENAI_API_KEY", "not-this-one")
    port = server.split(":")[2].split("/")[0]
    client = sampler(f"http://ana:p%40ss-981@127.0.0.1:{port}/v1", chat_policy, max_retries=0)
    assert client.base_url == server  # what is printed
    assert client.sample([prompt("a")["messages"]], 1, max_tokens=2)[0][0].text == "yes"
    assert set(Server.auth) == {"Basic " + base64.b64encode(b"ana:p@ss-981").decode()}
    Server.auth = []
    judge = OpenAIJudgeBackend(f"{server}?api_key=k-3141", "served", str(chat_policy), max_retries=0)
    judge.label_logprobs(["prompt"], ["7"])
    assert set(Server.auth) == {"Bearer k-3141"} and not [p for p in Server.requests if "k-3141" in p]
    Server.refusal = {"error": {"message": "no", "type": "BadRequestError"}}
    for url in (f"http://ana:p%40ss-981@127.0.0.1:{port}/v1", f"{server}?api_key=k-3141"):
        with pytest.raises(ServerError, match="HTTP 400 BadRequestError: no") as error:
            sampler(url, chat_policy, max_model_len=512).sample([prompt("a")["messages"]], 1, max_tokens=2)
        assert "981" not in str(error.value) and "3141" not in str(error.value)


def test_a_url_with_two_credentials_or_one_and_api_key_env_is_refused_at_load():
    from align.config import load_config
    from align.errors import ConfigError
    from align.stages.sample import Config

    base = ["prompts=p.jsonl", "sampler.backend=openai", "sampler.model=m"]
    with pytest.raises(ConfigError, match="carries more than one credential") as error:
        load_config(Config, None, [*base, "sampler.base_url=http://u:secret-1@h:8/v1?api_key=secret-2"])
    assert "secret" not in str(error.value)
    with pytest.raises(ConfigError, match=r"carries credentials and api_key_env names \$MY_KEY: keep one") as error:
        load_config(Config, None, [*base, "sampler.base_url=http://h:8/v1?api_key=secret-3", "sampler.api_key_env=MY_KEY"])
    assert "secret" not in str(error.value)
    with pytest.raises(ConfigError, match="not an http"):
        load_config(Config, None, [*base, "sampler.base_url=node17:8000/v1"])


@pytest.mark.parametrize(("url", "problem"), [
    ("node17:8000/v1", r"not an http\(s\) URL with a host"),
    ("http://node17:99999/v1", r"not a URL \(Port out of range"),
    ("http://[::1/v1", r"not a URL \(Invalid IPv6 URL\)"),
])
def test_a_base_url_that_is_no_http_url_is_refused_at_load(url, problem):
    from align.config import load_config
    from align.errors import ConfigError
    from align.stages.sample import Config

    with pytest.raises(ConfigError, match=problem):
        load_config(Config, None, ["prompts=p.jsonl", "sampler.backend=openai", "sampler.model=m",
                                   f"sampler.base_url={url}"])


def test_base_url_takes_environment_variables(monkeypatch):
    from align.config import load_config
    from align.errors import ConfigError
    from align.stages.annotate import Config as Annotate
    from align.stages.sample import Config as Sample

    monkeypatch.setenv("VLLM_URL", "http://node17:8000/v1")
    monkeypatch.setenv("VLLM_PORT", "8001")
    monkeypatch.delenv("ALIGN_NO_SUCH_URL", raising=False)
    base = ["prompts=p.jsonl", "sampler.backend=openai", "sampler.model=m"]
    assert load_config(Sample, None, [*base, "sampler.base_url=$VLLM_URL"]).sampler.base_url == "http://node17:8000/v1"
    judge = load_config(Annotate, None, ["input=a.jsonl", "provider=judge", "model=m", "backend=openai",
                                         "base_url=http://node17:${VLLM_PORT}/v1"])
    assert judge.base_url == "http://node17:8001/v1"
    with pytest.raises(ConfigError, match=r"base_url='\$ALIGN_NO_SUCH_URL': \$ALIGN_NO_SUCH_URL is not set"):
        load_config(Sample, None, [*base, "sampler.base_url=$ALIGN_NO_SUCH_URL"])


@pytest.mark.parametrize(("key", "value", "problem"), [
    ("timeout_s", "1e12", r"timeout_s: must be a number of seconds in \(0, 604800\]"),
    ("timeout_s", "0", r"timeout_s: must be a number of seconds in \(0, 604800\]"),
    ("timeout_s", "-5", r"timeout_s: must be a number of seconds in \(0, 604800\]"),
    ("max_retries", "-1", r"max_retries: must be an integer in \[0, 100\], got -1"),
    ("max_retries", "1000000", r"max_retries: must be an integer in \[0, 100\], got 1000000"),
    ("concurrency", "0", r"concurrency: must be an integer in \[1, 1024\], got 0"),
    ("concurrency", "100000", r"concurrency: must be an integer in \[1, 1024\], got 100000"),
])
def test_the_connection_settings_are_bounded_at_load(key, value, problem):
    from align.config import load_config
    from align.errors import ConfigError
    from align.stages.annotate import Config as Annotate
    from align.stages.sample import Config as Sample

    with pytest.raises(ConfigError, match=problem):
        load_config(Sample, None, ["prompts=p.jsonl", f"sampler.{key}={value}"])
    if key != "concurrency":
        with pytest.raises(ConfigError, match=problem):
            load_config(Annotate, None, ["input=a.jsonl", "provider=verifiable", f"{key}={value}"])


def test_a_week_of_timeout_is_accepted_and_works(server, chat_policy):
    client = sampler(server, chat_policy, timeout_s=7 * 24 * 3600, max_retries=100)
    assert client.sample([prompt("a")["messages"]], 1, max_tokens=2)[0][0].text == "yes"


def test_every_prompt_over_the_servers_context_fails_the_job_before_it_writes(server, chat_policy, tmp_path):
    from align.errors import InputError

    Server.max_model_len = 8
    client = sampler(server, chat_policy)
    rows = [prompt("a", words=5), prompt("b", words=3)]
    shortest = len(client.encoder.prompt_ids(rows[1]["messages"]))
    with pytest.raises(InputError, match=rf"every prompt is too long for the context length of 8 tokens \(the "
                                         rf"server's max_model_len \({server}/models\)\): the shortest has "
                                         rf"{shortest} tokens"):
        _sample(client, rows, tmp_path / "s")
    assert not (tmp_path / "s").exists() and _completion_requests() == 0


def test_a_shard_whose_prompts_are_all_too_long_goes_on_when_another_shards_fit(server, chat_policy, tmp_path):
    from align.jobs.sharding import shard_of
    from align.sampling.stages import sample_references

    ids = [f"p{i}" for i in range(40)]
    first = next(i for i in ids if shard_of(i, 2) == 0)
    second = next(i for i in ids if shard_of(i, 2) == 1)
    Server.max_model_len = 120
    rows = [prompt(first, words=400), prompt(second)]  # shard 0 holds only the long one
    client = sampler(server, chat_policy)
    sample_references(rows, client, output_dir=tmp_path / "s", n=1, max_tokens=4, shard_index=0, num_shards=2)
    out = [json.loads(line) for path in (tmp_path / "s").glob("shard-*.jsonl") for line in path.read_text().splitlines()
           if line.startswith("{")]
    assert [r["id"] for r in out] == [first] and "context length is 120" in out[0]["skip_reason"]


# --------------------------------------------------------------------------- resumes and submissions


def _cli(args) -> tuple[int, str, str]:
    import contextlib
    import io

    from align.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in args])
    return rc, out.getvalue(), err.getvalue()


def _sample_args(tmp_path, url, chat_policy) -> list:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps(prompt("a")) + "\n")
    return ["sample", f"prompts={prompts}", f"output_dir={tmp_path / 'out'}", "sampler.backend=openai",
            f"sampler.base_url={url}", "sampler.model=served", f"sampler.tokenizer={chat_policy}",
            "sampler.chat_date=2026-01-01", "n=1", "max_tokens=4"]


def test_a_finished_sample_stays_current_when_only_the_connection_changes(server, chat_policy, tmp_path,
                                                                          monkeypatch):
    """The server back on another port, a longer timeout, more retries, a key variable: the same samples."""
    from align.io import stage_completion_info

    monkeypatch.setenv("ALIGN_TEST_SERVER_KEY", "k")
    rc, _, err = _cli(_sample_args(tmp_path, server, chat_policy))
    assert rc == 0, err
    done = stage_completion_info(tmp_path / "out")
    other = HTTPServer(("127.0.0.1", 0), Server)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        moved = f"http://127.0.0.1:{other.server_address[1]}/v1"
        rc, out, err = _cli([*_sample_args(tmp_path, moved, chat_policy), "sampler.timeout_s=60",
                             "sampler.max_retries=1", "sampler.concurrency=2",
                             "sampler.api_key_env=ALIGN_TEST_SERVER_KEY"])
    finally:
        other.shutdown()
        other.server_close()
    assert rc == 0, err
    assert "is already complete; skipping" in out and stage_completion_info(tmp_path / "out") == done
    rc, _, err = _cli([*_sample_args(tmp_path, server, chat_policy), "n=2"])  # a setting that changes results
    assert rc == 2 and "StaleOutputError" in err and "sample.n: 1 → 2" in err, err


def test_the_judges_connection_settings_are_left_out_of_its_manifest():
    from align.config import load_config
    from align.manifests import build_manifest
    from align.stages.annotate import Config

    base = ["input=a.jsonl", "provider=judge", "model=served", "backend=openai"]
    first = load_config(Config, None, [*base, "base_url=http://node17:8000/v1"])
    moved = load_config(Config, None, [*base, "base_url=http://node18:8001/v1", "timeout_s=60", "max_retries=0",
                                       "api_key_env=MY_KEY"])
    assert build_manifest("annotate", first).fingerprint == build_manifest("annotate", moved).fingerprint
    other = load_config(Config, None, [*base, "base_url=http://node17:8000/v1", "model=other"])
    assert build_manifest("annotate", first).fingerprint != build_manifest("annotate", other).fingerprint


def test_a_submission_cannot_carry_credentials_in_a_url(chat_policy, tmp_path, monkeypatch):
    """The recipe the jobs read leaves credentials out, so a job would reach the server without them: a dry
    run says a real submission refuses, a real one refuses before anything is queued, and nothing written
    holds them."""
    import yaml

    from align.drivers import submit

    monkeypatch.chdir(tmp_path)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps(prompt("a")) + "\n")
    sampler_keys = {"backend": "openai", "base_url": "http://ana:pw-2718@node17:8000/v1", "model": "served",
                    "tokenizer": str(chat_policy)}
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"output_dir": str(tmp_path / "runs"), "slurm": {"log_dir": "logs"},
                                      "steps": {"sample": {"stage": "sample", "prompts": str(prompts),
                                                           "sampler": sampler_keys}}}))
    rc, out, err = _cli(["submit", recipe, "dry_run=true"])
    assert rc == 0, err
    assert "a real submission would refuse: sample.sampler.base_url='http://node17:8000/v1' carries credentials" \
        in out and "api_key_env" in out
    written = [p for p in (tmp_path / "logs").rglob("*") if p.is_file()]
    assert written and not [p for p in written if "2718" in p.read_text(errors="replace")]
    monkeypatch.setattr(submit, "code_snapshot", lambda log_dir: log_dir)
    monkeypatch.setattr(submit, "sbatch", lambda *a, **k: pytest.fail("a job was queued"))
    rc, out, err = _cli(["submit", recipe])
    assert rc == 2 and "ConfigError: the jobs would fail" in err and "carries credentials" in err, err
    assert "2718" not in out + err
