"""The error of a program that parses and type-checks but cannot be executed.

Its own module because both engines raise it: the project's (``engine.py``) and the wrapper of
the reference one (``executor.py``, which re-exports it).
"""

from __future__ import annotations

from typing import Any


class ExecutionError(RuntimeError):
    """A program that could not be executed; ``code`` says why (e.g. ``unknown_entity``).

    Attributes:
        code: Why, in a short stable identifier.
        step: The 1-based step that failed, when known (the executor sets it for the step it was
            running: where the failure is, which the message of an engine exception does not say).
    """

    def __init__(self, code: str, message: str, step: int | None = None):
        self.code = code
        self.step = step
        super().__init__(f"execution error [{code}]: {message}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description (used in ``predictions.jsonl``); ``step`` when known."""
        out: dict[str, Any] = {"kind": "execution", "code": self.code, "message": str(self)}
        if self.step is not None:
            out["step"] = self.step
        return out
