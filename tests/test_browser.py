"""``browser.html`` and ``compare.html``: self-contained, every question there, hostile text inert,
filters that work (in headless Chromium when it is installed: Debian's ``chromium``, see .ci/run)."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
import shutil
import subprocess

import pytest

from cbr2.evaluation.metrics import judged
from cbr2.evaluation.trace import build_trace
from cbr2.report.browser import SUMMARY_FIELDS, browser_data, embed_json, page_blocks, write_browser, write_compare

HOSTILE = "</script><img src=x onerror=alert(1)>"
"""Generated text that would run script if the page ever parsed data as markup."""

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


STEPS = [{"step": 1, "function": "Find", "args": ["Paris"], "inputs": [], "holds": "entities", "count": 1,
          "first": ["Paris"]},
         {"step": 2, "function": "QueryAttr", "args": ["population"], "inputs": [1], "holds": "values", "count": 1,
          "first": ["1"]}]
"""The ``steps`` of a prediction record of the program below (``Executor.summarize``)."""


def prediction(qid, category, correct, *, kind=None, program="r1: Find[Paris] → QueryAttr[population]", **extra):
    return {"id": qid, "question": f"Question {qid}?", "category": category, "gold_answer": "1",
            "gold_program": "r1: Find[Paris] → QueryAttr[population]", "generated": program, "repairs": [],
            "syntax_error_before_repair": False, "syntax_error": False, "program": program,
            "unknown_arguments": [], "canonicalized": [], "answer": "1" if correct else "2", "correct": correct,
            "error_kind": None if correct else kind, "error": None, "steps": STEPS, "prompt_hash": "ab" * 32,
            "generation_key": "k", "prompt_tokens": 900, "completion_tokens": 20, "latency_s": 0.5, **extra}


def write_run(folder, records, retrieval=(), hits=None):
    """A run folder as the runner writes it (no config.yaml: the benchmark is not consulted)."""
    folder.mkdir(parents=True)
    (folder / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    if retrieval:
        (folder / "retrieval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in retrieval), encoding="utf-8")
    n = len(records)
    right = sum(bool(r.get("correct")) for r in records)
    cats = sorted({r.get("category") or "unknown" for r in records})
    metrics = {"hits@1": right / n if hits is None else hits, "ser": 0.0, "ser_before_repair": 0.0, "n": n,
               "per_category": {c: {"hits@1": 0.5, "ser": 0.0, "n": 1} for c in cats},
               "provenance": {"config": {"data": {"name": "mini-kqapro", "split": "val"},
                                         "llm": {"backend": "gold", "model": None}},
                              "ablation": None, "split": "val"}}
    (folder / "metrics.json").write_text(json.dumps(metrics), encoding="utf-8")
    return folder


@pytest.fixture
def run(tmp_path):
    records = [
        prediction("val-1", "Count", True),
        prediction("val-2", "Verify", False, kind="wrong", program="r1: Find[Rome] → QueryAttr[population]"),
        {**prediction("val-3", "Verify", False, kind="syntax", program=None), "generated": HOSTILE,
         "question": f"Is {HOSTILE} a question?", "syntax_error": True,
         "error": {"kind": "syntax", "code": "no_program", "message": HOSTILE}},
        {"id": "val-4", "question": "An old record with few fields", "correct": False},  # older runs
    ]
    case = {"id": "train-7", "views": ["semantic", "structural"], "scores": [0.91, 0.5],
            "ontology": ["city | has attribute | population (quantity)"], "facts": [f"Paris | note | {HOSTILE}"]}
    retrieval = [{"id": "val-1", "ontology": ["city | has attribute | population (quantity)"],  # no scores: older runs
                  "facts": ["Paris | population | 2102650"], "facts_scores": [0.75], "cases": [case]},
                 {"id": "val-3", "ontology": [], "facts": [], "cases": [case]},
                 {"id": "val-9", "ontology": [], "facts": [], "cases": []}]  # retrieved, never generated
    return write_run(tmp_path / "run", records, retrieval)


def embedded(page: str):
    m = re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.DOTALL)
    assert m, "no data block"
    return json.loads(m.group(1))


def browser_page(page: str):
    """What browser.html's script reads: each question whole (its row's fields joined with its
    details from block ``data-K``), with the triples and cases of block ``data-0``."""
    head = embedded(page)
    found = re.findall(r'<script type="application/json" id="data-(\d+)">(.*?)</script>', page, re.DOTALL)
    assert [int(k) for k, _ in found] == list(range(len(found)))
    tables, *details = [json.loads(text) for _, text in found]
    size = head["chunk"]
    questions = [{**q, **details[i // size][i % size]} for i, q in enumerate(head["questions"])]
    return {**head, **tables, "questions": questions}


def trace_of(data, question):
    """A question's trace as the page's ``traceOf`` expands it from the page's data (the same steps)."""
    t, strings, cases = dict(question["trace"]), data["strings"], data["cases"]
    if t["knowledge"] is not None:
        t["knowledge"] = {kind: [{"text": strings[i], "score": score} for i, score in t["knowledge"][kind]]
                          for kind in ("ontology", "facts")}
    if t["cases"] is not None:
        expanded = []
        for cid, found, *own in t["cases"]:
            c = cases.get(cid, {})
            k = own[0] if own else c
            expanded.append({"id": cid, "question": c.get("question"), "program": c.get("program"),
                             "found_by": [{"view": v, "score": s} for v, s in found],
                             "ontology": [strings[i] for i in k.get("ontology", [])],
                             "facts": [strings[i] for i in k.get("facts", [])]})
        t["cases"] = expanded
    return t


def test_page_is_self_contained_and_holds_every_question(run):
    path = write_browser(run)
    assert path == run / "browser.html"
    page = path.read_text(encoding="utf-8")
    data = browser_page(page)
    assert [q["id"] for q in data["questions"]] == ["val-1", "val-2", "val-3", "val-4", "val-9"]
    by_id = {q["id"]: q for q in data["questions"]}
    assert (by_id["val-1"]["verdict"], by_id["val-2"]["kind"], by_id["val-9"]["verdict"]) == ("right", "wrong", "n/a")
    assert by_id["val-2"]["analysis"]["class"] == "grounding" and by_id["val-3"]["class"] == "other"
    assert by_id["val-4"]["category"] == "unknown" and by_id["val-4"]["trace"]["knowledge"] is None
    hit = by_id["val-1"]["trace"]["cases"][0]
    assert hit == ["train-7", [["semantic", 0.91], ["structural", 0.5]]]
    assert data["strings"][data["cases"]["train-7"]["facts"][0]] == f"Paris | note | {HOSTILE}"
    assert "generation_key" not in json.dumps(by_id["val-1"])
    # Each question's details are its trace, built by build_trace from its two records: the page holds
    # exactly that (expanded as its script does), with the retrieval scores the record kept.
    trace = trace_of(data, by_id["val-1"])
    records = {r["id"]: r for r in map(json.loads, (run / "predictions.jsonl").read_text().splitlines())}
    retrieval = {r["id"]: r for r in map(json.loads, (run / "retrieval.jsonl").read_text().splitlines())}
    assert trace == build_trace(judged(records["val-1"]), retrieval["val-1"], question=None, cases={})
    assert trace["knowledge"]["facts"] == [{"text": "Paris | population | 2102650", "score": 0.75}]
    assert trace["knowledge"]["ontology"] == [{"text": "city | has attribute | population (quantity)", "score": None}]
    assert trace["steps"][1] == STEPS[1] and trace["answered"] and trace["correct"]
    assert trace_of(data, by_id["val-9"])["generation"] is None and by_id["val-9"]["trace"]["question"] is None
    # No network: no URL at all, no external src/href; one page, no other file to fetch.
    assert "http://" not in page and "https://" not in page
    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:[a-z]+:)?//""", page, re.IGNORECASE)
    assert not re.search(r"<(?:link|iframe|object|embed)\b", page, re.IGNORECASE)


def test_hostile_text_stays_inert(run):
    page = write_browser(run).read_text(encoding="utf-8")
    # The data cannot end its script block: only the page's own scripts close (rows, code, triples, details).
    assert page.count("</script>") == 4 and HOSTILE not in page and "<img" not in page
    data = browser_page(page)
    hostile = next(q for q in data["questions"] if q["id"] == "val-3")["trace"]
    assert hostile["generation"]["text"] == HOSTILE and hostile["error"]["message"] == HOSTILE
    # The code never parses data as markup ...
    script = page.rsplit("<script>", 1)[1].split("</script>", 1)[0]
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in script
    # ... and the page's policy runs this one script only (by hash): no inline handler, no fetch.
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page).group(1)
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in csp and "default-src 'none'" in csp


def test_the_first_block_holds_the_rows_only_and_the_others_every_detail(run):
    """Split in blocks of 2, the part parsed at load has each question's row fields and no details;
    each question reads back whole from its row and its own details block, as browser_data has it."""
    data = browser_data(run)
    head, (tables, *details) = page_blocks(data, chunk=2)
    assert [len(d) for d in details] == [2, 2, 1]
    assert tables == {"strings": data["strings"], "cases": data["cases"]}
    assert "strings" not in head and "cases" not in head and head["chunk"] == 2
    assert all(set(q) <= set(SUMMARY_FIELDS) for q in head["questions"])
    assert {k: v for k, v in head.items() if k not in ("questions", "chunk")} == \
        {k: v for k, v in data.items() if k not in ("questions", "strings", "cases")}
    for i, (q, row) in enumerate(zip(data["questions"], head["questions"], strict=True)):
        assert {**row, **details[i // 2][i % 2]} == q

    # The page: the rows' part before the script, the rest after it.
    page = write_browser(run).read_text(encoding="utf-8")
    assert page.index('id="data"') < page.index("<script>") < page.index('id="data-0"') < page.index('id="data-1"')


def test_embed_json_round_trips_what_could_break_a_script_block():
    value = {"t": ["</script>", "<!--", "<script>", "&amp;", "\u2028", "\ud800 lone surrogate", "é"]}
    text = embed_json(value)
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == value


def test_compare_lists_the_flips_with_relative_links(tmp_path):
    base = write_run(tmp_path / "runs" / "full", [prediction(f"val-{i}", "Count", i < 3, kind="wrong") for i in range(5)])
    other = write_run(tmp_path / "runs" / "wo_act",
                      [prediction(f"val-{i}", "Count", i in (0, 3), kind="empty") for i in range(5)])
    write_browser(base)
    path = write_compare([base, other], tmp_path / "report", ["Full", "w/o act"])
    page = path.read_text(encoding="utf-8")
    data = embedded(page)
    assert [r["href"] for r in data["runs"]] == ["../runs/full/browser.html", "../runs/wo_act/browser.html"]
    assert [r["has_browser"] for r in data["runs"]] == [True, False]
    (pair,) = data["pairs"]
    flips = {f["id"]: f["direction"] for f in pair["flips"]}
    assert flips == {"val-1": "lost", "val-2": "lost", "val-3": "gained"}
    assert (pair["common"], pair["both_right"], pair["both_wrong"]) == (5, 1, 1)
    assert "http://" not in page and "https://" not in page


def test_report_cli_writes_the_comparison(tmp_path):
    from cbr2.report.compare import main

    a = write_run(tmp_path / "a", [prediction("val-1", "Count", True), prediction("val-2", "Count", False, kind="wrong")])
    b = write_run(tmp_path / "b", [prediction("val-1", "Count", False, kind="wrong"), prediction("val-2", "Count", True)])
    assert main([str(a), str(b), "--out", str(tmp_path / "report")]) == 0
    pairs = embedded((tmp_path / "report" / "compare.html").read_text(encoding="utf-8"))["pairs"]
    assert {f["id"] for f in pairs[0]["flips"]} == {"val-1", "val-2"}


def test_every_evaluation_writes_its_browser(tmp_path):
    from cbr2.config import load_config
    from cbr2.run.runner import run_evaluation

    overrides = ["llm.backend=gold", "eval.per_category=null", "wandb.mode=disabled", "generation.constrained=false",
                 "retrieval.cases=none", "retrieval.k_ontology=0", "retrieval.k_facts=0", "eval.limit=12"]
    run_evaluation(load_config([f"output_dir={tmp_path / 'run'}", *overrides]))
    data = browser_page((tmp_path / "run" / "browser.html").read_text(encoding="utf-8"))
    assert len(data["questions"]) == 12 and all(q["verdict"] == "right" for q in data["questions"])
    # The --show-prompt index of each question is its position in the selection.
    assert [q["index"] for q in data["questions"]] == list(range(12))
    assert data["prompt_command"].endswith("config.yaml --show-prompt")


# ------------------------------------------------------------------------------ headless Chromium

def chromium():
    for name in CHROMIUM_NAMES:
        if path := shutil.which(name):
            return path
    pytest.skip(f"no headless Chromium ({', '.join(CHROMIUM_NAMES)}) on PATH: apt-get install chromium (.ci/run does)")


def dump_dom(browser, page, fragment, profile):
    """The DOM after the page's script ran, as headless Chromium serialises it."""
    url = page.resolve().as_uri() + (f"#{fragment}" if fragment else "")
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           f"--user-data-dir={profile}", "--dump-dom", url],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    assert 'data-ready="1"' in dom, f"the page's script did not finish: {done.stderr[-2000:]}"
    return dom


def rows(dom):
    """``(id, hidden)`` of every question row."""
    tags = re.findall(r'<details class="q [^"]*"[^>]*>', dom)
    return [(html.unescape(re.search(r'data-id="([^"]*)"', t).group(1)), " hidden" in t) for t in tags]


def shown_count(dom):
    return re.search(r'id="count">([^<]*)<', dom).group(1)


def test_chromium_shows_every_question_and_filters(run, tmp_path):
    browser = chromium()
    page = write_browser(run)
    dom = dump_dom(browser, page, "", tmp_path / "profile")
    assert rows(dom) == [(q, False) for q in ("val-1", "val-2", "val-3", "val-4", "val-9")]
    assert shown_count(dom) == "5 of 5 questions shown"

    dom = dump_dom(browser, page, "kind=wrong", tmp_path / "profile")
    assert [q for q, hidden in rows(dom) if not hidden] == ["val-2"]
    assert shown_count(dom) == "1 of 5 questions shown"
    dom = dump_dom(browser, page, "correct=wrong&category=Verify", tmp_path / "profile")
    assert [q for q, hidden in rows(dom) if not hidden] == ["val-2", "val-3"]
    dom = dump_dom(browser, page, "q=rome", tmp_path / "profile")
    assert [q for q, hidden in rows(dom) if not hidden] == ["val-2"]


def test_chromium_pages_a_long_run(tmp_path):
    """A whole validation set is shown a page of rows at a time; a link opens a question on its page."""
    browser = chromium()
    records = [prediction(f"val-{i:04d}", "Count" if i % 3 else "Verify", i % 2 == 0, kind="wrong")
               for i in range(450)]
    records[430]["generated"] = "r1: Find[Lyon] → QueryAttr[area]"  # in the third details block only
    page = write_browser(write_run(tmp_path / "long", records))
    dom = dump_dom(browser, page, "", tmp_path / "profile")
    assert rows(dom) == [(f"val-{i:04d}", False) for i in range(200)]  # the first page only is built
    assert shown_count(dom) == "450 of 450 questions shown" and "page 1 of 3" in dom
    dom = dump_dom(browser, page, "page=3", tmp_path / "profile")
    assert rows(dom) == [(f"val-{i:04d}", False) for i in range(400, 450)]
    dom = dump_dom(browser, page, "correct=wrong&page=2", tmp_path / "profile")  # filters, then pages
    assert [q for q, _ in rows(dom)] == [f"val-{i:04d}" for i in range(1, 450, 2)][200:]
    dom = dump_dom(browser, page, "open=val-0321", tmp_path / "profile")
    assert re.search(r'<details class="q wrong" data-id="val-0321"[^>]* open=""', dom) and "page 2 of 3" in dom
    assert "<b>tokens in / out</b><span>900 / 20</span>" in dom  # its details, from the second block
    # Its trace's steps: each call, the steps it reads, what its result holds and its first items.
    assert re.search(r'<li value="2"><code>QueryAttr\[population\]</code><span class="score"> ← 1</span> ⇒ '
                     r'values \(1\): 1</li>', dom)
    dom = dump_dom(browser, page, "q=lyon", tmp_path / "profile")  # a search reads every block
    assert rows(dom) == [("val-0430", False)] and shown_count(dom) == "1 of 450 questions shown"
    dom = dump_dom(browser, page, "category=Verify&open=val-0001", tmp_path / "profile")  # filtered out: shown too
    assert rows(dom)[0] == ("val-0001", False) and shown_count(dom) == "151 of 450 questions shown"


def test_chromium_renders_hostile_text_as_text(run, tmp_path):
    browser = chromium()
    page = write_browser(run)
    dom = dump_dom(browser, page, "open=val-3", tmp_path / "profile")
    assert re.search(r'<details class="q wrong" data-id="val-3"[^>]* open=""', dom)
    assert "&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;" in dom  # the question, the generated text, the error
    assert "<img" not in dom
    assert "--show-prompt K" in dom  # a run without config.yaml: the index is unknown


def test_chromium_compare_page(tmp_path):
    browser = chromium()
    base = write_run(tmp_path / "full", [prediction(f"val-{i}", "Count", i < 2, kind="wrong") for i in range(4)])
    other = write_run(tmp_path / "chain", [prediction(f"val-{i}", "Count", i == 3, kind="wrong") for i in range(4)])
    page = write_compare([base, other], tmp_path / "report", ["Full", "Chain"])
    dom = dump_dom(browser, page, "", tmp_path / "profile")
    assert re.findall(r'<tr class="flip (\w+)" data-id="([^"]+)"', dom) == [
        ("lost", "val-0"), ("lost", "val-1"), ("gained", "val-3")]
    assert shown_count(dom) == "3 of 3 flipped questions shown"
    assert 'href="../full/browser.html#open=val-0"' in dom
    dom = dump_dom(browser, page, "direction=gained", tmp_path / "profile")
    assert shown_count(dom) == "1 of 3 flipped questions shown"


def test_the_browser_reads_repeated_ids_as_a_resumed_run_does(tmp_path, caplog):
    from cbr2.evaluation.records import load_predictions
    from cbr2.report.browser import browser_data

    path = tmp_path / "predictions.jsonl"
    # A stale record generated again (the newer wins), then two writers' records of q2 (a conflict).
    lines = [prediction("q1", "Count", False, kind="wrong_answer", prompt_hash="old"), prediction("q1", "Count", True),
             prediction("q2", "Count", True), prediction("q2", "Count", False, kind="wrong_answer")]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")
    with pytest.raises(ValueError, match="lines 3 and 4 both hold id 'q2'"):
        load_predictions(path)
    shown = {q["id"]: q["verdict"] for q in browser_data(tmp_path)["questions"]}
    assert shown == {"q1": "right", "q2": "right"}  # the newer q1; q2's first record, as the repair keeps
    assert "lines 3 and 4 both hold 'q2'" in caplog.text
