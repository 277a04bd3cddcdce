"""A newcomer's first ``make evaluate``, timed stage by stage, on a fresh clone with no caches.

    python3 benchmarks/first_run.py                      # clone HEAD into /tmp/cbr2-first-run, run, print the table
    python3 benchmarks/first_run.py --dir /tmp/fr2 --make-args 'ARGS=eval.limit=3'
    python3 benchmarks/first_run.py --parse /tmp/cbr2-first-run/first_run.log   # the table of an earlier log

What "fresh" means here: a new ``git clone`` of this checkout's HEAD (no ``.venv``, an empty
``checkpoints/``), ``PIP_NO_CACHE_DIR=1`` (pip neither reads nor writes its wheel cache, so
llama-cpp-python compiles as on a new machine; its other downloads come from the index again)
and an empty ``CBR2_CACHE_DIR`` (no KB store, embeddings or reassembled model). Only the
standard library is used: it runs before any virtual environment exists.

Each output line of ``make evaluate`` is written to ``first_run.log`` in the clone with the
seconds since the start; the stages are cut at marker lines (the Makefile's ``install i/n:``
announcements and the log lines of ``evaluate.py`` below). The load average is sampled every
10 s, so the table says how busy the 2 cores were: other jobs on the machine stretch every stage.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# (stage, the first line that starts it). A stage ends where the next one that occurred starts.
# The install stages are the Makefile's announcements; the rest are evaluate.py's log lines.
MARKERS: list[tuple[str, re.Pattern[str]]] = [
    ("install: venv, pip, torch", re.compile(r"^install 1/")),
    ("install: llama.cpp build", re.compile(r"^install 2/")),
    ("install: other dependencies", re.compile(r"^install 3/")),
    ("install: LLM weight packages", re.compile(r"^install 4/")),
    ("install: xgrammar", re.compile(r"^install 5/")),
    ("evaluate: start", re.compile(r"evaluate\.py")),
    ("evaluate: retriever training", re.compile(r"training one now")),
    ("evaluate: KB store, encoding (KB triples, case pools)", re.compile(r"building the KB store|\bencoding \d+ ")),
    ("evaluate: model reassembly", re.compile(r"reassembling .* \(once\)")),
    ("evaluate: model load, grammar", re.compile(r"reassembled \S+ \(")),
    ("evaluate: generation (27 questions)", re.compile(r"compiled the grammar|generate 1/")),
    ("evaluate: scoring, report", re.compile(r"generated \d+ completions")),
]
RESULT = re.compile(r"^Hits@1 .*")


def _loadavg() -> tuple[float, float, float]:
    one, five, fifteen = Path("/proc/loadavg").read_text().split()[:3]
    return float(one), float(five), float(fifteen)


def run(clone: Path, make_args: list[str]) -> Path:
    """Clone, run ``make evaluate`` with no caches, log every line with its time; return the log."""
    if clone.exists():
        shutil.rmtree(clone)
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    cache = clone / ".first-run-cache"  # inside the clone: removed with it, never shared
    cache.mkdir()
    env = dict(os.environ, PIP_NO_CACHE_DIR="1", CBR2_CACHE_DIR=str(cache), PYTHONUNBUFFERED="1")
    log_path = clone / "first_run.log"
    start = time.time()
    loads: list[tuple[float, tuple[float, float, float]]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            loads.append((time.time() - start, _loadavg()))
            stop.wait(10)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    commit = subprocess.run(["git", "-C", str(clone), "rev-parse", "--short", "HEAD"], check=True, text=True,
                            capture_output=True).stdout.strip()
    with log_path.open("w", encoding="utf-8") as log:
        log.write(f"# {time.strftime('%Y-%m-%d %H:%M:%S %Z')} make evaluate {' '.join(make_args)} in {clone}; "
                  f"git {commit}; load {_loadavg()}\n")
        proc = subprocess.Popen(["make", "evaluate", *make_args], cwd=clone, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=1)
        assert proc.stdout is not None
        for line in proc.stdout:
            stamped = f"{time.time() - start:8.1f} {line.rstrip()}"
            print(stamped, flush=True)
            log.write(stamped + "\n")
            log.flush()
        code = proc.wait()
        stop.set()
        sampler.join()
        for t, (one, five, fifteen) in loads:
            log.write(f"# load {t:.0f} {one} {five} {fifteen}\n")
        log.write(f"# exit {code} after {time.time() - start:.1f} s\n")
    return log_path


def table(log_path: Path) -> str:
    """The Markdown stage table of a ``first_run.log``."""
    lines: list[tuple[float, str]] = []
    loads: list[tuple[float, float]] = []
    header, total = "", None
    for raw in log_path.read_text(encoding="utf-8").splitlines():
        if raw.startswith("# load "):
            t, one = raw.split()[2:4]
            loads.append((float(t), float(one)))
        elif raw.startswith("# exit "):
            total = float(raw.split()[4])
        elif raw.startswith("# "):
            header = raw[2:]
        else:
            t, _, text = raw.strip().partition(" ")
            lines.append((float(t), text))
    starts: list[tuple[float, str]] = []
    for name, pattern in MARKERS:
        hit = next((t for t, text in lines if pattern.search(text)), None)
        if hit is not None:
            starts.append((hit, name))
    starts.sort()
    end = total if total is not None else (lines[-1][0] if lines else 0.0)
    rows = ["| stage | start | duration | load (1-min avg, mean) |", "|---|---:|---:|---:|"]
    for i, (t, name) in enumerate(starts):
        until = starts[i + 1][0] if i + 1 < len(starts) else end
        during = [one for s, one in loads if t <= s <= until] or [one for s, one in loads if s <= until][-1:]
        load = f"{sum(during) / len(during):.1f}" if during else "?"
        rows.append(f"| {name} | {_mmss(t)} | {_mmss(until - t)} | {load} |")
    result = next((text for _, text in lines if RESULT.match(text)), "no Hits@1 line")
    mean_load = sum(one for _, one in loads) / len(loads) if loads else float("nan")
    rows.append(f"| **total** | | **{_mmss(end)}** | {mean_load:.1f} |")
    return f"{header}\n\n" + "\n".join(rows) + f"\n\nprinted: `{result}`\n"


def _mmss(seconds: float) -> str:
    return f"{int(seconds // 60)} min {seconds % 60:04.1f} s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/cbr2-first-run"), help="the fresh clone (replaced)")
    parser.add_argument("--make-args", default="", help="extra make arguments, e.g. 'ARGS=eval.limit=3'")
    parser.add_argument("--parse", type=Path, metavar="LOG", help="only print the table of an earlier first_run.log")
    args = parser.parse_args()
    log_path = args.parse or run(args.dir.resolve(), args.make_args.split())
    print(table(log_path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
