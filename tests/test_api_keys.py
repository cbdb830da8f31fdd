"""One API-key rule for every OpenAI-compatible client (the judge backend and the sampler).

A local server on 127.0.0.1 demands a bearer key. The key comes from $OPENAI_API_KEY, or
from the variable a recipe names with `api_key_env`; it is never read from a recipe and
never written into an output. A refused request (401/403) or a server that is down is a
one-line error naming the URL, not a traceback.
"""

from __future__ import annotations

import json
import math
import socket
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from align.cli import main
from align.io.http import ServerError, api_key_from_env, request_json

KEY = "sk-test-3c9f1e7a"


class KeyedServer(BaseHTTPRequestHandler):
    """Answers /models and /completions (judge: prompt text; sampler: token ids) when the
    bearer key is right; 401 otherwise."""

    key: ClassVar[str] = KEY
    seen: ClassVar[list[str | None]] = []

    def _authorised(self) -> bool:
        auth = self.headers.get("Authorization")
        KeyedServer.seen.append(auth)
        if auth == f"Bearer {self.key}":
            return True
        payload = b'{"error": {"message": "invalid api key", "type": "invalid_request_error"}}'
        self.send_response(401)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)
        return False

    def _json(self, data: dict) -> None:
        payload = json.dumps(data).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self):
        if self._authorised():
            self._json({"data": [{"id": "served", "max_model_len": 2048}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if not self._authorised():
            return
        if body.get("return_token_ids"):  # the sampler: ids back, ending in a stop id
            stop = body["stop_token_ids"][0]
            choices = [{"index": i, "token_ids": [40, 41, stop], "finish_reason": "stop"} for i in range(body["n"])]
        else:  # the judge: the first position's top log-probs
            top = {"7": math.log(0.6), "8": math.log(0.3)}
            choices = [{"index": i, "text": "7", "finish_reason": "length",
                        "logprobs": {"top_logprobs": [top]}} for i in range(len(body["prompt"]))]
        self._json({"choices": choices})

    def log_message(self, *args):
        pass


@pytest.fixture()
def server():
    KeyedServer.seen = []
    httpd = HTTPServer(("127.0.0.1", 0), KeyedServer)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture()
def no_keys(monkeypatch):
    for name in ("OPENAI_API_KEY", "MY_SERVER_KEY", "ALIGN_TRACEBACK"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    from align.chat import install_format
    from align.testing.tiny import build_tokenizer

    tokenizer = build_tokenizer()
    install_format(tokenizer, chat_format="apertus")
    path = tmp_path_factory.mktemp("served_tokenizer")
    tokenizer.save_pretrained(path)
    return path


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


# --------------------------------------------------------------------------- the rule


def test_the_key_comes_from_the_environment_only(no_keys):
    assert api_key_from_env() is None
    no_keys.setenv("OPENAI_API_KEY", KEY)
    assert api_key_from_env() == KEY
    no_keys.setenv("MY_SERVER_KEY", "other")
    assert api_key_from_env("MY_SERVER_KEY") == "other"
    no_keys.delenv("MY_SERVER_KEY")
    with pytest.raises(ValueError, match=r"api_key_env='MY_SERVER_KEY'.*\$MY_SERVER_KEY is not set"):
        api_key_from_env("MY_SERVER_KEY")


def test_a_key_put_where_its_variables_name_belongs_is_refused_without_echoing_it():
    with pytest.raises(ValueError, match="not the key itself") as error:
        api_key_from_env(KEY)
    assert KEY not in str(error.value)


@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_request_is_one_line_naming_the_url(status, monkeypatch):
    monkeypatch.setattr(KeyedServer, "_authorised", lambda self: self.send_error(status) or False)
    httpd = HTTPServer(("127.0.0.1", 0), KeyedServer)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/v1/models"
    try:
        with pytest.raises(ServerError, match=rf"{url}: HTTP {status}.*no API key was sent.*OPENAI_API_KEY"):
            request_json(url, method="GET", max_retries=0)
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_server_that_is_down_is_an_os_error_naming_the_url():
    url = closed_port_url()
    with pytest.raises(OSError, match=rf"{url}/models: request failed after 1 tries"):
        request_json(url + "/models", method="GET", max_retries=0)


# --------------------------------------------------------------------------- both clients


def test_the_judge_sends_the_key_from_the_environment(server, no_keys, tokenizer_dir):
    from rewards.judge_backends import OpenAIJudgeBackend

    no_keys.setenv("OPENAI_API_KEY", KEY)
    backend = OpenAIJudgeBackend(server, "served", str(tokenizer_dir), max_retries=0)
    assert backend.label_logprobs(["prompt"], ["7", "8"])[0]["7"] == pytest.approx(math.log(0.6))
    assert set(KeyedServer.seen) == {f"Bearer {KEY}"}  # its context length from /models, then the prompt


def test_the_judge_reads_the_variable_a_recipe_names(server, no_keys, tokenizer_dir):
    from rewards.judge_backends import OpenAIJudgeBackend

    no_keys.setenv("MY_SERVER_KEY", KEY)
    no_keys.setenv("OPENAI_API_KEY", "wrong")
    backend = OpenAIJudgeBackend(server, "served", str(tokenizer_dir), api_key_env="MY_SERVER_KEY", max_retries=0)
    backend.label_logprobs(["prompt"], ["7"])
    assert set(KeyedServer.seen) == {f"Bearer {KEY}"}


def test_the_judge_without_a_key_gets_a_one_line_error(server, no_keys, tokenizer_dir):
    from rewards.judge_backends import OpenAIJudgeBackend

    backend = OpenAIJudgeBackend(server, "served", str(tokenizer_dir), max_retries=0)
    with pytest.raises(ServerError, match=rf"{server}/completions: HTTP 401.*no API key was sent"):
        backend.label_logprobs(["prompt"], ["7"])
    assert set(KeyedServer.seen) == {None}


def test_the_sampler_reads_the_variable_its_config_names(server, no_keys, tokenizer_dir):
    from align.sampling.config import SamplerConfig, build_sampler

    no_keys.setenv("MY_SERVER_KEY", KEY)
    config = SamplerConfig(backend="openai", base_url=server, model="served", tokenizer=str(tokenizer_dir),
                           api_key_env="MY_SERVER_KEY", chat_date="2026-01-01")
    sampler = build_sampler(config)
    assert sampler.max_model_len == 2048
    completions = sampler.sample([[{"role": "user", "content": "hi"}]], 2, max_tokens=4)
    assert [c.finish_reason for c in completions[0]] == ["stop", "stop"]
    assert set(KeyedServer.seen) == {f"Bearer {KEY}"}


def test_the_sampler_with_a_wrong_key_is_told_the_key_was_refused(server, no_keys, tokenizer_dir):
    from align.sampling.config import SamplerConfig, build_sampler

    no_keys.setenv("OPENAI_API_KEY", "wrong")
    sampler = build_sampler(SamplerConfig(backend="openai", base_url=server, model="served",
                                          tokenizer=str(tokenizer_dir)))
    with pytest.raises(ServerError, match=rf"{server}/models: HTTP 401.*the API key sent was refused"):
        _ = sampler.max_model_len


def test_api_key_env_must_name_a_variable_in_the_recipe():
    from align.config import ConfigError, load_config
    from align.stages.annotate import Config

    with pytest.raises(ConfigError, match="api_key_env: must be the name of an environment variable") as error:
        load_config(Config, None, ["provider=verifiable", f"api_key_env={KEY}"])
    assert KEY not in str(error.value)


# --------------------------------------------------------------------------- through the CLI


def _prompts(tmp_path: Path) -> Path:
    path = tmp_path / "in.jsonl"
    row = {"id": "a", "messages": [{"role": "user", "content": "Is 4 even?"}],
           "completions": [{"text": t, "num_tokens": 1, "finish_reason": "stop", "is_reference": True,
                            "source": "policy"} for t in ("yes", "no")]}
    path.write_text(json.dumps(row) + "\n")
    return path


def _run(args: list, capsys) -> tuple[int, str]:
    rc = main([str(a) for a in args])
    return rc, capsys.readouterr().err


def _judge_args(tmp_path: Path, url: str, tokenizer_dir: Path) -> list:
    return ["annotate", f"input={_prompts(tmp_path)}", f"output_dir={tmp_path / 'out'}", "provider=judge",
            "backend=openai", f"base_url={url}", "model=served", f"tokenizer={tokenizer_dir}", "top_k_pairwise=0"]


def test_cli_judge_without_the_key_is_one_line_naming_the_url(server, no_keys, tokenizer_dir, tmp_path, capsys):
    rc, err = _run(_judge_args(tmp_path, server, tokenizer_dir), capsys)
    assert rc == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("align annotate: ")]
    assert len(lines) == 1 and f"ServerError: {server}/models: HTTP 401" in lines[0], err


def test_cli_judge_with_the_named_variable_runs_and_writes_no_key(server, no_keys, tokenizer_dir, tmp_path, capsys):
    no_keys.setenv("MY_SERVER_KEY", KEY)
    rc, err = _run([*_judge_args(tmp_path, server, tokenizer_dir), "api_key_env=MY_SERVER_KEY"], capsys)
    assert rc == 0, err
    assert set(KeyedServer.seen) == {f"Bearer {KEY}"}
    written = [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert written and not [p for p in written if KEY in p.read_text(errors="replace")]


def test_cli_sampler_against_a_server_that_is_down(no_keys, tokenizer_dir, tmp_path, capsys):
    url = closed_port_url()
    rc, err = _run(["sample", f"prompts={_prompts(tmp_path)}", f"output_dir={tmp_path / 'out'}",
                    "sampler.backend=openai", f"sampler.base_url={url}", "sampler.model=served",
                    f"sampler.tokenizer={tokenizer_dir}", "sampler.chat_date=2026-01-01", "n=2", "max_tokens=4"], capsys)
    assert rc == 2, err
    assert "Traceback" not in err and f"align sample: ServerError: {url}/models: request failed" in err, err
