"""Which program arguments name something the KB has: the vocabulary of each argument slot.

The function table gives every textual argument a kind; the kinds below name KB items, and
``slot_items`` says which items each one may be. Constrained decoding (the grammar's closed
lists), canonicalisation (what an argument is snapped to) and the error analysis ("outside
the schema") all read this one mapping.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from cbr2.kb.model import Vocabulary
from cbr2.kopl.functions import get_spec
from cbr2.kopl.program import Program

SLOT_KINDS = ("entity", "concept", "key", "qkey", "relation")
"""Argument kinds whose value must be an item of the KB (``entity``: ``Find`` also takes concept
names, as the engine does)."""


def slot_items(vocab: Vocabulary, kind: str) -> Collection[str]:
    """The valid values of an argument of ``kind`` (one of ``SLOT_KINDS``).

    Raises:
        KeyError: For a kind that does not name KB items.
    """
    table = {"entity": vocab.names, "concept": vocab.concepts, "key": vocab.keys,
             "qkey": vocab.qualifier_keys, "relation": vocab.relations}
    return table[kind]


def unknown_arguments(program: Program, vocab: Vocabulary) -> list[dict[str, Any]]:
    """The arguments of ``program`` that name no KB item of their slot, in program order.

    Returns:
        One ``{"step", "function", "arg", "kind", "value"}`` dict per such argument (``step``
        is 0-based).
    """
    found = []
    for i, step in enumerate(program.steps):
        spec = get_spec(step.function)
        for arg, value in zip(spec.args, step.inputs):
            if arg.kind in SLOT_KINDS and value not in slot_items(vocab, arg.kind):
                found.append({"step": i, "function": step.function, "arg": arg.name, "kind": arg.kind,
                              "value": value})
    return found
