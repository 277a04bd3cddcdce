"""Program text: the paper's structure-aware DAG form and the flat ``chain`` form.

DAG form, one line per branch::

    r1: Find[Richard Widmark]
    r2: Find[Academy Award for Best Supporting Actor]
    r3: (r1, r2) → QueryRelationQualifier[nominated for | point in time]

A line starts with a start function (``Find[...]``, ``FindAll[]``), a reference (``rK``) or
a tuple of references for a two-input function, followed by ``→``-chained one-input steps.
Arguments are separated by `` | ``; ``\\``, ``|``, ``[`` and ``]`` inside an argument are
escaped with a backslash; a control character or line break (which would end the line) is
written ``\\uXXXX``; whitespace at either end of an argument (which the parser trims) and the
opening quote of a name that is wholly quoted (a model's slip otherwise) get a backslash. So
every string a data file may hold survives a round trip; ``unwritable`` names the few that
cannot be written at all, which the data loaders reject.

Chain form: one step per line in execution order (``Find[X]`` then ``Relate[...]``); the data
flow is KoPL's post-order convention (see ``Program.branch_stack_dependencies``).
"""

from __future__ import annotations

import re

from cbr2.kopl.functions import get_spec
from cbr2.kopl.program import SYNTAX, TYPE, Program, ProgramError, Step

ARROW = "→"
FORMATS = ("dag", "chain")
CALL_SEPARATORS = {"dag": f" {ARROW} ", "chain": "\n"}
"""What each program form writes between a call and the next one-input call of its branch."""

# Bounds on what is parsed. Generated text can be anything, and every stage after the parser
# is linear in the program, so capping the input bounds the time and the size of the whole
# scoring path. The caps sit far above real programs (KQA Pro's longest have about 20 steps
# and arguments of under 200 characters; an LLM's output is capped at a few hundred tokens).
MAX_TEXT_CHARS = 16_384
"""Longer texts are a syntax error (``too_long``) without being parsed or repaired."""
MAX_STEPS = 128
"""Programs with more steps are a syntax error (``too_long``)."""
MAX_ARG_CHARS = 1_000
"""A longer argument is a syntax error (``too_long``): no KB item has such a name."""
MAX_LABEL_DIGITS = 6
"""``r1234567`` is no label: Python refuses to convert integers of thousands of digits at all."""

QUOTE_PAIRS = {'"': '"', "'": "'", "`": "`", "“": "”", "‘": "’"}
"""Quotes a model may wrap an argument in; the text form has none, so they are a slip."""

_ESCAPED = re.compile(r"([\\|\[\]])")
_CODED = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
"""Control characters and line breaks (every character ``str.splitlines`` breaks on is one): ``\\uXXXX``."""
_UNESCAPE = re.compile(r"\\(u[0-9A-Fa-f]{4}|.)", re.DOTALL)
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_CALL = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\[(.*)\]$", re.DOTALL)
_REF = re.compile(r"^r(\d+)$")
_TUPLE = re.compile(r"^\(\s*r(\d+)\s*,\s*r(\d+)\s*\)$")
_LABEL = re.compile(r"^\s*r(\d+)\s*:\s*(.*)$")


def escape_arg(value: str) -> str:
    """An argument as the program text writes it (the module docstring gives the escapes)."""
    text = _CODED.sub(lambda m: f"\\u{ord(m.group()):04x}", _ESCAPED.sub(r"\\\1", value))
    if is_quoted(text) or text[:1].isspace():
        text = "\\" + text
    if text[-1:].isspace() and len(tokens(text)[-1]) == 1:
        text = text[:-1] + "\\" + text[-1]
    return text


def unwritable(value: str) -> str | None:
    """Why ``value`` cannot be a program argument, or None when it round-trips through the text.

    Empty (``Find[]`` reads as no argument), longer than ``MAX_ARG_CHARS`` (a syntax error), or
    holding a lone surrogate (no Unicode text: no file or model can carry it).
    """
    if not value:
        return "is empty (a program cannot name it)"
    if len(value) > MAX_ARG_CHARS:
        return f"has {len(value)} characters (a program argument has at most {MAX_ARG_CHARS})"
    bad = _SURROGATE.search(value)
    if bad:
        return f"holds a lone surrogate U+{ord(bad.group()):04X} at character {bad.start()} (not Unicode text)"
    return None


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
    last_on_line: dict[int, int] = {}  # line number -> index of the last step placed on it
    lines: list[list[str]] = []
    for i, step in enumerate(program.steps):
        deps = step.dependencies
        if len(deps) == 1 and consumers[deps[0]] == [i] and last_on_line[line_of[deps[0]]] == deps[0]:
            line_of[i] = line_of[deps[0]]
            last_on_line[line_of[i]] = i
            lines[line_of[i] - 1].append(format_call(step))
            continue
        lines.append([])
        line_of[i] = len(lines)
        last_on_line[len(lines)] = i
        refs = [f"r{line_of[d]}" for d in deps]
        if len(refs) == 1:
            lines[-1].append(refs[0])
        elif refs:
            lines[-1].append(f"({', '.join(refs)})")
        lines[-1].append(format_call(step))
    return "\n".join(f"r{n}: " + f" {ARROW} ".join(parts) for n, parts in enumerate(lines, 1))


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
    return _UNESCAPE.sub(lambda m: chr(int(m.group(1)[1:], 16)) if len(m.group(1)) == 5 else m.group(1), value)


def strip_arg(raw: str) -> str:
    """A raw (escaped) argument without the unescaped whitespace at its ends (escaped whitespace stays)."""
    toks = tokens(raw)
    start, end = 0, len(toks)
    while start < end and toks[start].isspace():
        start += 1
    while end > start and toks[end - 1].isspace():
        end -= 1
    return "".join(toks[start:end])


def parse_call(segment: str, line: int) -> Step:
    """Parse ``Function[args]`` into a step without dependencies.

    Raises:
        ProgramError: On a malformed call, an unknown function, a wrong argument count, an
            argument over ``MAX_ARG_CHARS`` or wrapped in quotes.
    """
    m = _CALL.match(segment.strip())
    if not m:
        raise ProgramError(SYNTAX, "unparsable", f"expected Function[arguments], got {_shown(segment)}", line)
    name, body = m.group(1), m.group(2)
    spec = get_spec(name)
    if spec is None:
        raise ProgramError(SYNTAX, "unknown_function", f"unknown function {_shown(name)}", line)
    if any(tok in "[]" for tok in tokens(body)):
        raise ProgramError(SYNTAX, "unparsable", f"unbalanced brackets in {_shown(segment)}", line)
    raw_args = [] if not body.strip() else [strip_arg(a) for a in split_top(body, "|")]
    args = [_unescape(a) for a in raw_args]
    if len(args) != len(spec.args):
        expected = " | ".join(a.name for a in spec.args) or "no arguments"
        raise ProgramError(
            SYNTAX, "wrong_argument_count",
            f"{name} takes {len(spec.args)} arguments ({expected}), got {len(args)}", line)
    for raw, arg in zip(raw_args, args, strict=True):
        if len(arg) > MAX_ARG_CHARS:
            raise ProgramError(SYNTAX, "too_long", f"an argument of {name} has {len(arg)} characters "
                               f"(at most {MAX_ARG_CHARS})", line)
        if is_quoted(raw):  # as written: a name that is itself in quotes is written with \" first
            raise ProgramError(SYNTAX, "quoted_argument", f"argument {_shown(arg)} of {name} is quoted", line)
    return Step(name, tuple(args))


def is_quoted(arg: str) -> bool:
    """Whether ``arg`` is wrapped in one matching pair of quotes (``"X"``, ``'X'``, ``“X”``).

    A name that holds quotes of its own (``"X" and "Y"``) is not: only its ends are quotes.
    """
    close = QUOTE_PAIRS.get(arg[:1])
    return len(arg) >= 3 and arg[-1] == close and close not in arg[1:-1] and arg[0] not in arg[1:-1]


def _shown(text: str, limit: int = 80) -> str:
    """``repr`` of a piece of text, clipped: messages stay short whatever the text holds."""
    text = text.strip()
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text)} characters)"


def _program_lines(text: str) -> list[tuple[int, str]]:
    """Non-blank lines with their 1-based numbers, after the size checks every parser makes."""
    if len(text) > MAX_TEXT_CHARS:
        raise ProgramError(SYNTAX, "too_long", f"the text has {len(text)} characters (at most {MAX_TEXT_CHARS})")
    lines = [(n, ln) for n, ln in enumerate(text.splitlines(), 1) if ln.strip()]
    if not lines:
        raise ProgramError(SYNTAX, "empty_program", "no program text")
    return lines


def _label(digits: str, line: int) -> int:
    if len(digits) > MAX_LABEL_DIGITS:
        raise ProgramError(SYNTAX, "bad_label", f"label r{digits[:10]}... has {len(digits)} digits "
                           f"(at most {MAX_LABEL_DIGITS})", line)
    return int(digits)


def _add_step(steps: list[Step], step: Step, line: int) -> None:
    if len(steps) >= MAX_STEPS:
        raise ProgramError(SYNTAX, "too_long", f"more than {MAX_STEPS} steps", line)
    steps.append(step)


def parse_dag_text(text: str) -> Program:
    """Parse the DAG text form.

    Raises:
        ProgramError: ``syntax`` on anything that does not form a program; ``type`` when a
            branch's result is never used.
    """
    lines = _program_lines(text)
    steps: list[Step] = []
    label_end: dict[int, int] = {}  # label number -> index of its last step
    label_line: dict[int, int] = {}
    used: set[int] = set()
    all_labels = {_label(m.group(1), n) for n, ln in lines if (m := _LABEL.match(ln))}
    for lineno, raw in lines:
        m = _LABEL.match(raw)
        if not m:
            raise ProgramError(SYNTAX, "unparsable", f"expected 'rK: ...', got {_shown(raw)}", lineno)
        label, body = _label(m.group(1), lineno), m.group(2)
        if label in label_end:
            raise ProgramError(SYNTAX, "duplicate_label", f"r{label} is defined twice", lineno)
        segments = [s.strip() for s in split_top(body, ARROW)]
        if any(not s for s in segments):
            raise ProgramError(SYNTAX, "unparsable", f"empty step in {_shown(body)}", lineno)
        head, calls = segments[0], segments[1:]
        refs = _parse_refs(head, lineno)
        if refs is None:
            refs, calls = [], segments
        if len(set(refs)) < len(refs):
            raise ProgramError(SYNTAX, "duplicate_reference", f"r{refs[0]} is joined with itself", lineno)
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
            _add_step(steps, Step(step.function, step.inputs, prev), lineno)
            prev = (len(steps) - 1,)
        label_end[label], label_line[label] = prev[0], lineno
    last = max(label_end, key=lambda lab: label_end[lab])
    unused = [lab for lab in label_end if lab not in used and lab != last]
    if unused:
        lab = unused[0]
        raise ProgramError(TYPE, "unused_result", f"the result of r{lab} is never used", label_line[lab])
    return Program(tuple(steps))


def _parse_refs(head: str, line: int) -> list[int] | None:
    if m := _REF.match(head):
        return [_label(m.group(1), line)]
    if m := _TUPLE.match(head):
        return [_label(m.group(1), line), _label(m.group(2), line)]
    return None


def parse_chain_text(text: str) -> Program:
    """Parse the flat chain form (one call per line, post-order data flow).

    Raises:
        ProgramError: ``syntax`` when a call cannot be parsed or lacks its inputs; ``type``
            when branches are left unjoined at the end.
    """
    lines = _program_lines(text)
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
        _add_step(steps, Step(step.function, step.inputs, deps), lineno)
        open_branches.append(len(steps) - 1)
    if len(open_branches) > 1:
        raise ProgramError(TYPE, "unused_result", f"{len(open_branches) - 1} branch(es) are never used")
    return Program(tuple(steps))


def parse_text(text: str, fmt: str = "dag") -> Program:
    """Parse program text in ``dag`` or ``chain`` form."""
    return _by_format({"dag": parse_dag_text, "chain": parse_chain_text}, fmt)(text)
