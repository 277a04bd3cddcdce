"""``cbr2 serve`` (``cbr2.service.server``): the trace over HTTP, concurrent requests answered in
batches by one worker, each with its own answer; every bad request refused with its status and a
message while the service goes on; the time and queue bounds; the page in headless Chromium; and
the CPU default served by the real command (slow tier).

The fast tests run the real uvicorn server in a thread of the test process (the fake backend of
tests/conftest.py is in-process only) and talk to it over a real socket."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="cbr2 serve needs the [serve] extra: pip install -e '.[serve]'")
pytest.importorskip("uvicorn", reason="cbr2 serve needs the [serve] extra: pip install -e '.[serve]'")

import httpx  # after the skips: the [serve] extra brings FastAPI and its test client

from cbr2.data.benchmarks import Benchmark
from cbr2.evaluation.trace import TRACE_VERSION
from cbr2.kopl.text import to_text
from cbr2.service import KBQA, MAX_QUESTION_CHARS
from cbr2.service.server import MAX_BODY_BYTES, bind, create_app, main, make_server

ROOT = Path(__file__).resolve().parents[1]

FAST = ["llm.backend=fake", "retrieval.cases=random"]
"""The fake LLM (tests/conftest.py) and random cases: retrieval needs no encoder, linking still runs."""

QUESTION = "Between Australia and the sovereign state whose area is 9833520 square kilometre, which one has " \
           "the lower population?"
"""mini-kqapro's val-20 (answer: Australia), asked as text only."""

HOSTILE = "</script><img src=x onerror=alert(1)>"
"""Text that would run script if the page ever parsed it as markup."""

GATE = "Is this the question that holds the worker?"
"""A question whose generation waits on the test's gate (an event): the worker is busy meanwhile."""

LATE = "Is this the question that is generated late?"
"""Another question whose generation waits on an event of its own (``late``)."""

BOOM = "Which question makes the backend raise?"
"""A question whose generation raises, as a broken LLM server would."""

TRACE_KEYS = {"version", "id", "question", "gold", "linked", "knowledge", "cases", "case_views", "prompt", "generation",
              "program", "steps", "answer", "answered", "correct", "error_kind", "error", "fallback"}


def asked(prompt) -> str:
    """The question a prompt asks: the text after its last ``Question:``."""
    return prompt.user.rsplit("Question: ", 1)[1].split("\n", 1)[0]


@pytest.fixture(scope="module")
def gold():
    """mini-kqapro's val questions by text: their gold programs (DAG text)."""
    return {q.question: to_text(q.program) for q in Benchmark("mini-kqapro").questions("val")}


@pytest.fixture(scope="module")
def kbqa():
    """One ``KBQA`` for the module over the fake backend (``llm.backend=fake``), and that fake."""
    import conftest

    from cbr2 import llm

    fake = conftest.FakeBackend()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(conftest, "_registered_fake", fake)
        patch.setitem(llm.BACKENDS, "fake", "conftest:_registered_fake")
        yield KBQA.load(overrides=FAST), fake


@pytest.fixture
def gate():
    """The event ``GATE``'s generation waits on; set at the end of the test whatever happened."""
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
def late():
    """The event ``LATE``'s generation waits on."""
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
def replies(kbqa, gold, gate, late, monkeypatch):
    """The fake answers each question with its gold program (another text: a program that counts
    entities), ``GATE`` and ``LATE`` once their events are set, ``BOOM`` by raising, and ``HOSTILE`` questions with
    hostile text; it records how many prompts each ``generate`` call got."""
    _, fake = kbqa
    calls: list[int] = []

    def reply(prompt):
        question = asked(prompt)
        if question == GATE:
            assert gate.wait(60), "the test never opened the gate"
        if question == LATE:
            assert late.wait(60), "the test never let LATE go"
        if question == BOOM:
            raise RuntimeError("the LLM engine fell over")
        if HOSTILE in question:
            return HOSTILE
        return gold.get(question, "r1: FindAll[] → Count[]")

    generate = fake.generate
    monkeypatch.setattr(fake, "reply", reply)
    monkeypatch.setattr(fake, "generate", lambda prompts, on_result=None, **kw: calls.append(len(prompts)) or
                        generate(prompts, on_result))
    return calls


@contextmanager
def serving(api: KBQA, **bounds) -> Iterator[tuple[str, object]]:
    """The real server (``make_server``: uvicorn) of ``create_app(api, **bounds)`` on a free port of
    127.0.0.1, in a thread; yields its URL and the app."""
    app = create_app(api, **bounds)
    server = make_server(app, log_level="warning", **{k: v for k, v in bounds.items()
                                                     if k in ("queue_limit", "batch_size")})
    sock = bind("127.0.0.1", 0)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, 30, "the server did not start")
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", app
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
    assert not thread.is_alive(), "the server did not stop"


def wait_until(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def post(url: str, body=None, **kw) -> httpx.Response:
    return httpx.post(f"{url}/api/ask", json=body, timeout=60, **kw) if body is not None else \
        httpx.post(f"{url}/api/ask", timeout=60, **kw)


def in_threads(url: str, bodies: list[dict]) -> tuple[list[threading.Thread], list]:
    """Each body POSTed from a thread of its own; the responses land in the list, in order."""
    out: list = [None] * len(bodies)

    def one(i: int) -> None:
        out[i] = post(url, bodies[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    return threads, out


def queue(app) -> dict:
    return app.state.worker.state()


def hold_the_worker(url: str, app) -> tuple[list[threading.Thread], list]:
    """``GATE`` sent and being answered: the worker waits on the gate until the test opens it."""
    held = in_threads(url, [{"question": GATE}])
    wait_until(lambda: queue(app)["answering"] == 1, 30, "the worker never took the gate question")
    return held


def same_answer(a: dict, b: dict) -> bool:
    """Two traces of one question agree on everything but the seconds generation took."""
    keys = ("id", "question", "linked", "cases", "program", "steps", "answer", "answered", "error_kind", "error")
    return {k: a[k] for k in keys} == {k: b[k] for k in keys}


# ------------------------------------------------------------------------------------- endpoints

def test_ask_returns_the_trace_that_cbr2_ask_json_prints(kbqa, replies, gold):
    api, fake = kbqa
    direct = api.ask(QUESTION).trace
    with serving(api) as (url, _):
        response = post(url, {"question": f"  {QUESTION}\n"})
        assert response.status_code == 200 and response.headers["content-type"] == "application/json"
        trace = response.json()
        assert set(trace) == TRACE_KEYS and trace["version"] == TRACE_VERSION and same_answer(trace, direct)
        assert (trace["question"], trace["answer"], trace["answered"]) == (QUESTION, "Australia", True)
        assert trace["program"]["text"] == gold[QUESTION] and len(trace["steps"]) == 5
        assert trace["prompt"]["text"] is None
        assert response.headers["x-content-type-options"] == "nosniff"
        assert "default-src 'none'" in response.headers["content-security-policy"]

        shown = post(url, {"question": QUESTION, "show_prompt": True}).json()["prompt"]["text"]
        assert shown == fake.render(fake.prompts[-1]) and f"Question: {QUESTION}\n" in shown

        # A program that fails is still an answer: the trace says where and why.
        failed = post(url, {"question": f"Is {HOSTILE} a question?"})
        assert failed.status_code == 200
        trace = failed.json()
        assert not trace["answered"] and trace["error_kind"] == "syntax" and trace["generation"]["text"] == HOSTILE
        assert trace["question"] == f"Is {HOSTILE} a question?"  # text, as it was asked


def test_health_says_what_answers_and_how_the_queue_stands(kbqa, replies):
    api, _ = kbqa
    with serving(api, batch_size=3, queue_limit=5, timeout_s=42,
                 startup={"load_s": 1.5, "warm_up_s": 2.5}) as (url, _):
        post(url, {"question": QUESTION})
        post(url, {"question": ""})
        health = httpx.get(f"{url}/api/health", timeout=30).json()
    assert health["benchmark"] == "mini-kqapro" and health["kb"]["entities"] == 643 and health["cases"] == 2000
    assert (health["backend"], health["case_views"]["used"], health["max_question_chars"]) == ("fake", ["random"],
                                                                                               MAX_QUESTION_CHARS)
    service = health["service"]
    assert service["status"] == "ok" and service["uptime_s"] > 0
    assert (service["load_s"], service["warm_up_s"], service["request_timeout_s"]) == (1.5, 2.5, 42)
    assert service["queue"] == {"waiting": 0, "answering": 0, "limit": 5, "batch_size": 3, "batch_running_s": None,
                                "batches": 1, "answered": 1, "failed": 0}
    assert service["refused"] == {"422": 1}


def test_concurrent_requests_are_answered_in_batches_each_with_its_own_answer(kbqa, replies, gold, gate):
    """12 different questions at once while the worker is busy: they wait, then go in two
    ``ask_many`` calls (8, then 4: the batch size), and each request gets its own question's trace."""
    api, _ = kbqa
    texts = [q for q in gold if q != QUESTION][:12]
    expected = {a.question: a.trace for a in api.ask_many(texts)}
    assert len({json.dumps(t["answer"]) for t in expected.values()}) > 4  # answers that tell the questions apart
    replies.clear()
    with serving(api, batch_size=8) as (url, app):
        held, _ = hold_the_worker(url, app)
        threads, responses = in_threads(url, [{"question": q} for q in texts])
        wait_until(lambda: queue(app)["waiting"] == 12, 30, "the requests did not all wait")
        gate.set()
        for t in [*held, *threads]:
            t.join(60)
    assert replies == [1, 8, 4]  # the gate alone, then the 12 in two calls
    for text, response in zip(texts, responses, strict=True):
        assert response.status_code == 200
        assert same_answer(response.json(), expected[text]), text


def test_each_answer_is_sent_when_it_is_final_not_at_the_end_of_its_batch(kbqa, replies, gate, late):
    """llama.cpp answers a batch's prompts in turn: the request of the batch's first question is
    answered while the second's generation still runs."""
    api, _ = kbqa
    with serving(api) as (url, app):
        held, _ = hold_the_worker(url, app)
        first = in_threads(url, [{"question": QUESTION}])
        wait_until(lambda: queue(app)["waiting"] == 1, 30, "QUESTION did not wait")
        second = in_threads(url, [{"question": LATE}])
        wait_until(lambda: queue(app)["waiting"] == 2, 30, "LATE did not wait")
        gate.set()  # the next batch: [QUESTION, LATE]
        wait_until(lambda: first[1][0] is not None, 30, "QUESTION was not answered before its batch ended")
        assert first[1][0].status_code == 200 and first[1][0].json()["answer"] == "Australia"
        assert second[1][0] is None and queue(app)["answering"] == 1  # LATE's generation still runs
        late.set()
        for t in [*held, *second[0]]:
            t.join(30)
    assert second[1][0].status_code == 200 and second[1][0].json()["question"] == LATE


BAD = [
    # (what, method, path, content, headers, status, message)
    ("not JSON", "POST", "/api/ask", b"{", {"content-type": "application/json"}, 422, "the body is not JSON"),
    ("a list", "POST", "/api/ask", b"[1, 2]", {"content-type": "application/json"}, 422,
     "the body is not a JSON object"),
    ("not sent as JSON", "POST", "/api/ask", b'{"question": "Who?"}', {"content-type": "text/plain"}, 422,
     "the body is not a JSON object"),
    ("no body", "POST", "/api/ask", b"", {}, 422, "the body is not a JSON object"),
    ("no question", "POST", "/api/ask", b"{}", {"content-type": "application/json"}, 422, "question: Field required"),
    ("a number", "POST", "/api/ask", b'{"question": 5}', {"content-type": "application/json"}, 422,
     "question: Input should be a valid string"),
    ("null", "POST", "/api/ask", b'{"question": null}', {"content-type": "application/json"}, 422,
     "question: Input should be a valid string"),
    ("a string flag", "POST", "/api/ask", b'{"question": "Who?", "show_prompt": "yes"}',
     {"content-type": "application/json"}, 422, "show_prompt: Input should be a valid boolean"),
    ("an unknown key", "POST", "/api/ask", b'{"question": "Who?", "show_promt": true}',
     {"content-type": "application/json"}, 422, "unknown key 'show_promt'"),
    ("empty", "POST", "/api/ask", b'{"question": " \\n "}', {"content-type": "application/json"}, 422,
     "the question is empty"),
    ("too long", "POST", "/api/ask", json.dumps({"question": "x" * (MAX_QUESTION_CHARS + 1)}).encode(),
     {"content-type": "application/json"}, 422, f"at most {MAX_QUESTION_CHARS:,} are taken"),
    ("a lone surrogate", "POST", "/api/ask", b'{"question": "Who \\ud800?"}', {"content-type": "application/json"},
     422, "lone surrogate"),
    ("too large", "POST", "/api/ask", json.dumps({"question": "x" * MAX_BODY_BYTES}).encode(),
     {"content-type": "application/json"}, 413, f"over {MAX_BODY_BYTES:,} bytes"),
    ("too large, in chunks", "POST", "/api/ask", iter([b'{"question": "', b"x" * 9000, b"x" * 9000, b'"}']),
     {"content-type": "application/json"}, 413, f"over {MAX_BODY_BYTES:,} bytes"),
    ("a GET", "GET", "/api/ask", None, {}, 405, "GET is not taken by /api/ask"),
    ("elsewhere", "GET", "/api/../../etc/passwd", None, {}, 404, "no such path"),
    ("elsewhere", "POST", "/api/evaluate", b"{}", {}, 404, "no such path: /api/evaluate"),
]


def test_every_bad_request_is_refused_with_its_status_and_a_message_and_the_service_goes_on(kbqa, replies):
    api, fake = kbqa
    before = len(fake.prompts)
    with serving(api) as (url, _), httpx.Client(base_url=url, timeout=30) as client:
        for what, method, path, content, headers, status, message in BAD:
            response = client.request(method, path, content=content, headers=headers)
            assert response.status_code == status, (what, response.text)
            if message is not None:
                error = response.json()["error"]
                assert message in error and "\n" not in error, (what, error)
        for raw in (b"POST /api/ask HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n{}",  # no HTTP client sends these
                    b"POST /api/ask HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nContent-Length: 9\r\n\r\n{}",
                    b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03 TLS, not HTTP\r\n\r\n"):
            with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=30) as conn:
                conn.sendall(raw)
                assert conn.recv(4096).startswith(b"HTTP/1.1 400 "), raw
        assert len(fake.prompts) == before  # nothing was asked of the model
        response = client.post("/api/ask", json={"question": QUESTION})
        assert response.status_code == 200 and response.json()["answer"] == "Australia"


def test_a_request_past_the_timeout_gets_504_and_a_waiting_one_is_dropped(kbqa, replies, gate):
    """GATE is generating past the bound (504; its work goes on, its answer is discarded); a request
    that times out still waiting is never generated; the service answers the next request."""
    api, fake = kbqa
    before = len(fake.prompts)
    with serving(api, timeout_s=0.5) as (url, app):
        slow = post(url, {"question": GATE})
        assert slow.status_code == 504 and "no answer within 0.5 s" in slow.json()["error"]
        assert queue(app)["answering"] == 1  # still generating
        dropped = post(url, {"question": QUESTION})
        assert dropped.status_code == 504
        gate.set()
        wait_until(lambda: queue(app)["answering"] == 0 and queue(app)["waiting"] == 0, 30, "the worker stayed busy")
        assert [asked(p) for p in fake.prompts[before:]] == [GATE] and replies == [1]  # QUESTION: never generated
        ok = post(url, {"question": "How many cities are there?"})
        assert ok.status_code == 200 and ok.json()["answered"]
        assert httpx.get(f"{url}/api/health").json()["service"]["refused"] == {"504": 2}


def test_a_full_queue_refuses_with_503_and_the_waiting_requests_are_answered(kbqa, replies, gate):
    api, _ = kbqa
    with serving(api, queue_limit=2) as (url, app):
        held, _ = hold_the_worker(url, app)
        threads, responses = in_threads(url, [{"question": QUESTION}, {"question": "How many cities are there?"}])
        wait_until(lambda: queue(app)["waiting"] == 2, 30, "the requests did not wait")
        refused = post(url, {"question": "One more?"})
        assert refused.status_code == 503 and refused.headers["retry-after"]
        assert "2 questions wait already (--queue 2)" in refused.json()["error"]
        gate.set()
        for t in [*held, *threads]:
            t.join(60)
    assert [r.status_code for r in responses] == [200, 200] and responses[0].json()["answer"] == "Australia"


def test_a_failing_batch_fails_its_requests_with_500_and_the_service_goes_on(kbqa, replies, caplog):
    api, _ = kbqa
    with serving(api) as (url, app):
        failed = post(url, {"question": BOOM})
        assert failed.status_code == 500
        assert failed.json()["error"] == "the service failed on this question (RuntimeError); its log has the traceback"
        assert "the LLM engine fell over" in caplog.text  # the traceback is logged
        assert post(url, {"question": QUESTION}).json()["answer"] == "Australia"
        assert queue(app)["failed"] == 1 and queue(app)["answered"] == 1


# ------------------------------------------------------------------------------------------ page

def test_the_page_is_the_service_s_own_under_a_strict_policy(kbqa, replies):
    import base64
    import hashlib

    api, _ = kbqa
    with serving(api, example=QUESTION) as (url, _):
        response = httpx.get(f"{url}/", timeout=30)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    page, csp = response.text, response.headers["content-security-policy"]
    script = re.search(r"<script>(.*?)</script>", page, re.DOTALL).group(1)
    style = re.search(r"<style>(.*?)</style>", page, re.DOTALL).group(1)
    digest = {name: base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()
              for name, text in (("script", script), ("style", style))}
    assert csp.startswith("default-src 'none'; ") and f"script-src 'sha256-{digest['script']}'" in csp
    assert f"style-src 'sha256-{digest['style']}'" in csp and "connect-src 'self'" in csp
    assert "form-action 'none'" in csp and "unsafe" not in csp
    data = json.loads(re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.DOTALL).group(1))
    assert data == {"info": json.loads(json.dumps(api.info())), "example": QUESTION}
    # No network: no URL at all, no external src/href, nothing left of the template.
    assert "http://" not in page.replace("http://HOST:PORT", "") and "https://" not in page and "@@" not in page
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in script


CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]


@pytest.fixture
def browser():
    """Headless Chromium driven by Playwright (the machine's Chromium; Playwright downloads none)."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="the page test drives Chromium with Playwright "
                                   "(pip install playwright; the [dev] extra has it)")
    path = next((p for name in CHROMIUM_NAMES if (p := shutil.which(name))), None)
    if path is None:
        pytest.skip(f"no headless Chromium ({', '.join(CHROMIUM_NAMES)}) on PATH: apt-get install chromium "
                    "(.ci/run does)")
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=path, args=CHROMIUM_FLAGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


def test_chromium_asks_a_question_and_shows_the_answer_program_steps_and_cases(kbqa, replies, gold, browser):
    api, _ = kbqa
    with serving(api, example=QUESTION) as (url, _):
        page = browser.new_page()
        console, dialogs, requests = [], [], []
        page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
        page.on("dialog", lambda d: dialogs.append(d.message) or d.dismiss())
        page.on("request", lambda r: requests.append(r.url))
        page.goto(f"{url}/")
        page.wait_for_selector("body[data-state=ready]", timeout=30_000)
        assert "mini-kqapro (643 entities, 2000 solved cases) · fake" in page.text_content("#info")
        assert page.get_attribute("#question", "placeholder") == f"e.g. {QUESTION}"

        page.fill("#question", QUESTION)
        page.click("#ask")
        page.wait_for_selector("body[data-state=answered]", timeout=60_000)
        assert page.text_content("#asked") == QUESTION and page.text_content("#answer") == "Australia"
        assert page.text_content("#program pre") == gold[QUESTION] == page.text_content("#generated pre")
        steps = page.locator("#steps > li").all_text_contents()
        assert len(steps) == 5 and steps[0] == "Find[Australia] ⇒ entities (1): Australia"
        assert steps[4] == "SelectBetween[population | less] ← 1, 4 ⇒ a name: Australia"
        assert "entitiesAustralia" in page.text_content("#linked").replace(" ", "")
        cases = page.locator("#cases > details > summary").all_text_contents()
        assert len(cases) == 6 and all(re.match(r"\d\. train-\d+ random ", c) for c in cases)
        assert page.text_content("#status").startswith("answered in ")

        # Hostile text, in the question and as the program, shows as text; nothing runs.
        hostile = f"Is {HOSTILE} a question?"
        page.fill("#question", hostile)
        page.click("#ask")
        page.wait_for_selector("body[data-state=failed]", timeout=60_000)
        assert page.text_content("#asked") == hostile and page.text_content("#generated pre") == HOSTILE
        assert "failed (syntax)" in page.text_content("#error")
        assert page.locator("img").count() == 0 and HOSTILE not in page.content() and not dialogs

        # The service's refusal shows as its message.
        page.fill("#question", BOOM)
        page.click("#ask")
        page.wait_for_selector("body[data-state=error]", timeout=60_000)
        assert page.text_content("#error-message") == ("the service failed on this question (RuntimeError); its log "
                                                       "has the traceback")
        page.close()
    assert all(r.startswith(url) for r in requests), requests  # no request leaves the service
    # Nothing refused by the policy, no script error: the one message is the 500's own.
    assert console and all(m.startswith("error: Failed to load resource") for m in console), console


# ----------------------------------------------------------------------------------- the command

def test_serve_refuses_what_it_cannot_do_in_one_line(capsys, monkeypatch):
    import logging

    root = logging.getLogger()  # main's setup_logging points it at this test's captured stderr: undone after
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)
    taken = bind("127.0.0.1", 0)
    taken.listen()
    try:
        assert main(["--port", str(taken.getsockname()[1]), *FAST]) == 2
    finally:
        taken.close()
    assert re.fullmatch(r"error: cannot serve on 127\.0\.0\.1:\d+: .*; choose another --port or --host\n",
                        capsys.readouterr().err)
    assert main(["--timeout", "0", *FAST]) == 2
    assert capsys.readouterr().err == "error: --timeout is a number of seconds above 0, not 0\n"
    assert main(["--batch-size", "0", *FAST]) == 2
    assert main(["--port", "0", "llm.backend=gold"]) == 2
    assert "llm.backend=gold writes the gold programs" in capsys.readouterr().err


@pytest.mark.slow
def test_cbr2_serve_on_the_cpu_default_answers_two_concurrent_requests(tmp_path):
    """The real command on the CPU default (llama.cpp, the packaged Qwen2.5-Coder-0.5B), the untrained
    backbone as the structural view so that no retriever is trained here: two questions at once, each
    answered with its own trace; then Ctrl-C stops it cleanly."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen([sys.executable, "-m", "cbr2.cli", "serve", "--port", str(port),
                               "structural.checkpoint=sentence-transformers/all-MiniLM-L6-v2"],
                              cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        def up() -> bool:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                return httpx.get(f"{url}/api/health", timeout=5).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(up, 900, "cbr2 serve did not start in 15 minutes")
        health = httpx.get(f"{url}/api/health", timeout=5).json()
        assert health["backend"] == "llamacpp" and health["service"]["warm_up_s"] > 0
        texts = ["How many film production companies have an inception after 1912?",
                 "What is the capital of Australia?"]
        out: list = [None, None]

        def ask(i: int) -> None:
            out[i] = httpx.post(f"{url}/api/ask", json={"question": texts[i]}, timeout=600)

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(660)
        for text, response in zip(texts, out, strict=True):
            assert response is not None and response.status_code == 200, response and response.text
            trace = response.json()
            assert set(trace) == TRACE_KEYS and trace["question"] == text and trace["generation"]["text"]
            assert trace["prompt"]["tokens"] > 1000 and trace["cases"] and trace["gold"] is None
        assert httpx.get(f"{url}/api/health", timeout=5).json()["service"]["queue"]["answered"] == 2
    finally:
        server.send_signal(signal.SIGINT)
        try:
            code = server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            code = None
        log.close()
    text = (tmp_path / "serve.log").read_text()
    assert code == 0, text[-3000:]
    assert re.search(r"ready in [\d.]+ s \(loading [\d.]+ s, warm-up [\d.]+ s\): http://127\.0\.0\.1:\d+/", text)
