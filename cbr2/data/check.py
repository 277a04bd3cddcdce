"""``python -m cbr2.data check DIR``: every problem of a dataset folder, then what it holds; and
``check --kb FILE --cases FILE``: every problem of a KB and cases of your own (``check_custom``),
then the KB's vocabulary and each case's computed answer, for the author to confirm.

The loaders stop at the first problem of a file; this runs the same validators (``cbr2.data.
schema``, ``Program.from_json``, the category rule of ``cbr2.data.questions``) with a collecting
``Problems``, so one pass names every broken item of every file, in the loaders' message form
(``val.json: [3].program: ...``), then counts the questions per split and category and the KB.

A file of the layout that is absent is a note, not a problem: the check judges the files that
are there, and says what each absent one prevents (no KB: nothing can be executed; no qtype
file: no gold programs). A folder of questions alone, like the public MetaQA test questions,
is then clean; ``evaluate.py`` still refuses a ``data.root`` without its KB, in one line, and
``fetch`` requires every file it lays out.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from cbr2.common.errors import UserError
from cbr2.data.cases import MIN_STRUCTURAL_CASES, case_questions
from cbr2.data.kb_loaders import check_triples_kb, custom_kb_kind
from cbr2.data.questions import (
    KQAPRO_ABBREVIATIONS,
    KQAPRO_CATEGORIES,
    METAQA_CATEGORIES,
    Question,
    kqapro_category,
    load_metaqa_questions,
)
from cbr2.data.reading import DataError, Problems, read_json, read_text
from cbr2.data.schema import (
    in_line_order,
    parse_cases,
    parse_metaqa_kb,
    validate_kqapro_kb,
    validate_kqapro_questions,
)
from cbr2.kb.model import KB
from cbr2.kopl.program import Program, ProgramError

KINDS = ("kqapro", "metaqa")
KQAPRO_SPLITS = ("train", "val", "test")
METAQA_SPLITS = ("train", "dev", "test")
METAQA_HOPS = (1, 2, 3)
NO_PROGRAM = "no program"
"""The column of questions without a gold program (KQA Pro test, MetaQA without qtype files)."""
BROKEN = "broken"
"""The column of KQA Pro questions whose structure or program has a problem (listed above it)."""


def kqapro_files() -> list[str]:
    """The files of the KQA Pro layout, relative to its folder."""
    return ["kb.json"] + [f"{split}.json" for split in KQAPRO_SPLITS]


def metaqa_files() -> list[str]:
    """The files of MetaQA's release layout, relative to its folder."""
    out = ["kb.txt"]
    for k in METAQA_HOPS:
        out += [f"{k}-hop/vanilla/qa_{split}.txt" for split in METAQA_SPLITS]
        out += [f"{k}-hop/qa_{split}_qtype.txt" for split in METAQA_SPLITS]
    return out


LAYOUTS = {"kqapro": kqapro_files, "metaqa": metaqa_files}


@dataclass
class Report:
    """What ``check_folder`` found.

    Attributes:
        root: The folder.
        kind: ``kqapro`` or ``metaqa``.
        problems: Every problem, ``<file>: <item>: <what is wrong>`` (file relative to ``root``).
        notes: What is absent and what that prevents.
        questions: Split → category → number of questions (``NO_PROGRAM`` for those without one).
        kb: The KB's sizes (``KB.stats``), or None when it is absent or broken.
    """

    root: Path
    kind: str
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    questions: dict[str, Counter[str]] = field(default_factory=dict)
    kb: dict[str, int] | None = None

    @property
    def clean(self) -> bool:
        """No problem found (notes allowed)."""
        return not self.problems


def detect_kind(root: Path) -> str:
    """``kqapro`` or ``metaqa``, from the files of either layout that ``root`` holds.

    Raises:
        UserError: If it holds files of neither layout, or of both.
    """
    found = [kind for kind in KINDS if any((root / f).exists() for f in LAYOUTS[kind]())]
    if len(found) != 1:
        what = "files of both layouts" if found else "no file of either layout"
        raise UserError(f"{root}: {what} (KQA Pro: {', '.join(kqapro_files())}; MetaQA: kb.txt, "
                        "{1,2,3}-hop/vanilla/qa_{train,dev,test}.txt, {1,2,3}-hop/qa_{split}_qtype.txt); "
                        "pass --kind kqapro|metaqa")
    return found[0]


def check_folder(root: str | Path, kind: str | None = None) -> Report:
    """Validate every file of a dataset folder, listing all problems, and count what it holds.

    Args:
        root: The folder.
        kind: ``kqapro`` or ``metaqa``; default: told from the layout (``detect_kind``).

    Raises:
        UserError: If ``root`` is not a folder, or its kind cannot be told.
    """
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"{root}: not a folder")
    kind = kind or detect_kind(root)
    report = Report(root, kind)
    if not any((root / f).exists() for f in LAYOUTS[kind]()):
        report.problems.append(f"{root}: no file of the {kind} layout ({', '.join(LAYOUTS[kind]())})")
        return report
    problems = Problems(collect=True)
    (_check_kqapro if kind == "kqapro" else _check_metaqa)(root, report, problems)
    prefix = f"{root}{os.sep}"
    report.problems += [p.replace(prefix, "") for p in problems.found]  # files named relative to the folder
    return report


def _check_kqapro(root: Path, report: Report, problems: Problems) -> None:
    kb_path = root / "kb.json"
    if not kb_path.is_file():
        report.notes.append("kb.json: absent: no program can be executed (evaluate.py needs it)")
    elif (raw := problems.guard(lambda: read_json(kb_path))) is not None:
        before = len(problems.found)
        validate_kqapro_kb(raw, str(kb_path), problems)
        if len(problems.found) == before:
            from cbr2.data.kb_loaders import kqapro_kb_from_dict

            report.kb = kqapro_kb_from_dict(raw, str(kb_path)).stats()
    for split in KQAPRO_SPLITS:
        path = root / f"{split}.json"
        if not path.is_file():
            report.notes.append(f"{path.name}: absent: no {split} split")
            continue
        items = problems.guard(lambda p=path: read_json(p))
        if items is None:
            continue
        broken = validate_kqapro_questions(items, str(path), problems)
        counts: Counter[str] = Counter()
        for i, item in enumerate(items if isinstance(items, list) else ()):
            if i in broken:
                counts[BROKEN] += 1
                continue
            raw_program = item.get("program")
            if raw_program is None:
                counts[NO_PROGRAM] += 1
                continue
            # The load path's own steps (cbr2.data.questions.load_kqapro_questions), reported instead of raised.
            try:
                program = Program.from_json(raw_program)
            except ProgramError as err:
                problems.add(f"{path}: [{i}].{err.detail}")
                counts[BROKEN] += 1
                continue
            try:
                counts[kqapro_category(program)] += 1
            except ValueError as err:  # a last function with no category
                problems.add(f"{path}: [{i}].program: {err}")
                counts[BROKEN] += 1
        report.questions[split] = counts
        if split == "test" and counts and set(counts) == {NO_PROGRAM}:
            report.notes.append("test.json: no programs or answers (the official test file): nothing to score")


def _check_metaqa(root: Path, report: Report, problems: Problems) -> None:
    kb_path = root / "kb.txt"
    if not kb_path.is_file():
        report.notes.append("kb.txt: absent: no program can be executed (evaluate.py needs it); the questions "
                            "are checked alone")
    elif (text := problems.guard(lambda: read_text(kb_path))) is not None:
        before = len(problems.found)
        parse_metaqa_kb(text, str(kb_path), problems)
        if len(problems.found) == before:
            from cbr2.data.kb_loaders import load_metaqa_kb

            report.kb = load_metaqa_kb(kb_path).stats()
    for split in METAQA_SPLITS:
        counts: Counter[str] = Counter()
        if not any((root / f"{k}-hop/vanilla/qa_{split}.txt").is_file() for k in METAQA_HOPS):
            report.notes.append(f"{{1,2,3}}-hop/vanilla/qa_{split}.txt: absent: no {split} split")
            continue
        for k in METAQA_HOPS:
            qa = f"{k}-hop/vanilla/qa_{split}.txt"
            if not (root / qa).is_file():
                report.notes.append(f"{qa}: absent: no {k}-hop {split} questions")
                continue
            questions = load_metaqa_questions(root, split, (k,), problems)
            counts.update(q.category for q in questions)
            if not (root / f"{k}-hop/qa_{split}_qtype.txt").is_file():
                report.notes.append(f"{k}-hop/qa_{split}_qtype.txt: absent: the {len(questions):,} {k}-hop {split} "
                                    f"questions have their hop ({k}-hop, from the folder) but no gold program")
        if counts:
            report.questions[split] = counts


def render(report: Report) -> str:
    """The report as the command prints it: problems, notes, question counts, KB size, verdict."""
    lines = [f"{report.kind} folder {report.root}"]
    if report.problems:
        lines.append(f"problems ({len(report.problems)}):")
        lines += [f"  {p}" for p in report.problems]
    if report.notes:
        lines.append(f"notes ({len(report.notes)}):")
        lines += [f"  {n}" for n in report.notes]
    if report.questions:
        known = KQAPRO_CATEGORIES if report.kind == "kqapro" else METAQA_CATEGORIES
        seen = {c for counts in report.questions.values() for c in counts}
        last = (NO_PROGRAM, BROKEN)
        columns = [c for c in known if c in seen] + sorted(seen - set(known) - set(last))
        columns += [c for c in last if c in seen]
        rows = [["split", "questions", *(KQAPRO_ABBREVIATIONS.get(c, c) for c in columns)]]
        rows += [[split, f"{sum(counts.values()):,}", *(f"{counts[c]:,}" for c in columns)]
                 for split, counts in report.questions.items()]
        legend = ", ".join(f"{KQAPRO_ABBREVIATIONS[c]} {c}" for c in columns if c in KQAPRO_ABBREVIATIONS)
        lines.append(f"questions per split and category{f' ({legend})' if legend else ''}:")
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines += ["  " + "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w)
                                   in enumerate(zip(row, widths, strict=True))) for row in rows]
    if report.kb is not None:
        kb = report.kb
        facts = (f"{kb['attribute_facts']:,} attribute facts, {kb['relation_facts']:,} relation facts"
                 if report.kind == "kqapro" else f"{kb['relation_facts']:,} distinct triples")
        lines.append(f"KB: {kb['entities']:,} entities, {kb['concepts']:,} concepts, {facts}, "
                     f"{kb['relations']:,} relations")
    verdict = "clean" if report.clean else f"{len(report.problems)} problem{'s' * (len(report.problems) != 1)}"
    lines.append(f"result: {verdict}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- your own KB and cases

FORMS = {"tab": "triples, TAB-separated", "pipe": "triples, '|'-separated", "metaqa": "MetaQA's kb.txt",
         "kqapro": "KoPL JSON"}
"""How the report names each kind of KB file of your own."""
LISTED = 20
"""Names of each kind the report lists before saying how many more there are."""
ANSWER_VALUES = 8
"""Values of one case's answer the report lists before saying how many more there are."""


@dataclass
class CustomReport:
    """What ``check_custom`` found.

    Attributes:
        kb_path: The KB file.
        cases_path: The cases file, or None when only the KB was checked.
        form: A key of ``FORMS`` (None when the file could not be read).
        problems: Every problem, ``<file>:<line>: <what is wrong>`` (cases: ``<file>:<line> (case N): ...``).
        notes: What could not be checked, and why.
        kb: The KB, or None when it has problems.
        cases: How many cases the file's list holds (None without a cases file).
        questions: The cases without a problem, as questions with their computed answers.
    """

    kb_path: Path
    cases_path: Path | None
    form: str | None = None
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    kb: KB | None = None
    cases: int | None = None
    questions: list[Question] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        """No problem found (notes allowed)."""
        return not self.problems


def check_custom(kb: str | Path, cases: str | Path | None = None) -> CustomReport:
    """Validate a KB of your own and its cases file, listing all problems, and compute every answer.

    The KB is read as ``load_custom_kb`` reads it (KoPL JSON or a triples file) with a collecting
    ``Problems``; each case is checked as ``cbr2.data.cases`` checks it at load (parsed, type-checked,
    grounded in the KB, executed, its given answer compared). When the KB has problems the cases
    are parsed and type-checked only.

    Raises:
        UserError: If a file does not exist.
    """
    kb_path = Path(kb)
    cases_path = Path(cases) if cases is not None else None
    for path in (kb_path, cases_path):
        if path is not None and not path.is_file():
            raise UserError(f"{path}: no such file")
    report = CustomReport(kb_path, cases_path)
    problems = Problems(collect=True)
    try:
        kind = custom_kb_kind(kb_path)
    except DataError as err:  # gone since the check above
        raise UserError(str(err)) from None
    if kind == "kqapro":
        report.form = kind
        raw = problems.guard(lambda: read_json(kb_path))
        if raw is not None:
            validate_kqapro_kb(raw, str(kb_path), problems)
            if not problems.found:
                from cbr2.data.kb_loaders import kqapro_kb_from_dict

                report.kb = kqapro_kb_from_dict(raw, str(kb_path))
    else:
        report.form, report.kb = check_triples_kb(kb_path, problems)
    if cases_path is not None:
        found = Problems(collect=True)  # the file's structure first, then each case: reported in line order
        text = found.guard(lambda: read_text(cases_path))
        if text is not None:
            report.cases, entries = parse_cases(text, str(cases_path), found)
            report.questions = case_questions(entries, report.kb, str(cases_path), found)
            if report.kb is None and entries:
                report.notes.append(f"{cases_path}: the programs were parsed and type-checked only: with the KB's "
                                    "problems fixed, they are grounded in it and executed")
        problems.found += in_line_order(found.found, str(cases_path))
    report.problems = problems.found
    return report


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:LISTED])
    return shown + (f" ... and {len(names) - LISTED:,} more" if len(names) > LISTED else "")


def render_custom(report: CustomReport) -> str:
    """The report as the command prints it: problems, notes, the KB, the cases and their answers, verdict."""
    lines = [f"KB {report.kb_path} ({FORMS.get(report.form, 'unreadable')})"]
    if report.cases_path is not None:
        lines.append(f"cases {report.cases_path}")
    if report.problems:
        lines.append(f"problems ({len(report.problems)}):")
        lines += [f"  {p}" for p in report.problems]
    if report.notes:
        lines.append(f"notes ({len(report.notes)}):")
        lines += [f"  {n}" for n in report.notes]
    if report.kb is not None:
        stats, voc = report.kb.stats(), report.kb.vocabulary
        lines.append(f"KB: {stats['entities']:,} entities, {stats['concepts']:,} concepts, {stats['relations']:,} "
                     f"relations, {stats['attribute_keys']:,} attribute keys, {stats['relation_facts']:,} relation "
                     f"facts, {stats['attribute_facts']:,} attribute facts")
        lines.append(f"  concepts: {_listed(sorted(voc.concepts)) or 'none'}")
        lines.append(f"  relations: {_listed(sorted(voc.relations)) or 'none'}")
        keys = [f"{k} ({t}{', ' + ' / '.join(sorted(voc.units[k] - {'1'})) if voc.units.get(k, set()) - {'1'} else ''})"
                for k, t in sorted(voc.keys.items())]
        lines.append(f"  attribute keys: {_listed(keys) or 'none'}")
    if report.cases is not None:
        n = len(report.questions)
        counts = Counter(q.category for q in report.questions)
        kinds = ", ".join(f"{c} {counts[c]}" for c in KQAPRO_CATEGORIES if counts[c])
        broken = report.cases - n if report.kb is not None else 0  # without a KB, no case is run
        lines.append(f"cases: {report.cases}{f' ({kinds})' if kinds else ''}"
                     f"{f'; {broken} with problems' if broken else ''}")
        if report.kb is not None and report.cases:
            enough = report.cases >= MIN_STRUCTURAL_CASES
            lines.append(f"  structural retriever: {'trained on them' if enough else 'none'} ({report.cases} cases, "
                         f"{'at least' if enough else 'fewer than'} {MIN_STRUCTURAL_CASES}"
                         f"{'' if enough else ': runs retrieve semantic cases only'})")
    if report.questions:
        lines.append("answers, as the programs compute them:")
        width = max(len(q.qid) for q in report.questions)
        for q in report.questions:
            values = list(q.answer)
            shown = "; ".join(values[:ANSWER_VALUES]) + (f" ... ({len(values)} values)" if len(values) > ANSWER_VALUES
                                                           else "")
            lines.append(f"  {q.qid.ljust(width)}  {q.question} → {shown}")
    verdict = "clean" if report.clean else f"{len(report.problems)} problem{'s' * (len(report.problems) != 1)}"
    lines.append(f"result: {verdict}")
    return "\n".join(lines) + "\n"
