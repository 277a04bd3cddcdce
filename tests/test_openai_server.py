"""The ``openai`` backend against a real OpenAI-compatible server that dies mid-run.

llama-cpp-python's server (the ``server`` extra) on the packaged SmolLM2-135M, on a loopback
port only, with ``llm.concurrency=4``. Killed while a run is going, the run ends with a clear
message and a folder that resumes; restarted, the same command finishes the run with every
question answered once and the metrics of a run that was never interrupted.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from cbr2.evaluation.records import read_records

pytest.importorskip("llama_cpp")
pytest.importorskip("uvicorn")
pytest.importorskip("fastapi")
pytest.importorskip("sse_starlette")
pytest.importorskip("starlette_context")
pytest.importorskip("pydantic_settings")

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
QUESTIONS = 12
METRIC_KEYS = ("hits@1", "ser", "ser_before_repair", "n", "per_category", "errors")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class Server:
    """``python -m llama_cpp.server`` on ``HOST:port``; ``start`` waits (bounded) until it answers."""

    def __init__(self, port: int, log: Path):
        from cbr2.llm.packaged import gguf_path

        self.port, self.log, self.model = port, log, gguf_path("smollm2-135m")
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with self.log.open("a") as sink:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "llama_cpp.server", "--model", str(self.model), "--model_alias", "smollm2",
                 "--host", HOST, "--port", str(self.port), "--n_ctx", "4096", "--n_threads", "2"],
                stdout=sink, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"http://{HOST}:{self.port}/v1/models", timeout=5):
                    return
            except OSError:
                time.sleep(0.5)
        raise AssertionError(f"the server did not answer in 120 s: {self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)


@pytest.fixture()
def server(tmp_path):
    srv = Server(_free_port(), tmp_path / "server.log")
    yield srv
    srv.kill()


def _command(out: Path, port: int) -> list[str]:
    # The server answers one request at a time, so the last of 4 in flight waits for the other 3:
    # a generous timeout keeps a busy machine from reading as a dead server (a dead one refuses at once).
    return [sys.executable, str(ROOT / "evaluate.py"), f"output_dir={out}", "llm.backend=openai",
            f"llm.base_url=http://{HOST}:{port}/v1", "llm.model=smollm2", "llm.chat=false", "llm.concurrency=4",
            "llm.max_retries=2", "llm.timeout_s=600", "llm.max_new_tokens=48", "generation.constrained=false",
            "eval.per_category=null", f"eval.limit={QUESTIONS}", "wandb.mode=disabled", "retrieval.cases=none",
            "retrieval.k_ontology=0", "retrieval.k_facts=0"]


def _lines(path: Path) -> int:
    return len(path.read_bytes().splitlines()) if path.exists() else 0


def _metrics(out: Path) -> dict:
    metrics = json.loads((out / "metrics.json").read_text())
    return {k: metrics[k] for k in METRIC_KEYS}


@pytest.mark.slow
def test_a_server_killed_mid_run_then_restarted_loses_and_repeats_nothing(tmp_path, server):
    server.start()
    reference = tmp_path / "reference"
    done = subprocess.run(_command(reference, server.port), cwd=ROOT, capture_output=True, text=True, check=False, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]

    out = tmp_path / "run"
    run = subprocess.Popen(_command(out, server.port), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    deadline = time.monotonic() + 600
    while _lines(out / "predictions.jsonl") < 3 and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    server.kill()  # mid-run: some answers written, requests in flight
    _, err = run.communicate(timeout=600)
    # A server that does not come back: a clear message, no traceback, a folder to resume.
    assert run.returncode == 3, err[-3000:]
    assert "error: the LLM server failed" in err and f"connection error with http://{HOST}:{server.port}/v1" in err
    assert "run the same command again to resume" in err and "Traceback" not in err
    written = [r["id"] for _, r in read_records(out / "predictions.jsonl")]
    assert 3 <= len(written) < QUESTIONS and len(set(written)) == len(written)
    before = (out / "predictions.jsonl").read_bytes()

    server.start()
    again = subprocess.run(_command(out, server.port), cwd=ROOT, capture_output=True, text=True, check=False, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    after = (out / "predictions.jsonl").read_bytes()
    assert after.startswith(before)  # what the first run wrote is kept as it was
    # Only the missing questions were generated: the rerun's own records are exactly those.
    appended = [r["id"] for _, r in read_records(out / "predictions.jsonl")][len(written):]
    assert sorted(appended) == sorted(set(appended)) and not set(appended) & set(written)
    assert len(written) + len(appended) == QUESTIONS
    assert _metrics(out) == _metrics(reference)


@pytest.mark.slow
def test_a_server_that_is_never_there_ends_the_run_clearly(tmp_path):
    out = tmp_path / "run"
    run = subprocess.run(_command(out, _free_port()), cwd=ROOT, capture_output=True, text=True, check=False, timeout=600)
    assert run.returncode == 3 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert "error: the LLM server failed" in run.stderr and "after 2 retries" in run.stderr
    assert _lines(out / "predictions.jsonl") == 0 and (out / "config.yaml").is_file()
