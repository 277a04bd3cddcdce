"""KB values and program literals of the project's KoPL engine (``cbr2.kopl.engine``).

A value is a tuple ``(type, value, unit)``: ``("quantity", 155.0, "centimetre")``, ``("year", 1903,
None)``, ``("date", date(1867, 11, 7), None)``, ``("string", "female", None)``. Literals are parsed
as the reference engine (PyPI ``kopl``) parses them, including the errors it raises (a
``ValueError`` of a bad number or date keeps that exception's name as the error code), and
``matcher`` compares as ``kopl.util.comp`` does, case by case (the engine's docstring lists them).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from datetime import date
from typing import Any

from cbr2.kb.model import format_number
from cbr2.kopl.errors import ExecutionError

STRING, QUANTITY, YEAR, DATE = "string", "quantity", "year", "date"
Value = tuple[str, Any, "str | None"]
"""``(type, value, unit)``; ``unit`` is None except for quantities."""

_NEGATIVE_DATE = re.compile(r"^-(\d+)[-/]\d+[-/]\d+$")
_OPS: dict[str, Callable[[Any, Any], bool]] = {"=": operator.eq, "!=": operator.ne, "<": operator.lt, ">": operator.gt}


def _parse_time(text: str) -> Value:
    # The reference engine's rule: a '/' or a '-' not in front makes a date, else a year.
    if "/" in text or ("-" in text and text[0] != "-"):
        sep = "/" if "/" in text else "-"
        p1, p2 = text.find(sep), text.rfind(sep)
        return (DATE, date(int(text[:p1]), int(text[p1 + 1:p2]), int(text[p2 + 1:])), None)
    return (YEAR, int(text), None)


def parse_literal(text: str, typ: str) -> Value:
    """A program's literal as the reference engine reads it (``_parse_key_value``).

    Args:
        text: The literal (``"155 centimetre"``, ``"1998-07-16"``, ``"1998"``, ``"female"``).
        typ: ``string``, ``quantity``, or anything else for a time (year or date by form).

    Raises:
        ValueError, IndexError: Where the reference engine raises them (``float("abc")``,
            a month 13, a quantity of spaces only).
    """
    if typ == STRING:
        return (STRING, text, None)
    if typ == QUANTITY:
        if " " in text:
            parts = text.split()
            number, unit = parts[0], " ".join(parts[1:])
        else:
            number, unit = text, "1"
        return (QUANTITY, float(number), unit)
    return _parse_time(text)


def kb_value(raw: dict[str, Any]) -> Value:
    """A value of the KB file (``{"type", "value", "unit"}``) as a ``Value``; a date before year 1 is its year.

    Raises:
        ValueError: A time that is neither a date nor a year.
    """
    typ = raw["type"]
    if typ == STRING:
        return (STRING, raw["value"], None)
    if typ == QUANTITY:
        return (QUANTITY, float(raw["value"]), raw.get("unit", "1"))
    text = str(raw["value"])
    try:
        return _parse_time(text)
    except ValueError:
        m = _NEGATIVE_DATE.match(text)
        if m:
            return (YEAR, -int(m.group(1)), None)
        raise ValueError(f"{text!r} is neither a date (yyyy-mm-dd, yyyy/mm/dd) nor a year") from None


def format_value(value: Value) -> str:
    """The answer text of a value, as ``executor.format_engine_value`` writes the reference's."""
    typ, x, unit = value
    if typ == QUANTITY:
        number = format_number(x)
        return number if unit == "1" else f"{number} {unit}"
    if typ == DATE:
        return x.isoformat()
    return str(x)


def matcher(target: Value, op: str) -> Callable[[Value], bool]:
    """``lambda v: v.can_compare(target) and comp(v, target, op)`` of the reference engine.

    ``v`` is a KB value, ``target`` the program's literal. Strings compare with ``=`` and
    ``!=`` only (the reference raises on ``<`` between strings, so does this, lazily, when it
    meets one); an unknown ``op`` raises ``TypeError``-coded errors where the reference does.
    """
    typ, x, unit = target
    cmp = _OPS.get(op)
    if cmp is None:
        def unknown(v: Value) -> bool:
            if _comparable(v, target):
                raise ExecutionError("TypeError", f"unsupported comparison operator {op!r}")
            return False
        return unknown
    if typ == STRING:
        if op in ("<", ">"):
            def strings(v: Value) -> bool:
                if v[0] == STRING:
                    raise ExecutionError("Exception", f"cannot compare strings with {op!r}")
                return False
            return strings
        return lambda v: v[0] == STRING and cmp(v[1], x)
    if typ == QUANTITY:
        return lambda v: v[0] == QUANTITY and v[2] == unit and cmp(v[1], x)
    if typ == YEAR:
        # '=' is "lies in the year": a date by its year; '<' and '>' compare years too.
        return lambda v: (v[0] == YEAR and cmp(v[1], x)) or (v[0] == DATE and cmp(v[1].year, x))
    # A date target: a year never lies in a date ('=' false, '!=' true), '<'/'>' by years.
    if op == "=":
        return lambda v: v[0] == DATE and v[1] == x
    if op == "!=":
        return lambda v: v[0] == YEAR or (v[0] == DATE and v[1] != x)
    year = x.year
    return lambda v: (v[0] == DATE and cmp(v[1], x)) or (v[0] == YEAR and cmp(v[1], year))


def _comparable(v: Value, target: Value) -> bool:
    if v[0] == STRING:
        return target[0] == STRING
    if v[0] == QUANTITY:
        return target[0] == QUANTITY and target[2] == v[2]
    return target[0] in (YEAR, DATE)
