"""``cbr2 serve``: questions over HTTP, the model and the KB loaded once, and a page to ask them from.

    cbr2 serve                                          # the CPU default on http://127.0.0.1:8000/
    cbr2 serve --port 8080 --config configs/quality.yaml --ablation full llm.model=qwen2.5-coder-1.5b
    cbr2 serve --kb my_kb.json --cases my_cases.yaml --batch-size 4 --timeout 120

At start it composes the configuration as ``evaluate.py`` does and loads everything once
(``KBQA.load``: KB, case pool, retriever, grammar, backend, executor), then answers one question
of the case pool, so that the LLM's weights are loaded (and a first generation made) before the
first person asks; the log says how long each took. Endpoints:

``POST /api/ask``
    ``{"question": "...", "show_prompt": false}`` → 200 and the question's trace: the object
    ``cbr2 ask --json`` prints (``cbr2.evaluation.trace``), whether its program ran or failed.
``GET /api/health``
    ``KBQA.info()`` (benchmark, KB sizes, case pool, model, backend, case views, bounds) and
    ``service``: uptime, start-up seconds, the queue's length, requests answered and refused.
``GET /``
    A page to type a question and see its answer, program, steps, links and cases (``page/``:
    HTML, vanilla JS and CSS, package data; no URL outside the service).

Every answer the service cannot give is JSON ``{"error": "one line"}`` with its status: 413 for a
body over ``MAX_BODY_BYTES``; 422 for one that is not JSON, not ``{"question": str,
"show_prompt": bool}``, or a question that is empty or over ``MAX_QUESTION_CHARS`` characters;
503 when ``--queue`` questions already wait; 504 when no answer came within ``--timeout``
seconds (the question is dropped if it was still waiting, else its work ends and the answer is
discarded: nothing is interrupted mid-generation); 404 for other paths. Nothing a request holds
is run or rendered as markup: a question is text for the prompt, and the page puts every string
of a trace in a text node under a Content-Security-Policy that admits its own script only.

Concurrency: requests arrive on uvicorn's event loop; the model is used by one worker thread
(``Worker``), which takes every waiting question (up to ``--batch-size``) and answers them with
one ``KBQA.ask_many`` call. vLLM generates such a batch at once; llama.cpp answers its prompts in
turn, and each request is answered as soon as its own answer is final (``ask_many``'s
``on_answer``), not at the end of the batch. Each request waits on its own future, so each gets
the answer to its own question.
"""

# No ``from __future__ import annotations``: FastAPI reads the endpoints' annotations at run time,
# and those of the functions defined inside ``create_app`` would not resolve from strings.

import argparse
import asyncio
import base64
import collections
import concurrent.futures
import hashlib
import logging
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from pydantic import BaseModel, ConfigDict

from cbr2.common.errors import SetupError, UserError
from cbr2.service.api import KBQA, Answer, QuestionError, clean_question

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
"""This machine only: the service has no authentication, so reaching it from elsewhere is a choice (``--host``)."""

DEFAULT_PORT = 8000

MAX_BODY_BYTES = 16 * 1024
"""The largest request body taken, in bytes: a question of ``MAX_QUESTION_CHARS`` characters,
each written as a ``\\uXXXX`` escape, is 6 kB; anything larger is not a question."""

BATCH_SIZE = 8
"""Questions answered by one ``ask_many`` call at most (``--batch-size``)."""

QUEUE_LIMIT = 64
"""Questions that may wait for the worker (``--queue``); one more is refused with 503."""

TIMEOUT_S = 300.0
"""Seconds a request waits for its answer, in the queue and in generation (``--timeout``): on
llama.cpp a question takes 5 to 60 s on 2 cores, and a request may wait for the batch before its own."""

class QueueFull(Exception):
    """The worker's queue holds as many questions as it may (``--queue``)."""


class ServiceClosed(Exception):
    """The service is shutting down: it takes no more questions."""


class AskRequest(BaseModel):
    """The body of ``POST /api/ask``: strict, so a number is not taken for a question nor a string
    for a flag, and an unknown key (a misspelt ``show_prompt``) is an error rather than ignored."""

    model_config = ConfigDict(strict=True, extra="forbid")

    question: str
    show_prompt: bool = False


@dataclass
class _Job:
    question: str
    show_prompt: bool
    future: concurrent.futures.Future


class Worker:
    """The one thread that uses the model: it answers the waiting questions in batches.

    ``submit`` queues a question and returns its future; the thread takes every waiting question
    (up to ``batch_size``, first come first served), answers them with one ``KBQA.ask_many`` call
    and resolves each future with its question's trace as soon as that answer is final. A future
    cancelled before its turn (its request timed out) is dropped unanswered; one being answered
    can no longer be cancelled, and its answer is discarded by whoever gave up on it.

    Args:
        kbqa: The loaded instance to answer with.
        batch_size: Questions per ``ask_many`` call at most.
        queue_limit: Questions that may wait; ``submit`` refuses one more.

    Attributes:
        batches: ``ask_many`` calls begun.
        answered: Questions answered (their program ran or failed: a trace each).
        failed: Questions whose batch raised (the LLM server failed, a bug).
    """

    def __init__(self, kbqa: KBQA, *, batch_size: int = BATCH_SIZE, queue_limit: int = QUEUE_LIMIT):
        if batch_size < 1 or queue_limit < 1:
            raise ValueError(f"batch_size and queue_limit are at least 1, not {batch_size} and {queue_limit}")
        self.kbqa, self.batch_size, self.queue_limit = kbqa, batch_size, queue_limit
        self.batches = self.answered = self.failed = 0
        self._jobs: collections.deque[_Job] = collections.deque()
        self._answering = 0
        self._since: float | None = None
        self._closed = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="cbr2-serve-worker", daemon=True)
        self._thread.start()

    def submit(self, question: str, show_prompt: bool = False) -> concurrent.futures.Future:
        """Queue a (cleaned) question; the future gets its trace, or the batch's exception.

        Raises:
            QueueFull: When ``queue_limit`` questions wait already.
            ServiceClosed: After ``close``.
        """
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._cond:
            if self._closed:
                raise ServiceClosed("the service is shutting down")
            if len(self._jobs) >= self.queue_limit:
                raise QueueFull(f"{len(self._jobs)} questions wait already (--queue {self.queue_limit}); "
                                "try again in a while")
            self._jobs.append(_Job(question, show_prompt, future))
            self._cond.notify()
        return future

    def state(self) -> dict[str, Any]:
        """The queue as the health endpoint shows it."""
        with self._cond:
            busy = None if self._since is None else round(time.monotonic() - self._since, 3)
            return {"waiting": len(self._jobs), "answering": self._answering, "limit": self.queue_limit,
                    "batch_size": self.batch_size, "batch_running_s": busy, "batches": self.batches,
                    "answered": self.answered, "failed": self.failed}

    def close(self, wait_s: float = 10.0) -> None:
        """Take no more questions, fail those still waiting, and give the batch being answered up
        to ``wait_s`` seconds to end (the thread is a daemon: an engine stuck in a generation does
        not keep the process alive)."""
        with self._cond:
            self._closed = True
            waiting = list(self._jobs)
            self._jobs.clear()
            self._cond.notify_all()
        for job in waiting:
            if job.future.set_running_or_notify_cancel():
                job.future.set_exception(ServiceClosed("the service is shutting down"))
        self._thread.join(wait_s)

    def _take(self) -> list[_Job] | None:
        """The next batch (None once closed); questions whose request gave up are dropped here."""
        with self._cond:
            while not self._jobs and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            batch = []
            while self._jobs and len(batch) < self.batch_size:
                job = self._jobs.popleft()
                if job.future.set_running_or_notify_cancel():  # False: cancelled while it waited
                    batch.append(job)
            if batch:
                self.batches += 1
                self._answering, self._since = len(batch), time.monotonic()
            return batch

    def _run(self) -> None:
        while (batch := self._take()) is not None:
            if batch:
                self._answer(batch)

    def _settle(self, job: _Job, trace: dict[str, Any] | None = None, failure: BaseException | None = None) -> None:
        """Count a question answered or failed, then resolve its future: the counts are current by
        the time its request is answered."""
        with self._cond:
            self._answering -= 1
            if self._answering == 0:
                self._since = None
            if failure is None:
                self.answered += 1
            else:
                self.failed += 1
        if failure is None:
            job.future.set_result(trace)
        else:
            job.future.set_exception(failure)

    def _answer(self, batch: list[_Job]) -> None:
        """One ``ask_many`` call for the batch; each future resolved as its answer comes."""
        show = any(job.show_prompt for job in batch)
        done = [False] * len(batch)
        started = time.perf_counter()

        def on_answer(n: int, answer: Answer) -> None:
            job = batch[n]
            trace = answer.trace
            if show and not job.show_prompt:  # asked with others who want theirs: not this one
                trace = {**trace, "prompt": {**trace["prompt"], "text": None}}
            done[n] = True
            self._settle(job, trace)

        try:
            self.kbqa.ask_many([job.question for job in batch], show_prompt=show, on_answer=on_answer)
        except Exception as err:  # a failed batch fails its requests (logged); the service goes on
            log.exception("a batch of %d question(s) failed", len(batch))
            failure: BaseException = err
        else:
            failure = RuntimeError("ask_many returned without this question's answer")
        missing = [job for job, ok in zip(batch, done, strict=True) if not ok]
        for job in missing:
            self._settle(job, failure=failure)
        log.info("answered %d question(s) in %.1f s%s", len(batch) - len(missing), time.perf_counter() - started,
                 f"; {len(missing)} failed" if missing else "")


# ------------------------------------------------------------------------------------------ page

def page_asset(name: str) -> str:
    """A file of ``cbr2/service/page/`` (package data), as text."""
    return resources.files(__package__).joinpath("page").joinpath(name).read_text(encoding="utf-8")


def _sha256(text: str) -> str:
    return base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii")


def render_page(info: dict[str, Any], example: str | None = None) -> tuple[str, str]:
    """The page and its Content-Security-Policy.

    The page is ``page/index.html`` with the styles (the run browser's ``browser.css``, then
    ``page.css``), the data (what the service answers with, as JSON that no text can close: the
    browser's ``embed_json``) and the script (the run browser's ``common.js``: ``el`` builds text
    nodes only; then ``page.js``) put in. The policy admits that script and that style by their
    hashes and requests to the service itself (``connect-src 'self'``), nothing else: no other
    script, no inline handler, no image, no frame, no form sent anywhere.

    Returns:
        ``(html, content_security_policy)``.
    """
    from cbr2.report.browser import asset, embed_json

    script = asset("common.js") + page_asset("page.js")
    style = asset("browser.css") + page_asset("page.css")
    data = {"info": info, "example": example}
    parts = {"STYLE": style, "DATA": embed_json(data), "SCRIPT": script}
    # One pass: a value put in is never searched for markers again (a model's name could hold one).
    html = re.sub(r"@@(STYLE|DATA|SCRIPT)@@", lambda m: parts[m.group(1)], page_asset("index.html"))
    csp = (f"default-src 'none'; script-src 'sha256-{_sha256(script)}'; style-src 'sha256-{_sha256(style)}'; "
           "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
    return html, csp


# ------------------------------------------------------------------------------------------- app

class _Guard:
    """ASGI middleware: the request body's bound and the headers of every response.

    A body declared longer than ``max_body`` (``Content-Length``) is refused before it is read; one
    sent in chunks is read as it arrives and refused as soon as it passes the bound; a body within
    it is handed to the app whole (a few kB at most). Every response gets
    ``X-Content-Type-Options: nosniff``, ``Referrer-Policy: no-referrer`` and, unless it set its
    own (the page), a Content-Security-Policy that allows nothing.
    """

    HEADERS = ((b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer"))

    def __init__(self, app: Any, max_body: int):
        self.app, self.max_body = app, max_body

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def guarded_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers") or ())
                names = {k.lower() for k, _ in headers}
                headers += [h for h in self.HEADERS if h[0] not in names]
                if b"content-security-policy" not in names:
                    headers.append((b"content-security-policy", b"default-src 'none'; frame-ancestors 'none'"))
                message = {**message, "headers": headers}
            await send(message)

        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and not declared.isdigit():  # uvicorn refuses those itself; never a 500 here
            await self._refuse(guarded_send, 400, "the Content-Length header is not a number")
            return
        if declared is not None and int(declared) > self.max_body:
            await self._too_large(guarded_send)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left: nothing to answer
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body:
                await self._too_large(guarded_send)
                return
            if not message.get("more_body"):
                break
        whole = {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        async def replay() -> dict:
            nonlocal whole
            if whole is not None:
                message, whole = whole, None
                return message
            return await receive()  # after the body: a disconnect, when the client leaves

        await self.app(scope, replay, guarded_send)

    async def _too_large(self, send: Callable) -> None:
        await self._refuse(send, 413, f"the request body is over {self.max_body:,} bytes: send "
                                      '{"question": "..."} with a question of at most a few thousand characters')

    @staticmethod
    async def _refuse(send: Callable, status: int, message: str) -> None:
        """Answer ``{"error": message}`` and close the connection (the rest of the body is not read)."""
        body = _json_bytes({"error": message})
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


def _json_bytes(value: Any) -> bytes:
    """JSON as UTF-8 that always encodes: a lone surrogate (a model may write one) as a ``\\u`` escape."""
    from cbr2.evaluation.records import utf8_json

    return utf8_json(value).encode("utf-8")


def _one_line(errors: Sequence[dict[str, Any]]) -> str:
    """FastAPI's validation errors as one line: ``where: what`` each, joined."""
    out = []
    for e in errors:
        where = ".".join(str(p) for p in e.get("loc", ()) if p != "body")
        kind, what = e.get("type"), e.get("msg", "invalid")
        if kind == "json_invalid":
            out.append(f"the body is not JSON ({(e.get('ctx') or {}).get('error', what)}): {_SEND}")
        elif not where:  # not an object, or not sent as application/json (then FastAPI reads no JSON)
            out.append(f"the body is not a JSON object: {_SEND}")
        elif kind == "extra_forbidden":
            out.append(f"unknown key {where!r}: the body takes question and show_prompt")
        else:
            out.append(f"{where}: {what}")
    return "; ".join(out)


_SEND = 'send {"question": "...", "show_prompt": false} as Content-Type: application/json'


def require_framework() -> None:
    """Check that FastAPI and uvicorn are installed (the ``[serve]`` extra), before anything loads.

    Raises:
        SetupError: Naming what is missing and the install command.
    """
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as err:
        raise SetupError(f"cbr2 serve needs FastAPI and uvicorn ({err}): pip install -e '.[serve]'") from None


def create_app(kbqa: KBQA, *, batch_size: int = BATCH_SIZE, queue_limit: int = QUEUE_LIMIT,
               timeout_s: float = TIMEOUT_S, max_body: int = MAX_BODY_BYTES,
               startup: dict[str, Any] | None = None, example: str | None = None) -> Any:
    """The FastAPI application over a loaded ``KBQA`` (its worker runs while the app does: started
    and closed by the app's lifespan).

    Args:
        kbqa: The instance to answer with (``KBQA.load``).
        batch_size: Questions per ``ask_many`` call at most.
        queue_limit: Questions that may wait for the worker; one more is refused (503).
        timeout_s: Seconds a request waits for its answer (504 after).
        max_body: The largest request body taken, in bytes (413 above).
        startup: What the start-up took (``{"load_s", "warm_up_s"}``), for the health endpoint.
        example: A question to show as the page's example (the warm-up's).

    Returns:
        A ``fastapi.FastAPI`` application.

    Raises:
        SetupError: When FastAPI is not installed (the ``[serve]`` extra).
    """
    require_framework()
    from contextlib import asynccontextmanager

    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import HTMLResponse, Response
    from starlette.exceptions import HTTPException

    info = kbqa.info()  # read once: it does not change, and a health check must not wait on the worker
    page, csp = render_page(info, example)
    began = time.monotonic()
    refused = collections.Counter()

    class JSON(Response):
        media_type = "application/json"

        def render(self, content: Any) -> bytes:
            return _json_bytes(content)

    def error(status: int, message: str, *, headers: dict[str, str] | None = None, **extra: Any) -> Any:
        refused[status] += 1
        return JSON({"error": message, **extra}, status_code=status, headers=headers)

    @asynccontextmanager
    async def lifespan(app: Any):
        app.state.worker = Worker(kbqa, batch_size=batch_size, queue_limit=queue_limit)
        try:
            yield
        finally:
            await asyncio.get_running_loop().run_in_executor(None, app.state.worker.close)

    # No /docs: FastAPI's documentation pages load their script from a CDN.
    app = FastAPI(title="CBR²", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url="/api/openapi.json",
                  default_response_class=JSON)
    app.add_middleware(_Guard, max_body=max_body)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError) -> Any:
        detail = [{k: e.get(k) for k in ("loc", "msg", "type")} for e in err.errors()]
        return error(422, _one_line(err.errors()), detail=detail)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, err: HTTPException) -> Any:
        if err.status_code == 404:
            return error(404, f"no such path: {request.url.path} (the service has GET /, GET /api/health, "
                              "POST /api/ask)")
        if err.status_code == 405:
            return error(405, f"{request.method} is not taken by {request.url.path}",
                         headers=dict(err.headers or {}))
        return error(err.status_code, str(err.detail))

    @app.get("/", response_class=HTMLResponse)
    async def index() -> Any:
        return HTMLResponse(page, headers={"content-security-policy": csp, "cache-control": "no-store"})

    @app.get("/api/health")
    async def health() -> Any:
        worker: Worker = app.state.worker
        service = {"status": "ok", "uptime_s": round(time.monotonic() - began, 3), **(startup or {}),
                   "queue": worker.state(), "refused": {str(k): v for k, v in sorted(refused.items())},
                   "request_timeout_s": timeout_s, "max_body_bytes": max_body}
        return JSON({**info, "service": service}, headers={"cache-control": "no-store"})

    @app.post("/api/ask")
    async def ask(body: AskRequest) -> Any:
        try:
            question = clean_question(body.question)
            question.encode("utf-8")
        except QuestionError as err:
            return error(422, str(err))
        except UnicodeEncodeError:
            return error(422, "the question holds a lone surrogate (\\ud800 to \\udfff): send text")
        worker: Worker = app.state.worker
        try:
            future = worker.submit(question, body.show_prompt)
        except QueueFull as err:
            return error(503, str(err), headers={"retry-after": "10"})
        except ServiceClosed as err:
            return error(503, str(err))
        try:
            # On timeout wait_for cancels the wrapper, which cancels the future if it still waits.
            trace = await asyncio.wait_for(asyncio.wrap_future(future), timeout_s)
        except asyncio.TimeoutError:
            return error(504, f"no answer within {timeout_s:g} s (--timeout): the service is busy or the "
                              "question slow; try again later")
        except ServiceClosed as err:
            return error(503, str(err))
        except Exception as err:  # noqa: BLE001 - the batch failed; the worker goes on with the next
            return error(*_failure(err))
        return JSON(trace, headers={"cache-control": "no-store"})

    return app


def _failure(err: BaseException) -> tuple[int, str]:
    """The status and message of a batch that raised: the LLM server's failure, a user error, a bug."""
    from cbr2.llm.openai_compat import LLMRequestError

    if isinstance(err, LLMRequestError):
        return 502, f"the LLM server failed: {err}"
    if isinstance(err, UserError):
        return 422, str(err)
    return 500, f"the service failed on this question ({type(err).__name__}); its log has the traceback"


# ---------------------------------------------------------------------------------------- server

def make_server(app: Any, *, queue_limit: int = QUEUE_LIMIT, batch_size: int = BATCH_SIZE,
                log_level: str = "info") -> Any:
    """The uvicorn server of ``app``, run with ``server.run(sockets=[sock])``.

    Its bounds: open connections at most ``queue_limit + batch_size + 32`` (the requests that may
    wait or be answered, and room for health checks; uvicorn answers 503 past it), idle
    keep-alive connections closed after 5 s, and on shutdown the requests still open given 10 s.
    Its loggers go to the one handler of ``setup_logging`` (no configuration of its own).
    """
    import uvicorn

    config = uvicorn.Config(app, log_config=None, log_level=log_level, lifespan="on", server_header=False,
                            limit_concurrency=queue_limit + batch_size + 32, timeout_keep_alive=5,
                            timeout_graceful_shutdown=10)
    return uvicorn.Server(config)


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (uvicorn listens on it), bound before the model loads so that
    a port in use fails at once.

    Raises:
        UserError: When the address cannot be bound (in use, not this machine's, no permission).
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as err:
        raise UserError(f"cannot serve on {host}:{port}: {err.strerror or err}; choose another --port or --host") \
            from None
    return sock


def warm_up(kbqa: KBQA) -> tuple[str, float]:
    """Answer one question of the case pool (its first), so that the LLM's weights load and the
    first generation is made now, not in the first person's request.

    Returns:
        ``(question, seconds)``.
    """
    pool = kbqa.bench.questions(kbqa.bench.family.train_split)
    question = pool[0].question if pool else "How many entities are there?"
    started = time.perf_counter()
    answer = kbqa.ask(question)
    seconds = time.perf_counter() - started
    log.info("warm-up: a question of the case pool answered in %.1f s (%s)", seconds,
             "a program ran" if answer.ok else f"its program failed: {answer.trace['error_kind']}")
    return question, seconds


def main(argv: Sequence[str] | None = None) -> int:
    """``cbr2 serve``: serve until interrupted; 0 then, 2 on a user error (one line), 3 when the LLM
    server failed at start."""
    from cbr2.common.console import setup_logging
    from cbr2.config import ABLATIONS
    from cbr2.config.cli import add_config_arguments
    from cbr2.llm.openai_compat import LLMRequestError

    parser = argparse.ArgumentParser(prog="cbr2 serve", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"the address to listen on (default {DEFAULT_HOST}: "
                        "this machine only; the service has no authentication)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}")
    add_config_arguments(parser)
    parser.add_argument("--ablation", metavar="NAME", help=f"a Table 5 setting: {', '.join(ABLATIONS)}")
    parser.add_argument("--kb", metavar="FILE", help="your own KB (data.name=custom data.kb=FILE)")
    parser.add_argument("--cases", metavar="FILE", help="its solved cases (data.cases=FILE); with --kb")
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE, metavar="N",
                        help=f"questions answered by one generate call at most (default {BATCH_SIZE})")
    parser.add_argument("--queue", type=int, default=QUEUE_LIMIT, metavar="N",
                        help=f"questions that may wait; more are refused with 503 (default {QUEUE_LIMIT})")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, metavar="SECONDS",
                        help=f"how long a request waits for its answer, queue included; 504 after (default "
                             f"{TIMEOUT_S:g})")
    parser.add_argument("--no-warm-up", action="store_true",
                        help="skip the warm-up question (the first request then loads the LLM's weights)")
    args = parser.parse_intermixed_args(argv)  # options may come between overrides
    setup_logging()
    started = time.perf_counter()
    try:
        if args.timeout <= 0:
            raise UserError(f"--timeout is a number of seconds above 0, not {args.timeout:g}")
        if args.batch_size < 1 or args.queue < 1:
            raise UserError(f"--batch-size and --queue are at least 1, not {args.batch_size} and {args.queue}")
        require_framework()
        sock = bind(args.host, args.port)
        kbqa = KBQA.load(args.config, args.overrides, args.ablation, kb=args.kb, cases=args.cases)
        load_s = time.perf_counter() - started
        example, warm_s = warm_up(kbqa) if not args.no_warm_up else (None, None)
        app = create_app(kbqa, batch_size=args.batch_size, queue_limit=args.queue, timeout_s=args.timeout,
                         startup={"load_s": round(load_s, 3), "warm_up_s": None if warm_s is None else round(warm_s, 3)},
                         example=example)
    except LLMRequestError as err:
        print(f"error: the LLM server failed: {err}", file=sys.stderr)
        return 3
    except UserError as err:  # the user's to fix: one line; anything else is a bug and shows its traceback
        print(f"error: {err}", file=sys.stderr)
        return 2
    host = f"[{args.host}]" if ":" in args.host else args.host
    log.info("ready in %.1f s (loading %.1f s%s): http://%s:%d/", time.perf_counter() - started, load_s,
             "" if warm_s is None else f", warm-up {warm_s:.1f} s", host, sock.getsockname()[1])
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("listening on %s: anyone who reaches this address can ask questions (no authentication)",
                    args.host)
    try:
        make_server(app, queue_limit=args.queue, batch_size=args.batch_size).run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn shuts down on Ctrl-C, then raises it again for the caller
        log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
