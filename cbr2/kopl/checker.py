"""Type checking of KoPL programs, and the one entry point from any string to a checked program.

Syntax errors come from the parsers (``cbr2.kopl.text``); this module adds KoPL's typing
rules, read from the function table: the type each functional input accepts, closed argument
vocabularies (ops, directions), literal formats of quantities, years and dates, and that the
program ends with a query.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date

from cbr2.kopl.functions import ANSWER_TYPES, CLOSED_KINDS, accepts, get_spec
from cbr2.kopl.program import TYPE, Program, ProgramError
from cbr2.kopl.text import parse_text

_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
_YEAR = re.compile(r"^-?\d{1,4}$")
_DATE = re.compile(r"^(-?\d{1,4})[-/](\d{1,2})[-/](\d{1,2})$")


def is_quantity_literal(value: str) -> bool:
    """``"206"`` or ``"206 centimetre"``: a number, optionally followed by a unit."""
    number, _, _unit = value.strip().partition(" ")
    return bool(_NUMBER.match(number))


def is_year_literal(value: str) -> bool:
    """A year such as ``"1998"``."""
    return bool(_YEAR.match(value.strip()))


def is_date_literal(value: str) -> bool:
    """A calendar date ``yyyy-mm-dd`` / ``yyyy/mm/dd``, or a year (the engine accepts both)."""
    value = value.strip()
    if is_year_literal(value):
        return True
    m = _DATE.match(value)
    if not m:
        return False
    try:
        date(*(int(g) for g in m.groups()))
    except ValueError:
        return False
    return True


_LITERAL_CHECKS = {"quantity": is_quantity_literal, "year": is_year_literal, "date": is_date_literal}


def check_types(program: Program) -> None:
    """Check a parsed program against KoPL's typing rules.

    Raises:
        ProgramError: kind ``type``, with the step (1-based) in the message and in ``step``.
    """
    produced: list[str] = []
    for i, step in enumerate(program.steps):
        spec = get_spec(step.function)
        at = f"step {i + 1} ({step.function})"
        for want, dep in zip(spec.inputs, step.dependencies):
            got = produced[dep]
            if accepts(want, got):
                continue
            if want == "facts":
                code, why = "qfilter_needs_facts", "must follow a step that yields facts (Filter*, QFilter*, Relate)"
            elif want == "values":
                code, why = "verify_needs_values", "must follow QueryAttr or QueryAttrUnderCondition"
            else:
                code, why = "input_type", f"needs {want}"
            raise ProgramError(TYPE, code, f"{at} {why}, but its input is {got}", step=i + 1)
        for arg, value in zip(spec.args, step.inputs):
            if arg.kind in CLOSED_KINDS and value not in CLOSED_KINDS[arg.kind]:
                raise ProgramError(
                    TYPE, f"invalid_{arg.kind}",
                    f"{at}: {arg.name} must be one of {', '.join(CLOSED_KINDS[arg.kind])}, got {value!r}", step=i + 1)
            if arg.kind in _LITERAL_CHECKS and not _LITERAL_CHECKS[arg.kind](value):
                raise ProgramError(TYPE, "bad_literal", f"{at}: {arg.name} {value!r} is not a {arg.kind}",
                                   step=i + 1)
        produced.append(spec.output)
    if produced[-1] not in ANSWER_TYPES:
        raise ProgramError(TYPE, "no_answer", f"the program ends with {produced[-1]}, not with a query",
                           step=len(produced))


@dataclass(frozen=True)
class CheckResult:
    """Outcome of ``check_text``: exactly one of ``program`` and ``error`` is set."""

    program: Program | None
    error: ProgramError | None

    @property
    def ok(self) -> bool:
        """Whether the text is a well-typed program."""
        return self.error is None


def check_text(text: str, fmt: str = "dag") -> CheckResult:
    """Turn any string into either a checked program or a classified error.

    Args:
        text: Program text (``dag`` or ``chain`` form); generated text goes through here,
            it is parsed, never evaluated.
        fmt: ``dag`` or ``chain``.
    """
    try:
        program = parse_text(text, fmt)
        check_types(program)
    except ProgramError as err:
        return CheckResult(None, err)
    return CheckResult(program, None)


def check_program(program: Program) -> CheckResult:
    """Type-check an already built program (e.g. from JSON)."""
    try:
        check_types(program)
    except ProgramError as err:
        return CheckResult(None, err)
    return CheckResult(program, None)


__all__ = ["TYPE", "CheckResult", "check_program", "check_text", "check_types"]
