"""The error of a program that parses and type-checks but cannot be executed.

Its own module because both engines raise it: the project's (``engine.py``) and the wrapper of
the reference one (``executor.py``, which re-exports it).
"""

from __future__ import annotations

from typing import Any


class ExecutionError(RuntimeError):
    """A program that could not be executed; ``code`` says why (e.g. ``unknown_entity``)."""

    def __init__(self, code: str, message: str):
        self.code = code
        super().__init__(f"execution error [{code}]: {message}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description (used in ``predictions.jsonl``)."""
        return {"kind": "execution", "code": self.code, "message": str(self)}
