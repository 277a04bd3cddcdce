"""The solved cases of your own KB: a small YAML file, each case checked against the KB at load.

    - question: Who teaches Databases?
      program: "r1: Find[Databases] → Relate[taught by | forward] → QueryName[]"
      answer: Ada Lovelace        # optional; a list for several

A program is DAG text (``cbr2.kopl.text``; ``program: |`` for one of several lines). Each case's
program is parsed and type-checked (``cbr2.kopl.checker``), its names grounded in the KB (an
entity, concept, attribute key, qualifier key or relation the KB lacks is named, with the
nearest the KB has), executed on the KB, and its answer computed: a case answers what its
program does. An answer the file gives must be that answer (as a set of values: their order is
free); one that differs, or a program that answers nothing, is a problem, since a solved case
the model imitates must be right. The structure of the file itself is ``cbr2.data.schema.
parse_cases``'s; messages read ``<file>:<line> (case N): <what is wrong>``.

The cases become ``Question`` s of the ``custom`` benchmark's one split (``case_questions``): id
``case-N`` (N the case's place in the file), the gold program, the computed answer as a list of
values (the set form of MetaQA: a question over your KB may have several answers, and a given
list is compared as a set), and a category from the program's last function (KQA Pro's nine,
``kqapro_category``), so a run reports per kind of question.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path

from cbr2.data.questions import Question, kqapro_category
from cbr2.data.reading import Problems, read_text
from cbr2.data.schema import CaseEntry, parse_cases
from cbr2.kb.model import KB
from cbr2.kopl.checker import check_text
from cbr2.kopl.errors import ExecutionError
from cbr2.kopl.executor import Executor
from cbr2.kopl.functions import get_spec
from cbr2.kopl.grounding import SLOT_KINDS, slot_items
from cbr2.kopl.program import SYNTAX, Program
from cbr2.kopl.text import escape_arg

MIN_STRUCTURAL_CASES = 30
"""Cases a cases file needs for the structural retriever to be trained on it
(``cbr2.structural.on_demand``); with fewer, runs retrieve semantic cases only.

Training cuts the cases by a hash of their ids into a fit pool and held-out questions
(``structural.holdout``, 0.1), and both sides need at least 2 (``PairDataModule``): with the ids
``case-1`` ... ``case-N`` that cut holds out ``case-3`` and ``case-26``, so it works from 26
cases on, and only grows with N. Above that, pairs are drawn evenly over ``structural.label_bins``
(5) bins of program similarity: 30 cases leave at least 28 in the fit pool, 378 question pairs,
about 75 per bin where the programs spread over the range, so that an epoch's 1,280 draws are not a
few pairs over and over; the held-out questions query those 28 for sketch-hit@5, which then ranks
something. Fewer cases teach a dual encoder little that the semantic view does not already find."""

LISTED_ITEMS = 12
"""A KB with at most this many items of a kind lists them all when a case names one it lacks
(and none is near): a relation misremembered is not always a misspelling."""

_ARGUMENT_KINDS = {"entity": ("entity", "entities and concepts"), "concept": ("concept", "concepts"),
                   "key": ("attribute key", "attribute keys"), "qkey": ("qualifier key", "qualifier keys"),
                   "relation": ("relation", "relations")}
"""How a message names the KB item an argument of each ``SLOT_KINDS`` kind must be, and several of
them (``Find`` takes an entity's or a concept's name)."""


def load_cases(path: str | Path, kb: KB | None, problems: Problems | None = None) -> list[Question]:
    """The questions of a cases file, each case checked against ``kb`` (see the module docstring).

    Args:
        path: The cases file (YAML).
        kb: The KB the programs run on; None checks each program's syntax and types only (what
            ``python -m cbr2.data check`` does when the KB itself has problems).
        problems: Where to report; default: raise the first. With a collecting one, the
            questions of the cases without a problem.

    Raises:
        DataError: ``<file>:<line> (case N): <what is wrong>`` at the first problem, unless
            ``problems`` collects.
    """
    problems = Problems() if problems is None else problems
    text = problems.guard(lambda: read_text(path))
    if text is None:
        return []
    _, entries = parse_cases(text, str(path), problems)
    return case_questions(entries, kb, str(path), problems)


def case_questions(entries: Iterable[CaseEntry], kb: KB | None, source: str, problems: Problems) -> list[Question]:
    """The questions of a cases file's parsed cases (``parse_cases``), each checked against ``kb``
    (None: syntax and types only); a case with a problem is reported and left out."""
    executor = Executor(kb) if kb is not None else None
    out = []
    for entry in entries:
        question = _case_question(entry, kb, executor, source, problems)
        if question is not None:
            out.append(question)
    return out


def _case_question(entry: CaseEntry, kb: KB | None, executor: Executor | None, source: str,
                   problems: Problems) -> Question | None:
    """One case as a question, or None after reporting why it is not one."""
    def at(line: int) -> str:
        return f"{source}:{line} (case {entry.number})"

    checked = check_text(entry.program, "dag")
    if not checked.ok:
        err = checked.error
        what = "does not parse" if err.kind == SYNTAX else "does not type-check"
        problems.add(f"{at(entry.file_line(err.line))}: the program {what}: {err.detail}")
        return None
    program = checked.program
    if kb is None or executor is None:
        return None
    unknown = list(_unknown_names(program, kb))
    for step, kind, value, items in unknown:
        problems.add(f"{at(_line_of(entry, program, step, value))}: {_ARGUMENT_KINDS[kind][0]} {value!r} is not in "
                     f"the KB{_suggest(value, kind, items)}")
    if unknown:
        return None
    try:
        values = executor.run(program)
    except ExecutionError as err:
        problems.add(f"{at(entry.program_line)}: the program fails on the KB: {err}")
        return None
    if not values:
        problems.add(f"{at(entry.program_line)}: the program answers nothing (an empty set): a solved case must have "
                     "an answer; check its names, filters and each Relate's direction")
        return None
    if entry.answer is not None and set(entry.answer) != set(values):
        problems.add(f"{at(entry.answer_line)}: the given answer {_shown(entry.answer)} is not the program's, "
                     f"{_shown(values)}")
        return None
    return Question(qid=f"case-{entry.number}", question=entry.question, program=program, answer=list(values),
                    category=kqapro_category(program))


def _unknown_names(program: Program, kb: KB) -> Iterable[tuple[int, str, str, Iterable[str]]]:
    """``(step, kind, value, the KB's items of that kind)`` of each argument naming no KB item.

    The executor's rule (``Executor.ground``): an attribute key may also be a qualifier key.
    """
    vocab = kb.vocabulary
    for i, step in enumerate(program.steps):
        for arg, value in zip(get_spec(step.function).args, step.inputs, strict=False):
            if arg.kind not in SLOT_KINDS:
                continue
            items = slot_items(vocab, arg.kind)
            if value in items or (arg.kind == "key" and value in vocab.qualifier_keys):
                continue
            yield i, arg.kind, value, items


def _suggest(value: str, kind: str, items: Iterable[str]) -> str:
    """`` (did you mean 'X'?)`` with the KB's nearest items of the kind; where none is near and the
    KB has few (a handful of relations, say), `` (the KB's relations: ...)`` with all of them."""
    items = sorted(items)
    close = difflib.get_close_matches(value, items, n=2, cutoff=0.6)
    if close:
        return f" (did you mean {' or '.join(repr(c) for c in close)}?)"
    if 0 < len(items) <= LISTED_ITEMS:
        return f" (the KB's {_ARGUMENT_KINDS[kind][1]}: {', '.join(items)})"
    return ""


def _line_of(entry: CaseEntry, program: Program, step: int, value: str) -> int:
    """The file line of the program line that writes ``value`` in a call of step ``step``'s
    function (the program's first line when none does, or when it is not a literal block)."""
    call = f"{program.steps[step].function}["
    for k, line in enumerate(entry.program.splitlines(), 1):
        if call in line and escape_arg(value) in line:
            return entry.file_line(k)
    return entry.program_line


def _shown(values: Iterable[str]) -> str:
    """An answer as a message quotes it: one value, or the sorted values in brackets."""
    values = sorted(values)
    return repr(values[0]) if len(values) == 1 else "[" + ", ".join(repr(v) for v in values) + "]"
