"""The one validation layer of every input data file, run once at load.

Formats: KQA Pro ``kb.json`` (both published schemas) and question files, MetaQA ``kb.txt`` and
question files, and a KB and cases of your own (a triples file, ``parse_triples``; a YAML file of
solved cases, ``parse_cases``, whose programs ``cbr2.data.cases`` checks against the KB). The JSON
formats are described here once, as pydantic schemas that mirror the official
layout (``extra="allow"``: fields the project does not read, such as ``sparql``, are fine),
validated in strict mode so that nothing is coerced: the loaders go on with the parsed data
itself, so a file either loads exactly as written or is rejected. Checks that span items (a
relation's target exists, no single question lacks its answer) run right after the structural
ones, in the same functions.

Every rejection is a ``DataError`` whose message reads ``<file>: <item>: <what is wrong>``,
e.g. ``kb.json: entities["Q42"].attributes[3]: missing key 'key'`` (the files of your own KB and
cases: ``<file>:<line>: <what is wrong>``, the form editors jump to). Loading stops at the first;
given a collecting ``Problems`` (``cbr2.data.reading``), the same functions report every problem
in that form and go on (``python -m cbr2.data check``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date
from functools import cache
from typing import Annotated, Any, Literal

import yaml
from pydantic import ConfigDict, Field, StringConstraints, TypeAdapter, ValidationError, with_config
from typing_extensions import NotRequired, TypedDict  # pydantic needs these on Python < 3.12

from cbr2.common.console import did_you_mean
from cbr2.common.files import gc_paused
from cbr2.data.names import kqapro_kb_strings, kqapro_question_strings, question_problem, string_problems
from cbr2.data.reading import DataError, Problems, text_lines

# ------------------------------------------------------------------- error messages

_JSON_TYPES = {"dict_type": "an object", "model_type": "an object", "model_attributes_type": "an object",
               "list_type": "a list", "string_type": "a string", "int_type": "an integer",
               "float_type": "a number", "bool_type": "true or false"}
"""pydantic's type errors, said in JSON's words (the files are JSON, not Python)."""


def _got(value: Any) -> str:
    """What a bad value is, briefly: a whole entity in a message would hide the point."""
    if isinstance(value, (dict, list)):
        return "an object" if isinstance(value, dict) else "a list"
    if isinstance(value, bool) or value is None:
        return json.dumps(value)  # true / false / null, as the file writes them
    text = repr(value)
    return f"{'the string' if isinstance(value, str) else 'the number'} {text if len(text) <= 60 else text[:57] + '...'}"


def _what(err: dict[str, Any]) -> str:
    """The ``<what is wrong>`` of one pydantic error."""
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind == "missing":
        return f"missing key {err['loc'][-1]!r}"
    if kind == "union_tag_not_found":
        return f"missing key {ctx['discriminator']}"
    if kind == "union_tag_invalid":
        return f"unknown {ctx['discriminator'].strip(chr(39))} {ctx['tag']!r}; expected {ctx['expected_tags']}"
    if kind in _JSON_TYPES:
        return f"expected {_JSON_TYPES[kind]}, got {_got(err['input'])}"
    if kind == "literal_error":
        return f"expected {ctx['expected']}, got {_got(err['input'])}"
    if kind in ("string_too_short", "too_short"):
        return "must not be empty"
    return f"{err['msg'][0].lower()}{err['msg'][1:]}, got {_got(err['input'])}"


def _item(loc: Iterable[str | int], data: Any, mappings: frozenset[str] = frozenset()) -> str:
    """The path of an error's place in the file, e.g. ``entities["Q42"].attributes[3]``.

    Walks ``loc`` through the data itself: parts that are not places in the file (the value
    type a tagged union adds, the missing key of a ``missing`` error) drop out on the way.

    Args:
        loc: pydantic's ``loc`` of the error.
        data: What was validated.
        mappings: Fields whose keys are ids or names (``entities``), written ``["Q42"]``.
    """
    parts: list[str] = []
    node, key_of_mapping = data, False
    for part in loc:
        if isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            parts.append(f"[{part}]")
            node, key_of_mapping = node[part], False
        elif isinstance(node, dict) and part in node:
            is_field = not key_of_mapping
            parts.append(f".{part}" if is_field else f"[{json.dumps(part, ensure_ascii=False)}]")
            node, key_of_mapping = node[part], is_field and part in mappings
    return "".join(parts).removeprefix(".") or "top level"


def _raise_first(source: str, err: ValidationError, data: Any, mappings: frozenset[str] = frozenset()) -> None:
    """Raise a ``DataError`` for the first (in file order) of pydantic's errors."""
    errors = err.errors(include_url=False)
    first = errors[0]
    more = f" (the first of {len(errors)} problems)" if len(errors) > 1 else ""
    raise DataError(f"{source}: {_item(first['loc'], data, mappings)}: {_what(first)}{more}") from None


# ------------------------------------------------------------------------ schemas

METAQA_RELATIONS = {
    # relation -> concept of the tail (the head is always a movie)
    "directed_by": "person",
    "written_by": "person",
    "starred_actors": "person",
    "release_year": "year",
    "in_language": "language",
    "has_tags": "tag",
    "has_genre": "genre",
    "has_imdb_votes": "imdb votes",
    "has_imdb_rating": "imdb rating",
}
"""MetaQA's nine relations and the concept their tails get in the KB model."""


# TypedDicts rather than BaseModels: on a kb.json of KQA Pro's size (~1M facts), validating
# into model objects took 4x as long as json.loads, into dicts about as long. strict: a "5" is
# not a 5 and a 5 is not a "5", since the loaders go on with the data as parsed.
_record = with_config(ConfigDict(extra="allow", strict=True))


@_record
class StringValue(TypedDict):
    type: Literal["string"]
    value: str


@_record
class QuantityValue(TypedDict):
    type: Literal["quantity"]
    value: float  # strict mode takes a JSON integer here too, never a string
    unit: NotRequired[str]  # "1" (or no unit) is unitless


@_record
class DateValue(TypedDict):
    type: Literal["date"]
    value: str  # yyyy-mm-dd or yyyy/mm/dd


@_record
class YearValue(TypedDict):
    type: Literal["year"]
    value: int


Value = Annotated[StringValue | QuantityValue | DateValue | YearValue, Field(discriminator="type")]
Qualifiers = dict[str, list[Value]]


@_record
class Attribute(TypedDict):
    key: str
    value: Value
    qualifiers: NotRequired[Qualifiers]


@_record
class Relation(TypedDict):
    relation: NotRequired[str]  # newer schema
    predicate: NotRequired[str]  # the older schema's name for it; one of the two is checked after
    direction: Literal["forward", "backward"]
    object: str  # an entity id, or a concept id
    qualifiers: NotRequired[Qualifiers]


@_record
class Entity(TypedDict):
    name: str
    instanceOf: NotRequired[list[str]]  # concept ids
    attributes: NotRequired[list[Attribute]]
    relations: NotRequired[list[Relation]]


@_record
class Concept(TypedDict):
    name: str
    subclassOf: NotRequired[list[str]]  # newer schema
    instanceOf: NotRequired[list[str]]  # the older schema's name for the parents; checked after


@_record
class KQAProKB(TypedDict):
    concepts: dict[str, Concept]
    entities: dict[str, Entity]


@_record
class Step(TypedDict):
    function: str
    inputs: list[str]
    dependencies: NotRequired[list[int]]


@_record
class KQAProQuestion(TypedDict):
    question: NotRequired[str | None]
    rewrite: NotRequired[str | None]  # redistributed copies carry these instead of `question`
    origin: NotRequired[str | None]
    program: NotRequired[list[Step] | None]  # absent from the official test file, as is the answer
    choices: NotRequired[list[str]]
    answer: NotRequired[str | None]


Name = Annotated[str, StringConstraints(min_length=1)]


@_record
class MetaQATriple(TypedDict):
    # One kb.txt line, ``head|relation|tail``.
    head: Name
    relation: Literal[tuple(METAQA_RELATIONS)]  # type: ignore[valid-type]
    tail: Name


@_record
class MetaQAQuestion(TypedDict):
    # One question line, ``question with [topic]<TAB>ans1|ans2``.
    question: str
    topic: Name
    answers: Annotated[list[Name], Field(min_length=1)]


_KB_MAPPINGS = frozenset({"concepts", "entities", "qualifiers"})
"""Fields whose keys are ids or names, written ``entities["Q42"]`` in messages."""


# ------------------------------------------------------------------------ validation

@cache
def _adapter(schema: Any) -> TypeAdapter:
    # Built once per schema: building a validator costs more than running it on a small file.
    return TypeAdapter(schema)


def _check_strings(source: str, strings: Iterable[tuple[str, str, bool]], problems: Problems) -> None:
    """Report the names and values the program text cannot carry (``cbr2.data.names``)."""
    for item, what in string_problems(strings):
        problems.add(f"{source}: {item}: {what}")


def _check(schema: Any, raw: Any, source: str, problems: Problems,
           mappings: frozenset[str] = frozenset()) -> list[tuple[str | int, ...]]:
    """Validate ``raw`` against ``schema``; the validated copy is dropped, the caller keeps ``raw``.

    Returns:
        The places (pydantic ``loc``) of the problems found, when ``problems`` collects them:
        the checks that follow skip the items they are in, whose structure they cannot trust.
    """
    try:
        # Validation builds (and drops) a copy of the parsed file; json.loads is left alone, since
        # what it builds is kept and pausing would only defer the collection.
        with gc_paused():
            _adapter(schema).validate_python(raw)
    except ValidationError as err:
        if not problems.collect:
            _raise_first(source, err, raw, mappings)
        errors = err.errors(include_url=False)
        for e in errors:
            problems.add(f"{source}: {_item(e['loc'], raw, mappings)}: {_what(e)}")
        return [e["loc"] for e in errors]
    return []


def validate_kqapro_kb(raw: Any, source: str, problems: Problems | None = None) -> None:
    """Check a parsed KQA Pro ``kb.json`` (either schema) before it is read.

    Structure first (one pydantic pass over the whole dict, in pydantic's compiled core), then
    what the structure cannot say: a relation names its relation (``relation`` or ``predicate``)
    and points at an existing entity or concept; ``instanceOf`` and ``subclassOf`` name
    existing concepts, and every concept has its parents (``subclassOf`` or ``instanceOf``).

    Args:
        raw: The parsed file.
        source: The file, for messages.
        problems: Where to report; default: raise the first. A collecting one gets every
            problem; an entity or concept with a structural problem is not checked further.

    Raises:
        DataError: At the first problem, unless ``problems`` collects, e.g.
            ``kb.json: entities["Q42"].relations[0].object: unknown entity or concept 'Q9'``.
    """
    problems = Problems() if problems is None else problems
    broken = _check(KQAProKB, raw, source, problems, _KB_MAPPINGS)
    if any(len(loc) < 2 for loc in broken):
        return  # the top level itself is broken: nothing below it can be trusted
    concepts, entities = raw["concepts"], raw["entities"]
    if broken:  # collecting: go on with the items whose structure holds
        bad = {loc[:2] for loc in broken}
        raw = {"concepts": {k: v for k, v in concepts.items() if ("concepts", k) not in bad},
               "entities": {k: v for k, v in entities.items() if ("entities", k) not in bad}}

    def fail(item: str, what: str) -> None:
        problems.add(f"{source}: {item}: {what}")

    for cid, con in raw["concepts"].items():
        here = f"concepts[{json.dumps(cid, ensure_ascii=False)}]"
        field = "subclassOf" if "subclassOf" in con else "instanceOf"
        if field not in con:
            fail(here, "missing key 'subclassOf' (or 'instanceOf', the older schema's name)")
            continue
        for k, parent in enumerate(con[field]):
            if parent not in concepts:
                fail(f"{here}.{field}[{k}]", f"unknown concept {parent!r}")
    for eid, ent in raw["entities"].items():
        here = f"entities[{json.dumps(eid, ensure_ascii=False)}]"
        for k, cid in enumerate(ent.get("instanceOf", ())):
            if cid not in concepts:
                fail(f"{here}.instanceOf[{k}]", f"unknown concept {cid!r}")
        for k, rel in enumerate(ent.get("relations", ())):
            if "relation" not in rel and "predicate" not in rel:
                fail(f"{here}.relations[{k}]", "missing key 'relation' (or 'predicate', the older schema's name)")
            if rel["object"] not in entities and rel["object"] not in concepts:
                fail(f"{here}.relations[{k}].object", f"unknown entity or concept {rel['object']!r}")
    _check_strings(source, kqapro_kb_strings(raw), problems)


def validate_kqapro_questions(raw: Any, source: str, problems: Problems | None = None) -> set[int]:
    """Check a parsed KQA Pro ``train.json`` / ``val.json`` / ``test.json``.

    Beyond the structure: every question has a text (``question``, ``rewrite`` or ``origin``),
    and a file has answers (and programs) for all of its questions or for none (the official
    test file), so one missing answer is named rather than taken for a test split. The program
    itself is checked when it is read (``Program.from_json``).

    Args:
        raw: The parsed file.
        source: The file, for messages.
        problems: Where to report; default: raise the first. A collecting one gets every
            problem; a question with a structural problem is not checked further.

    Returns:
        The indices of the questions whose structure is broken (when ``problems`` collects):
        what reads them further must skip them.

    Raises:
        DataError: At the first problem, unless ``problems`` collects, e.g.
            ``val.json: [3]: missing key 'answer' ...``.
    """
    problems = Problems() if problems is None else problems
    broken = _check(list[KQAProQuestion], raw, source, problems)
    if any(not loc for loc in broken):
        return set(range(len(raw))) if isinstance(raw, list) else set()  # the top level is broken
    bad = {loc[0] for loc in broken}
    items = [(i, item) for i, item in enumerate(raw) if i not in bad]
    for i, item in items:
        if not (item.get("question") or item.get("rewrite") or item.get("origin")):
            problems.add(f"{source}: [{i}]: no question text: missing key 'question' (or 'rewrite' / 'origin')")
            continue
        key = next(k for k in ("question", "rewrite", "origin") if item.get(k))
        if problem := question_problem(item[key]):
            problems.add(f"{source}: [{i}].{key}: {problem}")
    # Broken questions stand in as empty ones, so that the strings keep their places ([i]).
    _check_strings(source, kqapro_question_strings([{} if i in bad else item for i, item in enumerate(raw)]),
                   problems)
    for key in ("answer", "program"):
        have = [item.get(key) is not None for _, item in items]
        if any(have) and not all(have):
            for (i, _), present in zip(items, have, strict=True):
                if not present:
                    problems.add(f"{source}: [{i}]: missing key {key!r} (present in {sum(have)} of the "
                                 f"{len(items)} questions; only a test file leaves it out, and then for all of them)")
    return bad


_TOPIC = re.compile(r"\[([^\[\]]+)\]")


def _check_lines(schema: Any, rows: list[dict[str, Any]], linenos: list[int], source: str,
                 problems: Problems) -> set[int]:
    """Validate the parsed lines of a text file; errors read ``<file>: line N: <field>: <what>``.

    Returns:
        The indices (into ``rows``) of the rows with a problem, when ``problems`` collects them.
    """
    try:
        _adapter(list[schema]).validate_python(rows)
    except ValidationError as err:
        bad = set()
        for e in err.errors(include_url=False):
            index, *field = e["loc"]
            # Named by its line in the file, which blank lines make differ from the row index.
            problems.add(f"{source}: line {linenos[index]}: {_item(field, rows[index])}: {_what(e)}")
            bad.add(index)
        return bad
    return set()


def parse_metaqa_kb(text: str, source: str, problems: Problems | None = None) -> list[tuple[str, str, str]]:
    """The triples of a MetaQA ``kb.txt``, checked; blank lines are skipped.

    Fields are stripped of surrounding spaces, as the official loaders do.

    Args:
        text: The file's text.
        source: The file, for messages.
        problems: Where to report; default: raise the first. With a collecting one, the
            triples of the lines without a problem.

    Raises:
        DataError: Naming the line of one that is not ``head|relation|tail`` with a known
            relation and non-empty names, unless ``problems`` collects.
    """
    problems = Problems() if problems is None else problems
    rows, linenos = [], []
    for lineno, line in text_lines(text):
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) != 3:
            problems.add(f"{source}: line {lineno}: expected 'head|relation|tail' (two '|'), got {line!r}")
            continue
        head, relation, tail = (p.strip() for p in parts)
        rows.append({"head": head, "relation": relation, "tail": tail})
        linenos.append(lineno)
    bad = _check_lines(MetaQATriple, rows, linenos, source, problems)
    if bad:
        keep = [i for i in range(len(rows)) if i not in bad]
        rows, linenos = [rows[i] for i in keep], [linenos[i] for i in keep]
    _check_strings(source, ((f"line {n}: {f}", r[f], True) for n, r in zip(linenos, rows) for f in ("head", "tail")),
                   problems)
    if not rows and not problems.found:
        problems.add(f"{source}: no triples (the file is empty)")
    return [(r["head"], r["relation"], r["tail"]) for r in rows]


def parse_metaqa_question_line(line: str) -> dict[str, Any]:
    """Split ``question with [topic]<TAB>a1|a2`` into ``{question, topic, answers}``, unchecked.

    Answers are split on ``|`` only: names with commas (``Girl, Interrupted``) stay whole.

    Raises:
        ValueError: If the line has no tab or not exactly one bracketed topic.
    """
    text, tab, answers = line.rstrip("\r\n").partition("\t")
    if not tab:
        raise ValueError(f"expected 'question<TAB>answers' (no tab), got {line!r}")
    topics = _TOPIC.findall(text)
    if len(topics) != 1:
        raise ValueError(f"expected one [topic entity] in the question, found {len(topics)}: {text!r}")
    return {"question": text, "topic": topics[0], "answers": answers.split("|")}


def parse_metaqa_questions(text: str, source: str, problems: Problems | None = None) -> list[dict[str, Any]]:
    """The lines of a MetaQA question file as ``{question, topic, answers, line}``, checked.

    Args:
        text: The file's text.
        source: The file, for messages.
        problems: Where to report; default: raise the first. With a collecting one, the rows
            of the lines without a problem (``line`` says which line each is).

    Raises:
        DataError: Naming the line of one without a tab, without exactly one ``[topic]``, or
            with an empty answer, unless ``problems`` collects.
    """
    problems = Problems() if problems is None else problems
    rows, linenos = [], []
    for lineno, line in enumerate(text.splitlines(), 1):
        try:
            rows.append(parse_metaqa_question_line(line))
        except ValueError as err:
            problems.add(f"{source}: line {lineno}: {err}")
            continue
        linenos.append(lineno)
    bad = _check_lines(MetaQAQuestion, rows, linenos, source, problems)
    return [{**row, "line": n} for i, (row, n) in enumerate(zip(rows, linenos, strict=True)) if i not in bad]


# ------------------------------------------------------------- your own KB: a triples file

INSTANCE_OF = "instance of"
"""The relation of a triples file whose object is a concept (the subject's ``instanceOf``)."""
SUBCLASS_OF = "subclass of"
"""The relation of a triples file between two concepts (the subject's ``subclassOf``)."""
TRIPLE_FORMS = {"tab": "\t", "pipe": "|"}
"""The two forms of a triples file: ``subject<TAB>relation<TAB>object`` and MetaQA's
``subject|relation|object``; the first triple of a file decides which it is."""

_ISO_DATE = re.compile(r"^(\d{4})-(\d{2})-(\d{2})$")
# A number, then at most one unit word: "6", "-2.5", "3.5 km". A word that starts with a digit,
# a sign or a point is no unit ("5 1"), and more than one word is a name ("2001 A Space Odyssey").
_QUANTITY = re.compile(r"^([+-]?\d+(?:\.\d+)?)(?:\s+([^\s\d+\-.]\S*))?$")


@dataclass(frozen=True)
class Triple:
    """One line of a triples file, checked.

    Attributes:
        line: Its line in the file (1-based).
        subject: The subject's name.
        relation: The relation (or attribute key) as written.
        object: The object as written.
        value: The attribute value the object is (``{type, value[, unit]}``: a date or a quantity
            of the TAB form), None when it names an entity or a concept.
    """

    line: int
    subject: str
    relation: str
    object: str
    value: dict[str, Any] | None = None


def literal_value(text: str) -> dict[str, Any] | None:
    """The attribute value an object of the TAB form is, or None when it names an entity.

    An ISO date (``yyyy-mm-dd``) is a date; a number, optionally followed by one unit word
    (``6``, ``3.5 km``), a quantity (unitless: unit ``"1"``, as KQA Pro writes it).

    Raises:
        ValueError: For a text in the date form that is no calendar date (``2023-02-30``): read as
            an entity's name it would hide the slip.
    """
    m = _ISO_DATE.match(text)
    if m:
        try:
            date(*(int(g) for g in m.groups()))
        except ValueError as err:
            raise ValueError(f"{text!r} has the form of a date (yyyy-mm-dd) but is none ({err})") from None
        return {"type": "date", "value": text}
    m = _QUANTITY.match(text)
    if m:
        number = m.group(1)
        return {"type": "quantity", "value": float(number) if "." in number else int(number),
                "unit": m.group(2) or "1"}
    return None


def _field_count(form: str, parts: list[str], first: int | None) -> str:
    """Why a line of a triples file does not split into three fields."""
    other = "pipe" if form == "tab" else "tab"
    said = {"tab": "TAB", "pipe": "'|'"}
    if len(parts) == 1 and TRIPLE_FORMS[other] in parts[0]:
        return (f"{said[other]}-separated, but this file is {said[form]}-separated (its first triple, line {first}, "
                "is): one form per file")
    if form == "tab":
        return f"expected subject<TAB>relation<TAB>object (2 TABs), got {len(parts) - 1}"
    return (f"expected subject|relation|object (2 '|'), got {len(parts) - 1} (a name holding '|' needs the TAB "
            "form)")


def parse_triples(text: str, source: str, problems: Problems | None = None) -> tuple[str | None, list[Triple]]:
    """The triples of a triples file, checked; blank lines and ``#`` comment lines are skipped.

    The first triple decides the form (``TRIPLE_FORMS``: a TAB in it, else ``|``); fields are
    stripped of surrounding spaces. In the TAB form an object that reads as a date or a quantity
    is one (``literal_value``), except for ``instance of`` and ``subclass of``, whose objects are
    concepts; in the ``|`` form every object is a name, as in MetaQA.

    Besides each line, the file as a whole: a name is a concept (the object of ``instance of``,
    either side of ``subclass of``) or an entity, never both; an attribute key holds one type of
    value (date or quantity) and is no relation between entities as well.

    Args:
        text: The file's text.
        source: The file, for messages.
        problems: Where to report; default: raise the first. With a collecting one, the
            triples of the lines without a problem.

    Returns:
        ``(form, triples)``: ``tab`` or ``pipe`` (None for a file without a triple), and the triples.

    Raises:
        DataError: ``<file>:<line>: <what is wrong>`` at the first problem (a line that is not
            three fields, an empty field, a mix of the two forms ...), unless ``problems`` collects.
    """
    outer = Problems() if problems is None else problems
    # Collected here first when collecting, so that the file-wide checks' problems take their
    # places among the lines' in the report.
    problems = Problems(collect=True) if outer.collect else outer
    form: str | None = None
    first: int | None = None
    rows: list[Triple] = []
    for lineno, line in text_lines(text):
        body = line.strip()
        if not body or body.startswith("#"):
            continue
        where = f"{source}:{lineno}"
        if form is None:
            form = "tab" if "\t" in line else "pipe" if "|" in line else None
            if form is None:
                problems.add(f"{where}: expected subject<TAB>relation<TAB>object or subject|relation|object, "
                             f"got {body[:80]!r}")
                continue
            first = lineno
        parts = line.split(TRIPLE_FORMS[form])
        if len(parts) != 3:
            problems.add(f"{where}: {_field_count(form, parts, first)}")
            continue
        fields = dict(zip(("subject", "relation", "object"), (p.strip() for p in parts), strict=True))
        empty = [name for name, value in fields.items() if not value]
        if empty:
            problems.add(f"{where}: empty {' and '.join(empty)} (a line is subject, relation, object)")
            continue
        bad = [f"{name} {what}" for name, what in string_problems((name, value, True) for name, value in fields.items())]
        if bad:
            problems.add(f"{where}: {'; '.join(bad)}")
            continue
        value = None
        if form == "tab" and fields["relation"] not in (INSTANCE_OF, SUBCLASS_OF):
            try:
                value = literal_value(fields["object"])
            except ValueError as err:
                problems.add(f"{where}: {err}")
                continue
        rows.append(Triple(lineno, fields["subject"], fields["relation"], fields["object"], value))
    rows = _check_roles(rows, source, problems)
    if not rows and not problems.found:
        problems.add(f"{source}: no triples (the file holds no line but blank and comment lines)")
    if problems is not outer:
        for message in in_line_order(problems.found, source):
            outer.add(message)
    return form, rows


def in_line_order(messages: Iterable[str], source: str) -> list[str]:
    """Messages about ``source`` (``<file>:<line>...``) in the order of their lines; a message
    without a line comes first, messages of one line keep their order."""
    def line(message: str) -> int:
        digits = message[len(source) + 1:].partition(":")[0].partition(" ")[0]
        return int(digits) if message.startswith(f"{source}:") and digits.isdigit() else 0

    return sorted(messages, key=line)


def _check_roles(rows: list[Triple], source: str, problems: Problems) -> list[Triple]:
    """The triples whose names keep one role across the file (``parse_triples``), the others reported."""
    concepts: dict[str, int] = {}  # concept name -> the first line that makes it one
    for t in rows:
        if t.relation == INSTANCE_OF:
            concepts.setdefault(t.object, t.line)
        elif t.relation == SUBCLASS_OF:
            concepts.setdefault(t.subject, t.line)
            concepts.setdefault(t.object, t.line)
    keys: dict[str, tuple[str, int]] = {}  # attribute key -> (type, first line)
    relations: dict[str, int] = {}  # relation between entities -> first line
    kept = []
    for t in rows:
        where = f"{source}:{t.line}"
        named = [] if t.relation == SUBCLASS_OF else [t.subject]
        if t.relation not in (INSTANCE_OF, SUBCLASS_OF) and t.value is None:
            named.append(t.object)
        clash = next((n for n in named if n in concepts), None)
        if clash is not None:
            problems.add(f"{where}: {clash!r} is a concept (line {concepts[clash]}) and cannot be an entity too: "
                         "give one of them another name")
            continue
        if t.relation in (INSTANCE_OF, SUBCLASS_OF):
            kept.append(t)
            continue
        if t.value is not None:
            typ = t.value["type"]
            if t.relation in relations:
                problems.add(f"{where}: {t.relation!r} holds a {typ} here but relates two entities on line "
                             f"{relations[t.relation]}: a name is an attribute key or a relation, not both")
                continue
            seen = keys.setdefault(t.relation, (typ, t.line))
            if seen[0] != typ:
                problems.add(f"{where}: {t.relation!r} holds a {typ} here and a {seen[0]} on line {seen[1]}: an "
                             "attribute key holds one type of value")
                continue
        elif t.relation in keys:
            typ, line = keys[t.relation]
            problems.add(f"{where}: {t.relation!r} relates two entities here but holds a {typ} on line {line}: a "
                         "name is an attribute key or a relation, not both")
            continue
        else:
            relations.setdefault(t.relation, t.line)
        kept.append(t)
    return kept


# ----------------------------------------------------------- your own cases: a YAML file

CASE_KEYS = ("question", "program", "answer")
"""The keys of one case in a cases file; ``answer`` may be left out."""

_NULL = "tag:yaml.org,2002:null"


@dataclass(frozen=True)
class CaseEntry:
    """One case of a cases file as written, its structure checked (``parse_cases``).

    Attributes:
        number: Its place in the file (1-based): the case's id is ``case-{number}``.
        line: The file line it starts on.
        question: The question text.
        program: The program text (DAG form).
        program_line: The file line of the program's value.
        program_block: Whether the program is a literal block (``program: |``): its line k is then
            file line ``program_line + k``; else every line of it is reported at ``program_line``.
        answer: The given answer (one value or several), or None when the case gives none.
        answer_line: The file line of the answer (None without one).
    """

    number: int
    line: int
    question: str
    program: str
    program_line: int
    program_block: bool
    answer: tuple[str, ...] | None
    answer_line: int | None

    def file_line(self, program_line: int | None) -> int:
        """The file line of a line of the program text (1-based; None: its first)."""
        if self.program_block and program_line is not None:
            return self.program_line + program_line
        return self.program_line


def _kind_of(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "mapping"
    if isinstance(node, yaml.SequenceNode):
        return "list"
    return "null" if node.tag == _NULL else f"value {node.value[:40]!r}"


def _text(node: yaml.Node) -> str | None:
    """A scalar's text as written (YAML's ``yes``, ``4`` or ``2020-01-01`` stay text); None for a
    null, a list or a mapping."""
    if isinstance(node, yaml.ScalarNode) and node.tag != _NULL:
        return node.value
    return None


def parse_cases(text: str, source: str, problems: Problems | None = None) -> tuple[int, list[CaseEntry]]:
    """The cases of a cases file, their structure checked.

    The file is a YAML list; each case a mapping with ``question`` and ``program`` (text) and
    optionally ``answer`` (one value, or a list of them). Scalars are read as the file writes
    them, never converted: ``answer: yes`` is the text ``yes``, ``answer: 4`` the text ``4``.
    Line numbers come from the YAML nodes, so every message names its line.

    Args:
        text: The file's text.
        source: The file, for messages.
        problems: Where to report; default: raise the first. With a collecting one, the cases
            without a problem.

    Returns:
        ``(cases, entries)``: how many cases the file's list holds, and those whose structure holds.

    Raises:
        DataError: ``<file>:<line> (case N): <what is wrong>`` at the first problem (not YAML, not
            a list of cases, an unknown or missing key, an empty question or answer ...), unless
            ``problems`` collects.
    """
    problems = Problems() if problems is None else problems
    try:
        root = yaml.compose(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        problems.add(f"{source}{line}: not valid YAML ({err.problem or err.context})")
        return 0, []
    if root is None or (isinstance(root, yaml.SequenceNode) and not root.value):
        problems.add(f"{source}: no cases (the file holds none)")
        return 0, []
    if not isinstance(root, yaml.SequenceNode):
        problems.add(f"{source}:{root.start_mark.line + 1}: expected a list of cases ('- question: ...' with "
                     f"program: and answer:), got a {_kind_of(root)}")
        return 0, []
    out = []
    for number, node in enumerate(root.value, 1):
        entry = _case(number, node, source, problems)
        if entry is not None:
            out.append(entry)
    return len(root.value), out


def _case(number: int, node: yaml.Node, source: str, problems: Problems) -> CaseEntry | None:
    """One case of ``parse_cases``; None (reported) when its structure is broken."""
    line = node.start_mark.line + 1

    def fail(at: yaml.Node | int, what: str) -> None:
        problems.add(f"{source}:{at if isinstance(at, int) else at.start_mark.line + 1} (case {number}): {what}")

    if not isinstance(node, yaml.MappingNode):
        fail(line, f"expected a case (question:, program:, answer:), got a {_kind_of(node)}")
        return None
    fields: dict[str, yaml.Node] = {}
    broken = False
    for key_node, value in node.value:
        key = _text(key_node)
        if key not in CASE_KEYS:
            fail(key_node, f"unknown key {key!r}{did_you_mean(key, CASE_KEYS)}; a case has "
                           f"{', '.join(CASE_KEYS[:-1])} and optionally {CASE_KEYS[-1]}")
            broken = True
        elif key in fields:
            fail(key_node, f"key {key!r} given twice (first on line {fields[key].start_mark.line + 1})")
            broken = True
        else:
            fields[key] = value
    texts = {}
    for key in ("question", "program"):
        if key not in fields:
            fail(line, f"missing key {key!r}")
            broken = True
            continue
        value = _text(fields[key])
        if value is None or not value.strip():
            fail(fields[key], f"{key} must be text, got {'an empty one' if value is not None else 'a ' + _kind_of(fields[key])}")
            broken = True
            continue
        texts[key] = value
    if "question" in texts and (problem := question_problem(texts["question"].strip())):
        fail(fields["question"], f"the question {problem}")
        broken = True
    answer, answer_line = None, None
    if "answer" in fields and fields["answer"].tag != _NULL:
        node_a = fields["answer"]
        answer_line = node_a.start_mark.line + 1
        items = node_a.value if isinstance(node_a, yaml.SequenceNode) else [node_a]
        values = [_text(item) for item in items]
        if not items or any(v is None or not v.strip() for v in values):
            fail(node_a, "answer must be a value or a list of values, none of them empty (leave the key out to "
                         "give no answer)")
            broken = True
        else:
            answer = tuple(v.strip() for v in values)
    if broken:
        return None
    program = fields["program"]
    return CaseEntry(number, line, texts["question"].strip(), texts["program"], program.start_mark.line + 1,
                     getattr(program, "style", None) == "|", answer, answer_line)
