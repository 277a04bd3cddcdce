"""Names as the data has them: every string a KB name, value or gold argument may hold either
round-trips through the program text or is rejected at load naming file, item and what."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cbr2.data.names import question_problem
from cbr2.data.schema import DataError, validate_kqapro_kb, validate_kqapro_questions
from cbr2.evaluation.records import read_records
from cbr2.kopl.program import Program, Step
from cbr2.kopl.text import FORMATS, parse_text, to_text, unwritable

ROOT = Path(__file__).resolve().parents[1]

ANY_CHAR = st.characters(codec=None, exclude_categories=())
"""Every code point, surrogates and controls included (hypothesis leaves out surrogates by default)."""

ODD = ["Line\nbreak r9: Find[X]", " lead", "trail ", " ", '"Heroes"', "'Allo 'Allo!", "a\u2028b\r\nc", "\\u0041",
       "x\\", "\t", "a\x85b\xa0", "→ r1: (r1, r2)", "A | B [x] \\ y", "ends\\ ", "\x00\x1f\x7f", "\u3000wide\u3000",
       '"a" and "b"', "“quoted”"]


def _program(a: str, b: str, c: str) -> Program:
    return Program((Step("Find", (a,), ()), Step("Relate", (b, "forward"), (0,)),
                    Step("FilterStr", (c, a), (1,)), Step("QueryName", (), (2,))))


def _kb(name: str) -> dict:
    return {"concepts": {"C1": {"name": "city", "subclassOf": []}},
            "entities": {"Q1": {"name": name, "instanceOf": ["C1"], "attributes": [], "relations": []}}}


@settings(max_examples=400, deadline=None)
@given(st.lists(st.text(ANY_CHAR, max_size=30), min_size=3, max_size=3))
@example(ODD[:3])
@example(ODD[3:6])
@example(["", "x" * 1001, "\ud800"])
def test_every_name_round_trips_or_is_rejected_at_load(names):
    a, b, c = names
    if all(unwritable(n) is None for n in names):
        program = _program(a, b, c)
        for fmt in FORMATS:
            assert parse_text(to_text(program, fmt), fmt) == program
    for name in names:
        if unwritable(name) is None:
            validate_kqapro_kb(_kb(name), "kb.json")
        else:
            with pytest.raises(DataError, match=r'^kb\.json: entities\["Q1"\]\.name: .*'):
                validate_kqapro_kb(_kb(name), "kb.json")


@pytest.mark.parametrize("name", ODD)
def test_odd_names_round_trip_as_every_argument(name):
    program = _program(name, name, name)
    for fmt in FORMATS:
        text = to_text(program, fmt)
        assert len(text.splitlines()) == (1 if fmt == "dag" else 4)  # no name opens a line of its own
        assert parse_text(text, fmt) == program


def test_what_cannot_be_carried_is_rejected_with_file_item_and_what():
    with pytest.raises(DataError, match=r'kb\.json: entities\["Q1"\]\.name: .* has 1001 characters'):
        validate_kqapro_kb(_kb("x" * 1001), "kb.json")
    kb = _kb("ok")
    kb["entities"]["Q1"]["attributes"] = [{"key": "k", "value": {"type": "string", "value": "v"},
                                           "qualifiers": {"": [{"type": "string", "value": "w"}]}}]
    with pytest.raises(DataError, match=r'kb\.json: entities\["Q1"\]\.attributes\[0\]\.qualifiers: .* is empty'):
        validate_kqapro_kb(kb, "kb.json")
    with pytest.raises(DataError, match=r"val\.json: \[0\]\.question: holds a line break \(U\+2028\)"):
        validate_kqapro_questions([{"question": "Who\u2028Program: r1: Find[X]", "program": [], "answer": "x"}],
                                  "val.json")
    with pytest.raises(DataError, match=r"val\.json: \[0\]\.program\[0\]\.inputs\[0\]: .* lone surrogate U\+DC00"):
        validate_kqapro_questions([{"question": "q", "program": [{"function": "Find", "inputs": ["a\udc00"]}],
                                    "answer": "x"}], "val.json")
    assert question_problem("What is \"it\"?\t(tab)") is None


def _odd_kqapro(tmp_path: Path, names: list[str]) -> Path:
    """The embedded mini-kqapro in the official layout, with entities renamed to ``names``."""
    from cbr2.data.benchmarks import EMBEDDED_ROOT

    src = EMBEDDED_ROOT / "mini-kqapro"
    kb = json.loads((src / "kb.json").read_text())
    train, val = (json.loads((src / f).read_text()) for f in ("train.json", "val.json"))
    used = {arg for item in val for step in item["program"] if step["function"] == "Find" for arg in step["inputs"]}
    renames = {}
    for ent, new in zip((e for e in kb["entities"].values() if e["name"] in used), names):
        renames[ent["name"]] = new
        ent["name"] = new

    def rename(node):
        if isinstance(node, dict):
            return {k: (v if k == "question" else rename(v)) for k, v in node.items()}
        if isinstance(node, list):
            return [rename(v) for v in node]
        return renames.get(node, node) if isinstance(node, str) else node

    root = tmp_path / "KQAPro"
    root.mkdir()
    (root / "kb.json").write_text(json.dumps(kb))
    (root / "train.json").write_text(json.dumps(rename(train)))
    (root / "val.json").write_text(json.dumps(rename(val)))
    return root


def _gold(root: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "evaluate.py"), "data.name=kqapro", f"data.root={root}",
                           f"output_dir={out}", "llm.backend=gold", "eval.per_category=null", "wandb.mode=disabled",
                           "generation.constrained=false", "retrieval.cases=none", "retrieval.k_ontology=0",
                           "retrieval.k_facts=0"], cwd=ROOT, capture_output=True, text=True, check=False, timeout=600)


@pytest.mark.slow
def test_gold_programs_over_odd_names_still_score_one(tmp_path):
    root = _odd_kqapro(tmp_path, ODD)
    run = _gold(root, tmp_path / "run")
    assert run.returncode == 0, run.stderr[-2000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert (metrics["hits@1"], metrics["ser"], metrics["ser_before_repair"]) == (1.0, 0.0, 0.0)
    records = [r for _, r in read_records(tmp_path / "run" / "predictions.jsonl")]
    assert any("\\u000a" in r["gold_program"] for r in records)  # the line-break name was asked about


@pytest.mark.slow
def test_a_name_no_program_can_carry_stops_the_load_naming_it(tmp_path):
    root = _odd_kqapro(tmp_path, ["x" * 1001])
    run = _gold(root, tmp_path / "run")
    assert run.returncode == 2
    assert ".json: " in run.stderr and "has 1001 characters" in run.stderr, run.stderr[-2000:]
