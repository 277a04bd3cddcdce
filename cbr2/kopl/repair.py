"""Deterministic repair of minor slips in generated program text.

Each rule is a pure text → text function; ``repair`` applies them in order and records the
names of the rules that changed something, so every repaired prediction says what was fixed.
The rules fix form only (arrows, brackets, quotes, labels, surrounding chatter); they never
invent functions or arguments, so a repaired program still says what the model wrote.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from cbr2.kopl.functions import get_spec
from cbr2.kopl.text import ARROW, MAX_TEXT_CHARS, is_quoted, split_top, strip_arg, tokens

# An ASCII or look-alike arrow. The look-behind lets a run of dashes be tried from its first
# dash only: without it every dash of a long run would start a new scan of the run, and a text
# of many dashes would take quadratic time. Spaces around an arrow are stripped in Python for
# the same reason (a leading ``\s*`` re-scans a run of spaces from each of its positions).
_ARROW_TOKEN = re.compile(r"(?<![-=—–])(?:-+>|=+>|—+>|–+>)|[⟶➔➜⇒]")
_LABELLED = re.compile(r"^\s*r\s*(\d+)\s*[:：]\s*(.*)$")
_CALL_START = re.compile(r"^\s*(?:\(\s*r\d+\s*,\s*r\d+\s*\)|r\d+|[A-Z][A-Za-z]*\s*\[)")
_REF_HEAD = re.compile(r"^\s*(?:\(\s*r\d+\s*,\s*r\d+\s*\)|r\d+)\s*$")
_FENCE = re.compile(r"^\s*```")
_PROGRAM_PREFIX = re.compile(r"^\s*(?:program|kopl|answer)\s*:\s*", re.IGNORECASE)
_ENUM_PREFIX = re.compile(r"^\s*(?:step\s*)?\d+\s*[.):]\s*", re.IGNORECASE)


def _strip_wrappers(text: str, fmt: str) -> str:
    """Drop code fences and a leading ``Program:`` label."""
    lines = [ln for ln in text.splitlines() if not _FENCE.match(ln)]
    if lines:
        lines[0] = _PROGRAM_PREFIX.sub("", lines[0])
    return "\n".join(lines)


def _normalise_arrows(text: str, fmt: str) -> str:
    """``->``, ``=>``, ``⟶`` and friends become `` → ``."""
    return "\n".join(_join_arrows(ln) for ln in text.splitlines())


def _join_arrows(line: str) -> str:
    parts = _ARROW_TOKEN.split(line)
    if len(parts) == 1:
        return line
    inner = [p.strip() for p in parts[1:-1]]
    return f" {ARROW} ".join([parts[0].rstrip(), *inner, parts[-1].lstrip()])


def _is_program_line(line: str, fmt: str) -> bool:
    if fmt == "dag":
        m = _LABELLED.match(line)
        return bool(m) or bool(_CALL_START.match(line))
    m = re.match(r"^\s*([A-Za-z]+)\s*(?:\[|$)", _ENUM_PREFIX.sub("", line))
    return bool(m) and get_spec(m.group(1)) is not None


def _drop_trailing_text(text: str, fmt: str) -> str:
    """Keep the first block of program lines; drop chatter before and after it.

    Small models go on writing a new ``Question:`` after the program; that text is not part
    of the program. Text after the last closing bracket of a line is dropped too.
    """
    kept: list[str] = []
    for line in text.splitlines():
        if _is_program_line(line, fmt):
            kept.append(_cut_after_last_call(line))
        elif kept and line.strip():
            break
    return "\n".join(kept) if kept else text


def _cut_after_last_call(line: str) -> str:
    """``... → Count[]  (this counts them)`` loses everything after the last ``]``.

    Only chatter is cut: a remainder that continues the chain (an arrow, an open bracket)
    is an unfinished step for ``fix_calls``, not trailing text.
    """
    end = line.rfind("]")
    rest = line[end + 1:] if end != -1 else ""
    if rest.strip() and ARROW not in rest and "[" not in rest and not _ARROW_TOKEN.search(rest):
        return line[: end + 1]
    return line


def _strip_enumeration(text: str, fmt: str) -> str:
    """Chain form: ``1. Find[X]`` / ``Step 2: Relate[...]`` lose their numbering."""
    if fmt != "chain":
        return text
    return "\n".join(_ENUM_PREFIX.sub("", ln) for ln in text.splitlines())


def _fix_calls(text: str, fmt: str) -> str:
    """Per call: stray spaces, a missing ``]``, a bare ``Count``, quoted arguments."""
    out = []
    for line in text.splitlines():
        m = _LABELLED.match(line) if fmt == "dag" else None
        prefix, body = (f"r{m.group(1)}: ", m.group(2)) if m else ("", line)
        body = _close_brackets(body)
        segments = [_fix_call(s.strip()) for s in split_top(body, ARROW)]
        out.append(prefix + f" {ARROW} ".join(segments))
    return "\n".join(out)


def _close_brackets(body: str) -> str:
    """Close a ``[`` left open before the next ``→`` or the end of the line."""
    out, depth = [], 0
    for tok in tokens(body):
        if tok == ARROW and depth:
            out.append("]" * depth + " ")
            depth = 0
        depth += tok == "["
        depth -= tok == "]" and depth > 0
        out.append(tok)
    return "".join(out).rstrip() + "]" * depth


def _fix_call(segment: str) -> str:
    m = re.match(r"^([A-Za-z_]\w*)\s*(\[.*)?$", segment, re.DOTALL)
    if not m or get_spec(m.group(1)) is None:
        return segment
    name, rest = m.group(1), (m.group(2) or "[]")
    if not rest.rstrip().endswith("]") or rest.count("[") > rest.count("]"):
        rest = rest.rstrip() + "]"
    body = rest.strip()[1:-1]
    args = [_unquote(strip_arg(a)) for a in split_top(body, "|")] if body.strip() else []
    return f"{name}[{' | '.join(args)}]"


def _unquote(arg: str) -> str:
    return arg[1:-1].strip() if is_quoted(arg) else arg


def _relabel(text: str, fmt: str) -> str:
    """DAG form: a lone unlabelled line gets ``r1:``; labels are renumbered r1..rn by position.

    Renumbering only renames: it applies when every label is defined once and every reference
    names an earlier line, and it normalises label spellings the parser does not read
    (``r1：`` with a full-width colon, ``r 1:``). A reference to its own line, to a later line,
    to a label defined nowhere or twice, or a line joined with itself is left for the parser to
    reject: choosing which line the model meant would run a program it did not write.
    """
    if fmt != "dag":
        return text
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) == 1 and not _LABELLED.match(lines[0]):
        return f"r1: {lines[0].strip()}"
    parsed = [_LABELLED.match(ln) for ln in lines]
    if not all(parsed):
        return text
    position: dict[str, int] = {}  # label as written (without leading zeros) -> new number
    out = []
    for pos, m in enumerate(parsed, 1):
        own = m.group(1).lstrip("0") or "0"
        body = split_top(m.group(2), ARROW)
        if own in position:
            return text
        if _REF_HEAD.match(body[0]):
            refs = [r.lstrip("0") or "0" for r in re.findall(r"r(\d+)", body[0])]
            if len(set(refs)) < len(refs) or any(r not in position for r in refs):
                return text
            new = [f"r{position[r]}" for r in refs]
            body[0] = new[0] if len(new) == 1 else f"({', '.join(new)})"
        position[own] = pos
        out.append(f"r{pos}: " + f" {ARROW} ".join(p.strip() for p in body))
    return "\n".join(out)


RULES: list[tuple[str, Callable[[str, str], str]]] = [
    ("strip_wrappers", _strip_wrappers),
    ("normalise_arrows", _normalise_arrows),
    ("drop_trailing_text", _drop_trailing_text),
    ("strip_enumeration", _strip_enumeration),
    ("fix_calls", _fix_calls),
    ("relabel", _relabel),
]
"""Repair rules in the order they are applied."""


def repair(text: str, fmt: str = "dag") -> tuple[str, list[str]]:
    """Apply every repair rule in order.

    Args:
        text: Generated program text.
        fmt: ``dag`` or ``chain``.

    Returns:
        The repaired text and the names of the rules that changed it. A text over
        ``MAX_TEXT_CHARS`` comes back unchanged: the parser rejects it as ``too_long``.
    """
    if len(text) > MAX_TEXT_CHARS:
        return text, []
    applied = []
    for name, rule in RULES:
        new = rule(text, fmt)
        if _canon(new) != _canon(text):
            applied.append(name)
        text = new
    return text.strip(), applied


def _canon(text: str) -> str:
    """Blank lines and line-edge spaces do not count as a repair; anything else does."""
    return "\n".join(ln.strip() for ln in text.strip().splitlines() if ln.strip())


__all__ = ["RULES", "repair"]
