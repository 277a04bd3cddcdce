"""Names, values and questions as the data has them: what the program text and the prompt can carry.

Every KB name, value and gold-program argument reaches the model and the scorer as program
text (``cbr2.kopl.text``), which escapes every character that would break it (delimiters,
control characters, line breaks, whitespace at the ends, an opening quote), so nothing is
altered on the way. What no escape can carry is rejected here, at load, by
``cbr2.data.schema``'s checks, with a message ``<file>: <item>: <what>``:

* a value or program argument the text cannot write (``text.unwritable``: longer than a
  program argument may be, or a lone surrogate, which is no Unicode text), and an empty name
  (entity, concept, attribute or qualifier key, relation): ``Find[]`` reads as no argument;
* a question text holding a line break or a lone surrogate: the prompt gives each question
  one line (``Question: ...``), so a line break would let a question write its own prompt lines.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from typing import Any

from cbr2.kopl.text import MAX_ARG_CHARS, unwritable

_LINE_BREAK = re.compile(r"[\n\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029]|[\ud800-\udfff]")
"""What ``str.splitlines`` breaks on, and lone surrogates."""


def name_problem(value: str, is_name: bool) -> str | None:
    """Why a KB string cannot be carried, or None. Names must also be non-empty; values may be empty."""
    if not value and not is_name:
        return None
    return unwritable(value)


def question_problem(text: str) -> str | None:
    """Why a question text cannot be one line of a prompt, or None."""
    bad = _LINE_BREAK.search(text)
    if bad is None:
        return None
    what = "a lone surrogate" if "\ud800" <= bad.group() <= "\udfff" else "a line break"
    return f"holds {what} (U+{ord(bad.group()):04X}) at character {bad.start()}; a question is one line of the prompt"


def _key(key: str) -> str:
    return f"[{json.dumps(key, ensure_ascii=False)}]"


def _value(here: str, value: dict[str, Any]) -> Iterable[tuple[str, str, bool]]:
    if isinstance(value.get("value"), str):
        yield f"{here}.value", value["value"], False
    if isinstance(value.get("unit"), str):
        yield f"{here}.unit", value["unit"], False


def _qualifiers(here: str, qualifiers: dict[str, list[dict[str, Any]]]) -> Iterable[tuple[str, str, bool]]:
    for qkey, values in qualifiers.items():
        yield f"{here}.qualifiers", qkey, True
        for k, value in enumerate(values):
            yield from _value(f"{here}.qualifiers{_key(qkey)}[{k}]", value)


def kqapro_question_strings(raw: list[dict[str, Any]]) -> Iterable[tuple[str, str, bool]]:
    """The gold-program arguments of a (structurally valid) KQA Pro question file."""
    for i, item in enumerate(raw):
        for j, step in enumerate(item.get("program") or ()):
            for k, arg in enumerate(step["inputs"]):
                yield f"[{i}].program[{j}].inputs[{k}]", arg, False


def kqapro_kb_strings(raw: dict[str, Any]) -> Iterable[tuple[str, str, bool]]:
    """Every name and value of a (structurally valid) KQA Pro ``kb.json``: ``(item, text, is_name)``."""
    for cid, con in raw["concepts"].items():
        yield f"concepts{_key(cid)}.name", con["name"], True
    for eid, ent in raw["entities"].items():
        here = f"entities{_key(eid)}"
        yield f"{here}.name", ent["name"], True
        for k, att in enumerate(ent.get("attributes", ())):
            yield f"{here}.attributes[{k}].key", att["key"], True
            yield from _value(f"{here}.attributes[{k}].value", att["value"])
            yield from _qualifiers(f"{here}.attributes[{k}]", att.get("qualifiers", {}))
        for k, rel in enumerate(ent.get("relations", ())):
            field = "relation" if "relation" in rel else "predicate"
            if field in rel:  # a relation without a name is a problem of its own (cbr2.data.schema)
                yield f"{here}.relations[{k}].{field}", rel[field], True
            yield from _qualifiers(f"{here}.relations[{k}]", rel.get("qualifiers", {}))


def string_problems(strings: Iterable[tuple[str, str, bool]]) -> Iterator[tuple[str, str]]:
    """``(item, what)`` of each string of ``strings`` that cannot be carried, in order."""
    for item, text, is_name in strings:
        if text and text.isascii() and len(text) <= MAX_ARG_CHARS:
            continue  # the bulk of any KB: fine, and checked without a regex
        problem = name_problem(text, is_name)
        if problem:
            yield item, f"{text[:40]!r}{'...' if len(text) > 40 else ''} {problem}"
