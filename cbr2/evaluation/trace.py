"""One question's trace: everything that happened between its text and its answer, as one record.

``build_trace`` is the one place a trace is made, from the two records every answered question
has: its prediction record (``predictions.jsonl``, ``cbr2.evaluation.scoring``) and its retrieval
record (``retrieval.jsonl``, ``Retrieved.to_record``). The run browser shows a question's details
from it (``cbr2.report.browser``), the Python API returns it with each answer and the ``ask``
command prints it or writes it as JSON (``cbr2.service``), so the three never disagree on what a
question went through.

A trace is plain JSON (a dict of lists, strings, numbers, booleans and None). Its keys
(``TRACE_VERSION`` changes when they do):

``version``
    ``TRACE_VERSION``.
``id``, ``question``
    The question as retrieval and the prompt saw it (its id and text).
``gold``
    ``{"answer", "program"}`` of a benchmark question; None when the question has neither (a
    question asked through the API, a test split): nothing is judged then.
``linked``
    What linking found in the question: ``{"entities": [...], "concepts": [...], "values":
    {kind: [...]}}``; None with linking off or no retrieval.
``knowledge``
    ``{"ontology": [...], "facts": [...]}``, each ``{"text", "score"}`` best first (``score``:
    the similarity retrieval ranked by; None in records written before scores were kept); None
    when nothing was retrieved.
``cases``
    ``[{"id", "question", "program", "found_by": [{"view", "score"}], "ontology": [...],
    "facts": [...]}]`` in merge order (the prompt shows the first closest to the question):
    the solved question, its gold program (in the prompt's form; None when not known), the
    views that found it with their scores (None for ``random``) and its own triples' texts;
    None when nothing was retrieved.
``case_views``
    Which case views the configuration uses and why: ``{"used": [...], "setting": ..., "why": ...}``;
    None when not known (a run folder read back).
``prompt``
    ``{"chars", "tokens", "hash", "text"}``: its length as plain text, the tokens the model read
    (when the backend counts them), the predictions cache's hash, the whole text when asked for
    (else None: runs do not store prompts).
``generation``
    ``{"text", "chars", "tokens", "seconds"}``: what the model wrote (clipped at
    ``MAX_TEXT_CHARS``; ``chars`` is its length when it was clipped, else None), the tokens it
    generated, and seconds of generation.
``program``
    ``{"text", "repairs", "syntax_error_before_repair", "syntax_error", "unknown_arguments",
    "canonicalized"}``: the program that ran (DAG text, after the repairs named and any
    canonicalisation; None when nothing parsed and type-checked), the repair rules applied,
    whether it failed the check before and after repair, its arguments the KB lacks, and the
    snaps canonicalisation made.
``steps``
    Each executed step's result (``Executor.summarize``: ``step``, ``function``, ``args``,
    ``inputs``, ``holds``, ``count``, ``first``); those before the failing step of a program that
    failed during execution; None when no program ran.
``answer``
    The executed answer (a string, a list of names for MetaQA) or None.
``answered``
    Whether a program ran to a non-empty answer (right or wrong).
``correct``
    True or False against the gold answer; None without one.
``error_kind``, ``error``
    None when right (or answered without a gold answer), else the kind (``metrics.ERROR_KINDS``)
    and ``{"kind", "code", "message", "line", "step", "function", "where"}``: the checker's or
    engine's message, the line of a parse or type error, the step (1-based) and function of an
    execution error or of an empty result, and ``where`` in words.
``fallback``
    With ``generation.fallback``: ``{"single_pass": ..., "correction": ...}`` as the prediction
    record has them (``cbr2.generation.fallback``); else None.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from cbr2.kopl.text import parse_text

TRACE_VERSION = "cbr2-trace-1"
"""Names the trace's layout (the module docstring); changed with any key."""

_MESSAGES = {
    "empty": "the program ran, but its answer is empty",
    "wrong": "the program ran to an answer that is not the gold answer",
}


def build_trace(prediction: Mapping[str, Any] | None, retrieval: Mapping[str, Any] | None = None, *,
                question: Mapping[str, Any] | None = None, cases: Mapping[str, Mapping[str, Any]] | None = None,
                case_views: Mapping[str, Any] | None = None, prompt_text: str | None = None) -> dict[str, Any]:
    """The trace of one question (see the module docstring for its keys).

    Args:
        prediction: Its prediction record (``predictions.jsonl``); None when it was never generated
            (a retrieval-only run).
        retrieval: Its retrieval record (``retrieval.jsonl``, ``Retrieved.to_record``); None when
            the configuration retrieves nothing.
        question: What is known of the question without a prediction (``question_record``'s id,
            text and gold side); the prediction's own fields win.
        cases: Case id → ``{"question", "program"}``: the solved questions' texts and programs,
            which the retrieval record names by id only.
        case_views: Which case views were used and why (``trace["case_views"]``).
        prompt_text: The whole prompt, when it is to be part of the trace.
    """
    record: dict[str, Any] = {**(question or {}), **(prediction or {})}
    gold_answer, gold_program = record.get("gold_answer"), record.get("gold_program")
    generated = prediction is not None
    kind = record.get("error_kind") if generated else None
    return {
        "version": TRACE_VERSION,
        "id": record.get("id"),
        "question": record.get("question"),
        "gold": None if gold_answer is None and gold_program is None else {"answer": gold_answer,
                                                                           "program": gold_program},
        **_retrieved(retrieval, cases or {}),
        "case_views": copy.deepcopy(dict(case_views)) if case_views is not None else None,
        "prompt": {"chars": record.get("prompt_chars"), "tokens": record.get("prompt_tokens"),
                   "hash": record.get("prompt_hash"), "text": prompt_text},
        "generation": None if not generated else {
            "text": record.get("generated"), "chars": record.get("generated_chars"),
            "tokens": record.get("completion_tokens"), "seconds": record.get("latency_s")},
        "program": None if not generated else {
            "text": record.get("program"), "repairs": list(record.get("repairs") or ()),
            "syntax_error_before_repair": record.get("syntax_error_before_repair"),
            "syntax_error": record.get("syntax_error"), "unknown_arguments": record.get("unknown_arguments"),
            "canonicalized": list(record.get("canonicalized") or ())},
        "steps": record.get("steps"),
        "answer": record.get("answer"),
        "answered": generated and kind in (None, "wrong") and record.get("answer") not in (None, "", []),
        "correct": record.get("correct") if gold_answer is not None else None,
        "error_kind": kind,
        "error": _error(record, kind) if kind else None,
        "fallback": ({"single_pass": record.get("single_pass"), "correction": record["fallback"]}
                     if (record.get("fallback") or {}).get("fired") else None),
    }


def _retrieved(retrieval: Mapping[str, Any] | None, cases: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The trace's ``linked``, ``knowledge`` and ``cases`` from a retrieval record."""
    if retrieval is None:
        return {"linked": None, "knowledge": None, "cases": None}
    links = retrieval.get("links")
    knowledge = {kind: [{"text": text, "score": score} for text, score in
                        zip(retrieval.get(kind) or (), _aligned(retrieval.get(f"{kind}_scores"), retrieval.get(kind)))]
                 for kind in ("ontology", "facts")}
    found = []
    for c in retrieval.get("cases") or ():
        if not isinstance(c, Mapping) or not isinstance(c.get("id"), str):
            continue
        known = cases.get(c["id"]) or {}
        views = list(c.get("views") or ())
        found.append({"id": c["id"], "question": known.get("question"), "program": known.get("program"),
                      "found_by": [{"view": v, "score": s} for v, s in zip(views, _aligned(c.get("scores"), views))],
                      "ontology": list(c.get("ontology") or ()), "facts": list(c.get("facts") or ())})
    return {"linked": None if links is None else {"entities": list(links.get("entities") or ()),
                                                  "concepts": list(links.get("concepts") or ()),
                                                  "values": dict(links.get("values") or {})},
            "knowledge": knowledge, "cases": found}


def _aligned(scores: Sequence[Any] | None, items: Sequence[Any] | None) -> list[Any]:
    """``scores`` for ``items``, or None each where a record kept none (or not as many)."""
    n = len(items or ())
    return list(scores) if scores is not None and len(scores) == n else [None] * n


def _error(record: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """Where and why a prediction failed, from its ``error`` (and ``emptied_at`` for an empty answer)."""
    error = record.get("error") if isinstance(record.get("error"), Mapping) else {}
    out = {"kind": kind, "code": error.get("code"), "message": error.get("message") or _MESSAGES.get(kind),
           "line": error.get("line"), "step": error.get("step"), "function": None, "where": None}
    if kind == "empty" and isinstance(record.get("emptied_at"), Mapping):
        out.update(step=record["emptied_at"].get("step"), function=record["emptied_at"].get("function"))
    if out["step"] is not None:
        out["function"] = out["function"] or _function_at(record.get("program"), out["step"])
        at = f"step {out['step']}" + (f" ({out['function']})" if out["function"] else "")
        out["where"] = f"{at}, the first step with an empty result" if kind == "empty" else at
    elif out["line"] is not None:
        # The line of the text that was checked last: the repaired one when a repair rule applied.
        out["where"] = f"line {out['line']} of the {'repaired' if record.get('repairs') else 'generated'} text"
    return out


def _function_at(program: str | None, step: int) -> str | None:
    """The function of a program's 1-based ``step``, from its DAG text (None when unknown)."""
    if not program:
        return None
    try:
        steps = parse_text(program, "dag").steps
    except ValueError:
        return None
    return steps[step - 1].function if 0 < step <= len(steps) else None
