"""Questions of KQA Pro and MetaQA, read from the official files, and their categories."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from cbr2.data.reading import DataError, read_json, read_text
from cbr2.data.schema import parse_metaqa_question_line, parse_metaqa_questions, validate_kqapro_questions
from cbr2.kopl.program import Program, ProgramError, Step
from cbr2.kopl.text import to_text

KQAPRO_CATEGORIES = (
    "Count", "QueryAttr", "QueryAttrQualifier", "QueryName", "QueryRelation",
    "QueryRelationQualifier", "SelectAmong", "SelectBetween", "Verify",
)
"""The 9 categories of the few-shot literature, in the paper's table order."""

KQAPRO_ABBREVIATIONS = dict(zip(KQAPRO_CATEGORIES, ("CT", "QA", "QAQ", "QN", "QR", "QRQ", "SA", "SB", "VF"), strict=True))
"""Column names of the paper's Tables 3 and 5."""

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
        category: KQA Pro category or MetaQA ``{k}-hop``; None without a program.
        choices: KQA Pro's 10 choices (empty for MetaQA).
    """

    qid: str
    question: str
    program: Program | None
    answer: str | list[str] | None
    category: str | None
    choices: tuple[str, ...] = field(default=())


def kqapro_category(program: Program) -> str:
    """The category of a KQA Pro program: its last function, ``What`` → QueryName, Verify* → Verify."""
    last = program.final_function()
    return "Verify" if last.startswith("Verify") else last


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
        program = None
        if item.get("program") is not None:
            try:
                program = Program.from_json(item["program"])
            except ProgramError as err:
                raise DatasetFormatError(f"{path}: [{i}].program: {err}") from err
        out.append(Question(
            qid=f"{split}-{i}", question=text, program=program, answer=item.get("answer"),
            category=kqapro_category(program) if program else None,
            choices=tuple(item.get("choices", ()))))
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


def load_metaqa_questions(root: str | Path, split: str, hops: tuple[int, ...] = (1, 2, 3)) -> list[Question]:
    """Read MetaQA's ``{k}-hop/vanilla/qa_{split}.txt`` with ``{k}-hop/qa_{split}_qtype.txt``.

    Each line is ``question with [topic]<TAB>ans1|ans2``; answers split on ``|`` only, so
    names with commas stay whole. The program comes from the qtype line of the same index.

    Raises:
        DatasetFormatError: Naming file and line of a malformed line (no tab, not one
            ``[topic]``, an empty answer, not UTF-8), a missing qtype file or a line-count mismatch.
    """
    root = Path(root)
    out: list[Question] = []
    for k in hops:
        qa_path = root / f"{k}-hop" / "vanilla" / f"qa_{split}.txt"
        qtype_path = root / f"{k}-hop" / f"qa_{split}_qtype.txt"
        for p in (qa_path, qtype_path):
            if not p.is_file():
                raise DatasetFormatError(f"{p}: file not found (MetaQA layout: {{k}}-hop/vanilla/qa_{{split}}.txt "
                                         "and {k}-hop/qa_{split}_qtype.txt)")
        rows = parse_metaqa_questions(read_text(qa_path), str(qa_path))
        qtypes = read_text(qtype_path).splitlines()
        if len(rows) != len(qtypes):
            raise DatasetFormatError(f"{qtype_path}: {len(qtypes)} lines, but {qa_path} has {len(rows)}")
        for lineno, (row, qtype) in enumerate(zip(rows, qtypes, strict=True), 1):
            try:
                program = metaqa_program(row["topic"], qtype)
            except ValueError as err:
                raise DatasetFormatError(f"{qtype_path}: line {lineno}: {err}") from err
            out.append(Question(qid=f"{k}hop-{split}-{lineno}", question=row["question"], program=program,
                                answer=row["answers"], category=metaqa_category(program)))
    return out


def parse_metaqa_line(line: str) -> tuple[str, str, list[str]]:
    """Split ``question with [topic]<TAB>a1|a2`` into text, topic and answers.

    Answers are split on ``|`` only: names with commas (``Girl, Interrupted``) stay whole.
    Only the layout is checked here; ``load_metaqa_questions`` also rejects empty answers.

    Raises:
        ValueError: If the line has no tab or not exactly one bracketed topic.
    """
    row = parse_metaqa_question_line(line)
    return row["question"], row["topic"], row["answers"]


def metaqa_topics(program: Program) -> set[str]:
    """Names the program starts from (``Find`` arguments): MetaQA's answers never include them."""
    return {s.inputs[0] for s in program.steps if s.function == "Find"}


def question_record(q: Question) -> dict[str, Any]:
    """The gold side of a prediction line.

    ``gold_program`` is the gold program as DAG text (None without one). It serves the error
    analysis after scoring only; retrieval and prompts never read prediction records.
    """
    return {"id": q.qid, "question": q.question, "category": q.category, "gold_answer": q.answer,
            "gold_program": to_text(q.program, "dag") if q.program is not None else None}
