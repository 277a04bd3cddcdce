"""``browser.html``: a static, self-contained view of one run; ``compare.html``: the questions that
flipped between runs.

    python -m cbr2.report.browser RUN_DIR...      # (re)write browser.html of finished runs

Every evaluation and shard merge writes ``browser.html`` beside ``report.md``; ``python -m
cbr2.report.compare RUN_A RUN_B ...`` writes ``compare.html`` beside ``ablation.md``. Both are one file
each: the data embedded as JSON in ``<script type="application/json">`` blocks, vanilla JS and
inline CSS, no URL outside the folder, so they work from ``file://`` with no server and no network.
The JS and CSS are package data in ``browser_assets/`` (``common.js`` then ``browser.js`` or
``compare.js``, ``browser.css``), inlined into each page.

``browser.html`` splits its data (``page_blocks``) so that its first page costs little more at
10,000 questions than at 100: the block before the script holds what the rows and filters need (a
few fields per question); the blocks after it hold the questions' details (answers, programs,
generated text; ``CHUNK`` questions a block) and the run's triples and cases, and are parsed when
a question is opened (its block and the triples') or a search needs them (every block).

A question's details are its trace (``cbr2.evaluation.trace.build_trace``, the record the API and
the ``ask`` command return), built from its prediction and retrieval records by the same function,
then compacted for the page (``_compact``: triple texts as ids into one table, each case's text
and triples stored once); the page's script expands it back (``traceOf`` in ``browser.js``).

Generated text is untrusted: the JSON block escapes ``<``, ``>`` and ``&`` (no text can close the
script), and the page renders every string as a text node, never as markup.
"""

from __future__ import annotations

import argparse
import base64
import functools
import hashlib
import html
import json
import logging
import os
import shlex
import sys
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from cbr2.common.console import setup_logging
from cbr2.common.files import write_atomic
from cbr2.evaluation.errors import CLASSES, classify
from cbr2.evaluation.metrics import ERROR_KINDS, judged
from cbr2.evaluation.records import load_records, utf8_json
from cbr2.evaluation.trace import build_trace
from cbr2.report.run_report import run_title

log = logging.getLogger(__name__)

BROWSER = "browser.html"
COMPARE = "compare.html"

SUMMARY_FIELDS = ("id", "question", "category", "verdict", "kind", "class")
"""A question's fields in the block parsed at load: what its row shows and the filters test."""

CHUNK = 200
"""Questions per details block of ``browser.html``: opening a question parses one block (a few
hundred kB at KQA Pro's sizes), not the whole run's data."""


# ------------------------------------------------------------------------------------------ data

def _records(path: Path) -> dict[str, dict[str, Any]]:
    """Records of a JSONL file by id, as every reader takes them (``records.load_records``); a
    conflicting repetition keeps its first record with a warning, as the folder repair does."""
    conflicts: list[tuple[int, int, str]] = []
    try:
        out = load_records(path, conflicts=conflicts)
    except (OSError, ValueError) as err:
        log.warning("browser: %s is unreadable (%s); the page shows the rest", path, err)
        return {}
    for first, later, qid in conflicts:
        log.warning("browser: %s: lines %d and %d both hold %r; the page shows the first "
                    "(`python -m cbr2.run.repair FOLDER` settles it)", path, first, later, qid)
    return out


def _predictions(run_dir: Path) -> dict[str, dict[str, Any]]:
    """A run's predictions as ``_records`` reads them, judged by the current answer comparison."""
    return {qid: judged(record) for qid, record in _records(run_dir / "predictions.jsonl").items()}


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _run_context(run_dir: Path, bench: Any, case_ids: set[str], selection: Sequence[Any] | None
                 ) -> tuple[dict[str, int], dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """What only the benchmark knows: each question's position in the run's selection (the
    ``--show-prompt`` index), the cases' questions and programs, and the evaluated questions
    themselves (for a retrieval-only run, which writes no predictions).

    Best effort: a run whose data or config cannot be loaded any more gets empty maps (the
    page then shows ids only), with a warning.
    """
    try:
        from omegaconf import OmegaConf

        from cbr2.data.benchmarks import Benchmark
        from cbr2.data.questions import question_record
        from cbr2.evaluation.selection import select_questions
        from cbr2.kopl.text import to_text

        cfg = OmegaConf.load(run_dir / "config.yaml")
        if bench is None:
            bench = Benchmark.from_config(cfg.data, cfg.get("cache_dir"))
        if selection is None:  # a folder read on its own (python -m cbr2.report.browser)
            selection = select_questions(bench, cfg.data.split, cfg.eval)
        index = {q.qid: i for i, q in enumerate(selection)}
        questions = {q.qid: question_record(q) for q in selection}
        cases: dict[str, dict[str, Any]] = {}
        if case_ids:
            fmt = OmegaConf.select(cfg, "prompt.format", default="dag")
            for q in bench.questions(bench.family.train_split):
                if q.qid in case_ids:
                    cases[q.qid] = {"question": q.question,
                                    "program": to_text(q.program, fmt) if q.program is not None else None}
        return index, cases, questions
    except Exception as err:  # noqa: BLE001 - an auxiliary view must not fail a finished run
        log.warning("browser: %s: cannot load the run's benchmark (%s: %s); cases show their ids only",
                    run_dir, type(err).__name__, err)
        return {}, {}, {}


class _Strings:
    """Interned texts: a triple retrieved for many questions is stored once."""

    def __init__(self) -> None:
        self.table: list[str] = []
        self._index: dict[str, int] = {}

    def ids(self, texts: Sequence[str] | None) -> list[int]:
        out = []
        for text in texts or ():
            if text not in self._index:
                self._index[text] = len(self.table)
                self.table.append(text)
            out.append(self._index[text])
        return out


def _question(qid: str, record: dict[str, Any] | None, selected: dict[str, Any] | None,
              index: int | None) -> dict[str, Any]:
    """A question's entry without its trace: what its row shows and the filters test (id, question,
    category, verdict, error kind, error class), its error analysis and its selection index."""
    known = record or selected or {}
    entry: dict[str, Any] = {"id": qid, "question": known.get("question")}
    if record is None:
        entry.update(verdict="n/a", kind="n/a", analysis=None)
    else:
        entry["verdict"] = "right" if record.get("correct") else "wrong"
        entry["kind"] = record.get("error_kind") or ("none" if record.get("correct") else "unknown")
        try:
            entry["analysis"] = classify(record)
        except Exception as err:  # noqa: BLE001 - a malformed old record still gets its row
            entry["analysis"] = {"class": "other", "reason": "unparsable", "detail": f"{type(err).__name__}: {err}"}
    entry["class"] = entry["analysis"]["class"] if entry["analysis"] else "none"
    entry["category"] = known.get("category") or (selected or {}).get("category") or "unknown"
    entry["index"] = index
    return entry


def _compact(trace: dict[str, Any], strings: _Strings, cases: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A trace as the page stores it: each triple as ``[id into strings, score]``, each case as
    ``[id, [[view, score], ...]]`` with its question, program and triples entered in ``cases``
    once (a third element holds its triples when they differ from those stored). ``traceOf`` in
    ``browser.js`` expands it back to the trace."""
    out = dict(trace)
    if trace["knowledge"] is not None:
        out["knowledge"] = {kind: [[strings.ids([t["text"]])[0], t["score"]] for t in trace["knowledge"][kind]]
                            for kind in ("ontology", "facts")}
    if trace["cases"] is not None:
        hits = []
        for c in trace["cases"]:
            knowledge = {"ontology": strings.ids(c["ontology"]), "facts": strings.ids(c["facts"])}
            if c["id"] not in cases:
                cases[c["id"]] = {"question": c["question"], "program": c["program"], **knowledge}
            hit: list[Any] = [c["id"], [[f["view"], f["score"]] for f in c["found_by"]]]
            if {k: cases[c["id"]][k] for k in knowledge} != knowledge:
                hit.append(knowledge)  # retrieved with other triples than its first occurrence
            hits.append(hit)
        out["cases"] = hits
    return out


def browser_data(run_dir: str | Path, bench: Any = None, records: Sequence[dict[str, Any]] | None = None,
                 selection: Sequence[Any] | None = None) -> dict[str, Any]:
    """The data ``browser.html`` embeds: one entry per question of the run.

    Args:
        run_dir: A run folder (``predictions.jsonl`` and/or ``retrieval.jsonl``, ``metrics.json``,
            ``config.yaml``); any of them may be missing.
        bench: The run's ``Benchmark`` when the caller has it (else built from ``config.yaml``).
        records: The run's prediction records when the caller holds them (the runner, the
            merge); else ``predictions.jsonl`` is read.
        selection: The run's whole selection of questions when the caller holds it; else it is
            selected again from ``config.yaml``.

    Returns:
        ``{"title", "summary", "has_predictions", "has_retrieval", "prompt_command", "strings", "cases",
        "categories", "kinds", "classes", "questions"}``: a question is ``{"id", "question",
        "category", "verdict", "kind", "class", "analysis", "index", "trace"}``: ``verdict``
        (``right``, ``wrong`` or ``n/a``), ``kind`` (error kind or ``none``), ``class`` and
        ``analysis`` (``errors.classify``: class, reason, detail; None when right), ``index``
        (position in the selection, for ``--show-prompt``; None when unknown) and ``trace``, its
        ``build_trace`` from its prediction and retrieval records as ``_compact`` stores it (triple
        texts are ids into ``strings``; ``cases`` maps a case id to its question, program and
        retrieved triples).
    """
    run_dir = Path(run_dir)
    metrics = _read_json(run_dir / "metrics.json")
    predictions = {r["id"]: r for r in records} if records is not None else _predictions(run_dir)
    retrieval = _records(run_dir / "retrieval.jsonl")
    case_ids = {c.get("id") for r in retrieval.values() for c in r.get("cases") or () if isinstance(c, dict)}
    index, case_text, selected = _run_context(run_dir, bench, case_ids, selection) \
        if (run_dir / "config.yaml").is_file() else ({}, {}, {})

    ids = [*predictions, *(qid for qid in retrieval if qid not in predictions)]
    ids.sort(key=lambda qid: index.get(qid, len(index)))  # stable: unknown ids keep their file order

    strings = _Strings()
    cases: dict[str, dict[str, Any]] = {}
    questions = []
    for qid in ids:
        record, known = predictions.get(qid), selected.get(qid) or {"id": qid}
        entry = _question(qid, record, known, index.get(qid))
        trace = build_trace(record, retrieval.get(qid), question=known, cases=case_text)
        entry["trace"] = _compact(trace, strings, cases)
        questions.append(entry)

    order = list(metrics.get("per_category") or ())
    categories = order + sorted({q["category"] for q in questions} - set(order))
    summary = {k: metrics.get(k) for k in ("hits@1", "ser", "ser_before_repair", "n") if k in metrics}
    return {
        "title": run_title(metrics, run_dir),
        "summary": summary,
        "has_predictions": bool(predictions),
        "has_retrieval": bool(retrieval),
        "prompt_command": f"python evaluate.py --config {shlex.quote(str(run_dir / 'config.yaml'))} --show-prompt",
        "strings": strings.table,
        "cases": cases,
        "categories": categories,
        "kinds": [*ERROR_KINDS, "none", "unknown", "n/a"],
        "classes": [*CLASSES, "none"],
        "questions": questions,
    }


# ------------------------------------------------------------------------------------------ html

@functools.cache
def asset(name: str) -> str:
    """A file of ``browser_assets/`` (the pages' CSS and vanilla JS, package data), as text."""
    return resources.files(__package__).joinpath("browser_assets").joinpath(name).read_text(encoding="utf-8")


def embed_json(data: Any) -> str:
    """JSON safe inside ``<script type="application/json">``: no ``<``, ``>`` or ``&`` survive as
    such (``</script>``, ``<!--`` cannot end or confuse the block); ``JSON.parse`` reads it back
    unchanged. A lone surrogate (generated text may hold one) is written as a ``\\u`` escape."""
    text = utf8_json(data, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def page_blocks(data: dict[str, Any], chunk: int = CHUNK) -> tuple[dict[str, Any], list[Any]]:
    """:func:`browser_data` as ``browser.html`` embeds it: a light part, parsed at load, and blocks
    parsed on demand.

    Args:
        data: :func:`browser_data`'s structure.
        chunk: Questions per details block.

    Returns:
        ``(head, blocks)``. ``head`` is ``data`` without ``strings`` and ``cases``, each question
        cut to ``SUMMARY_FIELDS``, and ``chunk``. ``blocks[0]`` is ``{"strings", "cases"}`` (the
        run's interned triples and its cases, as in ``data``: each stored once); block ``k + 1``
        lists the other fields of questions ``k * chunk`` to ``(k + 1) * chunk - 1``, in order.
    """
    head = {k: v for k, v in data.items() if k not in ("strings", "cases", "questions")}
    head["chunk"] = chunk
    questions = data["questions"]
    head["questions"] = [{k: q[k] for k in SUMMARY_FIELDS if k in q} for q in questions]
    details = [{k: v for k, v in q.items() if k not in SUMMARY_FIELDS} for q in questions]
    return head, [{"strings": data["strings"], "cases": data["cases"]},
                  *(details[start: start + chunk] for start in range(0, len(details), chunk))]


def _page(title: str, data: Any, script: str, blocks: Sequence[Any] = ()) -> str:
    """The page around the asset ``script`` (run after ``common.js``), with ``data`` in the block
    ``data`` before the script and each of ``blocks`` in a block ``data-K`` after it (the script
    runs before those are parsed, so it must wait for them: ``DOMContentLoaded``).

    Its Content-Security-Policy allows that one script (by hash), inline styles and nothing else:
    no network, no other script, no inline event handler, even if some text ever reached the page
    as markup."""
    code = asset("common.js") + asset(script)
    digest = base64.b64encode(hashlib.sha256(code.encode("utf-8")).digest()).decode("ascii")
    later = "".join(f'<script type="application/json" id="data-{k}">{embed_json(block)}</script>\n'
                    for k, block in enumerate(blocks))
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'sha256-{digest}'; style-src 'unsafe-inline'">
<title>{html.escape(title)}</title>
<style>{asset("browser.css")}</style>
</head>
<body>
<noscript><p>This page needs JavaScript; it runs offline, from file://.</p></noscript>
<div id="app"></div>
<script type="application/json" id="data">{embed_json(data)}</script>
<script>{code}</script>
{later}</body>
</html>
"""


def render_browser(data: dict[str, Any]) -> str:
    """``browser.html`` for :func:`browser_data`'s structure (split by :func:`page_blocks`)."""
    head, blocks = page_blocks(data)
    return _page(f"{data['title']} · run browser", head, "browser.js", blocks)


def write_browser(run_dir: str | Path, bench: Any = None, records: Sequence[dict[str, Any]] | None = None,
                  selection: Sequence[Any] | None = None) -> Path:
    """Write ``run_dir/browser.html`` (see :func:`browser_data`) and return its path."""
    run_dir = Path(run_dir)
    path = run_dir / BROWSER
    write_atomic(path, render_browser(browser_data(run_dir, bench, records, selection)))
    return path


# ------------------------------------------------------------------------------------ comparison

def _side(record: dict[str, Any]) -> dict[str, Any]:
    """What the comparison shows of one run's prediction of a question."""
    try:
        analysis = classify(record)
    except Exception:  # noqa: BLE001
        analysis = None
    return {"answer": record.get("answer"), "program": record.get("program"), "generated": record.get("generated"),
            "kind": record.get("error_kind") or "none", "analysis": analysis,
            "message": (record.get("error") or {}).get("message") if isinstance(record.get("error"), dict) else None}


def compare_data(run_dirs: Sequence[str | Path], out_dir: str | Path, labels: Sequence[str] | None = None
                 ) -> dict[str, Any]:
    """The data ``compare.html`` embeds: the first run against each other one.

    Args:
        run_dirs: Run folders; the first is the base.
        out_dir: Where ``compare.html`` goes (links to the runs' pages are relative to it).
        labels: A name per run (default: the folders' names).

    Returns:
        ``{"runs": [{"label", "dir", "href", "has_browser", "hits@1", "n"}], "pairs": [{"a", "b",
        "common", "both_right", "both_wrong", "only_a", "only_b", "flips": [...]}]}``; a flip is
        ``{"id", "question", "category", "gold_answer", "gold_program", "direction", "a", "b"}``
        with ``direction`` ``lost`` (right in the base, wrong in the other) or ``gained``.
    """
    out_dir = Path(out_dir)
    labels = list(labels) if labels else [Path(d).name for d in run_dirs]
    runs, records = [], []
    for d, label in zip(run_dirs, labels, strict=True):
        d = Path(d)
        metrics = _read_json(d / "metrics.json")
        runs.append({"label": label, "dir": str(d), "href": Path(os.path.relpath(d / BROWSER, out_dir)).as_posix(),
                     "has_browser": (d / BROWSER).is_file(), "hits@1": metrics.get("hits@1"), "n": metrics.get("n")})
        records.append(_predictions(d))
    pairs = []
    base = records[0] if records else {}
    for j in range(1, len(records)):
        other = records[j]
        common = [qid for qid in base if qid in other]
        flips = []
        for qid in common:
            a, b = base[qid], other[qid]
            if bool(a.get("correct")) == bool(b.get("correct")):
                continue
            flips.append({"id": qid, "question": a.get("question"), "category": a.get("category") or "unknown",
                          "gold_answer": a.get("gold_answer"), "gold_program": a.get("gold_program"),
                          "direction": "lost" if a.get("correct") else "gained", "a": _side(a), "b": _side(b)})
        right = [bool(base[q].get("correct")) and bool(other[q].get("correct")) for q in common]
        wrong = [not base[q].get("correct") and not other[q].get("correct") for q in common]
        pairs.append({"a": 0, "b": j, "common": len(common), "both_right": sum(right), "both_wrong": sum(wrong),
                      "only_a": len(set(base) - set(other)), "only_b": len(set(other) - set(base)), "flips": flips})
    return {"title": "Run comparison", "runs": runs, "pairs": pairs}


def write_compare(run_dirs: Sequence[str | Path], out_dir: str | Path, labels: Sequence[str] | None = None,
                  title: str | None = None) -> Path:
    """Write ``out_dir/compare.html`` (see :func:`compare_data`) and return its path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    data = compare_data(run_dirs, out_dir, labels)
    if title:
        data["title"] = title
    path = out_dir / COMPARE
    write_atomic(path, _page(data["title"], data, "compare.js"))
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m cbr2.report.browser RUN_DIR...``: (re)write each run's ``browser.html``."""
    parser = argparse.ArgumentParser(prog="python -m cbr2.report.browser", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders")
    args = parser.parse_args(argv)
    setup_logging()
    status = 0
    for d in args.runs:
        if not Path(d).is_dir():
            print(f"error: {d}: no such run folder", file=sys.stderr)
            status = 2
            continue
        print(write_browser(d))
    return status


if __name__ == "__main__":
    sys.exit(main())
