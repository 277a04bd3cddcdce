"""Execution of checked programs on a KB.

Two engines run the functions: the project's own (``cbr2.kopl.engine``, the default: indexes
built once, no copy of the KB, the reference answers except where its docstring lists a
difference) and the official one (PyPI ``kopl``, ``engine="kopl"``, the reference). This
module drives either step by step along the program's recorded dependencies (the official
engine's own ``forward`` rebuilds them from post-order, which a generated DAG need not
follow), bounds the run time, and refuses programs that name schema items the KB lacks: the
engines answer those with an empty set, and a ``Verify`` step after an empty set says "no",
which would score as right on every "no" question.

Every failure is an ``ExecutionError`` carrying the step that failed; nothing is ever turned
into an answer. ``Executor.summarize`` says what each step's result holds (its kind, size and
first items), for a trace of the program (``predictions.jsonl``'s ``steps``).

The time bound has two parts. On the main thread ``SIGALRM`` interrupts a step that runs too
long. Signals reach the main thread only, so a program run from another thread (a server's
worker) is bounded by a deadline checked after each step: a program stops at the first step
that ends past it. A single step is then not interrupted; the engine's steps are set
operations over indexes, so one step's time is bounded by the KB's size.
"""

from __future__ import annotations

import contextlib
import heapq
import io
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from cbr2.kb.model import KB, format_number
from cbr2.kopl.engine import Engine, Entities
from cbr2.kopl.errors import ExecutionError
from cbr2.kopl.functions import canonical_name, get_spec
from cbr2.kopl.program import Program


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence the engine's prints and progress bars (stdout must stay clean for prompts)."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise ``ExecutionError('timeout')`` after ``seconds`` (main thread only; elsewhere this does
    nothing, and ``Executor.results`` checks its deadline between steps instead)."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum: int, frame: Any) -> None:
        raise ExecutionError("timeout", f"program ran longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def format_engine_value(value: Any) -> str:
    """Render one engine result item (a name, number or ``kopl.util.ValueClass``) as text."""
    if hasattr(value, "type") and hasattr(value, "value"):
        if value.type == "quantity":
            number = format_number(value.value)
            return number if value.unit == "1" else f"{number} {value.unit}"
        if value.type == "date":
            return value.value.isoformat()
        return str(value.value)
    return str(value)


@dataclass(frozen=True)
class _SlotCheck:
    attr: str  # Vocabulary attribute holding the legal items
    code: str


_GROUNDING = {
    "entity": _SlotCheck("names", "unknown_entity"),
    "concept": _SlotCheck("concepts", "unknown_concept"),
    "key": _SlotCheck("keys", "unknown_key"),
    "qkey": _SlotCheck("qualifier_keys", "unknown_qualifier"),
    "relation": _SlotCheck("relations", "unknown_relation"),
}


ENGINES = ("cbr2", "kopl")
"""``Executor(engine=...)`` choices: the project's engine, or the official reference engine."""

STEP_ITEMS = 5
"""Items of each step's result that ``Executor.summarize`` lists (its ``count`` says how many there were)."""

HOLDS = {
    "entities": "entities", "facts": "entities (with facts)", "values": "values", "names": "names",
    "name": "a name", "count": "a count", "bool": "yes/no", "relations": "relations",
    "qualifiers": "qualifier values",
}
"""What a step's result holds, in words, by its function's output type (``kopl.functions``)."""

SINGLE = frozenset({"name", "count", "bool"})
"""Output types of one item: a step's summary shows the item itself (``count`` is 1)."""


class Executor:
    """Runs programs on one KB; the engine is built once and reused.

    Args:
        kb: The KB.
        timeout_s: Per-program wall-clock limit in seconds (None or 0: no limit).
        engine: ``cbr2`` (``cbr2.kopl.engine.Engine``, reads the KB without copying it) or
            ``kopl`` (the official engine; it gets a deep copy because it mutates its input).

    Raises:
        ValueError: On another engine name.
    """

    def __init__(self, kb: KB, timeout_s: float | None = 10.0, engine: str = "cbr2"):
        if engine not in ENGINES:
            raise ValueError(f"unknown executor engine {engine!r}; expected one of {', '.join(ENGINES)}")
        self.kb = kb
        self.timeout_s = timeout_s
        self.engine_name = engine
        if engine == "kopl":
            from kopl.kopl import KoPLEngine  # the reference engine; imported here to keep imports light

            with quiet():
                self.engine = KoPLEngine(kb.to_kopl_dict())
        else:
            self.engine = Engine(kb)

    def ground(self, program: Program) -> None:
        """Reject names of entities, concepts, keys, qualifiers or relations the KB lacks.

        Raises:
            ExecutionError: With the offending step and argument.
        """
        voc = self.kb.vocabulary
        for i, step in enumerate(program.steps):
            for arg, value in zip(get_spec(step.function).args, step.inputs):
                check = _GROUNDING.get(arg.kind)
                if check is None:
                    continue
                legal = getattr(voc, check.attr)
                # Attribute keys double as qualifier keys in the engine's own key index.
                if value not in legal and not (arg.kind == "key" and value in voc.qualifier_keys):
                    raise ExecutionError(
                        check.code, f"step {i + 1} ({step.function}): {arg.name} {value!r} is not in the KB", step=i + 1)

    def run(self, program: Program) -> list[str]:
        """Execute a type-checked program and return its result as a list of strings.

        Sets (names, values, relations, qualifier values) come back de-duplicated and sorted,
        so results do not depend on hash order; single results (a count, yes/no, the name
        SelectBetween picks) come back as a one-element list.

        Raises:
            ExecutionError: On unknown schema items, engine exceptions and timeouts.
        """
        return self.answer(self.results(program)[-1])

    def answer(self, result: Any) -> list[str]:
        """The last step's ``result`` (of ``results``) as ``run`` returns it.

        Raises:
            ExecutionError: ``no_answer`` for an entity set.
        """
        if self.engine_name != "kopl":
            return self.engine.answer(result)
        if isinstance(result, tuple):  # an entity set: the program did not end with a query
            raise ExecutionError("no_answer", "the program ends with an entity set, not a query")
        if isinstance(result, list):
            return sorted({format_engine_value(v) for v in result})
        return [format_engine_value(result)]

    @staticmethod
    def first_empty_step(results: list[Any]) -> int | None:
        """Where a program that answered nothing went empty: the index of its first step whose
        result (of ``results``, either engine's) is an empty entity set or an empty list of values,
        names or relations. For error analysis (``emptied_at`` of a prediction): it says which step
        a fix must change, not why.

        Returns:
            The 0-based step index, or None when no step's result is empty.
        """
        for i, result in enumerate(results):
            # An entity set is ``Entities`` (cbr2) or an ``(ids, facts)`` tuple (the official engine).
            items = getattr(result, "ids", result[0] if isinstance(result, tuple) else result)
            if isinstance(items, list | set | frozenset) and not items:
                return i
        return None

    def results(self, program: Program, memory: list[Any] | None = None) -> list[Any]:
        """Every step's result, in order, within the time limit (``run`` answers from the last).

        Args:
            program: A type-checked program.
            memory: A list the results are appended to as the steps end, when given: after a
                failure it holds those of the steps before the failing one.

        Raises:
            ExecutionError: On unknown schema items, engine exceptions and timeouts, with the
                failing step (``step``; the last step that ran, for a timeout between steps).
        """
        self.ground(program)
        memory = [] if memory is None else memory
        kopl = self.engine_name == "kopl"
        # Checked after each step: the bound off the main thread, where SIGALRM cannot interrupt.
        deadline = time.monotonic() + self.timeout_s if self.timeout_s else None
        i = 0
        try:
            # Only the official engine prints; redirecting costs more than the cbr2 engine's steps.
            with time_limit(self.timeout_s), (quiet() if kopl else contextlib.nullcontext()):
                for i, step in enumerate(program.steps):
                    func = getattr(self.engine, canonical_name(step.function))
                    memory.append(func(*(memory[d] for d in step.dependencies), *step.inputs))
                    if deadline is not None and time.monotonic() > deadline:
                        raise ExecutionError("timeout", f"program ran longer than {self.timeout_s} s (stopped "
                                                        f"after step {i + 1} of {len(program.steps)})", step=i + 1)
        except ExecutionError as err:
            if err.step is None:  # raised inside the step (by the engine, or the alarm)
                err.step = i + 1
            raise
        except Exception as err:  # any engine failure (KeyError, IndexError, ...) is an execution error
            raise ExecutionError(type(err).__name__, f"{type(err).__name__}: {err}", step=i + 1) from err
        return memory

    def summarize(self, program: Program, results: list[Any], first: int = STEP_ITEMS) -> list[dict[str, Any]]:
        """What each step's result holds, for a trace: what ``results`` computed, read, not run again.

        Args:
            program: The program that ran.
            results: ``results``' list (or the ``memory`` of a failed run: its steps that ended).
            first: Items of each result listed.

        Returns:
            One ``{"step", "function", "args", "inputs", "holds", "count", "first"}`` per result:
            the 1-based step, the function as written, its textual arguments, the steps whose
            results it takes (1-based), what its result holds in words (``HOLDS``), how many
            items (entities, values, names ...; 1 for a count, yes/no or a name) and the first
            ``first`` of them as text (entities by name, the lowest nodes first: KB order on the
            cbr2 engine, id order on the reference one; other sets sorted, as ``run`` answers).
        """
        out = []
        for i, (step, result) in enumerate(zip(program.steps, results)):
            ids = self._entity_ids(result)
            if ids is not None:
                count, items = len(ids), [self._entity_name(n) for n in heapq.nsmallest(first, ids)]
            else:
                answer = self.answer(result)
                count, items = len(answer), answer[:first]
            spec = get_spec(step.function)
            out.append({"step": i + 1, "function": step.function, "args": list(step.inputs),
                        "inputs": [d + 1 for d in step.dependencies],
                        "holds": HOLDS.get(spec.output, spec.output) if spec else None,
                        "count": count, "first": items})
        return out

    @staticmethod
    def _entity_ids(result: Any) -> Any:
        """The node ids of an entity set (``Entities``, or the reference engine's ``(ids, facts)``), else None."""
        if isinstance(result, Entities):
            return result.ids
        if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], list | set | frozenset):
            return result[0]
        return None

    def _entity_name(self, node: Any) -> str:
        """An entity set member's name: the engine's for its node (cbr2), the KB's for its id (kopl)."""
        try:
            if self.engine_name == "kopl":
                return self.kb.name_of(node)
            return self.engine.QueryName(Entities((node,)))[0]
        except (KeyError, ExecutionError):  # the object of a relation the KB has no entity for
            return f"#{node}"
