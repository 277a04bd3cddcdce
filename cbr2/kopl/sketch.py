"""Function sketches: the shape of a program without its arguments."""

from __future__ import annotations

from cbr2.kopl.functions import canonical_name
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
