"""The entry points as a user runs them, and that every module imports with CPU dependencies only."""

import importlib
import importlib.util
import json
import logging
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import cbr2
from cbr2.data.benchmarks import EMBEDDED_ROOT

ROOT = Path(__file__).resolve().parents[1]


def test_every_module_imports():
    names = [m.name for m in pkgutil.walk_packages(cbr2.__path__, "cbr2.")]
    assert "cbr2.kopl.executor" in names
    for name in names:
        importlib.import_module(name)


def _run(*args, cwd):
    return subprocess.run([sys.executable, str(ROOT / "evaluate.py"), *GOLD, *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300, check=False)


GOLD = ["llm.backend=gold", "eval.per_category=null", "wandb.mode=disabled", "generation.constrained=false"]
"""The gold writer over whole splits, no W&B (overridable: later arguments win)."""

BACKBONE = "structural.checkpoint=sentence-transformers/all-MiniLM-L6-v2"
"""The untrained backbone as structural retriever: a real encoder without minutes of training."""


@pytest.mark.slow
def test_evaluate_cli_writes_results_and_prints_where(tmp_path):
    proc = _run("data.name=mini-metaqa", "eval.limit=30", BACKBONE, f"output_dir={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Hits@1 1.0000  SER 0.0000  n=30" in proc.stdout
    report = (tmp_path / "report.md").read_text()
    assert report.startswith("# mini-metaqa · gold") and "## Retrieval" in report
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert set(metrics["retrieval"]["cases"]) == {"semantic", "structural", "merged"}
    assert len((tmp_path / "retrieval.jsonl").read_text().splitlines()) == 30


@pytest.mark.slow
def test_retrieval_only_cli_scores_every_view(tmp_path):
    # The full method's retrieval: the CPU default recalls no knowledge triples to score.
    proc = _run("--retrieval-only", "--ablation", "full", "data.name=mini-metaqa", "eval.limit=30", BACKBONE,
                f"output_dir={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "sketch-hit@5 semantic" in proc.stdout and "knowledge recall" in proc.stdout
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert set(metrics["retrieval"]["cases"]) == {"semantic", "structural", "random", "merged"}
    assert 0 < metrics["retrieval"]["knowledge"]["recall"] <= 1
    assert not (tmp_path / "predictions.jsonl").exists()


@pytest.mark.parametrize("args, message", [
    (["data.nmae=mini-metaqa"], "unknown key 'data.nmae'"),
    (["data.name=metaqa"], "needs data.root"),
    (["data.name=metaqa", "data.root=/nonexistent"], "no kb.txt"),
    (["data.split=dev"], "not a kqapro split"),
    (["data.name=kqapro", "data.root=KQAPRO"], "python train.py data.name=kqapro data.root="),
    (["retrieval.cases=dua", BACKBONE], "unknown retrieval.cases 'dua'"),
    (["retrieval.index=ivff", BACKBONE], "unknown retrieval.index 'ivff'"),
])
def test_evaluate_cli_errors_exit_2_with_a_message(tmp_path, args, message):
    if "data.root=KQAPRO" in args:  # an official layout with no structural retriever trained on it
        root = tmp_path / "KQAPro"
        shutil.copytree(EMBEDDED_ROOT / "mini-kqapro", root)
        args = ["data.name=kqapro", f"data.root={root}"]
    proc = _run(*args, f"output_dir={tmp_path}", "eval.limit=5", cwd=tmp_path)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def _entry_point(script):
    """The module whose ``main`` ``evaluate.py`` or ``train.py`` runs (as ``cbr2 evaluate`` / ``cbr2 train``)."""
    return importlib.import_module(f"cbr2.cli.{Path(script).stem}")


@pytest.mark.parametrize("script, runs", [("evaluate.py", "cbr2.cli.evaluate.run_evaluation"),
                                         ("train.py", "cbr2.structural.train.train")])  # imported when training starts
def test_a_user_error_is_one_line_and_anything_else_shows_its_traceback(script, runs, monkeypatch, capsys):
    from cbr2.common.errors import SetupError, UserError
    from cbr2.config import ConfigError
    from cbr2.data.schema import DataError

    module = _entry_point(script)
    monkeypatch.setattr(module, "setup_logging", lambda: None)  # the test process keeps its logging ...
    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # ... without an earlier test's stderr handler

    def raising(error):
        def run(*args, **kwargs):
            raise error
        return run

    for error in (ConfigError("eval.limit=0: too small"), DataError("train.json: [3].answer: missing"),
                  SetupError("llm.model=x needs the package y"), UserError("the folder holds another run")):
        monkeypatch.setattr(runs, raising(error))
        assert module.main([]) == 2
        assert capsys.readouterr().err.splitlines() == [f"error: {error}"]
    for bug in (ValueError("a library's own ValueError"), OSError("disk full"), KeyError("x")):
        monkeypatch.setattr(runs, raising(bug))
        with pytest.raises(type(bug)):  # not turned into exit code 2: the traceback shows where it came from
            module.main([])


@pytest.mark.slow
def test_show_prompt_prints_the_prompt_and_nothing_else(tmp_path):
    # smollm2-135m is prompted as plain text; the default model's chat template is tested below.
    proc = _run("--show-prompt", "2", "--ablation", "w/o_knowledge", BACKBONE, "llm.model=smollm2-135m", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("You translate questions") and out.endswith("Program:\n")
    assert "\nOntology:" not in out and "\nFacts:" not in out and "\nr1: " in out  # cases, no knowledge
    assert "INFO" not in out and "INFO" in proc.stderr  # logs go to stderr
    # The printed question is named, so it can be matched to predictions.jsonl.
    from cbr2.config import load_config
    from cbr2.data.benchmarks import Benchmark
    from cbr2.run.runner import select_questions

    cfg = load_config(["eval.per_category=null"])
    third = select_questions(Benchmark("mini-kqapro"), cfg.data.split, cfg.eval)[2]
    assert f"--show-prompt 2: question id {third.qid} ({third.category})" in proc.stderr
    full = _run("--show-prompt", "2", "--ablation", "full", BACKBONE, "llm.model=smollm2-135m", cwd=tmp_path).stdout
    assert "\nOntology:" in full and full.split("\n\nQuestion:")[-1] != out.split("\n\nQuestion:")[-1]
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.slow
def test_show_prompt_of_the_default_model_is_its_chat_template(tmp_path):
    pytest.importorskip("llama_cpp")
    from cbr2.llm.packaged import DEFAULT_MODEL, PACKAGED, chunk_paths

    try:
        chunk_paths(PACKAGED[DEFAULT_MODEL])
    except OSError as err:
        pytest.skip(str(err))
    proc = _run("--show-prompt", "0", BACKBONE, "llm.backend=llamacpp", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("<|im_start|>system\nYou translate questions")
    assert proc.stdout.endswith("Program:\n<|im_end|>\n<|im_start|>assistant\n")


def test_unknown_ablation_lists_the_valid_ones(tmp_path):
    proc = _run("--ablation", "w/o_case", cwd=tmp_path)
    assert proc.returncode == 2 and "unknown ablation 'w/o_case'; valid: full, chain, w/o_reasoning_case" in proc.stderr
    proc = _run("--ablation", "w/o_knowlege", cwd=tmp_path)
    assert proc.returncode == 2 and "unknown ablation 'w/o_knowlege' (did you mean w/o_knowledge?)" in proc.stderr
    proc = _run("--show-prompt", "999", BACKBONE, "eval.per_category=3", cwd=tmp_path)
    assert proc.returncode == 2 and "the selection has 27 questions" in proc.stderr


# ------------------------------------------------------------------------------- the cbr2 command


def test_cbr2_help_lists_every_verb_in_one_line_each(capsys):
    from cbr2.cli import VERBS, main

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name, verb in VERBS.items():
        assert f"  {name} " in out and verb.summary in out
    assert {"evaluate", "train", "ask", "serve", "data", "sweep", "compare", "smoke", "model"} <= set(VERBS)


def test_every_verb_runs_a_function_of_the_package():
    import inspect

    from cbr2.cli import VERBS

    for name, verb in VERBS.items():
        module, function = verb.target.split(":")
        target = getattr(importlib.import_module(module), function)
        assert callable(target) and list(inspect.signature(target).parameters)[:1] == ["argv"], name


def test_an_unknown_verb_names_the_closest_one(capsys):
    from cbr2.cli import main

    assert main(["evalute"]) == 2
    assert "did you mean evaluate" in capsys.readouterr().err


def test_a_verb_is_its_modules_own_command(capsys):
    from cbr2.cli import main

    assert main(["config", "--config", str(ROOT / "configs" / "paper.yaml"), "--ablation", "w/o_ont"]) == 0
    out = capsys.readouterr().out
    assert "k_ontology: 0" in out and "k_semantic: 5" in out and out.rstrip().endswith("# Table 5 setting: w/o_ont")
    assert main(["config", "--ablation", "w/o_ont", "retrieval.k_ontology=3"]) == 2
    assert "contradicts --ablation w/o_ont" in capsys.readouterr().err


def test_the_console_script_is_declared_and_the_entry_scripts_call_the_same_mains():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"] == {"cbr2": "cbr2.cli:main"}
    for name in ("evaluate", "train"):
        assert f"from cbr2.cli.{name} import main" in (ROOT / f"{name}.py").read_text()
