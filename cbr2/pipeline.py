"""From generated text to a scored prediction: parse → check → repair → execute → score.

Every generator (the gold writer, and the LLM backends) goes through this one function, so
an LLM's output and a gold program are judged the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cbr2.data.benchmarks import Benchmark
from cbr2.data.questions import Question, question_record
from cbr2.evaluation.metrics import is_correct
from cbr2.kopl.checker import check_text
from cbr2.kopl.executor import ExecutionError, Executor
from cbr2.kopl.grounding import unknown_arguments
from cbr2.kopl.program import Program
from cbr2.kopl.repair import repair
from cbr2.kopl.text import to_text

Canonicalizer = Callable[[Program], tuple[Program, list[dict[str, Any]]]]
"""Maps a checked program to the program to execute and the snaps it made (one dict each)."""


def score_generation(text: str, question: Question, bench: Benchmark, executor: Executor,
                     fmt: str = "dag", canonicalize: Canonicalizer | None = None) -> dict[str, Any]:
    """Judge one generated program text against a question's gold answer.

    Args:
        text: What the generator wrote (any string; it is parsed, never evaluated).
        question: The question with its gold answer.
        bench: Gives the dataset's answer form.
        executor: Runs the program on the KB.
        fmt: ``dag`` or ``chain``.
        canonicalize: Applied to the checked program before execution
            (``generation.canonicalize``); its snaps are recorded as ``canonicalized``.

    Returns:
        A ``predictions.jsonl`` record: the question's gold side, ``generated``, ``program``
        (DAG text of the parsed program or None), ``repairs``, ``answer``, ``values``,
        ``unknown_arguments`` (arguments naming no KB item of their slot, before any
        canonicalisation), ``canonicalized``, ``correct``, ``error_kind`` (None when right, else one of
        ``metrics.ERROR_KINDS``), ``error`` details and the two syntax flags SER counts.
    """
    record = question_record(question)
    raw = check_text(text, fmt)
    result, repairs = raw, []
    if not raw.ok:
        repaired, repairs = repair(text, fmt)
        result = check_text(repaired, fmt)
    record.update(generated=text, repairs=repairs, syntax_error_before_repair=not raw.ok,
                  syntax_error=not result.ok, program=None, unknown_arguments=None, canonicalized=[],
                  answer=None, values=None, correct=False)
    if not result.ok:
        return _fail(record, result.error.kind, result.error.to_dict())
    program = result.program
    record["unknown_arguments"] = unknown_arguments(program, bench.kb.vocabulary)
    if canonicalize is not None and record["unknown_arguments"]:
        program, record["canonicalized"] = canonicalize(program)
    record["program"] = to_text(program, "dag")
    try:
        values = executor.run(program)
    except ExecutionError as err:
        return _fail(record, "execution", err.to_dict())
    answer = bench.answer_from_values(values, program)
    record.update(values=values, answer=answer)
    if not answer:
        return _fail(record, "empty", None)
    record["correct"] = is_correct(answer, question.answer)
    return _fail(record, "wrong", None) if not record["correct"] else {**record, "error_kind": None, "error": None}


def _fail(record: dict[str, Any], kind: str, error: dict[str, Any] | None) -> dict[str, Any]:
    return {**record, "error_kind": kind, "error": error}
