"""Adaptive fallback (``generation.fallback``): one correction round for programs that visibly failed.

After the single pass, a program that did not parse, type-check or execute, or that executed
to an empty answer, gets exactly one more generation: its question's prompt followed by the
failed program, the error message and the valid KB items nearest to the arguments involved
(``cbr2.generation.prompt.correction_prompt``). A non-empty wrong answer never fires it: telling it from
a right one needs the gold answer, which a deployed system does not have.

The correction prompt is built from a ``Failure``, which holds the generated text, the error
and the arguments of a record, never its gold side.

Record layout (``predictions.jsonl``) with the fallback on:

* top-level fields: the final result, i.e. the correction's when the fallback fired and the
  correction fails less visibly than the first pass (``VISIBLE_SEVERITY``), else the first
  pass's; ``latency_s``, ``prompt_tokens`` and ``completion_tokens`` add up both generations
  (what the question cost);
* ``single_pass``: the first pass's ``SINGLE_PASS_FIELDS`` (equal to the top-level ones when
  the fallback did not fire);
* ``fallback``: ``{"fired": False}``, or ``{"fired": True, "kept", "generated", "error_kind",
  "latency_s", "prompt_tokens", "completion_tokens", "fixed", "prompt_hash", "version"}``
  (``kept``: ``correction`` or ``single_pass``; ``error_kind``: the correction's own). A first pass
  whose correction has not run yet is written with ``{"pending": True}``; a resumed run runs
  only the correction for it.

With the fallback off, records carry neither key: they are the single-pass records as before.
The fallback's metrics are ``cbr2.evaluation.metrics.fallback_metrics``, its report section
``cbr2.report.run_report.render_fallback``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cbr2.common.records import Completion, Prediction, Prompt
from cbr2.generation.prompt import EMPTY_ANSWER, FALLBACK_VERSION, Suggestion, correction_prompt, program_text
from cbr2.kb.model import Vocabulary
from cbr2.kopl.functions import get_spec
from cbr2.kopl.grounding import SLOT_KINDS, slot_items
from cbr2.kopl.text import split_top

FIRES_ON = ("syntax", "type", "execution", "empty")
"""Error kinds that fire the correction round: the failures visible without the gold answer."""

SINGLE_PASS_FIELDS = ("generated", "program", "repairs", "answer", "correct", "error_kind", "error", "syntax_error",
                      "syntax_error_before_repair", "unknown_arguments", "canonicalized", "latency_s",
                      "prompt_tokens", "completion_tokens")
"""What ``single_pass`` keeps of the first pass: enough to score it (``compute_metrics`` and its
error analysis read these) and to say what it cost."""

VISIBLE_SEVERITY = {"syntax": 4, "type": 3, "execution": 2, "empty": 1}
"""How badly a program visibly fails; an answer (right or ``wrong``: the two cannot be told apart
without the gold answer) is 0. A correction replaces the first pass only when it is lower, so
the round never makes a visible result worse (a correction that fails to parse does not replace
a first pass that ran to an empty answer)."""

MAX_ARGUMENTS = 4
"""Arguments that get suggestions in one correction prompt (the first ones involved)."""

MAX_ITEMS = 5
"""Suggested KB items per argument."""

Nearest = Callable[..., list[tuple[str, float]]]
"""``nearest(value, kind, k=5, function=None) -> [(item, score), ...]``, best first
(``cbr2.generation.canonicalize.Canonicalizer.nearest``)."""

# A call as the prompt writes it, found anywhere in text that may not parse: Name[arg | arg].
_CALL = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*\[((?:\\.|[^\[\]\\])*)\]", re.DOTALL)


def fires(record: Prediction) -> bool:
    """Whether a scored first-pass record gets the correction round."""
    return record.get("error_kind") in FIRES_ON


def first_pass(record: Prediction) -> Prediction:
    """A scored first-pass record with the fallback fields: pending when it failed, else final."""
    single = {k: record.get(k) for k in SINGLE_PASS_FIELDS}
    return {**record, "single_pass": single, "fallback": {"pending": True} if fires(record) else {"fired": False}}


def _total(first: float | None, second: float | None) -> float | None:
    return None if first is None and second is None else (first or 0) + (second or 0)


def corrected(first: Prediction, second: Prediction, completion: Completion, latency_s: float,
              prompt_hash: str) -> Prediction:
    """The final record of a question whose fallback fired: the correction's result when it fails
    less visibly than the first pass (``VISIBLE_SEVERITY``), else the first pass's.

    Args:
        first: Its pending first-pass record.
        second: ``score_completion``'s record of the correction (its ``generated`` is the
            correction's completion).
        completion: What the correction generated.
        latency_s: Seconds the correction took.
        prompt_hash: ``prompt_hash`` of the correction prompt.
    """
    single = first["single_pass"]
    kept = "correction" if _severity(second) < _severity(single) else "single_pass"
    if kept == "correction":
        final = dict(second)
    else:
        final = {k: v for k, v in first.items() if k not in ("single_pass", "fallback")}
    return {
        **final,
        "prompt_hash": first["prompt_hash"],
        "generation_key": first["generation_key"],
        "latency_s": _total(single["latency_s"], latency_s),
        "prompt_tokens": _total(single["prompt_tokens"], completion.prompt_tokens),
        "completion_tokens": _total(single["completion_tokens"], completion.completion_tokens),
        "single_pass": single,
        "fallback": {"fired": True, "kept": kept, "generated": second["generated"], "error_kind": second["error_kind"],
                     "latency_s": latency_s, "prompt_tokens": completion.prompt_tokens,
                     "completion_tokens": completion.completion_tokens,
                     "fixed": kept == "correction" and bool(second["correct"]) and not single["correct"],
                     "prompt_hash": prompt_hash, "version": FALLBACK_VERSION},
    }


def _severity(record: Prediction) -> int:
    return VISIBLE_SEVERITY.get(record.get("error_kind"), 0)


def single_pass_view(record: Prediction) -> Prediction:
    """The record as the single pass left it (the record itself when it has no ``single_pass``)."""
    return {**record, **(record.get("single_pass") or {})}


# ---------------------------------------------------------------- the correction prompt

@dataclass(frozen=True)
class Failure:
    """What a correction prompt may be built from: the model's output and why it failed.

    Attributes:
        text: The program text the model wrote (code fence removed).
        error_kind: One of ``FIRES_ON``.
        message: The checker's or engine's message (``EMPTY_ANSWER`` for an empty answer).
        program: DAG text of the checked program, None when it did not parse or type-check.
        unknown: Its arguments that name no KB item of their slot (``unknown_arguments``).
    """

    text: str
    error_kind: str
    message: str
    program: str | None
    unknown: tuple[dict[str, Any], ...]

    @classmethod
    def of(cls, record: Prediction) -> Failure:
        """The failure of a scored record; its gold side (``gold_answer``, ``gold_program``) is left behind."""
        message = (record.get("error") or {}).get("message") or EMPTY_ANSWER
        return cls(program_text(record.get("generated") or ""), record["error_kind"], message,
                   record.get("program"), tuple(record.get("unknown_arguments") or ()))


def called_arguments(text: str) -> list[dict[str, Any]]:
    """The schema arguments of every ``Name[...]`` call in ``text``, which need not parse.

    The function table says which slot each argument fills (extra arguments are ignored, and
    so are unknown functions).

    Returns:
        One ``{"function", "arg", "kind", "value"}`` dict per non-empty argument of a kind in
        ``SLOT_KINDS``, in text order.
    """
    found = []
    for match in _CALL.finditer(text):
        spec = get_spec(match.group(1))
        body = match.group(2)
        if spec is None or not body.strip():
            continue
        values = [re.sub(r"\\(.)", r"\1", v.strip()) for v in split_top(body, "|")]
        found += [{"function": match.group(1), "arg": arg.name, "kind": arg.kind, "value": value}
                  for arg, value in zip(spec.args, values) if arg.kind in SLOT_KINDS and value]
    return found


def involved_arguments(failure: Failure, vocab: Vocabulary) -> list[dict[str, Any]]:
    """The arguments a correction should reconsider, most suspect first, each ``(kind, value)`` once.

    * A program that did not check: the arguments of its calls that name no KB item.
    * An execution error: the arguments naming no KB item (all schema arguments when there
      are none: the error lies elsewhere, and another item may avoid it).
    * An empty answer: the unknown arguments first, then every other schema argument, since
      an existing but wrong item empties an answer as surely as a missing one.
    """
    if failure.program is None:
        args = [a for a in called_arguments(failure.text) if a["value"] not in slot_items(vocab, a["kind"])]
    elif failure.error_kind == "execution" and failure.unknown:
        args = list(failure.unknown)
    else:
        args = [*failure.unknown, *called_arguments(failure.program)]
    seen: set[tuple[str, str]] = set()
    unique = []
    for a in args:
        if (a["kind"], a["value"]) not in seen:
            seen.add((a["kind"], a["value"]))
            unique.append(a)
    return unique


def suggestions(args: Sequence[dict[str, Any]], nearest: Nearest) -> list[Suggestion]:
    """Up to ``MAX_ITEMS`` nearest valid items (other than the value itself) for each of the first
    ``MAX_ARGUMENTS`` arguments; an argument with none is left out."""
    out: list[Suggestion] = []
    for a in args[:MAX_ARGUMENTS]:
        ranked = nearest(a["value"], a["kind"], k=MAX_ITEMS + 1, function=a["function"])
        items = [item for item, _ in ranked if item != a["value"]][:MAX_ITEMS]
        if items:
            out.append((a["function"], a["arg"], a["value"], items))
    return out


def build_correction(prompt: Prompt, record: Prediction, vocab: Vocabulary, nearest: Nearest) -> Prompt:
    """The correction prompt of a failed first-pass record.

    Args:
        prompt: The question's single-pass prompt.
        record: Its scored first-pass record (only its ``Failure`` is read).
        vocab: The KB's vocabulary (which arguments name no item).
        nearest: Ranks a slot's valid items by similarity to a value.
    """
    failure = Failure.of(record)
    return correction_prompt(prompt, failure.text, failure.message,
                             suggestions(involved_arguments(failure, vocab), nearest))
