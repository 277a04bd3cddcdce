"""Program text: the paper's structure-aware DAG form and the flat ``chain`` form.

DAG form, one line per branch::

    r1: Find[Richard Widmark]
    r2: Find[Academy Award for Best Supporting Actor]
    r3: (r1, r2) → QueryRelationQualifier[nominated for | point in time]

A line starts with a start function (``Find[...]``, ``FindAll[]``), a reference (``rK``) or
a tuple of references for a two-input function, followed by ``→``-chained one-input steps.
Arguments are separated by `` | ``; ``\\``, ``|``, ``[`` and ``]`` inside an argument are
escaped with a backslash, so every string survives a round trip.

Chain form: one step per line in execution order (``Find[X]`` then ``Relate[...]``); the data
flow is KoPL's post-order convention (see ``Program.branch_stack_dependencies``).
"""

from __future__ import annotations

import re

from cbr2.kopl.functions import get_spec
from cbr2.kopl.program import SYNTAX, TYPE, Program, ProgramError, Step

ARROW = "→"
FORMATS = ("dag", "chain")

_ESCAPED = re.compile(r"([\\|\[\]])")
_CALL = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\[(.*)\]$", re.DOTALL)
_REF = re.compile(r"^r(\d+)$")
_TUPLE = re.compile(r"^\(\s*r(\d+)\s*,\s*r(\d+)\s*\)$")
_LABEL = re.compile(r"^\s*r(\d+)\s*:\s*(.*)$")


def escape_arg(value: str) -> str:
    """Backslash-escape the characters that delimit arguments."""
    return _ESCAPED.sub(r"\\\1", value)


def format_call(step: Step) -> str:
    """``Function[arg1 | arg2]`` with escaped arguments."""
    return f"{step.function}[{' | '.join(escape_arg(a) for a in step.inputs)}]"


# ---------------------------------------------------------------- formatting

def to_dag_text(program: Program) -> str:
    """Render a program in the DAG text form.

    A one-input step continues the line of its input when it is that input's only consumer;
    everything else (starts, two-input joins, results used twice) opens a new line.
    """
    consumers = program.consumers()
    line_of: dict[int, int] = {}  # step index -> line number (1-based)
    lines: list[list[str]] = []
    for i, step in enumerate(program.steps):
        deps = step.dependencies
        if len(deps) == 1 and consumers[deps[0]] == [i] and _ends_line(lines, line_of, deps[0]):
            line_of[i] = line_of[deps[0]]
            lines[line_of[i] - 1].append(format_call(step))
            continue
        lines.append([])
        line_of[i] = len(lines)
        refs = [f"r{line_of[d]}" for d in deps]
        if len(refs) == 1:
            lines[-1].append(refs[0])
        elif refs:
            lines[-1].append(f"({', '.join(refs)})")
        lines[-1].append(format_call(step))
    return "\n".join(f"r{n}: " + f" {ARROW} ".join(parts) for n, parts in enumerate(lines, 1))


def _ends_line(lines: list[list[str]], line_of: dict[int, int], step: int) -> bool:
    """Whether ``step`` is the last step placed so far on its line."""
    latest = max(i for i, n in line_of.items() if n == line_of[step])
    return latest == step


def to_chain_text(program: Program) -> str:
    """Render a program as one step per line (the ``chain`` ablation).

    Raises:
        ValueError: If the program's data flow is not KoPL's post-order convention, which
            the flat form cannot express.
    """
    if not program.is_postorder():
        raise ValueError("chain text needs a program in post-order (KoPL's branch-stack convention)")
    return "\n".join(format_call(s) for s in program.steps)


def to_text(program: Program, fmt: str = "dag") -> str:
    """Render in ``dag`` or ``chain`` form."""
    return _by_format({"dag": to_dag_text, "chain": to_chain_text}, fmt)(program)


def _by_format(table: dict, fmt: str):
    if fmt not in table:
        raise ValueError(f"unknown program format {fmt!r}; expected one of {FORMATS}")
    return table[fmt]


# ------------------------------------------------------------------ parsing

def tokens(text: str) -> list[str]:
    """Characters of ``text``, with each backslash escape (``\\|``) kept as one token."""
    return re.findall(r"\\.|.", text, re.DOTALL)


def split_top(text: str, sep: str) -> list[str]:
    """Split on ``sep`` (a single character) outside brackets, honouring backslash escapes."""
    parts, buf, depth = [], [], 0
    for tok in tokens(text):
        if tok == sep and depth == 0:
            parts.append("".join(buf))
            buf = []
            continue
        depth += tok == "["
        depth -= tok == "]" and depth > 0
        buf.append(tok)
    parts.append("".join(buf))
    return parts


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", r"\1", value)


def parse_call(segment: str, line: int) -> Step:
    """Parse ``Function[args]`` into a step without dependencies.

    Raises:
        ProgramError: On a malformed call, an unknown function or a wrong argument count.
    """
    m = _CALL.match(segment.strip())
    if not m:
        raise ProgramError(SYNTAX, "unparsable", f"expected Function[arguments], got {segment.strip()!r}", line)
    name, body = m.group(1), m.group(2)
    spec = get_spec(name)
    if spec is None:
        raise ProgramError(SYNTAX, "unknown_function", f"unknown function {name!r}", line)
    if _has_unescaped(body, "[]"):
        raise ProgramError(SYNTAX, "unparsable", f"unbalanced brackets in {segment.strip()!r}", line)
    args = [] if not body.strip() else [_unescape(a.strip()) for a in split_top(body, "|")]
    if len(args) != len(spec.args):
        expected = " | ".join(a.name for a in spec.args) or "no arguments"
        raise ProgramError(
            SYNTAX, "wrong_argument_count",
            f"{name} takes {len(spec.args)} arguments ({expected}), got {len(args)}", line)
    return Step(name, tuple(args))


def _has_unescaped(text: str, chars: str) -> bool:
    return re.search(r"(?<!\\)(?:\\\\)*[" + re.escape(chars) + "]", text) is not None


def parse_dag_text(text: str) -> Program:
    """Parse the DAG text form.

    Raises:
        ProgramError: ``syntax`` on anything that does not form a program; ``type`` when a
            branch's result is never used.
    """
    lines = [(n, ln) for n, ln in enumerate(text.splitlines(), 1) if ln.strip()]
    if not lines:
        raise ProgramError(SYNTAX, "empty_program", "no program text")
    steps: list[Step] = []
    label_end: dict[int, int] = {}  # label number -> index of its last step
    label_line: dict[int, int] = {}
    used: set[int] = set()
    all_labels = {int(m.group(1)) for _, ln in lines if (m := _LABEL.match(ln))}
    for lineno, raw in lines:
        m = _LABEL.match(raw)
        if not m:
            raise ProgramError(SYNTAX, "unparsable", f"expected 'rK: ...', got {raw.strip()!r}", lineno)
        label, body = int(m.group(1)), m.group(2)
        if label in label_end:
            raise ProgramError(SYNTAX, "duplicate_label", f"r{label} is defined twice", lineno)
        segments = [s.strip() for s in split_top(body, ARROW)]
        if any(not s for s in segments):
            raise ProgramError(SYNTAX, "unparsable", f"empty step in {body.strip()!r}", lineno)
        head, calls = segments[0], segments[1:]
        refs = _parse_refs(head)
        if refs is None:
            refs, calls = [], segments
        for r in refs:
            if r not in all_labels:
                raise ProgramError(SYNTAX, "undefined_reference", f"r{r} is not defined", lineno)
            if r not in label_end:
                raise ProgramError(SYNTAX, "cyclic_reference", f"r{r} is used before it is defined", lineno)
        if not calls:
            raise ProgramError(SYNTAX, "unparsable", "a line needs at least one function call", lineno)
        prev: tuple[int, ...] = tuple(label_end[r] for r in refs)
        used.update(refs)
        for k, seg in enumerate(calls):
            step = parse_call(seg, lineno)
            arity = get_spec(step.function).arity
            if arity != len(prev):
                where = "after a reference tuple" if k == 0 and len(prev) == 2 else (
                    "at the start of a line" if not prev else "in a chain")
                raise ProgramError(
                    SYNTAX, "wrong_arity",
                    f"{step.function} takes {arity} inputs but gets {len(prev)} {where}", lineno)
            steps.append(Step(step.function, step.inputs, prev))
            prev = (len(steps) - 1,)
        label_end[label], label_line[label] = prev[0], lineno
    last = max(label_end, key=lambda lab: label_end[lab])
    unused = [lab for lab in label_end if lab not in used and lab != last]
    if unused:
        lab = unused[0]
        raise ProgramError(TYPE, "unused_result", f"the result of r{lab} is never used", label_line[lab])
    return Program(tuple(steps))


def _parse_refs(head: str) -> list[int] | None:
    if m := _REF.match(head):
        return [int(m.group(1))]
    if m := _TUPLE.match(head):
        return [int(m.group(1)), int(m.group(2))]
    return None


def parse_chain_text(text: str) -> Program:
    """Parse the flat chain form (one call per line, post-order data flow).

    Raises:
        ProgramError: ``syntax`` when a call cannot be parsed or lacks its inputs; ``type``
            when branches are left unjoined at the end.
    """
    lines = [(n, ln) for n, ln in enumerate(text.splitlines(), 1) if ln.strip()]
    if not lines:
        raise ProgramError(SYNTAX, "empty_program", "no program text")
    steps: list[Step] = []
    open_branches: list[int] = []
    for lineno, raw in lines:
        step = parse_call(raw, lineno)
        arity = get_spec(step.function).arity
        if arity > len(open_branches):
            raise ProgramError(
                SYNTAX, "wrong_arity",
                f"{step.function} takes {arity} inputs but only {len(open_branches)} branch(es) are open", lineno)
        deps = tuple(open_branches[len(open_branches) - arity:]) if arity else ()
        del open_branches[len(open_branches) - arity:]
        steps.append(Step(step.function, step.inputs, deps))
        open_branches.append(len(steps) - 1)
    if len(open_branches) > 1:
        raise ProgramError(TYPE, "unused_result", f"{len(open_branches) - 1} branch(es) are never used")
    return Program(tuple(steps))


def parse_text(text: str, fmt: str = "dag") -> Program:
    """Parse program text in ``dag`` or ``chain`` form."""
    return _by_format({"dag": parse_dag_text, "chain": parse_chain_text}, fmt)(text)
