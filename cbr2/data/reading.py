"""Reading an input data file: UTF-8 text, JSON, lines; what fails is a ``DataError`` naming the
file and the place (``cbr2.data.schema`` validates what is read).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from cbr2.common.errors import UserError

T = TypeVar("T")


class DataError(UserError):
    """A data file that does not follow its official format.

    The message is ``<file>: <item>: <what is wrong>``; the item is a path into the file
    (``entities["Q42"].attributes[3]``, ``[17].answer``) or a line (``line 12``).
    """


class Problems:
    """Where a validator reports what is wrong with a file.

    The loaders stop at the first problem (``collect=False``, the default: ``add`` raises it as
    a ``DataError``); ``python -m cbr2.data check`` lists them all (``collect=True``: ``add``
    keeps it in ``found`` and the validator goes on). The rules themselves are written once,
    in the validators, whichever way they report.

    Attributes:
        collect: Keep going after a problem instead of raising it.
        found: Every message added, in order (``<file>: <item>: <what is wrong>``).
    """

    def __init__(self, collect: bool = False):
        self.collect = collect
        self.found: list[str] = []

    def add(self, message: str) -> None:
        """Report one problem: raise it, or keep it when collecting.

        Raises:
            DataError: With ``message``, unless collecting.
        """
        if not self.collect:
            raise DataError(message)
        self.found.append(message)

    def guard(self, read: Callable[[], T]) -> T | None:
        """``read()``, or None after reporting the ``DataError`` it raised (a file that cannot be read at all)."""
        try:
            return read()
        except DataError as err:
            self.add(str(err))
            return None


def read_text(path: str | Path) -> str:
    """The text of a UTF-8 file.

    Raises:
        DataError: If the file does not exist, or is not UTF-8 (naming the line and byte offset
            of the first bad byte).
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError as err:
        raise DataError(f"{path}: file not found") from err
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise DataError(f"{path}: line {line}, byte {err.start}: not UTF-8 text "
                        f"({err.reason} 0x{data[err.start]:02x})") from err


def read_json(path: str | Path) -> Any:
    """Parse a UTF-8 JSON file.

    Raises:
        DataError: As ``read_text``, or naming line and column where the text stops being JSON.
    """
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(f"{path}: line {err.lineno}, column {err.colno}: not valid JSON ({err.msg})") from err


def text_lines(text: str) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` pairs without line endings; ``\\n``, ``\\r\\n`` and ``\\r`` all end a line.

    These are exactly the lines a text-mode file object yields, so a file reads as it did
    before validation existed (``str.splitlines`` would also split on form feeds and U+2028).
    """
    for lineno, line in enumerate(io.StringIO(text, newline=None), 1):
        yield lineno, line.rstrip("\n")
