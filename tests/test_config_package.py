"""Configuration is one package, ``cbr2.config``; any install carries ``configs/``; the dotted names
the configuration files and the docs point to exist.

The wheel test (``slow``) builds the package and composes a configuration from the installed
copy, outside the checkout; the fast tests check what it rests on: the link the package carries,
the package data that copies it, and where ``CONFIG_DIR`` points from a checkout.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

import cbr2
from cbr2.config import CONFIG_DIR, compose
from cbr2.config.files import PACKAGE_CONFIGS

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIR = Path(cbr2.__file__).resolve().parent

DOTTED = re.compile(r"\bcbr2(?:\.[A-Za-z_]\w*)+")
"""A dotted name of the package (``cbr2.config.LLMConfig``, ``python -m cbr2.config.reference``)."""

POINTING = [*sorted((ROOT / "configs").rglob("*.yaml")), *sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md",
            *sorted(PACKAGE_DIR.rglob("*.py")), ROOT / "train.py", ROOT / "evaluate.py",
            *sorted((ROOT / "benchmarks").glob("*.py")), *sorted((ROOT / "slurm").glob("*"))]
"""Files whose text points at names of the package (CHANGELOG.md is history: names it gives may be gone)."""

NOT_CODE = {"cbr2.progress"}
"""Dotted names that are no module or attribute: a logger's name (``cbr2.common.console``)."""


def _names(body: list[ast.stmt]) -> dict[str, ast.AST | str]:
    """The names a module or class body binds (also under ``if`` and ``try``), each with its node,
    or the dotted name it imports from the package."""
    out: dict[str, ast.AST | str] = {}
    for stmt in body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[stmt.name] = stmt
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            for target in stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]:
                out.update({n.id: stmt for n in ast.walk(target) if isinstance(n, ast.Name)})
        elif isinstance(stmt, ast.ImportFrom) and (stmt.module or "").startswith("cbr2"):
            out.update({a.asname or a.name: f"{stmt.module}.{a.name}" for a in stmt.names})  # followed
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            out.update({(a.asname or a.name).split(".")[0]: stmt for a in stmt.names})
        elif isinstance(stmt, (ast.If, ast.Try)):
            out.update(_names([*stmt.body, *stmt.orelse, *getattr(stmt, "finalbody", []),
                               *(s for h in getattr(stmt, "handlers", []) for s in h.body)]))
    return out


@functools.cache
def _parsed(source: Path) -> ast.Module:
    return ast.parse(source.read_text(encoding="utf-8"))


def resolves(name: str) -> bool:
    """Whether ``name`` is a module of the package, or a name its source binds (a class's field
    included), read without importing anything: the docs name modules that load torch."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        base = PACKAGE_DIR.parent.joinpath(*parts[:i])
        source = next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)
        if source is not None:
            break
    else:
        return False
    node: ast.AST | str | None = _parsed(source)
    rest = parts[i:]
    while rest:
        if isinstance(node, str):  # imported from another module of the package: look there
            return resolves(".".join([node, *rest]))
        if not isinstance(node, (ast.Module, ast.ClassDef)):
            return True  # an attribute of a value or a function: the source cannot say
        node = _names(node.body).get(rest.pop(0))
        if node is None:
            return False
    return resolves(node) if isinstance(node, str) else True


def test_configuration_is_one_package():
    assert (PACKAGE_DIR / "config" / "__init__.py").is_file()
    left = sorted(p.name for p in PACKAGE_DIR.glob("*.py") if "config" in p.name)
    assert left == [], "configuration modules outside cbr2/config/"


def test_the_package_carries_configs_as_a_link_to_the_checkouts_folder():
    # In a checkout the package's copy is the folder users edit: a link, never a second copy.
    assert PACKAGE_CONFIGS.is_symlink() and PACKAGE_CONFIGS.readlink() == Path("../../configs")
    assert CONFIG_DIR == ROOT / "configs"


def test_the_package_data_covers_every_config_file():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["package-data"]
    shipped = {p.resolve() for pattern in data["cbr2"] for p in PACKAGE_DIR.glob(pattern) if p.is_file()}
    files = {p.resolve() for p in (ROOT / "configs").rglob("*") if p.is_file()}
    assert sorted(files - shipped) == [], "configs/ files a wheel would leave out"


def test_every_dotted_name_the_configs_and_docs_point_to_exists():
    names = {(m.group(), path.relative_to(ROOT)) for path in POINTING for m in DOTTED.finditer(path.read_text("utf-8"))}
    assert names, "the pattern found nothing"
    missing = sorted(f"{where}: {name}" for name, where in names if name not in NOT_CODE and not resolves(name))
    assert missing == [], "names that do not exist:\n" + "\n".join(missing)


def test_resolves_tells_a_module_an_attribute_and_a_missing_name():
    assert resolves("cbr2.config.reference") and resolves("cbr2.config.LLMConfig")
    assert resolves("cbr2.config.schema.LLMConfig.backend")
    assert not resolves("cbr2.config.NoSuchConfig") and not resolves("cbr2.no_such_module")
    assert not resolves("cbr2.config_schema.LLMConfig") and not resolves("cbr2.config.LLMConfig.no_such_key")


@pytest.mark.slow
def test_a_wheel_install_composes_a_config_outside_the_checkout(tmp_path):
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), str(ROOT)],
                   check=True, cwd=tmp_path)
    wheel = next((tmp_path / "dist").glob("cbr2-*.whl"))
    site = tmp_path / "site"
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], check=True, cwd=tmp_path)
    probe = ("import cbr2.config as c; cfg = c.compose(ablation='w/o_act', files=[c.CONFIG_DIR / 'paper.yaml']); "
             "print(c.CONFIG_DIR); print(cfg.retrieval.k_facts, cfg.llm.backend, cfg.data.name)")
    # PYTHONPATH puts the installed copy before the checkout an editable install adds to sys.path.
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(site)},
                         capture_output=True, text=True, check=True).stdout.split("\n")
    assert Path(out[0]) == (site / "cbr2" / "config" / "configs").resolve() and not Path(out[0]).is_symlink()
    # The installed copy must compose exactly what the checkout composes: w/o_act over paper.yaml has no facts.
    want = compose(ablation="w/o_act", files=[CONFIG_DIR / "paper.yaml"])
    assert want.retrieval.k_facts == 0 and out[1] == f"{want.retrieval.k_facts} {want.llm.backend} {want.data.name}"
