"""``browser.html``: a static, self-contained view of one run; ``compare.html``: the questions that
flipped between runs.

    python -m cbr2.evaluation.browser RUN_DIR...      # (re)write browser.html of finished runs

Every evaluation and shard merge writes ``browser.html`` beside ``report.md``; ``python -m
cbr2.evaluation.compare RUN_A RUN_B ...`` writes ``compare.html`` beside ``ablation.md``. Both are one file
each: the data embedded as JSON in a ``<script type="application/json">`` block, vanilla JS and
inline CSS, no URL outside the folder, so they work from ``file://`` with no server and no network.

Generated text is untrusted: the JSON block escapes ``<``, ``>`` and ``&`` (no text can close the
script), and the page renders every string as a text node, never as markup.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import html
import json
import logging
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cbr2.common.console import setup_logging
from cbr2.evaluation.errors import CLASSES, classify
from cbr2.evaluation.metrics import ERROR_KINDS
from cbr2.evaluation.records import read_records

log = logging.getLogger(__name__)

BROWSER = "browser.html"
COMPARE = "compare.html"

DROPPED_FIELDS = ("generation_key",)
"""Record fields the page has no use for."""

MAX_VALUES = 50
"""Executed values kept per question (a MetaQA answer set can be long)."""


# ------------------------------------------------------------------------------------------ data

def _records(path: Path) -> dict[str, dict[str, Any]]:
    """Records of a JSONL file by id, the newest of a repeated id winning, in first-seen order."""
    out: dict[str, dict[str, Any]] = {}
    try:
        for _, record in read_records(path):
            out[record["id"]] = record
    except (OSError, ValueError) as err:
        log.warning("browser: %s is unreadable (%s); the page shows the rest", path, err)
    return out


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _run_context(run_dir: Path, bench: Any, case_ids: set[str]) -> tuple[dict[str, int], dict[str, dict[str, Any]],
                                                                         dict[str, dict[str, Any]]]:
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
        from cbr2.evaluation.runner import select_questions
        from cbr2.kopl.text import to_text

        cfg = OmegaConf.load(run_dir / "config.yaml")
        if bench is None:
            bench = Benchmark(cfg.data.name, cfg.data.root)
        selection = select_questions(bench, cfg)
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


def run_title(metrics: dict[str, Any], run_dir: Path) -> str:
    """``benchmark · backend · ablation`` from the provenance, else the folder's name."""
    prov = metrics.get("provenance") or {}
    cfg = prov.get("config") or {}
    bench = (cfg.get("data") or {}).get("name")
    if not bench:
        return run_dir.name
    kind = "retrieval" if "hits@1" not in metrics else (cfg.get("llm") or {}).get("backend")
    return " · ".join(str(x) for x in (bench, kind, prov.get("ablation")) if x)


def browser_data(run_dir: str | Path, bench: Any = None) -> dict[str, Any]:
    """The data ``browser.html`` embeds: one entry per question of the run.

    Args:
        run_dir: A run folder (``predictions.jsonl`` and/or ``retrieval.jsonl``, ``metrics.json``,
            ``config.yaml``); any of them may be missing.
        bench: The run's ``Benchmark`` when the caller has it (else built from ``config.yaml``).

    Returns:
        ``{"title", "summary", "has_predictions", "has_retrieval", "prompt_command", "strings", "cases",
        "categories", "kinds", "classes", "questions"}``:
        a question is its prediction record (as stored, minus ``generation_key``) with
        ``verdict`` (``right``, ``wrong`` or ``n/a``), ``kind`` (error kind or ``none``),
        ``analysis`` (``errors.classify``: class, reason, detail; None when right), ``index``
        (position in the selection, for ``--show-prompt``; None when unknown) and ``retrieval``
        (``{"ontology", "facts"}``: ids into ``strings``, ``"cases"``: ``[id, views, scores]``;
        None without a retrieval record). ``cases`` maps a case id to its question, program and
        retrieved triples.
    """
    run_dir = Path(run_dir)
    metrics = _read_json(run_dir / "metrics.json")
    predictions = _records(run_dir / "predictions.jsonl")
    retrieval = _records(run_dir / "retrieval.jsonl")
    case_ids = {c.get("id") for r in retrieval.values() for c in r.get("cases") or () if isinstance(c, dict)}
    index, case_text, selected = _run_context(run_dir, bench, case_ids) if (run_dir / "config.yaml").is_file() \
        else ({}, {}, {})

    ids = [*predictions, *(qid for qid in retrieval if qid not in predictions)]
    ids.sort(key=lambda qid: index.get(qid, len(index)))  # stable: unknown ids keep their file order

    strings = _Strings()
    cases: dict[str, dict[str, Any]] = {}
    questions = []
    for qid in ids:
        record = predictions.get(qid)
        entry: dict[str, Any] = dict(record) if record else {**selected.get(qid, {"id": qid})}
        for key in DROPPED_FIELDS:
            entry.pop(key, None)
        if isinstance(entry.get("values"), list) and len(entry["values"]) > MAX_VALUES:
            entry["values_n"] = len(entry["values"])
            entry["values"] = entry["values"][:MAX_VALUES]
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
        entry["category"] = entry.get("category") or selected.get(qid, {}).get("category") or "unknown"
        entry["index"] = index.get(qid)
        ret = retrieval.get(qid)
        if ret is None:
            entry["retrieval"] = None
        else:
            found = []
            for c in ret.get("cases") or ():
                if not isinstance(c, dict) or not isinstance(c.get("id"), str):
                    continue
                cid = c["id"]
                knowledge = {"ontology": strings.ids(c.get("ontology")), "facts": strings.ids(c.get("facts"))}
                if cid not in cases:
                    cases[cid] = {**case_text.get(cid, {}), **knowledge}
                hit: list[Any] = [cid, c.get("views") or [], c.get("scores") or []]
                if {k: cases[cid][k] for k in knowledge} != knowledge:
                    hit.append(knowledge)  # retrieved with other triples than its first occurrence
                found.append(hit)
            entry["retrieval"] = {"ontology": strings.ids(ret.get("ontology")), "facts": strings.ids(ret.get("facts")),
                                  "cases": found}
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

def embed_json(data: Any) -> str:
    """JSON safe inside ``<script type="application/json">``: no ``<``, ``>`` or ``&`` survive as
    such (``</script>``, ``<!--`` cannot end or confuse the block); ``JSON.parse`` reads it back
    unchanged. A lone surrogate (generated text may hold one) is written as a ``\\u`` escape."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(data, ensure_ascii=True, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _page(title: str, data: Any, script: str) -> str:
    """The page around ``script``. Its Content-Security-Policy allows that one script (by hash), inline
    styles and nothing else: no network, no other script, no inline event handler, even if some
    text ever reached the page as markup."""
    code = COMMON_JS + script
    digest = base64.b64encode(hashlib.sha256(code.encode("utf-8")).digest()).decode("ascii")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'sha256-{digest}'; style-src 'unsafe-inline'">
<title>{html.escape(title)}</title>
<style>{CSS}</style>
</head>
<body>
<noscript><p>This page needs JavaScript; it runs offline, from file://.</p></noscript>
<div id="app"></div>
<script type="application/json" id="data">{embed_json(data)}</script>
<script>{code}</script>
</body>
</html>
"""


def render_browser(data: dict[str, Any]) -> str:
    """``browser.html`` for :func:`browser_data`'s structure."""
    return _page(f"{data['title']} · run browser", data, BROWSER_JS)


def _write(path: Path, text: str) -> None:
    # Written beside and renamed: a reader never sees half a page.
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_browser(run_dir: str | Path, bench: Any = None) -> Path:
    """Write ``run_dir/browser.html`` (see :func:`browser_data`) and return its path."""
    run_dir = Path(run_dir)
    path = run_dir / BROWSER
    _write(path, render_browser(browser_data(run_dir, bench)))
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
        records.append(_records(d / "predictions.jsonl"))
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
    _write(path, _page(data["title"], data, COMPARE_JS))
    return path


# ----------------------------------------------------------------------------------- page assets

CSS = """
:root { --ok: #1a7f37; --bad: #c62828; --muted: #667; --line: #dde; --bg: #f6f7fb; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0; color: #1b1d24; }
header { padding: 12px 18px 4px; }
h1 { font-size: 19px; margin: 0 0 4px; }
h2 { font-size: 16px; margin: 18px 0 6px; }
h3 { font-size: 13px; margin: 12px 0 4px; text-transform: uppercase; letter-spacing: .04em; color: var(--muted); }
.summary { color: var(--muted); margin: 0 0 6px; }
.bar { position: sticky; top: 0; z-index: 2; background: #fff; border-bottom: 1px solid var(--line);
       padding: 8px 18px; display: flex; flex-wrap: wrap; gap: 10px; align-items: center; }
.bar label { color: var(--muted); font-size: 12px; }
.bar select, .bar input { font: inherit; padding: 2px 4px; margin-left: 4px; }
.bar input[type=search] { width: 260px; }
.count { margin-left: auto; font-weight: 600; }
main { padding: 8px 18px 40px; }
details.q { border: 1px solid var(--line); border-radius: 6px; margin: 4px 0; background: #fff; scroll-margin-top: 64px; }
details.q[open] { box-shadow: 0 1px 4px rgba(0,0,0,.08); }
details.q > summary { cursor: pointer; padding: 5px 8px; display: flex; gap: 10px; align-items: baseline; }
details.q > summary:hover { background: var(--bg); }
.mark { font-weight: 700; width: 1.2em; text-align: center; }
.right .mark, .ok { color: var(--ok); } .wrong .mark, .bad { color: var(--bad); } .na .mark { color: var(--muted); }
.qid { font-family: ui-monospace, Menlo, Consolas, monospace; color: var(--muted); min-width: 7em; }
.tag { font-size: 11px; padding: 0 6px; border-radius: 9px; background: var(--bg); border: 1px solid var(--line);
       white-space: nowrap; }
.tag.kind-none { display: none; } .tag.cls-none { display: none; }
.tag.cls-grounding { background: #fff4e0; } .tag.cls-logical { background: #f3e8ff; } .tag.cls-other { background: #eef; }
.text { flex: 1; }
.body { padding: 4px 14px 12px 36px; border-top: 1px solid var(--line); }
.grid { display: grid; grid-template-columns: 1fr 1fr; gap: 14px; }
pre { font: 12.5px/1.4 ui-monospace, Menlo, Consolas, monospace; background: var(--bg); border: 1px solid var(--line);
      padding: 6px 8px; margin: 2px 0 6px; white-space: pre-wrap; word-break: break-word; border-radius: 4px; }
.kv { margin: 2px 0; } .kv b { color: var(--muted); font-weight: 600; margin-right: 6px; }
ol.triples { margin: 2px 0 6px; padding-left: 2.2em; font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12.5px; }
details.case { margin: 3px 0; border-left: 3px solid var(--line); padding-left: 8px; }
details.case > summary { cursor: pointer; }
.score { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12px; color: var(--muted); }
.note { color: var(--muted); font-style: italic; }
table.flips { border-collapse: collapse; width: 100%; table-layout: fixed; }
table.flips td, table.flips th { border: 1px solid var(--line); padding: 6px 8px; vertical-align: top; text-align: left; }
table.flips th { background: var(--bg); }
a { color: #1f5fbf; }
"""

COMMON_JS = r"""
"use strict";
const DATA = JSON.parse(document.getElementById("data").textContent);
// Every string reaches the page as a text node: el() never parses markup.
function el(tag, attrs, ...kids) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v; else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const kid of kids.flat(Infinity)) {
    if (kid === null || kid === undefined || kid === false) continue;
    node.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return node;
}
function show(value) {
  if (value === null || value === undefined) return "—";
  if (Array.isArray(value)) return value.length ? value.map(show).join(", ") : "(empty)";
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}
function pct(x) { return typeof x === "number" ? (100 * x).toFixed(2) + "%" : "—"; }
function kv(key, value, cls) { return el("div", {class: "kv"}, el("b", {}, key), el("span", {class: cls}, show(value))); }
function code(text, empty) {
  return text === null || text === undefined || text === "" ? el("div", {class: "note"}, empty || "none") : el("pre", {}, text);
}
function select(name, label, values, counts) {
  const s = el("select", {name: name}, el("option", {value: ""}, "all"));
  for (const v of values) if (!counts || counts[v]) s.append(el("option", {value: v}, counts ? v + " (" + counts[v] + ")" : v));
  return [el("label", {}, label, s), s];
}
function hashParams() { return new URLSearchParams(location.hash.replace(/^#/, "")); }
function setHash(params) {
  const text = params.toString();
  try { history.replaceState(null, "", text ? "#" + text : location.pathname + location.search); } catch (e) { /* file:// quirks */ }
}
function verdictMark(v) { return v === "right" ? "✓" : v === "wrong" ? "✗" : "·"; }
"""

BROWSER_JS = r"""
const S = DATA.strings, C = DATA.cases, Q = DATA.questions;
const FILTERS = [["category", "category", "category"], ["correct", "correct", "verdict"],
                 ["kind", "error kind", "kind"], ["class", "error class", "class"]];
const app = document.getElementById("app");

function header() {
  const s = DATA.summary, bits = [];
  if (s["hits@1"] !== undefined) bits.push("Hits@1 " + pct(s["hits@1"]), "SER " + pct(s.ser));
  bits.push("n = " + (s.n !== undefined ? s.n : Q.length));
  if (!DATA.has_predictions) bits.push("retrieval only: no predictions");
  return el("header", {}, el("h1", {}, DATA.title),
            el("p", {class: "summary"}, bits.join(" · "), " · ", el("a", {href: "report.md"}, "report.md")));
}

function triples(ids, what) {
  if (!ids || !ids.length) return el("div", {class: "note"}, "no " + what);
  return el("ol", {class: "triples"}, ids.map(i => el("li", {}, S[i])));
}

function caseBlock(hit, rank) {
  const [cid, views, scores, own] = hit, c = C[cid] || {}, k = own || c;
  const found = views.map((v, i) => v + (typeof scores[i] === "number" ? " " + scores[i].toFixed(3) : "")).join(", ");
  const d = el("details", {class: "case"},
    el("summary", {}, rank + 1 + ". ", el("span", {class: "qid"}, cid), " ", el("span", {class: "score"}, found), " ",
       c.question || ""));
  d.addEventListener("toggle", () => {
    if (!d.open || d.dataset.built) return;
    d.dataset.built = "1";
    d.append(code(c.program, "program not known (the benchmark could not be loaded)"),
             el("h3", {}, "its ontology triples"), triples(k.ontology, "ontology triples"),
             el("h3", {}, "its fact triples"), triples(k.facts, "fact triples"));
  });
  return d;
}

function body(q) {
  const a = q.analysis, parts = [];
  parts.push(el("div", {class: "grid"},
    el("div", {}, el("h3", {}, "gold"), kv("answer", q.gold_answer), code(q.gold_program, "no gold program")),
    el("div", {}, el("h3", {}, "prediction"),
       kv("answer", q.answer, q.verdict === "right" ? "ok" : "bad"),
       q.values && q.values_n ? kv("values", q.values.length + " of " + q.values_n + " shown") : null,
       code(q.program, q.verdict === "n/a" ? "not generated" : "no program parsed"))));
  if (q.verdict !== "n/a") {
    parts.push(el("h3", {}, "verdict"),
      kv("correct", q.verdict, q.verdict === "right" ? "ok" : "bad"), kv("error kind", q.kind),
      q.error ? kv("error", q.error.message || q.error) : null,
      a ? kv("error class", a.class + " · " + a.reason) : null, a && a.detail ? kv("why", a.detail) : null);
    parts.push(el("h3", {}, "generated text"), code(q.generated, "empty"),
      q.generated_chars ? el("div", {class: "note"}, "clipped: the model wrote " + q.generated_chars + " characters") : null,
      kv("repairs", q.repairs && q.repairs.length ? q.repairs : "none"),
      kv("syntax error before / after repair", show(q.syntax_error_before_repair) + " / " + show(q.syntax_error)));
    if (q.unknown_arguments && q.unknown_arguments.length)
      parts.push(kv("arguments outside the KB", q.unknown_arguments.map(u => u.function + " " + u.arg + ": " + u.value)));
    if (q.canonicalized && q.canonicalized.length)
      parts.push(kv("canonicalised", q.canonicalized.map(c => show(c.value) + " → " + show(c.snapped))));
    if (q.fallback && q.fallback.fired) {
      const f = q.fallback, sp = q.single_pass || {};
      parts.push(el("details", {}, el("summary", {}, "fallback: the correction round (kept: " + show(f.kept) + ")"),
        el("h3", {}, "single pass"), kv("error kind", sp.error_kind), code(sp.generated, "empty"),
        el("h3", {}, "correction"), kv("error kind", f.error_kind), code(f.generated, "empty")));
    }
  }
  const r = q.retrieval;
  if (!r) {
    parts.push(el("h3", {}, "retrieval"), el("div", {class: "note"},
      DATA.has_retrieval ? "no retrieval record for this question" : "this run wrote no retrieval.jsonl (it retrieved nothing)"));
  } else {
    parts.push(el("div", {class: "grid"},
      el("div", {}, el("h3", {}, "ontology triples"), triples(r.ontology, "ontology triples")),
      el("div", {}, el("h3", {}, "fact triples"), triples(r.facts, "fact triples"))));
    parts.push(el("h3", {}, "cases (views that found them, scores)"),
      r.cases.length ? r.cases.map(caseBlock) : el("div", {class: "note"}, "no cases"));
  }
  if (q.verdict !== "n/a") {
    const cmd = DATA.prompt_command + " " + (q.index === null || q.index === undefined ? "K" : q.index);
    parts.push(el("details", {}, el("summary", {}, "prompt" + (q.prompt_tokens ? " (" + q.prompt_tokens + " tokens)" : "")),
      q.prompt ? code(q.prompt) : [el("div", {class: "note"}, "Prompts are not stored in the run; print this one, exactly as the model read it (no LLM is loaded), with:"),
        code(cmd), q.index === null || q.index === undefined ?
          el("div", {class: "note"}, "K: the question's 0-based position in the run's selection") : null],
      kv("prompt hash", q.prompt_hash),
      kv("tokens in / out", show(q.prompt_tokens) + " / " + show(q.completion_tokens)),
      kv("seconds", typeof q.latency_s === "number" ? q.latency_s.toFixed(2) : q.latency_s)));
  }
  return el("div", {class: "body"}, parts);
}

function row(q, i) {
  const d = el("details", {class: "q " + (q.verdict === "n/a" ? "na" : q.verdict), "data-id": q.id, "data-i": i},
    el("summary", {}, el("span", {class: "mark"}, verdictMark(q.verdict)), el("span", {class: "qid"}, q.id),
       el("span", {class: "tag"}, q.category), el("span", {class: "tag kind-" + q.kind}, q.kind),
       el("span", {class: "tag cls-" + q.class}, q.class), el("span", {class: "text"}, q.question || "")));
  d.addEventListener("toggle", () => {
    if (d.open && !d.dataset.built) { d.dataset.built = "1"; d.append(body(q)); }
  });
  return d;
}

function haystack(q) {
  if (q._hay === undefined)
    q._hay = [q.id, q.question, q.program, q.generated, show(q.answer), show(q.gold_answer), q.gold_program,
              q.analysis ? q.analysis.reason + " " + q.analysis.detail : ""].join("\n").toLowerCase();
  return q._hay;
}

const controls = {}, bar = el("div", {class: "bar"});
for (const [param, label, field] of FILTERS) {
  const counts = {};
  for (const q of Q) counts[q[field]] = (counts[q[field]] || 0) + 1;
  const values = field === "category" ? DATA.categories : field === "verdict" ? ["right", "wrong", "n/a"] :
                 field === "kind" ? DATA.kinds : DATA.classes;
  const [lab, sel] = select(param, label, values, counts);
  controls[param] = sel; bar.append(lab);
}
controls.q = el("input", {type: "search", name: "q", placeholder: "search id, question, program, answer…"});
bar.append(el("label", {}, "search", controls.q));
const count = el("span", {class: "count", id: "count"});
bar.append(count);
const list = el("main", {id: "list"});
const rows = [], frag = document.createDocumentFragment();
Q.forEach((q, i) => { const r = row(q, i); rows.push(r); frag.append(r); });
list.append(frag);
app.append(header(), bar, list);

function apply() {
  const want = {};
  for (const [param, , field] of FILTERS) want[field] = controls[param].value;
  const needle = controls.q.value.trim().toLowerCase();
  let shown = 0;
  Q.forEach((q, i) => {
    let ok = true;
    for (const field in want) if (want[field] && q[field] !== want[field]) { ok = false; break; }
    if (ok && needle) ok = haystack(q).includes(needle);
    rows[i].hidden = !ok;
    if (ok) shown++;
  });
  count.textContent = shown + " of " + Q.length + " questions shown";
  apply.shown = shown;
}

function fromHash() {
  const p = hashParams();
  for (const name in controls) {
    const v = p.get(name) || "";
    if (controls[name].tagName === "SELECT" && v && ![...controls[name].options].some(o => o.value === v))
      controls[name].append(el("option", {value: v}, v + " (0)"));
    controls[name].value = v;
  }
  apply();
  const open = p.get("open");
  if (open) {
    const r = rows.find(r => r.dataset.id === open);
    if (r && r.hidden) { r.hidden = false; count.textContent = (apply.shown + 1) + " of " + Q.length + " questions shown"; }
    if (r) {
      r.open = true;
      const top = r.getBoundingClientRect().top;
      if (top < bar.offsetHeight || top > window.innerHeight - 40) r.scrollIntoView();
    }
  }
}

function toHash() {
  const p = hashParams();
  for (const name in controls) { if (controls[name].value) p.set(name, controls[name].value); else p.delete(name); }
  setHash(p);
}
let typing = 0;  // search as one types, once the typing pauses (10k questions stay responsive)
for (const name in controls) controls[name].addEventListener(name === "q" ? "input" : "change", () => {
  clearTimeout(typing);
  typing = setTimeout(() => { apply(); toHash(); }, name === "q" ? 150 : 0);
});
window.addEventListener("hashchange", fromHash);
fromHash();
document.body.dataset.ready = "1";
"""

COMPARE_JS = r"""
const app = document.getElementById("app"), R = DATA.runs;
function runLink(run, qid) {
  return el("a", {href: run.href + "#open=" + encodeURIComponent(qid), title: "this question in " + run.label + "'s browser.html"},
            run.label + " ↗");
}
function sideCell(s) {
  return el("td", {}, kv("answer", s.answer, s.kind === "none" ? "ok" : "bad"), kv("error kind", s.kind),
    s.analysis ? kv("error class", s.analysis.class + " · " + s.analysis.reason) : null,
    s.message ? kv("error", s.message) : null,
    code(s.program, "no program parsed"),
    s.program === null || s.program === undefined ? el("details", {}, el("summary", {}, "generated text"), code(s.generated, "empty")) : null);
}
app.append(el("header", {}, el("h1", {}, DATA.title),
  el("p", {class: "summary"}, "Questions that flipped between the base run (first) and each other run; each run's own page (browser.html) has every question."),
  el("ul", {}, R.map(r => el("li", {}, el("a", {href: r.href}, r.label), " · Hits@1 " + pct(r["hits@1"]) + " · n = " + show(r.n),
    r.has_browser ? null : el("span", {class: "note"}, " (no browser.html yet: python -m cbr2.evaluation.browser " + r.dir + ")"))))));
const bar = el("div", {class: "bar"});
const cats = [...new Set(DATA.pairs.flatMap(p => p.flips.map(f => f.category)))].sort();
const [catLab, cat] = select("category", "category", cats);
const dir = el("select", {name: "direction"}, el("option", {value: ""}, "all"),
  el("option", {value: "lost"}, "lost: right → wrong"), el("option", {value: "gained"}, "gained: wrong → right"));
const dirLab = el("label", {}, "direction", dir);
const search = el("input", {type: "search", name: "q", placeholder: "search id, question…"});
const count = el("span", {class: "count", id: "count"});
bar.append(catLab, dirLab, el("label", {}, "search", search), count);
const main = el("main", {});
app.append(bar, main);
const rows = [];
for (const p of DATA.pairs) {
  const A = R[p.a], B = R[p.b];
  const lost = p.flips.filter(f => f.direction === "lost").length, gained = p.flips.length - lost;
  main.append(el("h2", {}, A.label + " vs " + B.label),
    el("p", {class: "summary"}, p.common + " questions in both: " + p.both_right + " right in both, " + p.both_wrong +
      " wrong in both, " + lost + " right → wrong (lost), " + gained + " wrong → right (gained)" +
      (p.only_a || p.only_b ? "; " + p.only_a + " only in " + A.label + ", " + p.only_b + " only in " + B.label : "")));
  if (!p.flips.length) { main.append(el("div", {class: "note"}, "no question flipped")); continue; }
  const table = el("table", {class: "flips"}, el("tr", {}, el("th", {}, "question"),
    el("th", {}, A.label + " (base)"), el("th", {}, B.label)));
  for (const f of p.flips) {
    const tr = el("tr", {class: "flip " + f.direction, "data-id": f.id, "data-direction": f.direction, "data-category": f.category},
      el("td", {}, el("div", {}, el("span", {class: f.direction === "lost" ? "bad" : "ok"},
          f.direction === "lost" ? "✓ → ✗ " : "✗ → ✓ "), el("span", {class: "qid"}, f.id), " ",
          el("span", {class: "tag"}, f.category)),
        el("div", {class: "score"}, "open in ", runLink(A, f.id), " · ", runLink(B, f.id)),
        el("div", {}, f.question || ""), kv("gold answer", f.gold_answer), code(f.gold_program, "no gold program")),
      sideCell(f.a), sideCell(f.b));
    tr._hay = [f.id, f.question, f.a.program, f.b.program].join("\n").toLowerCase();
    rows.push(tr); table.append(tr);
  }
  main.append(table);
}
function apply() {
  const needle = search.value.trim().toLowerCase();
  let shown = 0;
  for (const tr of rows) {
    const ok = (!cat.value || tr.dataset.category === cat.value) && (!dir.value || tr.dataset.direction === dir.value) &&
               (!needle || tr._hay.includes(needle));
    tr.hidden = !ok; if (ok) shown++;
  }
  count.textContent = shown + " of " + rows.length + " flipped questions shown";
}
const p0 = hashParams();
cat.value = p0.get("category") || ""; dir.value = p0.get("direction") || ""; search.value = p0.get("q") || "";
for (const c of [cat, dir]) c.addEventListener("change", apply);
search.addEventListener("input", apply);
apply();
document.body.dataset.ready = "1";
"""


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m cbr2.evaluation.browser RUN_DIR...``: (re)write each run's ``browser.html``."""
    parser = argparse.ArgumentParser(prog="python -m cbr2.evaluation.browser", description=__doc__,
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
