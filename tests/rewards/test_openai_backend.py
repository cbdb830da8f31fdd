"""OpenAIJudgeBackend against a local HTTP server that answers like the completions API."""

from __future__ import annotations

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import ClassVar

import pytest
from reward_cases import prompt

from rewards.judge import ConstitutionalJudge
from rewards.judge_backends import OpenAIJudgeBackend

CANNED = {
    "DIGITS": {"7": math.log(0.5), "8": math.log(0.2), "3": math.log(0.1), "Sure": math.log(0.1)},
    "NO-DIGITS": {"Sure": math.log(0.6), "I": math.log(0.3)},
}


def top_for(prompt_text: str) -> dict[str, float]:
    if "RESPONSE A:" in prompt_text:
        p_a = 0.8 if "RESPONSE A: good" in prompt_text else 0.3
        return {"A": math.log(p_a), "B": math.log(1 - p_a)}
    return CANNED["NO-DIGITS" if "NO-DIGITS" in prompt_text else "DIGITS"]


class Handler(BaseHTTPRequestHandler):
    requests: ClassVar[list[dict]] = []
    fail_with: ClassVar[int | None] = None

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Handler.requests.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
        if Handler.fail_with:
            self.send_response(Handler.fail_with)
            self.end_headers()
            self.wfile.write(b'{"error": "model not found"}')
            return
        choices = [
            {"index": i, "text": max(top_for(p), key=top_for(p).get), "finish_reason": "length",
             "logprobs": {"tokens": ["x"], "token_logprobs": [-0.1], "top_logprobs": [top_for(p)]}}
            for i, p in enumerate(body["prompt"])
        ]
        choices.reverse()  # servers may return choices in any order; `index` says which is which
        payload = json.dumps({"id": "cmpl-1", "object": "text_completion", "choices": choices}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture()
def server():
    Handler.requests, Handler.fail_with = [], None
    httpd = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


def make_judge(url, tok, charter, **kwargs):
    backend = OpenAIJudgeBackend(url, "judge-model", tok, api_key="k", batch_size=2, max_retries=0)
    return ConstitutionalJudge(backend, charter, **kwargs)


def test_pointwise_scores_from_top_logprobs(server, chat_tokenizer, short_charter):
    judge = make_judge(server, chat_tokenizer, short_charter, top_k_pairwise=0)
    scores = judge.score([prompt("Q1?"), prompt("Q2?"), prompt("Q3 NO-DIGITS?")], ["R1", "R2", "R3"])
    expected = (7 * 0.5 + 8 * 0.2 + 3 * 0.1) / 0.8
    assert scores[0].value == pytest.approx(expected) and scores[1].value == pytest.approx(expected)
    assert scores[0].details["scale_mass"] == pytest.approx(0.8)
    assert scores[2].value is None and "no scale token (1-9)" in scores[2].reason
    assert len(Handler.requests) == 2  # batch_size 2: two requests for three prompts
    request = Handler.requests[0]
    assert request["path"] == "/v1/completions" and request["auth"] == "Bearer k"
    body = request["body"]
    assert (body["model"], body["max_tokens"], body["temperature"], body["logprobs"]) == ("judge-model", 1, 0, 20)
    sent = body["prompt"][0]
    assert not sent.startswith(chat_tokenizer.bos_token)  # the server adds its own BOS
    assert sent == judge.pointwise_prompt(prompt("Q1?"), "R1")[len(chat_tokenizer.bos_token) :]


def test_pairwise_ranking_through_the_server(server, chat_tokenizer, short_charter):
    judge = make_judge(server, chat_tokenizer, short_charter, top_k_pairwise=2)
    final = judge.score_groups([prompt("Q?")], [["bad answer", "good answer"]])[0]
    # pointwise ties (same canned logprobs), so pairwise decides: "good" wins in both orders
    assert final[1].details["pairwise_rank"] == 1 and final[0].details["pairwise_rank"] == 2
    assert final[1].details["pairwise_orders_agree"] == 1
    pairwise_prompts = [p for r in Handler.requests for p in r["body"]["prompt"] if "RESPONSE A:" in p]
    assert len(pairwise_prompts) == 2  # asked once in each order


def test_http_errors_are_reported(server, chat_tokenizer, short_charter):
    Handler.fail_with = 404
    judge = make_judge(server, chat_tokenizer, short_charter)
    with pytest.raises(RuntimeError, match="HTTP 404: .*model not found"):
        judge.score([prompt("Q?")], ["R"])


def test_unreachable_server_is_reported(chat_tokenizer, short_charter):
    judge = make_judge("http://127.0.0.1:9/v1", chat_tokenizer, short_charter)
    with pytest.raises(RuntimeError, match="request failed after 1 tries"):
        judge.score([prompt("Q?")], ["R"])
