"""The KoPL program model and its official JSON form.

A program is a list of steps; each step names a function, its textual inputs and the indices
of the earlier steps it consumes. That is exactly KQA Pro's ``program`` field
(``function`` / ``inputs`` / ``dependencies``), so conversion to and from JSON is lossless.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cbr2.kopl.functions import canonical_name, get_spec

SYNTAX = "syntax"
TYPE = "type"


class ProgramError(ValueError):
    """A program text or JSON that is not a valid KoPL program.

    Attributes:
        kind: ``syntax`` (cannot be parsed into a program: unparsable text, unknown
            function, wrong arity, undefined or cyclic reference) or ``type`` (parsed, but
            violates KoPL's typing rules).
        code: A short stable identifier of the rule that failed (e.g. ``unknown_function``).
        line: 1-based line of the text where the error was found, when known.
        detail: The message alone, without kind, code and line: what a data file's error
            quotes after the item (``val.json: [3].program[0]: unknown function 'Fnd'``).
        step: 1-based step a type error is about, when known (the checker's; the message names it too).
    """

    def __init__(self, kind: str, code: str, message: str, line: int | None = None, step: int | None = None):
        self.kind, self.code, self.line, self.detail, self.step = kind, code, line, message, step
        where = f"line {line}: " if line is not None else ""
        super().__init__(f"{kind} error [{code}]: {where}{message}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description (used in ``predictions.jsonl``); ``step`` when known."""
        out: dict[str, Any] = {"kind": self.kind, "code": self.code, "line": self.line, "message": str(self)}
        if self.step is not None:
            out["step"] = self.step
        return out


@dataclass(frozen=True)
class Step:
    """One function application.

    Attributes:
        function: Function name as written (``What`` is kept, so round trips are exact).
        inputs: Textual arguments.
        dependencies: Indices of the steps whose results this step consumes, in order.
    """

    function: str
    inputs: tuple[str, ...] = ()
    dependencies: tuple[int, ...] = ()


@dataclass(frozen=True)
class Program:
    """A KoPL program: steps in execution order; the last step's result is the answer."""

    steps: tuple[Step, ...]

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def functions(self) -> list[str]:
        """Function names as written."""
        return [s.function for s in self.steps]

    def to_json(self) -> list[dict[str, Any]]:
        """The official KQA Pro form: ``[{function, dependencies, inputs}, ...]``."""
        return [
            {"function": s.function, "dependencies": list(s.dependencies), "inputs": list(s.inputs)}
            for s in self.steps
        ]

    @classmethod
    def from_json(cls, data: Any, where: str = "program") -> Program:
        """Build a program from the official JSON form, validating its structure.

        Args:
            data: A list of ``{function, dependencies, inputs}`` dicts.
            where: Names the origin (file and question) in error messages.

        Raises:
            ProgramError: (kind ``syntax``) on a malformed step, an unknown function, a wrong
                number of dependencies or inputs, or a dependency that is not an earlier step.
        """
        if not isinstance(data, list) or not data:
            raise ProgramError(SYNTAX, "empty_program", f"{where}: expected a non-empty list of steps")
        steps = []
        for i, raw in enumerate(data):
            at = f"{where}[{i}]"
            if not isinstance(raw, dict) or not {"function", "inputs"} <= raw.keys():
                raise ProgramError(SYNTAX, "malformed_step", f"{at}: expected keys function, inputs, dependencies")
            fn, inputs, deps = raw["function"], raw["inputs"], raw.get("dependencies", [])
            spec = get_spec(fn)
            if spec is None:
                raise ProgramError(SYNTAX, "unknown_function", f"{at}: unknown function {fn!r}")
            if not isinstance(inputs, list) or not all(isinstance(x, str) for x in inputs):
                raise ProgramError(SYNTAX, "malformed_step", f"{at}: inputs must be a list of strings")
            if len(inputs) != len(spec.args):
                raise ProgramError(
                    SYNTAX, "wrong_argument_count",
                    f"{at}: {fn} takes {len(spec.args)} arguments, got {len(inputs)}")
            if len(deps) != spec.arity:
                raise ProgramError(
                    SYNTAX, "wrong_arity", f"{at}: {fn} takes {spec.arity} inputs, got {len(deps)}")
            for d in deps:
                if not isinstance(d, int) or not 0 <= d < i:
                    raise ProgramError(SYNTAX, "cyclic_reference", f"{at}: dependency {d!r} is not an earlier step")
            steps.append(Step(fn, tuple(inputs), tuple(deps)))
        return cls(tuple(steps))

    def consumers(self) -> list[list[int]]:
        """For each step, the indices of the steps that consume its result."""
        out: list[list[int]] = [[] for _ in self.steps]
        for i, s in enumerate(self.steps):
            for d in s.dependencies:
                out[d].append(i)
        return out

    def branch_stack_dependencies(self) -> list[tuple[int, ...]] | None:
        """Dependencies implied by KoPL's post-order convention, or None if ill-formed.

        The reference engine ignores ``dependencies`` and rebuilds them this way: ``Find`` and
        ``FindAll`` open a branch, two-input functions join the last two branches, every other
        step consumes the previous step. The flat ``chain`` text relies on the same rule.
        """
        deps: list[tuple[int, ...]] = []
        open_branches: list[int] = []  # index of the last step of each open branch
        for i, s in enumerate(self.steps):
            spec = get_spec(s.function)
            if spec is None:
                return None
            if spec.arity == 0:
                deps.append(())
                open_branches.append(i)
            elif spec.arity == 1:
                if not open_branches:
                    return None
                deps.append((open_branches[-1],))
                open_branches[-1] = i
            else:
                if len(open_branches) < 2:
                    return None
                deps.append((open_branches[-2], open_branches[-1]))
                open_branches[-2:] = [i]
        return deps

    def is_postorder(self) -> bool:
        """Whether the recorded dependencies are those of the post-order convention."""
        return self.branch_stack_dependencies() == [s.dependencies for s in self.steps]

    def final_function(self) -> str:
        """Canonical name of the last step's function (``What`` resolves to QueryName)."""
        return canonical_name(self.steps[-1].function)
