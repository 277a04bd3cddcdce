"""The package's shape: modules of ``cbr2`` import each other without a cycle.

A cycle hidden inside a function (``def f(): from cbr2.a import x``) still ties two modules
together: neither can be read, tested or moved without the other, and which one finishes
importing first depends on who is imported first. So the graph counts every import statement,
wherever it stands: module level, inside functions and methods, under ``try``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import cbr2

PACKAGE_DIR = Path(cbr2.__file__).parent


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


def import_graph() -> dict[str, set[str]]:
    """Module of ``cbr2`` → the modules of ``cbr2`` it imports (anywhere in its file).

    ``from cbr2.x import y`` points at ``cbr2.x.y`` when that is a module, else at ``cbr2.x``
    (a name defined there). Relative imports are resolved against the importing module.
    """
    files = {_module_name(p): p for p in PACKAGE_DIR.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        skipped = _type_checking_only(tree)
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


def test_find_cycle_reports_the_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
    assert all_cycles({"a": {"b"}, "b": {"a", "c"}, "c": {"b"}}) == [["a", "b", "a"], ["b", "c", "b"]]


def test_import_graph_sees_imports_inside_functions():
    graph = import_graph()
    assert "cbr2.evaluation.runner" in graph
    # cbr2.llm loads a backend by its "module:Class" string, so the graph holds no edge for that,
    # but a backend's own import of its base module is a real edge.
    assert "cbr2.llm.base" in graph["cbr2.llm.gold"]


def test_no_import_cycles():
    cycles = all_cycles(import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" → ".join(c) for c in cycles)


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
