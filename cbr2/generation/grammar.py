"""Schema-constrained decoding: a grammar of well-typed KoPL programs over one KB's vocabulary.

The grammar is generated, never written by hand: its functions, argument kinds and typing rules
come from the function table (``cbr2.kopl.functions``), its closed lists from the KB's
vocabulary (``cbr2.kopl.grounding.slot_items``), and its surface from the two program forms of
``cbr2.kopl.text``. Whatever a model writes under it parses and type-checks, so the syntax error
rate of a constrained run is 0 by construction.

How typing becomes context-free. A KoPL program is a tree of branches: a branch starts with a
start function (``Find``, ``FindAll``) or joins two earlier branches with a two-input function,
and goes on with one-input functions. The grammar has one rule per (first line, last line,
result type) of a subtree, so every reference points at the branch it must, every input gets
the type its function accepts, and the last line ends with an answer type. The DAG form writes
each branch as a labelled line (``r3: (r1, r2) → And[] → QueryName[]``), the chain form writes
the same tree one call per line in post-order; both are rendered from the same rules.

Bounds. Lines per program, calls per line and characters of a free-text argument are bounded
(``generation.max_lines`` ...), so the language is finite: ``ProgramGrammar.max_bytes`` is the
longest text it accepts, and a token cap of that many tokens (every token is at least one byte)
guarantees that decoding ends inside the grammar instead of being cut mid-program.

Closed and open slots. Concepts, attribute keys, qualifier keys and relations are closed lists
of the KB; ops and directions the table's own lists; quantities, years and dates are literal
patterns that the type checker accepts. ``Find``'s argument is a closed list of the KB's names
up to ``generation.closed_entities`` of them (2,000: the mini KBs), free text above (KQA Pro's
17k names: xgrammar's token-mask tables of a list that long did not fit in 24 GB; canonicalisation
snaps a misspelt name afterwards);
string values are free text (a question's value need not be anywhere in the retrieved
knowledge, and a per-question list would make a retrieval miss unrecoverable).

Grounded decoding. ``grounded_ebnf`` is this grammar for one question: its grounded kinds'
arguments drawn from the question's candidates (``cbr2.generation.grounded``), its answer type
from its structural cases. It is the one definition of grounded decoding: the runner puts that
text in the prompt (``request_prompt``: ``Prompt.grammar``), and every engine that decodes a
grounded prompt decodes under it (``cbr2.llm.base.request_grammar``).

The backends receive the grammar as data (``record``: ``cbr2.common.records.Grammar``, its text,
byte bound and identity), never this object; compiling a text for a tokenizer, and caching the
compiled form, is theirs (``cbr2.llm.xgrammar_masks``). ``accepts`` checks a text against the
grammar at the character level, with no tokenizer.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from cbr2.common.records import Grammar, Prompt
from cbr2.config import GenerationConfig
from cbr2.generation.grounded import ANSWER, RELATE, closed_functions
from cbr2.kb.model import Vocabulary
from cbr2.kopl.functions import ALIASES, ANSWER_TYPES, CLOSED_KINDS, FUNCTIONS, FunctionSpec, accepts
from cbr2.kopl.grounding import SLOT_KINDS, slot_items
from cbr2.kopl.text import ARROW, CALL_SEPARATORS, FORMATS, escape_arg

log = logging.getLogger(__name__)

GRAMMAR_VERSION = 1
"""Bump when the generated grammar changes for the same inputs (its identity, a predictions-cache key)."""

_FORBIDDEN = "[]|\\\n"
"""Characters a free-text argument may not contain: they delimit arguments and lines."""

_MONTH_DAYS = {"01": 31, "02": 28, "03": 31, "04": 30, "05": 31, "06": 30, "07": 31, "08": 31, "09": 30,
               "10": 31, "11": 30, "12": 31}
"""Days a date literal may name per month. February stops at 28 because a 29th is valid in
leap years only, which a grammar cannot see cheaply; the checker accepts every date produced."""


@dataclass(frozen=True)
class Bounds:
    """Size limits that make the program language finite (``generation.*``; the defaults are the
    config schema's)."""

    max_lines: int = GenerationConfig.max_lines
    max_calls_per_line: int = GenerationConfig.max_calls_per_line
    max_literal_chars: int = GenerationConfig.max_literal_chars
    closed_entities: int = GenerationConfig.closed_entities

    @classmethod
    def from_config(cls, gen: Any) -> Bounds:
        """The bounds of a ``generation`` config section."""
        return cls(int(gen.max_lines), int(gen.max_calls_per_line), int(gen.max_literal_chars),
                   int(gen.closed_entities))


def _lit(text: str) -> str:
    """An EBNF string literal."""
    return json.dumps(text, ensure_ascii=False)


@dataclass
class _Rules:
    """EBNF rules under construction, with the longest text (in UTF-8 bytes) each one derives."""

    rules: dict[str, str] = field(default_factory=dict)
    longest: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, alternatives: list[tuple[str, int]]) -> str | None:
        """Define ``name`` as the alternatives ``(body, longest)``; None when there are none."""
        if not alternatives:
            return None
        self.rules[name] = " | ".join(body for body, _ in alternatives)
        self.longest[name] = max(n for _, n in alternatives)
        return name


class ProgramGrammar:
    """The EBNF grammar of well-typed programs of one KB, in one program form.

    Args:
        vocab: The KB's vocabulary.
        fmt: ``dag`` or ``chain``.
        bounds: Size limits.

    Attributes:
        ebnf: The grammar text (xgrammar's EBNF dialect, which vLLM's ``grammar`` takes too).
        max_bytes: Length in UTF-8 bytes of the longest accepted text (also of every
            ``grounded_ebnf``, whose language is a subset).
        functions: Functions usable with this KB (those whose closed slots are non-empty).
    """

    def __init__(self, vocab: Vocabulary, fmt: str = "dag", bounds: Bounds = Bounds()):
        if fmt not in FORMATS:
            raise ValueError(f"unknown program format {fmt!r}; expected one of {', '.join(FORMATS)}")
        self.fmt, self.bounds = fmt, bounds
        self._r = _Rules()
        self._valid: dict[str, Callable[[str], bool]] = {}
        """Per argument kind, whether an argument text is one its rule derives (``grounded_ebnf``)."""
        self._args = self._argument_rules(vocab)
        self.functions = [s for s in FUNCTIONS.values() if all(a.kind in self._args for a in s.args)]
        self._memo: dict[tuple, str | None] = {}
        self._root()
        self.ebnf = "\n".join(f"{name} ::= {body}" for name, body in self._r.rules.items()) + "\n"
        self.max_bytes = self._r.longest["root"]

    @cached_property
    def sha256(self) -> str:
        """Identity of the grammar (its text and the generator's version)."""
        return hashlib.sha256(f"{GRAMMAR_VERSION}\x00{self.ebnf}".encode()).hexdigest()

    def identity(self) -> dict[str, Any]:
        """What a predictions cache needs to know about the grammar."""
        return {"grammar": self.sha256[:16], "format": self.fmt, "max_bytes": self.max_bytes}

    def record(self) -> Grammar:
        """The grammar as the LLM backends receive it: its text, byte bound and identity."""
        return Grammar(self.ebnf, self.max_bytes, self.identity())

    def request_prompt(self, prompt: Prompt) -> Prompt:
        """``prompt`` as a backend decodes it under this grammar: with its own grammar text
        (``Prompt.grammar``: ``grounded_ebnf`` of its candidates) when it carries grounding that
        narrows this grammar; else as it is, to decode under this grammar (``record``)."""
        if not prompt.grounding:
            return prompt
        text = self.grounded_ebnf(dict(prompt.grounding))
        return prompt if text == self.ebnf else dataclasses.replace(prompt, grammar=text)

    # --- arguments ---------------------------------------------------------------------------

    def _argument_rules(self, vocab: Vocabulary) -> dict[str, str]:
        """One rule per argument kind; a kind with nothing valid gets none (its functions drop out).

        Beside each kind's rule, ``self._valid[kind]`` says whether a text is one the rule derives:
        the same language as a Python pattern or set, so ``grounded_ebnf`` can keep the candidates
        the grammar accepts without a grammar engine.
        """
        r, b = self._r, self.bounds
        n = b.max_literal_chars
        char = _char_class(_FORBIDDEN)
        edge = _char_class(_FORBIDDEN + " ")
        # Non-empty, no surrounding spaces (the parser strips them), at most n characters;
        # a character is up to 4 UTF-8 bytes.
        r.add("text", [(f"{edge} ({char}{{0,{max(0, n - 2)}}} {edge})?", 4 * n)])
        text = f"{edge}(?:{char}{{0,{max(0, n - 2)}}}{edge})?"
        r.add("int", [("[0-9]{1,20}", 20)])
        r.add("number", [('"-"? int ("." [0-9]{1,8})?', 30)])
        number = r"-?[0-9]{1,20}(?:\.[0-9]{1,8})?"
        r.add("year", [('"-"? [0-9]{1,4}', 5)])
        year = "-?[0-9]{1,4}"
        month_days = []
        for month, days in _MONTH_DAYS.items():
            day = "|".join(_lit(f"{d:02d}") for d in range(1, days + 1))
            month_days.append((f'"{month}-" ({day})', 5))
        r.add("monthday", month_days)
        monthday = "|".join(f"{month}-(?:{'|'.join(f'{d:02d}' for d in range(1, days + 1))})"
                            for month, days in _MONTH_DAYS.items())
        # A calendar date needs a positive year (Python's date, which the checker uses); a bare
        # year is a date literal too, as in the engine.
        r.add("date", [('[1-9] [0-9]{0,3} "-" monthday', 10), ("year", 5)])
        date = f"[1-9][0-9]{{0,3}}-(?:{monthday})|{year}"
        kinds: dict[str, str] = {"string": "text", "year": "year", "date": "date", "any": "text"}
        patterns = {"string": text, "year": year, "date": date, "any": text}
        units = sorted({u for us in vocab.units.values() for u in us if u != "1"})
        if units:
            r.add("unit", [(_lit(escape_arg(u)), _nbytes(escape_arg(u))) for u in units])
            r.add("quantity", [('number (" " unit)?', 30 + 1 + r.longest["unit"])])
            patterns["quantity"] = f"{number}(?: (?:{'|'.join(re.escape(escape_arg(u)) for u in units)}))?"
        else:
            r.add("quantity", [("number", 30)])
            patterns["quantity"] = number
        kinds["quantity"] = "quantity"
        self._valid = {kind: re.compile(pattern).fullmatch for kind, pattern in patterns.items()}
        for kind, values in CLOSED_KINDS.items():
            kinds[kind] = r.add(f"k_{kind}", [(_lit(v), _nbytes(v)) for v in values])
            self._valid[kind] = frozenset(values).__contains__
        for kind in SLOT_KINDS:
            items = sorted(slot_items(vocab, kind))
            if kind == "entity" and len(items) > b.closed_entities:
                kinds[kind] = "text"
                self._valid[kind] = self._valid["string"]
                continue
            written = [escape_arg(v) for v in items]
            kinds[kind] = r.add(f"k_{kind}", [(_lit(v), _nbytes(v)) for v in written])
            self._valid[kind] = frozenset(written).__contains__
        return {k: v for k, v in kinds.items() if v is not None}

    def _call(self, spec: FunctionSpec) -> str:
        """Rule of one call ``Name[arg | arg]`` (the dataset's alias names accepted too)."""
        name = f"f_{spec.name}"
        if name in self._r.rules:
            return name
        names = _names(spec.name)
        size = max(len(n) for n in names) + 2 + 3 * max(0, len(spec.args) - 1)
        size += sum(self._r.longest[self._args[arg.kind]] for arg in spec.args)
        self._r.add(name, [(self._call_body(spec, self._args), size)])
        return name

    @staticmethod
    def _call_body(spec: FunctionSpec, args: Mapping[str, str]) -> str:
        """The body of a call's rule, each argument of kind ``k`` written by rule ``args[k]``."""
        parts = [_head(spec.name), '"["']
        for i, arg in enumerate(spec.args):
            if i:
                parts.append('" | "')
            parts.append(args[arg.kind])
        parts.append('"]"')
        return " ".join(parts)

    # --- grounded decoding -------------------------------------------------------------------

    def grounded_ebnf(self, candidates: Mapping[str, Sequence[str]]) -> str:
        """This grammar for one question under grounded decoding (``generation.grounded``).

        An argument of a kind with candidates (``cbr2.generation.grounded.slot_candidates``:
        ``Prompt.grounding``) may only be one of those the KB grammar accepts for that kind; a kind
        with none of them valid, or without candidates, keeps the KB grammar's rule; a kind given
        with an empty list is closed: no branch starts with a call that takes it (``closed_functions``;
        only a start call's kind may be closed, ``entity`` by ``generation.find_needs_link``). This is
        the one definition of grounded decoding: every engine decodes a grounded prompt under this
        text (``request_prompt``, ``cbr2.llm.base.request_grammar``), vLLM's structured outputs and
        an ``openai`` server with the request, ``llamacpp`` compiled for the GGUF vocabulary
        (``cbr2.llm.xgrammar_masks.compiled_text``). Rules no longer reachable (a closed entity list
        replaced in every call) are left out, so the engine compiles a smaller grammar. Its language
        is a subset of ``ebnf``'s: ``max_bytes`` still bounds it.

        The ``answer`` kind (``cbr2.generation.grounded.ANSWER``, ``generation.answer_type``) is
        not an argument's: the program's last line must end with one of its answer types.

        Args:
            candidates: Argument kind → the question's values for it (as linking wrote them).

        Returns:
            The EBNF text; ``ebnf`` itself when no candidate is valid.

        Raises:
            ValueError: When a closed kind is taken by a call other than a branch's start: such a
                call sits in every tail rule, which this grammar does not rewrite.
        """
        shut = closed_functions(candidates)
        if tails := sorted(spec.name for spec in self.functions if spec.arity and spec.name in shut):
            raise ValueError(f"grounded_ebnf closes only start calls' kinds; closed here: {', '.join(tails)}")
        root = self._answer_root(candidates.get(ANSWER, ()))
        rules = dict(self._r.rules)
        if root is not None:
            rules["root"] = root
        args = dict(self._args)
        for kind, values in candidates.items():
            if kind not in args:
                continue
            kept = [t for t in dict.fromkeys(escape_arg(v) for v in values if v) if self._valid[kind](t)]
            if kept:
                args[kind] = f"g_{kind}"
                rules[args[kind]] = " | ".join(_lit(t) for t in kept)
        for spec in self.functions:
            name = f"f_{spec.name}"
            if name in rules and any(args[a.kind] != self._args[a.kind] for a in spec.args):
                rules[name] = self._call_body(spec, args)
        closed = {f"f_{spec.name}" for spec in self.functions
                  if any(not candidates[a.kind] for a in spec.args if a.kind in candidates and a.kind in args)}
        if closed:
            # A closed kind of start calls only (``slot_candidates``: no entity linked): no branch starts with them.
            for out in self._types:  # the start rules as _subtree builds them, less the closed calls
                kept = [call for call in self._calls(0, None, out) if call not in closed]
                if f"start_{out}" in rules and kept:
                    rules[f"start_{out}"] = " | ".join(kept)
        pairs = self._relate_pairs(candidates.get(RELATE, ()))
        if pairs and "f_Relate" in rules:
            # The whole bracket is one choice, so the direction is narrowed together with its relation.
            rules["g_relate"] = " | ".join(_lit(p) for p in pairs)
            rules["f_Relate"] = f'{_head("Relate")} "[" g_relate "]"'
        if rules == self._r.rules:
            return self.ebnf
        return "\n".join(f"{name} ::= {body}" for name, body in _reachable(rules, "root").items()) + "\n"

    def _answer_root(self, answers: Sequence[str]) -> str | None:
        """The ``root`` rule of programs ending with one of ``answers`` (answer types), or None when
        that narrows nothing or no such program can be written (the KB grammar's root stays). The
        rules it needs join the KB grammar's (memoised, like every subtree) but not ``ebnf``."""
        kept = [t for t in self._types if t in ANSWER_TYPES and t in answers]
        if not kept or kept == [t for t in self._types if t in ANSWER_TYPES]:
            return None
        programs = [self._subtree(1, last, t) for last in range(1, self.bounds.max_lines + 1) for t in kept]
        program = self._group([p for p in programs if p], "program_" + "_".join(kept))
        return None if program is None else f'{program} "\\n\\n"?'

    def _relate_pairs(self, values: Sequence[str]) -> list[str]:
        """``relation | direction`` candidates (``Reach``) as the grammar writes them, those it accepts."""
        kept = []
        for value in dict.fromkeys(values):
            relation, sep, direction = value.rpartition(" | ")
            written = escape_arg(relation)
            if sep and self._valid["relation"](written) and self._valid["direction"](direction):
                kept.append(f"{written} | {direction}")
        return kept

    # --- typed structure ---------------------------------------------------------------------

    def _calls(self, arity: int, inputs: tuple[str, ...] | None = None, output: str | None = None) -> list[str]:
        """Calls of ``arity`` whose inputs accept ``inputs`` (produced types) and that yield ``output``."""
        found = []
        for spec in self.functions:
            if spec.arity != arity or (output is not None and spec.output != output):
                continue
            if inputs is not None and not all(accepts(want, got) for want, got in zip(spec.inputs, inputs)):
                continue
            found.append(self._call(spec))
        return found

    @cached_property
    def _types(self) -> list[str]:
        """Every type a function of this grammar produces."""
        return sorted({s.output for s in self.functions})

    @cached_property
    def _branch_types(self) -> list[str]:
        """Types a branch other than the last may end with: those some join accepts."""
        joins = [s for s in self.functions if s.arity == 2]
        return [t for t in self._types if any(accepts(i, t) for s in joins for i in s.inputs)]

    def _alternatives(self, rules: Iterable[str]) -> list[tuple[str, int]]:
        return [(name, self._r.longest[name]) for name in rules]

    def _tail(self, start: str, end: str, calls: int) -> str | None:
        """Rule of up to ``calls`` one-input calls taking a ``start`` value to an ``end`` value
        (``end="answer"``: any answer type), each preceded by the form's separator."""
        key = ("tail", start, end, calls)
        if key in self._memo:
            return self._memo[key]
        sep = CALL_SEPARATORS[self.fmt]
        done = start in ANSWER_TYPES if end == "answer" else start == end
        alternatives = [('""', 0)] if done else []
        if calls > 0:
            for out in self._types:
                rest = self._tail(out, end, calls - 1)
                step = self._group(self._calls(1, (start,), out), f"c1_{start}_{out}")
                if rest is not None and step is not None:
                    alternatives.append((f"{_lit(sep)} {step} {rest}",
                                         _nbytes(sep) + self._r.longest[step] + self._r.longest[rest]))
        name = self._r.add(f"tail_{start}_{end}_{calls}", alternatives)
        self._memo[key] = name
        return name

    def _group(self, rules: list[str], name: str) -> str | None:
        """A rule choosing among ``rules`` (None when empty)."""
        if name in self._r.rules:
            return name
        return self._r.add(name, self._alternatives(rules))

    def _subtree(self, first: int, last: int, end: str) -> str | None:
        """Rule of a subtree whose branches are lines ``first..last`` and whose last line ends
        with an ``end`` value (a type, or ``answer``)."""
        key = ("sub", first, last, end)
        if key in self._memo:
            return self._memo[key]
        c = self.bounds.max_calls_per_line
        alternatives: list[tuple[str, int]] = []
        label = f"r{last}: " if self.fmt == "dag" else ""
        if first == last:  # one branch: a start call and its tail
            for out in self._types:
                start = self._group(self._calls(0, None, out), f"start_{out}")
                tail = self._tail(out, end, c)
                if start and tail:
                    alternatives.append((f"{_lit(label)} {start} {tail}",
                                         _nbytes(label) + self._r.longest[start] + self._r.longest[tail]))
        else:  # lines first..split, then split+1..last-1, joined on line `last`
            for split in range(first, last - 1):
                for left_t in self._branch_types:
                    left = self._subtree(first, split, left_t)
                    for right_t in self._branch_types:
                        right = self._subtree(split + 1, last - 1, right_t)
                        if left is None or right is None:
                            continue
                        for out in self._types:
                            join = self._group(self._calls(2, (left_t, right_t), out), f"c2_{left_t}_{right_t}_{out}")
                            tail = self._tail(out, end, c)
                            if join is None or tail is None:
                                continue
                            if self.fmt == "dag":
                                head = f"r{last}: (r{split}, r{last - 1}) {ARROW} "
                            else:
                                head = ""
                            body = f'{left} "\\n" {right} "\\n" {_lit(head)} {join} {tail}'
                            size = (self._r.longest[left] + self._r.longest[right] + 2 + _nbytes(head)
                                    + self._r.longest[join] + self._r.longest[tail])
                            alternatives.append((body, size))
        name = self._r.add(f"sub_{first}_{last}_{end}", alternatives)
        self._memo[key] = name
        return name

    def _root(self) -> None:
        """``root``: a program of 1..max_lines branches ending with an answer, then optionally
        the blank line that ends a program in the prompt's examples (a stop string)."""
        programs = [self._subtree(1, last, "answer") for last in range(1, self.bounds.max_lines + 1)]
        program = self._group([p for p in programs if p], "program")
        if program is None:
            raise ValueError("no KoPL program can be written over this KB's vocabulary")
        self._r.add("root", [(f'{program} "\\n\\n"?', self._r.longest[program] + 2)])
        # xgrammar starts at the first rule: put root first.
        self._r.rules = {"root": self._r.rules.pop("root"), **self._r.rules}

    # --- checking a text ----------------------------------------------------------------------

    def accepts(self, text: str) -> bool:
        """Whether the grammar accepts ``text`` exactly (character level; no tokenizer needed)."""
        matcher = self._text_matcher()
        matcher.reset()
        return bool(matcher.accept_string(text) and matcher.is_terminated())

    def _xgr_grammar(self) -> Any:
        if not hasattr(self, "_parsed"):
            import xgrammar as xgr

            self._parsed = xgr.Grammar.from_ebnf(self.ebnf, root_rule_name="root")
        return self._parsed

    def _text_matcher(self) -> Any:
        """A matcher over characters (compiled for an empty vocabulary: fast, tokenizer-free)."""
        if not hasattr(self, "_matcher"):
            import xgrammar as xgr

            text_only = xgr.GrammarCompiler(xgr.TokenizerInfo([]), cache_enabled=False)
            self._matcher = xgr.GrammarMatcher(text_only.compile_grammar(self._xgr_grammar()),
                                               terminate_without_stop_token=True)
        return self._matcher


_LITERALS = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]')
"""String literals and character classes of an EBNF body (what is not a rule name)."""
_NAMES = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _names(function: str) -> list[str]:
    """A function's canonical name and the dataset's aliases of it."""
    return [function] + [alias for alias, target in ALIASES.items() if target == function]


def _head(function: str) -> str:
    """The rule text of a call's function name, any of its ``_names``."""
    return f"({' | '.join(_lit(n) for n in _names(function))})"


def _reachable(rules: dict[str, str], root: str) -> dict[str, str]:
    """The rules that ``root`` reaches, in their order."""
    seen, todo = {root}, [root]
    while todo:
        for name in _NAMES.findall(_LITERALS.sub(" ", rules[todo.pop()])):
            if name in rules and name not in seen:
                seen.add(name)
                todo.append(name)
    return {name: body for name, body in rules.items() if name in seen}


def _nbytes(text: str) -> int:
    return len(text.encode("utf-8"))


def _char_class(forbidden: str) -> str:
    """An EBNF negated character class of ``forbidden`` characters."""
    escaped = "".join({"]": "\\]", "[": "\\[", "\\": "\\\\", "\n": "\\n", "^": "\\^", "-": "\\-"}.get(ch, ch)
                      for ch in forbidden)
    return f"[^{escaped}]"


def build_grammar(gen: GenerationConfig, program_format: str, bench: Any) -> ProgramGrammar:
    """The grammar of a run: ``bench``'s KB vocabulary, in ``program_format``, within the ``generation`` bounds.

    Args:
        gen: The ``generation`` section (its bounds: ``max_lines`` ...).
        program_format: ``prompt.format``, the program form the grammar accepts.
        bench: Gives the KB whose vocabulary fills the closed slots.
    """
    return ProgramGrammar(bench.kb.vocabulary, program_format, Bounds.from_config(gen))

