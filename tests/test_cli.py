"""The entry points as a user runs them, and that every module imports with CPU dependencies only."""

import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import cbr2

ROOT = Path(__file__).resolve().parents[1]


def test_every_module_imports():
    names = [m.name for m in pkgutil.walk_packages(cbr2.__path__, "cbr2.")]
    assert "cbr2.kopl.executor" in names
    for name in names:
        importlib.import_module(name)


def _run(*args, cwd):
    return subprocess.run([sys.executable, str(ROOT / "evaluate.py"), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300, check=False)


def test_evaluate_cli_writes_results_and_prints_where(tmp_path):
    proc = _run("data.name=mini-metaqa", "eval.limit=30", f"output_dir={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Hits@1 1.0000  SER 0.0000  n=30" in proc.stdout
    assert (tmp_path / "report.md").read_text().startswith("# mini-metaqa · gold")


@pytest.mark.parametrize("args, message", [
    (["data.nmae=mini-metaqa"], "unknown key 'data.nmae'"),
    (["data.name=metaqa"], "needs data.root"),
    (["data.name=metaqa", "data.root=/nonexistent"], "no kb.txt"),
    (["data.split=dev"], "not a kqapro split"),
])
def test_evaluate_cli_errors_exit_2_with_a_message(tmp_path, args, message):
    proc = _run(*args, f"output_dir={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
