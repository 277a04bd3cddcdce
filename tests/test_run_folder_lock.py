"""One writer per run folder, with real processes: two runs started together, a live holder, a
killed holder, records that differ only in timing, and the repair of a folder two writers damaged."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cbr2.evaluation.records import read_records, records_by_id

ROOT = Path(__file__).resolve().parents[1]
GOLD = ["llm.backend=gold", "eval.per_category=null", "wandb.mode=disabled", "generation.constrained=false",
        "retrieval.cases=none", "retrieval.k_ontology=0", "retrieval.k_facts=0"]
"""The gold writer over the whole mini-kqapro val split (450 questions), no retrieval: seconds a run."""

HOLDER = """
import sys, time
from cbr2.common.locks import hold_folder
with hold_folder(sys.argv[1], wait_s=0):
    print("held", flush=True)
    time.sleep(120)
"""


def _evaluate(out: Path, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ROOT / "evaluate.py"), f"output_dir={out}", *GOLD, *overrides],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _hold(folder: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def _ids(path: Path) -> list[str]:
    return [record["id"] for _, record in read_records(path)]


def _opened(pid: int, path: Path) -> bool:
    """Whether process ``pid`` has ``path`` open (Linux: its ``/proc/PID/fd`` links)."""
    fds = Path(f"/proc/{pid}/fd")
    try:
        return any(os.path.realpath(fd) == str(path.resolve()) for fd in fds.iterdir())
    except OSError:  # it ended, or closed a descriptor while we looked
        return False


def _wait_until_queued(procs: list[subprocess.Popen], lock: Path, timeout_s: float = 300) -> None:
    """Return once every process of ``procs`` has the folder's lock file open, i.e. is waiting for it.

    ``hold_folder`` opens the file before it polls for the lock, so while a holder keeps the lock
    an open descriptor means the process is in the queue, whatever its log says."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            raise AssertionError(f"a run ended before the folder was free: {[p.poll() for p in procs]}")
        if all(_opened(p.pid, lock) for p in procs):
            return
        time.sleep(0.2)
    raise AssertionError(f"the runs did not both wait for {lock} in {timeout_s} s")


@pytest.mark.slow
def test_two_runs_started_together_leave_one_record_per_question(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    # A third process holds the folder until both runs wait for it, so the two overlap on any
    # machine (a quiet one may finish a gold run before a second interpreter has started).
    holder = _hold(out)
    procs = [_evaluate(out) for _ in range(2)]
    try:
        _wait_until_queued(procs, out / ".lock")
    finally:
        holder.kill()
        holder.wait()
    results = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in results]
    ids = _ids(out / "predictions.jsonl")
    assert len(ids) == len(set(ids)) == 450
    # The one that took the folder second generated nothing: had it answered any question again,
    # its record would be a line more in the file (records are appended, never rewritten).
    assert len((out / "predictions.jsonl").read_bytes().splitlines()) == 450
    assert [out.split()[:2] for out, _ in results] == [["Hits@1", "1.0000"]] * 2
    # A third run of the folder reads it back without complaint.
    third = _evaluate(out)
    assert third.wait(timeout=600) == 0, third.stderr.read()[-2000:]


@pytest.mark.slow
def test_a_run_refuses_at_once_naming_the_live_holder(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    holder = _hold(out)
    try:
        start = time.monotonic()
        proc = _evaluate(out, "eval.folder_wait_s=0")
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 2
        assert f"pid {holder.pid} on host {socket.gethostname()}" in err, err[-2000:]
        assert not (out / "predictions.jsonl").exists()
        assert time.monotonic() - start < 120
    finally:
        holder.kill()
        holder.wait()


def test_a_killed_holder_blocks_nobody(tmp_path):
    holder = _hold(tmp_path)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    from cbr2.common.locks import hold_folder

    with hold_folder(tmp_path, wait_s=0):  # at once: the kernel released the dead process's lock
        held = json.loads((tmp_path / ".lock").read_text())
        assert held["pid"] == os.getpid() and held["host"] == socket.gethostname()
    assert (tmp_path / ".lock").read_text() == ""  # a free folder names nobody


def test_a_waiting_run_gives_up_after_its_wait_naming_the_holder(tmp_path):
    from cbr2.common.locks import FolderBusy, hold_folder

    holder = _hold(tmp_path)
    try:
        start = time.monotonic()
        with pytest.raises(FolderBusy, match=rf"pid {holder.pid} on host .* \(waited 1 s"), \
                hold_folder(tmp_path, wait_s=1.0):
            pass
        assert 1.0 <= time.monotonic() - start < 10
    finally:
        holder.kill()
        holder.wait()


def test_records_that_differ_only_in_timing_are_one_answer(tmp_path):
    record = {"id": "q1", "answer": "Paris", "latency_s": 0.5, "fallback": {"fired": True, "latency_s": 1.0}}
    again = {**record, "latency_s": 0.7, "fallback": {"fired": True, "latency_s": 2.0}}
    assert records_by_id("p.jsonl", [(1, record), (2, again)]) == {"q1": again}
    with pytest.raises(Exception, match="lines 1 and 2 both hold id 'q1'.*cbr2.run.repair"):
        records_by_id("p.jsonl", [(1, record), (2, {**again, "answer": "Warsaw"})])


@pytest.mark.slow
def test_the_repair_command_mends_a_folder_two_writers_damaged(tmp_path):
    clean = tmp_path / "clean"
    assert _evaluate(clean).wait(timeout=600) == 0
    expected = json.loads((clean / "metrics.json").read_text())
    lines = (clean / "predictions.jsonl").read_text(encoding="utf-8").split("\n")[:-1]
    # What two writers leave: each question written by both (the second writer's records differ in
    # timing, some in content), interleaved, and one line cut by the other's write.
    second = [json.loads(line) for line in lines[:40]]
    for k, rec in enumerate(second):
        rec["latency_s"] = 9.0
        if k % 10 == 0:
            rec["generated"] += " "
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for name in ("config.yaml", "retrieval.jsonl"):
        if (clean / name).exists():
            (damaged / name).write_bytes((clean / name).read_bytes())
    mixed = lines[:20] + [json.dumps(r) for r in second] + [lines[20][:50]] + lines[20:]
    (damaged / "predictions.jsonl").write_text("\n".join(mixed) + "\n", encoding="utf-8")

    stuck = _evaluate(damaged)
    assert stuck.wait(timeout=600) == 2 and "cbr2.run.repair" in stuck.stderr.read()

    fix = subprocess.run([sys.executable, "-m", "cbr2.run.repair", str(damaged)], cwd=ROOT,
                         capture_output=True, text=True, check=False, timeout=300)
    assert fix.returncode == 0, fix.stderr
    assert "kept 450 records of 491 lines" in fix.stdout and "4 conflicting dropped, 1 damaged" in fix.stdout
    assert (damaged / "predictions.jsonl.damaged").read_text(encoding="utf-8").count("\n") == 491
    kept = records_by_id("p", read_records(damaged / "predictions.jsonl"))
    assert list(kept) == _ids(clean / "predictions.jsonl")  # first records kept, in order

    again = _evaluate(damaged)
    _, err = again.communicate(timeout=600)
    assert again.returncode == 0, err[-2000:]
    metrics = json.loads((damaged / "metrics.json").read_text())
    assert {k: metrics[k] for k in ("hits@1", "ser", "n", "per_category", "errors")} == \
        {k: expected[k] for k in ("hits@1", "ser", "n", "per_category", "errors")}
