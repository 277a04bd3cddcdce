"""How fast ``browser.html`` of a whole validation set shows its first page, in headless Chromium.

    python benchmarks/browser.py                        # 11,797 questions (KQA Pro's validation set)
    python benchmarks/browser.py --n 500 --repeat 3 --out /tmp/browser-bench

Builds a run folder of ``--n`` questions without retrieval or an LLM, written by the project's
own code: prediction records from ``evaluation.scoring.score_completion`` (gold programs; one
question in ten given another question's program, one in 25 a broken text, so every verdict,
error kind and error class occurs; with ``grounded`` as grounded decoding records it),
``retrieval.jsonl`` lines from ``Retrieved.to_record`` (10
ontology triples, 10 fact triples and 6 cases per question, each case with its own 10 + 10
triples), ``metrics.json`` from ``finish_metrics`` and ``provenance``, ``config.yaml`` from
``write_config``, then ``browser.html`` with ``write_browser``. The texts are mini-kqapro's real
questions, programs and triples; their pools are stretched to KQA Pro's sizes (94,376 training
questions as cases, 105,972 ontology triples, 650,187 fact triples) by numbering copies, and each
question draws from a part of each pool (``CASE_REACH`` ...), cases and ontology triples skewed
towards a popular few, so the page stores about as many distinct texts as the full-size run's.

Then, in one go, each of a blank page (``blank.html``: one line of text) and ``browser.html`` is
opened ``--repeat`` times, alternately, each time in a fresh headless Chromium driven over the
DevTools protocol (``--remote-debugging-pipe``: no network, no client library). A script the
benchmark injects before the page's own (``Page.addScriptToEvaluateOnNewDocument``; the page is
not changed) notes when the first question row enters the DOM. Per page, the medians of:

``start``   launching Chromium until it takes the navigation (the same for both pages)
``rows``    navigation start until the first page of question rows is in the DOM
``paint``   navigation start until the first contentful paint (the first page, shown)
``dcl``     navigation start until ``DOMContentLoaded`` ends (every block parsed)
``load``    navigation start until the ``load`` event ends
``shown``   ``start`` + ``paint``: from launching the browser until the first page is shown
``open``    then opening the first question until its details are built (the first open parses
            the run's triples and cases and that question's details block)
``search``  then typing in the search box until the counter changes (the first search parses
            every details block; the box waits for a 150 ms pause in typing first)

and the ratio of ``shown`` to the blank page's. Timings depend on what else runs: the output
gives the load average before and after. Writes ``OUT/run/`` (the run folder), ``OUT/blank.html``
and ``OUT/results.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import hashlib
import json
import os
import random
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

KEYS = ("start", "rows", "paint", "dcl", "load", "shown", "open", "search")
"""The timings of one opening, in seconds (see the module's docstring)."""

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
TRAIN_POOL, ONTOLOGY_POOL, FACT_POOL = 94_376, 105_972, 650_187
"""KQA Pro's training questions and the synthetic full-size KB's triples (docs/results/scale.md)."""

CASE_REACH, ONTOLOGY_REACH, FACT_REACH = 8_000, 20_000, 60_000
"""The part of each pool retrieval draws from: similar questions find the same cases and triples.
Chosen so that the page of 11,797 questions is about as large as the full-size run's (21.8 MB,
real retrieval on the synthetic KB; docs/results/scale.md); drawing from whole pools makes it
about twice that."""

FIRST_ROWS = """(() => {
  const mark = window.__bench = {};
  new MutationObserver((_, seen) => {
    if (document.querySelector("details.q")) { mark.rows = performance.now(); seen.disconnect(); }
  }).observe(document, {childList: true, subtree: true});
})();"""
"""Notes when the page's first question row is in the DOM (a mutation observer's callback runs
right after the script that inserted the rows)."""

READ_MARKS = """new Promise(done => {
  const read = () => {
    const nav = performance.getEntriesByType("navigation")[0] || {};
    const paint = performance.getEntriesByName("first-contentful-paint")[0];
    done(JSON.stringify({rows: (window.__bench || {}).rows ?? null, paint: paint ? paint.startTime : null,
                         dcl: nav.domContentLoadedEventEnd ?? null, load: nav.loadEventEnd ?? null,
                         shown_rows: document.querySelectorAll("details.q").length}));
  };
  const late = setTimeout(read, 10000);
  new PerformanceObserver((_, seen) => {
    if (performance.getEntriesByName("first-contentful-paint").length) { seen.disconnect(); clearTimeout(late); read(); }
  }).observe({type: "paint", buffered: true});
})"""
"""Read after the load event, once the first contentful paint is reported (its time comes from the
compositor, possibly after the load event; at most 10 s later)."""

OPEN_AND_SEARCH = """(async () => {
  const row = document.querySelector("details.q"), box = document.querySelector("input[name=q]");
  if (!row || !box) return JSON.stringify({open: null, search: null});
  let start = performance.now();
  const open = await new Promise(done => {
    row.addEventListener("toggle", () => done(performance.now() - start), {once: true});  // after the page's own
    row.open = true;
  });
  const count = document.getElementById("count"), before = count.textContent;
  start = performance.now();
  const search = await new Promise(done => {
    new MutationObserver((_, seen) => {
      if (count.textContent !== before) { seen.disconnect(); done(performance.now() - start); }
    }).observe(count, {childList: true, characterData: true, subtree: true});
    box.value = "no such text zq";
    box.dispatchEvent(new Event("input"));
  });
  return JSON.stringify({open, search});
})()"""
"""After the marks: open the first question (its details built), then search (until the counter
changes; the box waits for a 150 ms pause in typing first)."""


# ------------------------------------------------------------------------------------ the run

def _stretched(texts: list[str], size: int) -> list[str]:
    """``size`` distinct texts: ``texts`` then numbered copies (``subject #k | ...``)."""
    out = []
    for i in range(size):
        k, text = divmod(i, len(texts))
        if k:
            subject, _, rest = texts[text].partition(" | ")
            out.append(f"{subject} #{k} | {rest}")
        else:
            out.append(texts[text])
    return out


def build_run(out: Path, n: int, seed: int) -> dict[str, Any]:
    """Write a run folder of ``n`` questions (see the module's docstring) and its ``browser.html``.

    Args:
        out: The run folder (emptied first).
        n: Questions in the run.
        seed: For every random choice.

    Returns:
        Sizes and seconds: ``questions``, ``predictions_mb``, ``retrieval_mb``, ``browser_mb``,
        ``build_s``, ``browser_s``.
    """
    from cbr2.config import load_config
    from cbr2.data.benchmarks import Benchmark
    from cbr2.evaluation.metrics import finish_metrics
    from cbr2.evaluation.records import append_record
    from cbr2.evaluation.scoring import score_completion
    from cbr2.evaluation.selection import categories_of
    from cbr2.generation.grounded import grounded_arguments
    from cbr2.kb.triples import Triple, fact_triples, ontology_triples
    from cbr2.kopl.executor import Executor
    from cbr2.kopl.text import parse_text, to_text
    from cbr2.report.browser import write_browser
    from cbr2.retrieval.cases import Case, Query
    from cbr2.retrieval.knowledge import Knowledge
    from cbr2.retrieval.retriever import Retrieved
    from cbr2.run.run_folder import provenance, write_config

    start = time.perf_counter()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    rng = random.Random(seed)
    mini = Benchmark("mini-kqapro")
    val, train = mini.questions("val"), mini.questions(mini.family.train_split)
    pool = [dataclasses.replace(train[j % len(train)], qid=f"train-{j}") for j in range(TRAIN_POOL)]

    class Stretched(Benchmark):
        """mini-kqapro with a training split of KQA Pro's size (the cases' questions and programs)."""

        def questions(self, split: str | None = None) -> list[Any]:
            return pool if split == self.family.train_split else super().questions(split)

    bench = Stretched("mini-kqapro")
    selection = [dataclasses.replace(val[i % len(val)], qid=f"val-{i}") for i in range(n)]
    cfg = load_config([f"output_dir={out}", "llm.backend=gold", "wandb.mode=disabled", "eval.shard=0",
                       "eval.num_shards=1"])  # unsharded, as the runner records it
    write_config(out, cfg)

    # Records: gold programs, some swapped or broken; scored once per distinct (question, text).
    executor = Executor(mini.kb, cfg.eval.timeout_s, engine=cfg.eval.executor)
    scored: dict[tuple[int, str], dict[str, Any]] = {}
    records = []
    with (out / "predictions.jsonl").open("w", encoding="utf-8") as sink:
        for i, q in enumerate(selection):
            base = i % len(val)
            text = to_text(q.program, "dag")
            if i % 10 == 3:
                text = to_text(val[(base * 7 + 1) % len(val)].program, "dag")
            elif i % 25 == 7:
                text = text[: len(text) // 2]
            if (base, text) not in scored:
                record = score_completion(text, val[base], mini, executor, "dag")
                # What grounded decoding adds (the default configuration links the question's names):
                # the candidates are taken to be the gold program's own arguments.
                candidates: dict[str, list[str]] = {}
                for arg in grounded_arguments(val[base].program, {}):
                    candidates.setdefault(arg["kind"], []).append(arg["value"])
                program = parse_text(record["program"], "dag") if record.get("program") else None
                scored[base, text] = {**record, "grounded": grounded_arguments(program, candidates)}
            record = {**scored[base, text], "id": q.qid}
            record.update(prompt_hash=hashlib.sha256(f"{seed} {q.qid}".encode()).hexdigest(), generation_key="gold",
                          prompt_tokens=rng.randint(1500, 2600), completion_tokens=len(text) // 3,
                          latency_s=round(rng.uniform(0.2, 2.0), 3))
            append_record(sink, record)
            records.append(record)

    # Retrieval: texts by pool index, skewed where retrieval favours a popular few.
    ontology = _stretched([t.text for t in ontology_triples(mini.kb)], ONTOLOGY_POOL)
    facts = _stretched([t.text for t in fact_triples(mini.kb)], FACT_POOL)

    def triples(texts: list[str], picks: list[int]) -> tuple[Triple, ...]:
        # Triple.text (what to_record writes) of a pool text: its parts split back out.
        return tuple(Triple(*texts[p].split(" | ", 2)) for p in picks)

    def knowledge(r: random.Random) -> Knowledge:
        return Knowledge(ontology=triples(ontology, [int(ONTOLOGY_REACH * r.random() ** 2) for _ in range(10)]),
                         facts=triples(facts, [r.randrange(FACT_REACH) for _ in range(10)]))

    with (out / "retrieval.jsonl").open("w", encoding="utf-8") as sink:
        for q in selection:
            picks: list[int] = []
            while len(picks) < 6:
                j = int(CASE_REACH * rng.random() ** 2)
                if j not in picks:
                    picks.append(j)
            # semantic top-5 and structural top-5, 4 found by both: 6 cases.
            cases = [Case(pool[j], ("semantic", "structural") if r < 4 else (("semantic",), ("structural",))[r % 2],
                          (round(rng.uniform(0.5, 0.95), 4),) * (2 if r < 4 else 1)) for r, j in enumerate(picks)]
            item = Retrieved(Query(q.qid, q.question), knowledge(rng), cases,
                             [knowledge(random.Random(seed * 1_000_003 + j)) for j in picks])
            append_record(sink, item.to_record())

    types = {q.qid: q.reasoning_types for q in selection}
    metrics = finish_metrics(records, categories_of(bench), False, types)
    metrics["provenance"] = provenance(cfg, bench, out, selection, None)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    built = time.perf_counter()
    page = write_browser(out, bench, records, selection)
    return {"questions": n, "predictions_mb": (out / "predictions.jsonl").stat().st_size / 1e6,
            "retrieval_mb": (out / "retrieval.jsonl").stat().st_size / 1e6, "browser_mb": page.stat().st_size / 1e6,
            "build_s": built - start, "browser_s": time.perf_counter() - built}


# ------------------------------------------------------------------------ Chromium over a pipe

class Chromium:
    """One headless Chromium, driven over ``--remote-debugging-pipe`` (NUL-terminated JSON
    messages: commands on its fd 3, answers and events on its fd 4)."""

    def __init__(self, binary: str, profile: Path):
        to_child, self._write = os.pipe()
        self._read, from_child = os.pipe()

        def fds() -> None:  # in the child, before exec: the pipe ends where Chromium expects them
            # Copied above 9 first: an end already numbered 3 or 4 would otherwise keep its
            # close-on-exec flag (dup2 onto itself changes nothing) or be overwritten by the other.
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_child, from_child)]
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        self.proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
             "--remote-debugging-pipe", f"--user-data-dir={profile}", "--window-size=1280,900", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=fds, close_fds=False)  # noqa: PLW1509 - no threads here; Chromium reads fds 3 and 4
        os.close(to_child)
        os.close(from_child)
        self._buffer, self._next, self.events = b"", 0, []

    def _message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._read], [], [], left)[0]:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self._read, 1 << 16)
            if not chunk:
                raise RuntimeError(f"Chromium closed its pipe (exit {self.proc.poll()})")
            self._buffer += chunk
        text, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(text)

    def send(self, method: str, session: str | None = None, timeout: float = 120, **params: Any) -> dict[str, Any]:
        """Run one command; its result (events that arrive meanwhile are kept in ``events``)."""
        self._next += 1
        message = {"id": self._next, "method": method, "params": params, **({"sessionId": session} if session else {})}
        os.write(self._write, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._message(deadline)
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str, timeout: float = 300) -> dict[str, Any]:
        """The first event ``method`` (one already received counts)."""
        deadline = time.monotonic() + timeout
        while True:
            for i, event in enumerate(self.events):
                if event.get("method") == method:
                    return self.events.pop(i)
            self.events.append(self._message(deadline))

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=10)
        except (OSError, RuntimeError, TimeoutError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._write)
        os.close(self._read)


def open_once(binary: str, page: Path) -> dict[str, float | None]:
    """Open ``page`` in a fresh browser (new profile); its timings in seconds (see the docstring)."""
    with tempfile.TemporaryDirectory(prefix="cbr2-browser-bench-") as profile:
        launched = time.perf_counter()
        browser = Chromium(binary, Path(profile))
        try:
            target = browser.send("Target.createTarget", url="about:blank")["targetId"]
            session = browser.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
            browser.send("Page.enable", session)
            browser.send("Page.addScriptToEvaluateOnNewDocument", session, source=FIRST_ROWS)
            navigating = time.perf_counter()
            browser.send("Page.navigate", session, url=page.resolve().as_uri())
            browser.wait_event("Page.loadEventFired")
            marks = json.loads(browser.send("Runtime.evaluate", session, expression=READ_MARKS,
                                            awaitPromise=True, returnByValue=True)["result"]["value"])
            marks.update(json.loads(browser.send("Runtime.evaluate", session, expression=OPEN_AND_SEARCH,
                                                 awaitPromise=True, returnByValue=True)["result"]["value"]))
        finally:
            browser.close()
    ms = {k: (v / 1000 if isinstance(v, (int, float)) and k != "shown_rows" else v) for k, v in marks.items()}
    start = navigating - launched
    return {"start": start, **ms, "shown": start + ms["paint"] if ms["paint"] is not None else None}


def measure(binary: str, pages: dict[str, Path], repeat: int) -> dict[str, dict[str, Any]]:
    """Each page ``repeat`` times, alternating (so a slow spell of the machine hits both)."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in pages}
    for _ in range(repeat):
        for name, page in pages.items():
            runs[name].append(open_once(binary, page))
    out = {}
    for name, timings in runs.items():
        medians = {}
        for key in KEYS:
            values = [t[key] for t in timings if t[key] is not None]
            medians[key] = statistics.median(values) if values else None
        out[name] = {"median_s": medians, "runs": timings}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=11_797, help="questions in the run (default: KQA Pro's val)")
    parser.add_argument("--repeat", type=int, default=5, help="times each page is opened (median)")
    parser.add_argument("--out", type=Path, default=Path("outputs/browser-bench"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    binary = next((p for name in CHROMIUM_NAMES if (p := shutil.which(name))), None)
    if binary is None:
        print(f"error: no Chromium on PATH ({', '.join(CHROMIUM_NAMES)}): apt-get install chromium", file=sys.stderr)
        return 2

    out = args.out.resolve()
    load_before = os.getloadavg()
    print(f"building a run of {args.n:,} questions in {out / 'run'} (load average {load_before[0]:.2f})", flush=True)
    sizes = build_run(out / "run", args.n, args.seed)
    print(f"  predictions.jsonl {sizes['predictions_mb']:.1f} MB, retrieval.jsonl {sizes['retrieval_mb']:.1f} MB; "
          f"browser.html {sizes['browser_mb']:.1f} MB, written in {sizes['browser_s']:.1f} s", flush=True)
    blank = out / "blank.html"
    blank.write_text("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>blank</title></head>"
                     "<body><p>blank</p></body></html>\n", encoding="utf-8")
    pages = {"blank.html": blank, "browser.html": out / "run" / "browser.html"}
    print(f"opening each page {args.repeat} times in headless {binary}", flush=True)
    results = measure(binary, pages, args.repeat)
    load_after = os.getloadavg()

    print(f"\nmedian seconds of {args.repeat} (load average before {load_before[0]:.2f}, after {load_after[0]:.2f}; "
          f"{os.cpu_count()} CPUs)")
    print(f"{'page':<14}{'MB':>7}" + "".join(f"{k:>8}" for k in KEYS))
    for name, page in pages.items():
        m = results[name]["median_s"]
        cells = "".join(f"{m[k]:>8.3f}" if m[k] is not None else f"{'-':>8}"
                        for k in KEYS)
        print(f"{name:<14}{page.stat().st_size / 1e6:>7.1f}{cells}")
    shown = results["browser.html"]["median_s"]["shown"], results["blank.html"]["median_s"]["shown"]
    rows_shown = {r["shown_rows"] for r in results["browser.html"]["runs"]}
    if None not in shown:
        print(f"\nbrowser.html shows its first page {shown[0]:.2f} s after Chromium is launched, "
              f"a blank page {shown[1]:.2f} s: ratio {shown[0] / shown[1]:.2f}; rows on its first page: "
              f"{', '.join(map(str, sorted(rows_shown)))}")
    (out / "results.json").write_text(json.dumps(
        {"questions": args.n, "repeat": args.repeat, "sizes": sizes, "load_before": load_before,
         "load_after": load_after, "cpus": os.cpu_count(), "chromium": binary, "pages": results}, indent=1),
        encoding="utf-8")
    print(f"results: {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
