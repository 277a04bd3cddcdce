"""What a schema field accepts beyond its type: ``bounded(default, low, high)`` declares a
number's range on the field itself, and ``ranges`` reads them back for the loader's check and the
reference page.

Kept apart from ``cbr2.config.schema`` so that the schema module holds the dataclasses only (the
reference page parses its source for their attribute docstrings).
"""

from __future__ import annotations

import functools
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any


@dataclass(frozen=True)
class Range:
    """Numbers a key accepts (null is for the schema's type to allow: it then means the default)."""

    low: float | None = None
    high: float | None = None
    open_low: bool = False
    """The bound ``low`` itself is excluded."""
    open_high: bool = False
    why: str = ""
    """Added to the message (what the rejected values would do, or what null means)."""

    def accepts(self, value: float) -> bool:
        if self.low is not None and (value < self.low or (self.open_low and value == self.low)):
            return False
        return self.high is None or not (value > self.high or (self.open_high and value == self.high))

    def __str__(self) -> str:
        if self.high is None:
            text = f"{'greater than' if self.open_low else 'at least'} {self.low}"
        else:
            text = f"in {'(' if self.open_low else '['}{self.low}, {self.high}{')' if self.open_high else ']'}"
        return text + (f" ({self.why})" if self.why else "")


def bounded(default: Any, low: float | None = None, high: float | None = None, *, open_low: bool = False,
            open_high: bool = False, why: str = "") -> Any:
    """A schema field with its default and the numbers it accepts (``Range``; null, where the
    field's type allows it, is not checked: it means the documented fallback).

    Args:
        default: The field's default.
        low: The least value (None: no lower bound).
        high: The largest value (None: no upper bound).
        open_low: ``low`` itself is excluded.
        open_high: ``high`` itself is excluded.
        why: Added to the message of a rejected value.
    """
    return field(default=default, metadata={"range": Range(low, high, open_low, open_high, why)})


@functools.cache
def ranges(schema: type, prefix: str = "") -> dict[str, Range]:
    """Every key of ``schema`` declared with ``bounded``, and the numbers it accepts."""
    out: dict[str, Range] = {}
    hints = typing.get_type_hints(schema)
    for f in fields(schema):
        if is_dataclass(hints[f.name]):
            out.update(ranges(hints[f.name], f"{prefix}{f.name}."))
        elif "range" in f.metadata:
            out[f"{prefix}{f.name}"] = f.metadata["range"]
    return out
