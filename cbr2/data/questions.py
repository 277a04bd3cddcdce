"""Questions of KQA Pro and MetaQA, read from the official files, and their categories."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from cbr2.data.reading import DataError, Problems, read_json, read_text
from cbr2.data.schema import parse_metaqa_questions, validate_kqapro_questions
from cbr2.kopl.functions import canonical_name
from cbr2.kopl.program import Program, ProgramError, Step
from cbr2.kopl.text import to_text

KQAPRO_CATEGORIES = (
    "Count", "QueryAttr", "QueryAttrQualifier", "QueryName", "QueryRelation",
    "QueryRelationQualifier", "SelectAmong", "SelectBetween", "Verify",
)
"""The 9 categories of the few-shot literature, in the paper's table order."""

KQAPRO_ABBREVIATIONS = dict(zip(KQAPRO_CATEGORIES, ("CT", "QA", "QAQ", "QN", "QR", "QRQ", "SA", "SB", "VF"), strict=True))
"""Column names of the paper's Tables 3 and 5."""

CATEGORY_OF_LAST_FUNCTION = {"QueryAttrUnderCondition": "QueryAttr"}
"""Last functions that are not a category's own name. ``QueryAttrUnderCondition`` ("What was the
population of Ottawa in 2016?") asks for an attribute's value, as ``QueryAttr`` does; its condition
is a qualifier filter, as ``QFilter*`` steps are in every other category. KQA Pro's own question
types (its paper's Query Attribute) and the nine categories' published validation counts (which sum
to the whole split) both leave it no category of its own. ``What`` → QueryName and ``Verify*`` →
Verify are resolved by ``kqapro_category`` itself."""

KQAPRO_REASONING_TYPES = ("Multi-hop", "Qualifier", "Comparison", "Logical", "Count", "Verify", "Zero-shot")
"""KQA Pro's seven reasoning types (its paper's, and the columns of the CBR² paper's Figure 5):
multi-label, read off the gold program and the training answers (``kqapro_reasoning_types``)."""

_TYPE_FUNCTIONS = {
    "Qualifier": frozenset({"QFilterStr", "QFilterNum", "QFilterYear", "QFilterDate", "QueryAttrUnderCondition",
                            "QueryAttrQualifier", "QueryRelationQualifier"}),
    "Comparison": frozenset({"SelectBetween", "SelectAmong"}),
    "Logical": frozenset({"And", "Or"}),
    "Count": frozenset({"Count"}),
}
"""Reasoning types marked by one of these functions anywhere in the gold program."""

METAQA_CATEGORIES = ("1-hop", "2-hop", "3-hop")
"""MetaQA's categories: the hop count (the paper's Table 4 columns)."""


DatasetFormatError = DataError
"""The name this module's callers know; every data file problem is one ``DataError``."""


@dataclass(frozen=True)
class Question:
    """One question with what the dataset gives about it.

    Attributes:
        qid: Stable id (``{split}-{index}`` for KQA Pro, ``{k}hop-{split}-{line}`` for MetaQA).
        question: The text; the only field retrieval and the prompt may see of an evaluated
            question.
        program: Gold program, or None (KQA Pro test).
        answer: Gold answer: one string (KQA Pro) or a list of names (MetaQA); None if unknown.
        category: KQA Pro category or MetaQA ``{k}-hop``; None without a program (MetaQA: the
            hop of the question's folder when it has no qtype file).
        choices: KQA Pro's 10 choices (empty for MetaQA).
        reasoning_types: KQA Pro's reasoning types of the question (``KQAPRO_REASONING_TYPES``,
            set by ``Benchmark.questions``, which knows the training answers); empty for MetaQA
            and without a program.
    """

    qid: str
    question: str
    program: Program | None
    answer: str | list[str] | None
    category: str | None
    choices: tuple[str, ...] = field(default=())
    reasoning_types: tuple[str, ...] = field(default=())


def kqapro_category(program: Program) -> str:
    """The category of a KQA Pro program: its last function, ``What`` → QueryName, Verify* → Verify,
    ``QueryAttrUnderCondition`` → QueryAttr (``CATEGORY_OF_LAST_FUNCTION``).

    Raises:
        ValueError: When the last function is none of the nine categories' (a program that ends
            in ``Find`` or ``Relate`` asks nothing).
    """
    last = program.final_function()
    category = "Verify" if last.startswith("Verify") else CATEGORY_OF_LAST_FUNCTION.get(last, last)
    if category not in KQAPRO_CATEGORIES:
        raise ValueError(f"last function {program.steps[-1].function!r} is not one of the nine categories' "
                         f"({', '.join(KQAPRO_CATEGORIES)}; QueryAttrUnderCondition counts as QueryAttr)")
    return category


def kqapro_reasoning_types(program: Program, answer: str | None, train_answers: frozenset[str] | None
                           ) -> tuple[str, ...]:
    """KQA Pro's reasoning types of a question, in ``KQAPRO_REASONING_TYPES`` order.

    Multi-hop: a ``Relate`` or any ``Filter*`` step; Qualifier, Comparison, Logical, Count: one
    of ``_TYPE_FUNCTIONS``' functions; Verify: a ``Verify*`` step; Zero-shot: the gold answer is
    not among the training split's answers (as text). A question may have several types or none.

    Args:
        program: The gold program.
        answer: The gold answer (None: never zero-shot).
        train_answers: Every answer of the training split; None when there is no training split
            (then no question is zero-shot).
    """
    functions = {canonical_name(s.function) for s in program.steps}
    marked = {
        "Multi-hop": "Relate" in functions or any(f.startswith("Filter") for f in functions),
        **{kind: bool(functions & names) for kind, names in _TYPE_FUNCTIONS.items()},
        "Verify": any(f.startswith("Verify") for f in functions),
        "Zero-shot": train_answers is not None and answer is not None and answer not in train_answers,
    }
    return tuple(t for t in KQAPRO_REASONING_TYPES if marked[t])


def metaqa_category(program: Program) -> str:
    """The category of a MetaQA program: its hop count, e.g. ``2-hop``."""
    return f"{sum(1 for s in program.steps if s.function == 'Relate')}-hop"


# -------------------------------------------------------------------------- KQA Pro

def load_kqapro_questions(path: str | Path, split: str) -> list[Question]:
    """Read a KQA Pro ``train.json`` / ``val.json`` / ``test.json``.

    The text is ``question``, or ``rewrite`` / ``origin`` in redistributed copies; ``program``
    and ``answer`` are absent from the official test file.

    Raises:
        DatasetFormatError: Naming the file and the item (``[17].answer``) of anything
            malformed, or line and column of text that is not JSON (see ``cbr2.data.schema``).
    """
    path = Path(path)
    items = read_json(path)
    validate_kqapro_questions(items, str(path))
    out = []
    for i, item in enumerate(items):
        text = item.get("question") or item.get("rewrite") or item.get("origin")
        program, category = None, None
        if item.get("program") is not None:
            try:
                program = Program.from_json(item["program"])
            except ProgramError as err:
                raise DatasetFormatError(f"{path}: [{i}].{err.detail}") from err
            try:
                category = kqapro_category(program)
            except ValueError as err:  # a last function of no category
                raise DatasetFormatError(f"{path}: [{i}].program: {err}") from err
        out.append(Question(qid=f"{split}-{i}", question=text, program=program, answer=item.get("answer"),
                            category=category, choices=tuple(item.get("choices", ()))))
    return out


# --------------------------------------------------------------------------- MetaQA

METAQA_TYPES = {
    # qtype token -> KB relation; "movie_to_X" follows it forward, "X_to_movie" backward
    "director": "directed_by",
    "writer": "written_by",
    "actor": "starred_actors",
    "year": "release_year",
    "language": "in_language",
    "tag": "has_tags", "tags": "has_tags",
    "genre": "has_genre",
    "imdbvotes": "has_imdb_votes", "votes": "has_imdb_votes",
    "imdbrating": "has_imdb_rating", "rating": "has_imdb_rating",
}

def metaqa_program(topic: str, qtype: str) -> Program:
    """Build ``Find[topic] → Relate[rel | dir] × hops → QueryName[]`` from a qtype chain.

    Args:
        topic: The bracketed topic entity of the question.
        qtype: E.g. ``actor_to_movie_to_director``.

    Raises:
        ValueError: On a chain that does not alternate between movie and another type.
    """
    tokens = qtype.strip().split("_to_")
    if len(tokens) < 2:
        raise ValueError(f"qtype {qtype!r} is not a chain like 'movie_to_director'")
    steps = [Step("Find", (topic,), ())]
    for a, b in pairwise(tokens):
        if a == "movie" and b in METAQA_TYPES:
            relation, direction = METAQA_TYPES[b], "forward"
        elif b == "movie" and a in METAQA_TYPES:
            relation, direction = METAQA_TYPES[a], "backward"
        else:
            raise ValueError(f"qtype {qtype!r}: cannot read the hop {a}_to_{b} (known types: movie, "
                             f"{', '.join(sorted(METAQA_TYPES))})")
        steps.append(Step("Relate", (relation, direction), (len(steps) - 1,)))
    steps.append(Step("QueryName", (), (len(steps) - 1,)))
    return Program(tuple(steps))


def load_metaqa_questions(root: str | Path, split: str, hops: tuple[int, ...] = (1, 2, 3),
                          problems: Problems | None = None) -> list[Question]:
    """Read MetaQA's ``{k}-hop/vanilla/qa_{split}.txt`` with ``{k}-hop/qa_{split}_qtype.txt``.

    Each line is ``question with [topic]<TAB>ans1|ans2``; answers split on ``|`` only, so
    names with commas stay whole. The program comes from the qtype line of the same index.
    Without a hop's qtype file (the public test questions are redistributed without them), its
    questions load with the hop of their folder as category and no gold program.

    Args:
        root: The MetaQA folder.
        split: ``train``, ``dev`` or ``test``.
        hops: Which ``{k}-hop`` folders to read.
        problems: Where to report; default: raise the first. With a collecting one, the
            questions of the lines without a problem.

    Raises:
        DatasetFormatError: Naming file and line of a malformed line (no tab, not one
            ``[topic]``, an empty answer, not UTF-8, a qtype that is no chain), a missing
            question file or a line-count mismatch, unless ``problems`` collects.
    """
    root = Path(root)
    problems = Problems() if problems is None else problems
    out: list[Question] = []
    for k in hops:
        qa_path = root / f"{k}-hop" / "vanilla" / f"qa_{split}.txt"
        qtype_path = root / f"{k}-hop" / f"qa_{split}_qtype.txt"
        if not qa_path.is_file():
            problems.add(f"{qa_path}: file not found (MetaQA layout: {{k}}-hop/vanilla/qa_{{split}}.txt, "
                         "with {k}-hop/qa_{split}_qtype.txt for the gold programs)")
            continue
        text = problems.guard(lambda p=qa_path: read_text(p))
        if text is None:
            continue
        rows = parse_metaqa_questions(text, str(qa_path), problems)
        qtypes = problems.guard(lambda p=qtype_path: read_text(p).splitlines()) if qtype_path.is_file() else None
        if qtypes is not None and len(qtypes) != len(text.splitlines()):
            problems.add(f"{qtype_path}: {len(qtypes)} lines, but {qa_path} has {len(text.splitlines())}")
            qtypes = None
        for row in rows:
            program, category = None, f"{k}-hop"
            if qtypes is not None:
                try:
                    program = metaqa_program(row["topic"], qtypes[row["line"] - 1])
                except ValueError as err:
                    problems.add(f"{qtype_path}: line {row['line']}: {err}")
                    continue
                category = metaqa_category(program)
            out.append(Question(qid=f"{k}hop-{split}-{row['line']}", question=row["question"], program=program,
                                answer=row["answers"], category=category))
    return out


def metaqa_topics(program: Program) -> set[str]:
    """Names the program starts from (``Find`` arguments): MetaQA's answers never include them."""
    return {s.inputs[0] for s in program.steps if s.function == "Find"}


def question_record(q: Question) -> dict[str, Any]:
    """The gold side of a prediction line.

    ``gold_program`` is the gold program as DAG text (None without one); ``reasoning_types``
    (KQA Pro, when known) lists the question's reasoning types. It serves the error
    analysis after scoring only; retrieval and prompts never read prediction records.
    """
    record = {"id": q.qid, "question": q.question, "category": q.category, "gold_answer": q.answer,
              "gold_program": to_text(q.program, "dag") if q.program is not None else None}
    if q.reasoning_types:
        record["reasoning_types"] = list(q.reasoning_types)
    return record
