"""Importing the library's light modules loads none of the heavy packages (GPU engines, deep
learning, vector indexes, W&B): those are imported inside the functions that need them, so reading a
config, scoring a run or choosing the gold writer never pays for them (nor needs them installed).
Every module is light but the structural retriever's training (``cbr2.structural``'s ``data``,
``module`` and ``train``: Lightning classes, imported when training runs). What a whole gold run
imports is ``tests/test_lazy_imports.py``'s.

One fresh interpreter imports every light module with the heavy packages blocked: any attempt to
import one, even inside a ``try``, is recorded with the module that made it, so each light module
gets its own verdict from a single subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

HEAVY = ("torch", "transformers", "vllm", "faiss", "sentence_transformers", "lightning", "llama_cpp", "xgrammar",
         "onnxruntime", "wandb", "matplotlib", "scipy")
"""Top-level names of the heavy packages."""

LIGHT_PACKAGES = ("cbr2.common", "cbr2.config", "cbr2.kb", "cbr2.kopl", "cbr2.data", "cbr2.retrieval",
                  "cbr2.generation", "cbr2.llm", "cbr2.evaluation", "cbr2.report", "cbr2.run", "cbr2.cluster",
                  "cbr2.service", "cbr2.cli")
"""Packages all of whose modules are light (the LLM backends import their engines when they load a
model, retrieval FAISS when it builds an index, the device check torch when the run uses it)."""

LIGHT_MODULES = ("cbr2", "cbr2.structural", "cbr2.structural.labels", "cbr2.structural.checkpoints",
                 "cbr2.structural.on_demand")
"""Light modules of packages that also hold heavy ones."""

KNOWN_HEAVY: dict[str, str] = {}
"""Light modules that still load a heavy package, with why: expected failures (strict, so a fix is
noticed) until the module that pulls it in imports it lazily. None left."""


def _modules_of(package: str) -> list[str]:
    """Every module of ``package``, found on disk (importing them to list them would defeat the test)."""
    names = []
    for path in sorted(ROOT.joinpath(*package.split(".")).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


LIGHT = [*LIGHT_MODULES, *(m for p in LIGHT_PACKAGES for m in _modules_of(p))]

PROBE = r"""
import importlib, importlib.abc, json, sys

heavy, names = json.loads(sys.argv[1])
attempts, current = {}, [None]


class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] not in heavy:
            return None
        frame = sys._getframe(1)
        while frame is not None and frame.f_globals.get("__name__", "").startswith(("importlib", "_frozen_importlib")):
            frame = frame.f_back
        importer = frame.f_globals.get("__name__", "?") if frame is not None else "?"
        attempts.setdefault(current[0], []).append(f"{fullname} (imported by {importer})")
        raise ImportError(f"{fullname} is blocked by the import test")


sys.meta_path.insert(0, Block())
for name in names:
    current[0] = name
    try:
        importlib.import_module(name)
    except ImportError:
        pass  # recorded by Block (any other import error fails the probe)
print(json.dumps(attempts))
"""


@pytest.fixture(scope="module")
def heavy_imports() -> dict[str, list[str]]:
    """Light module → the heavy imports it attempted, from one fresh interpreter (this test process
    has imported torch & co. for other tests already)."""
    result = subprocess.run([sys.executable, "-c", PROBE, json.dumps([HEAVY, LIGHT])], cwd=ROOT, capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_walk_finds_the_light_packages():
    assert {"cbr2.kopl.executor", "cbr2.data.kb_store", "cbr2.data.benchmarks", "cbr2.llm", "cbr2.llm.hf",
            "cbr2.retrieval.index", "cbr2.run.runner", "cbr2.cli.evaluate", "cbr2.cli.train"} <= set(LIGHT)


@pytest.mark.parametrize("module", [
    pytest.param(m, marks=pytest.mark.xfail(strict=True, reason=KNOWN_HEAVY[m])) if m in KNOWN_HEAVY else m
    for m in LIGHT])
def test_importing_cbr2_loads_no_heavy_module(module, heavy_imports):
    attempts = heavy_imports.get(module, [])
    assert not attempts, f"importing {module} loads {', '.join(attempts)}"
