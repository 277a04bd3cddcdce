"""The ``openai`` backend against a real local HTTP server speaking the OpenAI API.

The server (``ThreadingHTTPServer`` on a free port) answers ``/v1/chat/completions`` and
``/v1/completions``, records every request body, counts requests in flight, and can be told to
delay, rate-limit or reject requests, so concurrency, retries and errors are exercised through
the real ``openai`` client (the retries are its own). Refusals carry ``retry-after-ms: 1`` where
the test is not about the backoff, so the client waits a millisecond rather than its 0.5 s.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from omegaconf import OmegaConf

from cbr2.common.records import Completion, Grammar, Prompt
from cbr2.config import LLMConfig
from cbr2.llm import backend_class
from cbr2.llm.openai_compat import LLMRequestError, OpenAIBackend

KEY_ENV = "CBR2_TEST_OPENAI_KEY"

SOON = {"retry-after-ms": "1"}
"""A refusal's headers asking for a retry after 1 ms (the client honours delays of up to 2 minutes)."""


def _prompts(n):
    return [Prompt(qid=f"q{i}", system="SYSTEM PART", user=f"question {i}") for i in range(n)]


def _answer(path, body):
    """What the default server generates: names the question, then runs past the stop string."""
    if path.endswith("/chat/completions"):
        question = body["messages"][-1]["content"]
    else:
        question = body["prompt"].split("\n\n")[-1]
    return f"Find({question})\n\nJUNK"


class FakeServer:
    """State of the test server; ``respond(path, body, n)`` decides each answer.

    ``respond`` returns ``(status, headers, payload, delay_s)``, or None for the default success;
    ``n`` counts earlier requests for the same question (0 on the first try).
    """

    def __init__(self):
        self.lock = threading.Lock()
        self.requests: list[tuple[str, dict, dict]] = []
        self.tries: dict[str, int] = {}
        self.in_flight = 0
        self.max_in_flight = 0
        self.delay_s = 0.0
        self.respond = lambda path, body, n: None
        self.url = ""

    def handle(self, path, body, headers):
        key = json.dumps(body.get("messages") or body.get("prompt"))
        with self.lock:
            self.requests.append((path, body, headers))
            n = self.tries.get(key, 0)
            self.tries[key] = n + 1
        custom = self.respond(path, body, n)
        if custom is not None:
            return custom
        text = _answer(path, body)
        if path.endswith("/chat/completions"):
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}
            obj = "text_completion"
        payload = {"id": "cmpl-1", "object": obj, "created": 0, "model": body["model"], "choices": [choice],
                   "usage": {"prompt_tokens": 40, "completion_tokens": 5, "total_tokens": 45}}
        return 200, {}, payload, self.delay_s

    def bodies(self, path_end=""):
        return [b for p, b, _ in self.requests if p.endswith(path_end)]


class Handler(BaseHTTPRequestHandler):
    """Answers through ``FakeServer.handle``; a request is in flight until its answer is sent."""

    def do_POST(self):
        state: FakeServer = self.server.state
        with state.lock:
            state.in_flight += 1
            state.max_in_flight = max(state.max_in_flight, state.in_flight)
        try:
            self._answer(state)
        finally:
            with state.lock:
                state.in_flight -= 1

    def _answer(self, state):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path not in ("/v1/chat/completions", "/v1/completions"):
            status, headers, payload, delay = 404, {}, {"error": {"message": f"no route {self.path}"}}, 0.0
        else:
            status, headers, payload, delay = state.handle(self.path, body, {k.lower(): v for k, v in self.headers.items()})
        time.sleep(delay)
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
            pass

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    state = FakeServer()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.state = state
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield state
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(autouse=True)
def _no_key(monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)


def _cfg(server=None, **overrides):
    base = {"backend": "openai", "model": "Qwen/Qwen3-8B", "api_key_env": KEY_ENV, "max_new_tokens": 50,
            "concurrency": 4, "timeout_s": 5.0, "max_retries": 3}
    if server is not None:
        base["base_url"] = server.url
    return OmegaConf.merge(OmegaConf.structured(LLMConfig), base, overrides)


def test_registry_resolves_the_class():
    assert backend_class("openai") is OpenAIBackend


def test_chat_requests_and_results(server):
    prompts = _prompts(5)
    seen = {}
    got = OpenAIBackend(_cfg(server)).generate(prompts, on_result=lambda i, c: seen.__setitem__(i, c))
    assert got == [Completion(f"Find(question {i})", 40, 5) for i in range(5)]
    assert seen == dict(enumerate(got))
    bodies = sorted(server.bodies("/chat/completions"), key=lambda b: b["messages"][-1]["content"])
    assert len(bodies) == 5 and not server.bodies("/v1/completions")
    for prompt, body in zip(prompts, bodies):
        assert body["model"] == "Qwen/Qwen3-8B"
        assert body["messages"] == prompt.messages
        assert body["stop"] == ["\n\n", "\nQuestion:"] and body["temperature"] == 0 and body["max_tokens"] == 50
        assert body["chat_template_kwargs"] == {"enable_thinking": False}
    # Nothing set the key variable and the server is local: the placeholder key is sent.
    assert all(h.get("authorization") == "Bearer EMPTY" for _, _, h in server.requests)


def test_plain_completions(server, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "sekrit")
    prompts = _prompts(2)
    got = OpenAIBackend(_cfg(server, chat=False)).generate(prompts)
    assert [c.text for c in got] == ["Find(question 0)", "Find(question 1)"]
    bodies = server.bodies("/v1/completions")
    assert sorted(b["prompt"] for b in bodies) == [p.text for p in prompts]
    assert all("messages" not in b and "chat_template_kwargs" not in b for b in bodies)
    assert all(h.get("authorization") == "Bearer sekrit" for _, _, h in server.requests)


def test_order_kept_when_answers_arrive_out_of_order(server):
    # Earlier questions answer later, so completion order is the reverse of input order.
    order = []

    def slow_first(path, body, n):
        i = int(body["messages"][-1]["content"].split()[-1])
        time.sleep(0.05 * (4 - i))  # then the default answer

    server.respond = slow_first
    got = OpenAIBackend(_cfg(server, concurrency=5)).generate(_prompts(5), on_result=lambda i, c: order.append(i))
    assert [c.text for c in got] == [f"Find(question {i})" for i in range(5)]
    assert sorted(order) == list(range(5)) and order != list(range(5))


def test_concurrency_is_bounded(server):
    server.delay_s = 0.1
    got = OpenAIBackend(_cfg(server, concurrency=3)).generate(_prompts(10))
    assert len(got) == 10
    assert 2 <= server.max_in_flight <= 3


def test_rate_limits_are_retried(server):
    def limited(path, body, n):
        if n < 2:
            return 429, SOON, {"error": {"message": "slow down", "type": "rate_limit"}}, 0.0
        return None

    server.respond = limited
    got = OpenAIBackend(_cfg(server)).generate(_prompts(3))
    assert [c.text for c in got] == [f"Find(question {i})" for i in range(3)]
    assert len(server.requests) == 9  # two refusals and one success each


def test_server_errors_are_retried_then_give_up(server):
    server.respond = lambda path, body, n: (503, SOON, {"error": {"message": "overloaded"}}, 0.0)
    with pytest.raises(LLMRequestError, match=r"q0: HTTP 503 .*overloaded \(after 2 retries\)"):
        OpenAIBackend(_cfg(server, max_retries=2)).generate(_prompts(1))
    assert len(server.requests) == 3
    # The client numbers its tries; the backend reads the last number for the message.
    assert [h.get("x-stainless-retry-count") for _, _, h in server.requests] == ["0", "1", "2"]


def test_retries_follow_llm_max_retries_and_retry_after(server, monkeypatch):
    server.respond = lambda path, body, n: (429, {"retry-after-ms": "300"}, {"error": {"message": "busy"}}, 0.0)
    sleeps, sleep = [], time.sleep  # what the client is asked to wait, not how long a busy machine took
    monkeypatch.setattr(time, "sleep", lambda s: sleeps.append(s) or sleep(s))
    with pytest.raises(LLMRequestError, match=r"HTTP 429 .*busy \(after 1 retries\)"):
        OpenAIBackend(_cfg(server, max_retries=1)).generate(_prompts(1))
    assert pytest.approx(0.3) in sleeps and len(server.requests) == 2  # waited as asked, then gave up
    server.requests.clear()
    with pytest.raises(LLMRequestError, match=r"HTTP 429 .*busy$"):
        OpenAIBackend(_cfg(server, max_retries=0)).generate(_prompts(1))
    assert len(server.requests) == 1
    # A server asking for more than the client waits (2 minutes) is not retried at all.
    server.requests.clear()
    server.respond = lambda path, body, n: (429, {"retry-after": "3600"}, {"error": {"message": "come back later"}},
                                            0.0)
    with pytest.raises(LLMRequestError, match="come back later"):
        OpenAIBackend(_cfg(server, max_retries=3)).generate(_prompts(1))
    assert len(server.requests) == 1


def test_the_client_is_configured_from_the_llm_section(server):
    client = OpenAIBackend(_cfg(server, max_retries=5, timeout_s=7.5)).client()
    assert client.max_retries == 5 and client.timeout == 7.5


def test_bad_request_fails_fast_with_the_server_text(server):
    server.respond = lambda path, body, n: (400, {}, {"error": {"message": "max_tokens is too large"}}, 0.0)
    with pytest.raises(LLMRequestError, match=r"HTTP 400.*max_tokens is too large"):
        OpenAIBackend(_cfg(server, concurrency=1)).generate(_prompts(3))
    assert max(server.tries.values()) == 1  # never retried


def test_finished_results_are_reported_before_the_failure(server):
    def reject_q2(path, body, n):
        if body["messages"][-1]["content"] == "question 2":
            return 400, {}, {"error": {"message": "bad"}}, 0.0
        return None

    server.respond = reject_q2
    server.delay_s = 0.05  # long enough for the failure to cancel what has not started
    seen = []
    with pytest.raises(LLMRequestError, match="q2"):
        OpenAIBackend(_cfg(server, concurrency=1)).generate(_prompts(6), on_result=lambda i, c: seen.append(i))
    assert seen[:2] == [0, 1] and 2 not in seen
    assert len(server.requests) < 6  # what had not started was cancelled


def test_timeouts_are_retried(server):
    server.respond = lambda path, body, n: (None if n else (200, {}, {}, 1.5))  # the first try hangs
    got = OpenAIBackend(_cfg(server, timeout_s=0.4)).generate(_prompts(2))
    assert [c.text for c in got] == ["Find(question 0)", "Find(question 1)"]
    # Each first try hung and was tried again (a busy machine may time out a second try too).
    assert len(server.tries) == 2 and min(server.tries.values()) >= 2


def test_connection_errors_are_retried_then_reported():
    with pytest.raises(LLMRequestError, match=r"q0: connection error with http://127\.0\.0\.1:9/v1.*\(after 1 retries\)"):
        OpenAIBackend(_cfg(base_url="http://127.0.0.1:9/v1", max_retries=1, timeout_s=2.0)).generate(_prompts(1))


def test_missing_key_names_the_variable():
    backend = OpenAIBackend(_cfg(base_url="https://api.example.com/v1"))
    with pytest.raises(ValueError, match=KEY_ENV):
        backend.generate(_prompts(1))
    # The official API (no base_url) needs a key just the same.
    with pytest.raises(ValueError, match=KEY_ENV):
        OpenAIBackend(_cfg()).api_key()


def test_model_is_required():
    with pytest.raises(ValueError, match=r"llm\.model"):
        OpenAIBackend(LLMConfig(backend="openai"))


def test_official_api_gets_no_vllm_extras():
    kwargs = OpenAIBackend(_cfg()).request_kwargs(_prompts(1)[0])
    assert "extra_body" not in kwargs and kwargs["messages"][0]["role"] == "system"


def test_identity_render_and_chat_default():
    backend = OpenAIBackend(_cfg(base_url="https://api.example.com/v1"))  # no key needed for these
    assert backend.uses_chat
    assert backend.identity() == {"backend": "openai", "model": "Qwen/Qwen3-8B", "chat": True, "max_new_tokens": 50,
                                  "temperature": 0.0, "top_p": 1.0, "stop": ["\n\n", "\nQuestion:"]}
    assert OpenAIBackend(_cfg(temperature=0.7, seed=4)).identity()["seed"] == 4
    prompt = _prompts(1)[0]
    assert backend.render(prompt) == "[system]\nSYSTEM PART\n\n[user]\nquestion 0"
    assert OpenAIBackend(_cfg(chat=False)).render(prompt) == prompt.text
    assert backend.generate([]) == []


GRAMMAR = Grammar('root ::= "r1: FindAll[] → Count[]"', 99, {"grammar": "abc", "format": "dag", "max_bytes": 99})


def test_constrained_requests_carry_the_grammar(server):
    own = replace(_prompts(2)[1], grammar='root ::= "r1: FindAll[] → QueryName[]"')  # a grounded prompt's
    OpenAIBackend(_cfg(server), grammar=GRAMMAR).generate([_prompts(1)[0], own])
    bodies = server.bodies("/chat/completions")
    assert sorted(body["structured_outputs"]["grammar"] for body in bodies) == sorted([GRAMMAR.ebnf, own.grammar])
    assert {body["max_tokens"] for body in bodies} == {100}  # the run grammar's bound holds for a prompt's own
    assert all(body["chat_template_kwargs"] == {"enable_thinking": False} for body in bodies)


def test_the_official_api_takes_no_grammar():
    with pytest.raises(ValueError, match="generation.constrained"):
        OpenAIBackend(_cfg(), grammar=GRAMMAR)
