"""A prompt over the model's context is a counted failure of its own kind; the run goes on.

Real llama.cpp (the packaged SmolLM2-135M) with a 2,048-token context, and one question of the
split made about 3,000 tokens long: the issue's outlier at one eighth of the scale.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cbr2.evaluation.records import read_records

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("llama_cpp")


def _kqapro_with_a_long_question(tmp_path: Path) -> Path:
    from cbr2.data.benchmarks import EMBEDDED_ROOT

    root = tmp_path / "KQAPro"
    root.mkdir()
    for name in ("kb.json", "train.json"):
        (root / name).write_bytes((EMBEDDED_ROOT / "mini-kqapro" / name).read_bytes())
    val = json.loads((EMBEDDED_ROOT / "mini-kqapro" / "val.json").read_text())
    val[1]["question"] = "Considering everything said so far, " * 300 + val[1]["question"]
    (root / "val.json").write_text(json.dumps(val))
    return root


def _run(root: Path, out: Path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "evaluate.py"), "data.name=kqapro", f"data.root={root}", f"output_dir={out}",
         "llm.backend=llamacpp", "llm.model=smollm2-135m", "llm.max_model_len=2048", "llm.max_new_tokens=24",
         "generation.constrained=false", "eval.per_category=null", "eval.limit=3", "wandb.mode=disabled",
         "retrieval.cases=none", "retrieval.k_ontology=0", "retrieval.k_facts=0", *overrides],
        cwd=ROOT, capture_output=True, text=True, check=False, timeout=900)


@pytest.mark.slow
def test_an_over_long_prompt_is_a_counted_failure_and_the_run_goes_on(tmp_path):
    root, out = _kqapro_with_a_long_question(tmp_path), tmp_path / "run"
    run = _run(root, out)
    assert run.returncode == 0, run.stderr[-3000:]
    records = {r["id"]: r for _, r in read_records(out / "predictions.jsonl")}
    assert list(records) == ["val-0", "val-1", "val-2"]
    long = records["val-1"]
    assert long["error_kind"] == "prompt_too_long" and not long["correct"] and not long["syntax_error"]
    assert "tokens, the context 2048" in long["error"]["message"] and long["prompt_tokens"] > 2048
    assert all(records[q]["error_kind"] != "prompt_too_long" and records[q]["prompt_tokens"] < 2048
               for q in ("val-0", "val-2"))
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["errors"]["prompt_too_long"] == 1 and metrics["prompt_too_long"] == ["val-1"]
    assert metrics["ser"] == sum(r["syntax_error"] for r in records.values()) / 3
    report = (out / "report.md").read_text()
    assert "| prompt_too_long | 1 |" in report and "`val-1`" in report

    # The same command again: the record is kept like any other (the configuration, context
    # included, is the folder's), nothing is generated, the report is the same.
    again = _run(root, out)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "3 cached" in again.stderr and "0 to generate" in again.stderr
    assert json.loads((out / "metrics.json").read_text())["prompt_too_long"] == ["val-1"]
