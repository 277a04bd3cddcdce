"""Execution of checked programs on a KB.

Two engines run the functions: the project's own (``cbr2.kopl.engine``, the default: indexes
built once, no copy of the KB, the reference answers except where its docstring lists a
difference) and the official one (PyPI ``kopl``, ``engine="kopl"``, the reference). This
module drives either step by step along the program's recorded dependencies (the official
engine's own ``forward`` rebuilds them from post-order, which a generated DAG need not
follow), bounds the run time, and refuses programs that name schema items the KB lacks: the
engines answer those with an empty set, and a ``Verify`` step after an empty set says "no",
which would score as right on every "no" question.

Every failure is an ``ExecutionError``; nothing is ever turned into an answer.
"""

from __future__ import annotations

import contextlib
import io
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from cbr2.kb.model import KB, format_number
from cbr2.kopl.engine import Engine
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
    """Raise ``ExecutionError('timeout')`` after ``seconds`` (main thread only; else unbounded)."""
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
                        check.code, f"step {i + 1} ({step.function}): {arg.name} {value!r} is not in the KB")

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

    def results(self, program: Program) -> list[Any]:
        """Every step's result, in order, within the time limit (``run`` answers from the last).

        Raises:
            ExecutionError: On unknown schema items, engine exceptions and timeouts.
        """
        self.ground(program)
        memory: list[Any] = []
        kopl = self.engine_name == "kopl"
        try:
            # Only the official engine prints; redirecting costs more than the cbr2 engine's steps.
            with time_limit(self.timeout_s), (quiet() if kopl else contextlib.nullcontext()):
                for step in program.steps:
                    func = getattr(self.engine, canonical_name(step.function))
                    memory.append(func(*(memory[d] for d in step.dependencies), *step.inputs))
        except ExecutionError:
            raise
        except Exception as err:  # any engine failure (KeyError, IndexError, ...) is an execution error
            raise ExecutionError(type(err).__name__, f"{type(err).__name__}: {err}") from err
        return memory
