"""``benchmarks/results_tables.py`` on two tiny run folders: the rows it prints (Δ, the paired interval
and the flips of the project's own functions) and ``--check`` against a page that states them, one
that leaves some out and one that differs."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from cbr2.evaluation.metrics import paired_difference

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "results_tables.py"

FULL = [True, True, False, False, True, False, False, False, True, False]
"""Per question, right or not: the full run (4 of 10) ..."""
WITHOUT = [True, True, True, False, True, True, False, False, False, False]
"""... and the run without the question's knowledge (5 of 10): +2 / −1 against full."""
CATEGORIES = ("Count", "QueryAttr")


def _script():
    """``benchmarks/results_tables.py`` as a module (it is a script, not a package's)."""
    name = "results_tables_benchmark"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, SCRIPT)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # before it runs: its dataclasses look their module up
        spec.loader.exec_module(module)
    return sys.modules[name]


def write_run(folder: Path, correct: list[bool], setting: str, seconds: float, model: str = "qwen2.5-coder-0.5b",
              programs: str = "r1: Find[Rome] → QueryAttr[population]") -> Path:
    """A run folder as the runner writes it: predictions.jsonl, metrics.json and config.yaml."""
    folder.mkdir(parents=True)
    records = [{"id": f"val-{i}", "question": f"Question {i}?", "category": CATEGORIES[i % 2], "correct": right,
                "program": programs if i < 5 else "r1: Find[Paris] → QueryName[]", "latency_s": seconds,
                "prompt_tokens": 2000} for i, right in enumerate(correct)]
    (folder / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    per_category = {c: {"hits@1": sum(r["correct"] for r in records if r["category"] == c)
                        / sum(r["category"] == c for r in records), "ser": 0.0,
                        "n": sum(r["category"] == c for r in records)} for c in CATEGORIES}
    config = {"data": {"name": "mini-kqapro", "split": "val"}, "llm": {"backend": "llamacpp", "model": model}}
    metrics = {"hits@1": sum(correct) / len(correct), "ser": 0.0, "n": len(correct), "per_category": per_category,
               "generation": {"seconds_per_question": seconds, "prompt_tokens": 2000.0},
               "provenance": {"config": config, "setting": setting, "split": "val", "seed": 0, "git": "abc1234",
                              "question_ids_sha256": "f" * 64}}
    (folder / "metrics.json").write_text(json.dumps(metrics), encoding="utf-8")
    (folder / "config.yaml").write_text("data:\n  name: mini-kqapro\n  split: val\nllm:\n  backend: llamacpp\n"
                                        f"  model: {model}\n", encoding="utf-8")
    return folder


@pytest.fixture
def pair(tmp_path):
    """The full run and the run without knowledge, of one model on the same ten questions."""
    return (write_run(tmp_path / "full", FULL, "full", 6.0),
            write_run(tmp_path / "wo", WITHOUT, "w/o_knowledge", 3.0, programs="r1: Find[Rome] → Count[]"))


def expected_interval() -> str:
    d = paired_difference(WITHOUT, FULL)
    script = _script()
    return script.interval(100 * d["low"], 100 * d["high"])


def test_ladder_rows_carry_delta_interval_and_flips(pair):
    table = _script().ladder([str(p) for p in pair])
    assert table.header == ["setting", "qwen2.5-coder-0.5b"]
    assert table.rows[0] == ["Full CBR²", "40.00"]
    assert table.rows[1] == ["-w/o knowledge", f"50.00 (+10.00 {expected_interval()}, +2 / −1)"]
    assert table.rows[2] == ["s / question, full · w/o knowledge", "6.00 · 3.00"]


def test_categories_rows(pair):
    table = _script().categories([str(p) for p in pair])
    assert table.header[:3] == ["setting", "CT", "QA"] and table.header[-5:] == [
        "Overall", "Δ vs full", "95% CI", "flips", "s / question"]
    full, wo = table.rows
    assert full[0] == "Full CBR²" and full[1:3] == ["60.00", "20.00"] and full[-5:] == ["40.00", "—", "—", "—", "6.00"]
    assert wo[0] == "-w/o knowledge" and wo[-5:] == ["50.00", "+10.00", expected_interval(), "+2 / −1", "3.00"]


def test_versus_and_runs_rows(pair):
    script = _script()
    table = script.versus(str(pair[0]), [str(pair[1])], ["no knowledge, H10"])
    assert table.rows == [["no knowledge, H10", "40.00", "50.00", "+10.00", expected_interval(), "+2 / −1", "5",
                           "6.00 · 3.00", "2,000 · 2,000"]]
    assert script.runs_table([str(p) for p in pair], ["full", "default"]).rows == [
        ["full", "40.00", "0.00", "6.00", "10"], ["default", "50.00", "0.00", "3.00", "10"]]


PAGE = """# Results

## The ladder

| setting | Qwen2.5-Coder-0.5B | Qwen2.5-Coder-1.5B |
|---|---:|---:|
| Full CBR² | **40** | 73.33 |
| -w/o knowledge (the default) | 50.00 (+10.00 {ci}, +2 / −1) | 75.56 |
| s / question, full · w/o knowledge | 6.00 · 3.00 | 19.45 · 11.36 |

## Another table with the same columns

| setting | Qwen2.5-Coder-0.5B |
|---|---:|
| Full CBR² | 12.00 |
"""


def test_check_finds_the_table_that_states_the_rows(pair, tmp_path, capsys):
    page = tmp_path / "page.md"
    page.write_text(PAGE.format(ci=expected_interval()), encoding="utf-8")
    assert _script().main(["ladder", *map(str, pair), "--check", str(page)]) == 0
    out = capsys.readouterr().out
    assert 'table under "The ladder": 3 cells agree, 0 differ, 0 rows not on the page' in out


def test_check_names_a_cell_that_differs(pair, tmp_path, capsys):
    page = tmp_path / "page.md"
    page.write_text(PAGE.format(ci=expected_interval()).replace("6.00 · 3.00", "6.00 · 3.50"), encoding="utf-8")
    assert _script().main(["ladder", *map(str, pair), "--check", str(page), "--section", "ladder"]) == 1
    out = capsys.readouterr().out
    assert "differs: s / question, full · w/o knowledge / qwen2.5-coder-0.5b: page '6.00 · 3.50'" in out


@pytest.mark.parametrize(("page_cell", "agrees"), [
    ("50.00 (+10.00 [−1.00, +2.00])", False),  # another interval
    ("50 (+10.00)", True),  # a cell that leaves out the interval and the flips
    ("48.89; 50.00 (+10.00) ⁴", True),  # figures of two runs, one of them these
    ("**50.00** (+10.00 [x], +2 / −1)", False),  # fewer numbers where the interval should be: not these
])
def test_cell_rules(page_cell, agrees):
    assert _script().cell_agrees(page_cell, f"50.00 (+10.00 {expected_interval()}, +2 / −1)") is agrees


def test_page_tables_skip_code_and_keep_headings():
    text = "## A\n\n```\n| not | a table |\n|---|---|\n```\n\n| k | v |\n|---|---:|\n| a \\| b | 1 |\n"
    (table,) = _script().page_tables(text)
    assert table.heading == "A" and table.header == ["k", "v"] and table.rows == [["a | b", "1"]]


def test_unreadable_runs_exit_2(tmp_path, capsys):
    assert _script().main(["runs", str(tmp_path / "nothing")]) == 2
    assert "no such run folder" in capsys.readouterr().err
