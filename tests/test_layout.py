"""The package's shape: modules of ``cbr2`` import each other without a cycle, and its packages are
layers that import only the layers below them (``LAYERS``).

A cycle hidden inside a function (``def f(): from cbr2.a import x``) still ties two modules
together: neither can be read, tested or moved without the other, and which one finishes
importing first depends on who is imported first. So the graph counts every import statement,
wherever it stands: module level, inside functions and methods, under ``try``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import tomllib

import cbr2

PACKAGE_DIR = Path(cbr2.__file__).parent
ROOT = PACKAGE_DIR.parent

LAYERS = ("common", "config", "kb", "kopl", "data", "retrieval", "structural", "generation", "llm", "evaluation",
          "report", "run", "cluster", "service", "cli")
"""The packages of ``cbr2``, lowest first; a module imports only from its own package and those before it.

``common`` is the core layer: errors, the records the stages pass on, files (cache root, folder
publishing), locks, console, devices, the Slurm allocation, W&B mode. ``config`` reads and checks
the configuration. ``kb`` is the KB model and its triples; ``kopl`` the programs and the engine
over a KB; ``data`` reads the official files (KBs, through the KB store, and questions) and the
benchmarks; then retrieval, the structural retriever (trained on data, encoded by retrieval),
generation (prompt, grammar, canonicalisation, fallback), the LLM backends (a leaf: they import only
common, config and kopl, ``LLM_NEEDS``, and decode under the grammar text they are handed);
``evaluation`` judges answers and holds what runs and reports share
(scoring, metrics, error analysis, the JSONL records, a question's trace, which questions a run
judges); ``report`` writes what a reader sees of one run or several (report.md, the browser, the
comparison and its charts, W&B), from records and metrics alone; ``run`` is the evaluation loop
and its output folder (whose ``finish_run`` calls the reports, so ``run`` sits above them); then
the cluster (sweeps and shard merges of runs), the service (the Python API, ``ask`` and ``serve``,
over the run's stages), and the ``cbr2`` command (``cli``: one verb per entry point, each
imported when it runs).
"""


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(tree: ast.AST) -> set[int]:
    """Ids of import nodes under ``if TYPE_CHECKING:``: never executed, so never a cycle."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(sub) for stmt in node.body for sub in ast.walk(stmt))
    return skipped


def import_graph(typing_imports: bool = False) -> dict[str, set[str]]:
    """Module of ``cbr2`` → the modules of ``cbr2`` it imports (anywhere in its file).

    ``from cbr2.x import y`` points at ``cbr2.x.y`` when that is a module, else at ``cbr2.x``
    (a name defined there). Relative imports are resolved against the importing module. Imports
    under ``if TYPE_CHECKING:`` count only with ``typing_imports`` (what a module names in its
    annotations, not what it runs).
    """
    files = {_module_name(p): p for p in PACKAGE_DIR.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        skipped = set() if typing_imports else _type_checking_only(tree)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            else:
                continue
            for target in targets:
                # `import cbr2.a.b` names cbr2.a.b; keep the longest prefix that is a module of ours.
                while target and target not in files:
                    target = target.rpartition(".")[0]
                if target and target.startswith("cbr2") and target != name:
                    graph[name].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or None when it is acyclic (iterative DFS)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    for root in sorted(graph):
        if root in state:
            continue
        path, stack = [root], [iter(sorted(graph[root]))]
        state[root] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


def all_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Cycles enough to see every tangle: each found cycle's closing edge is dropped and the search repeated."""
    graph = {k: set(v) for k, v in graph.items()}
    cycles = []
    while (cycle := find_cycle(graph)) is not None:
        cycles.append(cycle)
        graph[cycle[-2]].discard(cycle[-1])
    return cycles


def package_of(module: str) -> str:
    """The layer of a module: its package under ``cbr2``, with the configuration's modules as one.

    ``config.py``, ``config_schema.py``, ``_config_load.py`` and ``config_reference.py`` count as the
    ``config`` package, before and after they move into ``cbr2/config/``.
    """
    part = module.split(".")[1] if "." in module else ""
    return "config" if part.lstrip("_").startswith("config") else part


def upward_imports(graph: dict[str, set[str]], layers: tuple[str, ...] = LAYERS) -> list[str]:
    """Each import of a higher layer, as ``module → module (package → package)``, sorted."""
    rank = {name: i for i, name in enumerate(layers)}
    found = []
    for module, targets in graph.items():
        for target in targets:
            low, high = package_of(module), package_of(target)
            if low in rank and high in rank and rank[high] > rank[low]:
                found.append(f"{module} → {target} ({low} → {high})")
    return sorted(found)


def test_find_cycle_reports_the_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
    assert all_cycles({"a": {"b"}, "b": {"a", "c"}, "c": {"b"}}) == [["a", "b", "a"], ["b", "c", "b"]]


def test_import_graph_sees_imports_inside_functions():
    graph = import_graph()
    assert "cbr2.run.runner" in graph
    # The sweep imports the run loop only inside the function that runs locally.
    assert "cbr2.run.runner" in graph["cbr2.cluster.sweep"]
    # cbr2.llm loads a backend by its "module:Class" string, so the graph holds no edge for that,
    # but a backend's own import of its base module is a real edge.
    assert "cbr2.llm.base" in graph["cbr2.llm.gold"]


def test_no_import_cycles():
    cycles = all_cycles(import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" → ".join(c) for c in cycles)


def test_upward_imports_are_named_module_by_module():
    graph = {"cbr2.common.files": {"cbr2.kb.model"}, "cbr2.kb.model": {"cbr2.common.files"},
             "cbr2.config_schema": {"cbr2._config_load"}, "cbr2._config_load": {"cbr2.common.errors"}}
    assert upward_imports(graph, ("common", "config", "kb")) == ["cbr2.common.files → cbr2.kb.model (common → kb)"]
    assert package_of("cbr2._config_load") == package_of("cbr2.config.schema") == "config"


def test_packages_depend_downward_only():
    graph = import_graph()
    unplaced = sorted({package_of(m) for m in graph if m != "cbr2"} - set(LAYERS))
    assert not unplaced, f"packages of cbr2 missing from LAYERS (place each in the order): {unplaced}"
    upward = upward_imports(graph)
    assert not upward, ("imports of a higher layer (LAYERS: " + " < ".join(LAYERS) + "); move the code to the "
                        "layer that owns it or pass a value in:\n" + "\n".join(upward))


LLM_NEEDS = {"common", "config", "kopl"}
"""What the LLM backends (``cbr2.llm``) import beside themselves: the records they receive and return
(a prompt, a completion, the run's grammar as text), their configuration section, and program text
(the gold writer). Everything else reaches them as a value: the grammar as data, the gold programs,
the cache root, what retrieval holds on the GPU."""


def test_the_llm_backends_are_a_leaf():
    graph = import_graph(typing_imports=True)  # their annotations too: the records and the config section
    imported = {module: {package_of(t) for t in targets} - {"llm"}
                for module, targets in graph.items() if package_of(module) == "llm"}
    assert "cbr2.llm.xgrammar_masks" in imported and "cbr2.llm.smoke" not in imported
    beyond = {module: sorted(packages - LLM_NEEDS) for module, packages in sorted(imported.items())
              if packages - LLM_NEEDS}
    assert not beyond, f"cbr2.llm imports only {sorted(LLM_NEEDS)}; beyond them: {beyond}"
    # The gold writer is where the program text comes in; the backends read records and their section.
    assert imported["cbr2.llm.gold"] == {"common", "kopl"} and imported["cbr2.llm.base"] == {"common", "config"}


def unshipped(patterns: Iterable[str]) -> list[str]:
    """Files of the package that are not Python source and that no package-data pattern ships,
    relative to the package: what a wheel would leave out."""
    shipped = {p.resolve() for pattern in patterns for p in PACKAGE_DIR.glob(pattern) if p.is_file()}
    found = (p for p in PACKAGE_DIR.rglob("*")
             if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".py", ".pyc"))
    return sorted(str(p.relative_to(PACKAGE_DIR)) for p in found if p.resolve() not in shipped)


def test_package_data_follows_the_files_that_moved():
    # A folder of assets that moves with its module (the browser's, into cbr2/report/) must move in
    # pyproject.toml too, or a wheel installs pages without their script.
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"][
        "package-data"]["cbr2"]
    assert unshipped(patterns) == []
    before = [p.replace("report/browser_assets", "evaluation/browser_assets") for p in patterns]
    assert "report/browser_assets/browser.js" in unshipped(before)


def test_prediction_names_every_field_scoring_and_the_fallback_write():
    from cbr2.common.records import Completion, FallbackInfo, Prediction
    from cbr2.data.benchmarks import Benchmark
    from cbr2.evaluation.scoring import score_generation
    from cbr2.generation.fallback import corrected, first_pass
    from cbr2.kopl.executor import Executor
    from cbr2.kopl.text import MAX_TEXT_CHARS, to_text

    bench = Benchmark("mini-kqapro")
    question = bench.questions("val")[0]
    executor = Executor(bench.kb, 10)
    texts = [to_text(question.program, "dag"), "r1: Find[", "x" * (MAX_TEXT_CHARS + 1), "r1: Find[nowhere] → QueryName[]"]
    known = Prediction.__required_keys__ | Prediction.__optional_keys__
    for text in texts:
        record = score_generation(text, question, bench, executor)
        assert Prediction.__required_keys__ <= record.keys() <= known, text
        record.update(prompt_hash="p", generation_key="g", prompt_tokens=1, completion_tokens=1, latency_s=0.1)
        final = first_pass(record)
        if final["fallback"].get("pending"):
            final = corrected(final, score_generation(texts[0], question, bench, executor), Completion(texts[0]), 0.1, "c")
        assert final.keys() <= known and final["fallback"].keys() <= FallbackInfo.__optional_keys__
