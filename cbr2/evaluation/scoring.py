"""From generated text to a scored prediction: parse → check → repair → execute → score.

Every generator (the gold writer, and the LLM backends) goes through this one function, so
an LLM's output and a gold program are judged the same way.

Whatever the text holds, judging it is bounded: the parser and repair read at most
``MAX_TEXT_CHARS`` characters and every stage is linear in them, execution stops at
``eval.timeout_s``, and the record keeps at most ``MAX_TEXT_CHARS`` characters of the text.
An unexpected exception is recorded as this prediction's error (code ``INTERNAL_ERROR``,
logged with its traceback) instead of ending the evaluation; the fuzz tier
(``tests/test_fuzz.py``) checks that none occurs.

A program that ran keeps each step's result in ``steps`` (``Executor.summarize``: function,
arguments, what the result holds, its size and first items), read from the results execution
computed; a program that failed during execution keeps the steps before the failing one, and its
``error`` names that step (``error.step``), as a parse or type error names its line.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from typing import Any

from cbr2.common.records import Prediction
from cbr2.data.benchmarks import Benchmark
from cbr2.data.questions import Question, question_record
from cbr2.evaluation.metrics import is_correct
from cbr2.generation.prompt import program_text
from cbr2.kopl.checker import check_text
from cbr2.kopl.executor import ExecutionError, Executor
from cbr2.kopl.functions import canonical_name
from cbr2.kopl.grounding import unknown_arguments
from cbr2.kopl.program import SYNTAX, Program
from cbr2.kopl.repair import repair
from cbr2.kopl.text import MAX_TEXT_CHARS, to_text

log = logging.getLogger(__name__)

MAX_VALUES = 1_000
"""Executed values a record keeps (``values_count`` says how many there were): a program such as
``FindAll → QueryName`` on the full KQA Pro returns every name of the KB."""

INTERNAL_ERROR = "internal_error"
"""``error.code`` of a prediction whose scoring raised: a bug to report, never a crash."""

Canonicalizer = Callable[[Program], tuple[Program, list[dict[str, Any]]]]
"""Maps a checked program to the program to execute and the snaps it made (one dict each)."""


def score_completion(completion: str, question: Question, bench: Benchmark, executor: Executor,
                     fmt: str = "dag", canonicalize: Canonicalizer | None = None) -> Prediction:
    """Judge what an LLM returned: its program text (``prompt.program_text``) is scored.

    Args:
        completion: The completion as the backend returned it.
        question, bench, executor, fmt, canonicalize: As for ``score_generation``.

    Returns:
        ``score_generation``'s record, whose ``generated`` is the completion (clipped like
        there).
    """
    record = score_generation(program_text(completion), question, bench, executor, fmt, canonicalize)
    return {**record, **clipped_text(completion)}


def unanswered(question: Question, kind: str, message: str) -> Prediction:
    """The record of a question the model was never asked (e.g. ``common.records.PROMPT_TOO_LONG``).

    Wrong for Hits@1 with its own ``error_kind``; not a syntax error, since no text was generated.
    """
    record = question_record(question)
    record.update(generated="", repairs=[], syntax_error_before_repair=False, syntax_error=False, program=None,
                  unknown_arguments=None, canonicalized=[], answer=None, values=None, steps=None, correct=False)
    return _fail(record, kind, {"kind": kind, "code": kind, "line": None, "message": message})


def clipped_text(text: str) -> dict[str, Any]:
    """``generated`` as a record stores it: at most ``MAX_TEXT_CHARS`` characters.

    A longer text keeps its first ``MAX_TEXT_CHARS`` characters, with its length and
    sha256 in ``generated_chars`` / ``generated_sha256`` (it is a syntax error ``too_long``).
    """
    if len(text) <= MAX_TEXT_CHARS:
        return {"generated": text}
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return {"generated": text[:MAX_TEXT_CHARS], "generated_chars": len(text), "generated_sha256": digest}


def score_generation(text: str, question: Question, bench: Benchmark, executor: Executor,
                     fmt: str = "dag", canonicalize: Canonicalizer | None = None) -> Prediction:
    """Judge one generated program text against a question's gold answer; never raises.

    Args:
        text: What the generator wrote (any string; it is parsed, never evaluated).
        question: The question with its gold answer.
        bench: Gives the dataset's answer form.
        executor: Runs the program on the KB.
        fmt: ``dag`` or ``chain``.
        canonicalize: Applied to the checked program before execution
            (``generation.canonicalize``); its snaps are recorded as ``canonicalized``.

    Returns:
        A ``predictions.jsonl`` record (``common.records.Prediction``): the question's gold side,
        ``generated``, ``program`` (DAG text of the parsed program or None), ``repairs``, ``answer``, ``values``,
        ``unknown_arguments`` (arguments naming no KB item of their slot, before any
        canonicalisation), ``canonicalized``, ``steps`` (``Executor.summarize`` of the steps that
        ran; None when no program was executed), ``correct``, ``error_kind`` (None when right, else
        one of ``metrics.ERROR_KINDS``), ``error`` details (a parse or type error's ``line``, an
        execution error's ``step``) and the two syntax flags SER counts.
    """
    record = question_record(question)
    record.update(clipped_text(text), repairs=[], syntax_error_before_repair=True, syntax_error=True, program=None,
                  unknown_arguments=None, canonicalized=[], answer=None, values=None, steps=None, correct=False)
    try:
        return _score(text, record, question, bench, executor, fmt, canonicalize)
    except Exception as err:
        log.exception("scoring question %s raised; it is recorded as an %s", question.qid, INTERNAL_ERROR)
        # Before a program parsed, the text is what failed (a syntax error, as SER counts it);
        # after, the execution did.
        kind = SYNTAX if record["program"] is None else "execution"
        return _fail(record, kind, {"kind": kind, "code": INTERNAL_ERROR, "line": None,
                                    "message": f"{type(err).__name__}: {str(err)[:500]}"})


def _score(text: str, record: Prediction, question: Question, bench: Benchmark, executor: Executor,
           fmt: str, canonicalize: Canonicalizer | None) -> Prediction:
    raw = check_text(text, fmt)
    result, repairs = raw, []
    if not raw.ok:
        repaired, repairs = repair(text, fmt)
        result = check_text(repaired, fmt)
    record.update(repairs=repairs, syntax_error_before_repair=not raw.ok, syntax_error=not result.ok)
    if not result.ok:
        return _fail(record, result.error.kind, result.error.to_dict())
    program = result.program
    record["unknown_arguments"] = unknown_arguments(program, bench.kb.vocabulary)
    if canonicalize is not None and record["unknown_arguments"]:
        program, record["canonicalized"] = canonicalize(program)
    record["program"] = to_text(program, "dag")
    results: list[Any] = []  # filled as steps end: after a failure, the steps before it
    try:
        try:
            executor.results(program, results)
            values = executor.answer(results[-1])
        finally:
            record["steps"] = executor.summarize(program, results)
    except ExecutionError as err:
        return _fail(record, "execution", err.to_dict())
    answer = bench.answer_from_values(values, program)
    record.update(values=values[:MAX_VALUES], answer=answer)
    if len(values) > MAX_VALUES:
        record["values_count"] = len(values)
    if not answer:
        step = executor.first_empty_step(results) if not values else None
        if step is not None:  # which step a fix must change (error analysis, never scoring)
            record["emptied_at"] = {"step": step + 1, "function": canonical_name(program.steps[step].function)}
        return _fail(record, "empty", None)
    if question.answer is None:  # a split without gold answers (KQA Pro's test): answered, not judged
        return {**record, "correct": None, "error_kind": None, "error": None}
    record["correct"] = is_correct(answer, question.answer)
    return _fail(record, "wrong", None) if not record["correct"] else {**record, "error_kind": None, "error": None}


def _fail(record: Prediction, kind: str, error: dict[str, Any] | None) -> Prediction:
    return {**record, "error_kind": kind, "error": error}
