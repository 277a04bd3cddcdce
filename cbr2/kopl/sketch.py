"""Function sketches: the shape of a program without its arguments."""

from __future__ import annotations

from cbr2.kopl.functions import canonical_name, get_spec
from cbr2.kopl.program import Program


def sketch(program: Program) -> tuple[str, ...]:
    """The program's function names in execution order, aliases resolved.

    ``What`` and ``QueryName`` are one function, so they give one sketch; the structural
    retriever learns to predict how alike two questions' sketches are.
    """
    return tuple(canonical_name(f) for f in program.functions)


def sketch_text(program: Program) -> str:
    """The sketch as one readable string, e.g. ``Find → Relate → QueryName``."""
    return " → ".join(sketch(program))


SCHEMA_KINDS = ("concept", "key", "qkey", "relation")
"""Argument kinds that name an item of the KB's schema (knowledge recall counts these)."""


def schema_items(program: Program) -> set[tuple[str, str]]:
    """The schema items a program uses, as ``(kind, name)`` with kind in ``SCHEMA_KINDS``.

    Read from the function table's argument kinds, so a new function is covered without
    touching this code.
    """
    items = set()
    for step in program.steps:
        spec = get_spec(step.function)
        for arg, value in zip(spec.args, step.inputs):
            if arg.kind in SCHEMA_KINDS:
                items.add((arg.kind, value))
    return items
