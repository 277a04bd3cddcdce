"""Grounded decoding: ``Find`` arguments and literal values drawn from what the question mentions.

The KB grammar (``cbr2.generation.grammar``) makes every output a well-typed program over the
KB's vocabulary, compiled once per KB. It cannot know the question: a small model under it
still writes ``Find[Canada]`` for "the country whose capital is Canberra", copying an entity of
a retrieved case. This module is a per-question layer over that grammar, applied token by token
together with the grammar's mask (the ``llamacpp`` backend):

- while the model writes an argument of a grounded kind, the tokens allowed are those that
  continue one of the question's candidates for that kind (``slot_candidates``), or end the
  argument once a candidate is complete;
- a kind without candidates is left to the grammar alone (the fallback when linking found
  nothing), and so is a step where no candidate's continuation survives the grammar's mask;
- a kind present with no candidates is closed: no function that takes an argument of it may be
  written (``generation.find_needs_link``: no ``Find`` in a question that names no KB entity).

Candidates per kind (``slot_candidates``): ``entity`` the linked entities (``Find``); ``quantity``,
``year`` and ``date`` the values linking read off the question (a date slot also takes its
years); ``string`` any run of the question's words (string values are quoted from the question;
a KB value list would make a linking miss unrecoverable); ``any`` all of these.

With ``generation.narrow``, two more kinds come from the KB around the linked entities
(``Reach``): ``relate``, the ``relation | direction`` pairs that the entities within H hops of a
linked entity have, which a whole ``Relate`` call's bracket must be one of, and ``concept``, the
concepts (with their superclasses) of those entities and the question's linked concepts. H is the
longest chain of ``Relate`` steps from a ``Find`` in the training pool's programs (``pool_hops``):
a program of the question's kind reaches no farther than the pool's do. A ``Relate`` read the
wrong way from its entity, or a ``FilterConcept`` that no entity in reach belongs to, executes to
an empty answer; the KB's own facts rule them out before they are written. Nothing of the
question's gold side is read.

With ``generation.answer_type=structural``, one more kind, ``answer``, holds the answer types
(``cbr2.kopl.functions.ANSWER_TYPES``: ``count``, ``bool``, ``values`` ...) that the cases of the
structural view end with (``case_answer_types``): the program must end with one of them. The
structural retriever ranks the pool by how alike the programs are, from the question text alone,
so its cases' last functions say what kind of answer the question asks for; a small model instead
copies the last function of the case most like the question in wording (``SelectBetween`` for
"which has the lowest", ``QueryAttrQualifier`` for "what visitors per year"). The layer forbids a
call whose result can no longer become an allowed answer (``What`` where a count is asked) and
the end of a program whose result is not one (a ``QueryAttr`` where a ``VerifyNum`` must follow),
and going on after a result that is one and that no call still open takes (a ``VerifyNum`` after
the ``QueryAttr`` of a question whose cases all end with an attribute's values).
Without the structural view in the prompt (``retrieval.cases``) the kind is absent.

The candidates are recorded with the prompt (``Prompt.grounding``), so the predictions cache
keys on them, and each prediction records which of its arguments were grounded
(``grounded_arguments``).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cbr2.kb.model import KB
from cbr2.kopl.functions import ALIASES, ANSWER_TYPES, ENTITY_TYPES, FUNCTIONS, accepts, get_spec
from cbr2.kopl.program import Program
from cbr2.kopl.text import CALL_SEPARATORS
from cbr2.retrieval.linking import Links, question_spans

if TYPE_CHECKING:
    from cbr2.retrieval.cases import Case

GROUNDED_KINDS = ("entity", "quantity", "year", "date", "string", "any")
"""Argument kinds whose values come from the question."""

_CALL = re.compile(r"([A-Za-z]+)\[([^\[\]]*)$")

MAX_TOKEN_CHARS = 24
"""Longest token text looked up when extending a candidate (longer tokens are rare in names)."""


def slot_candidates(links: Links, question: str, find_needs_link: bool = False) -> dict[str, tuple[str, ...]]:
    """The candidates of each grounded kind for one question; kinds without any are left out.

    With ``find_needs_link`` (``generation.find_needs_link``) a question without linked entities
    keeps ``entity`` with no candidates: a closed kind, so no ``Find`` may be written."""
    values = links.values
    spans = tuple(question_spans(question))
    found = {
        "entity": links.entities,
        "quantity": values.get("quantity", ()),
        "year": values.get("year", ()),
        "date": tuple(dict.fromkeys((*values.get("date", ()), *values.get("year", ())))),
        "string": spans,
        "any": tuple(dict.fromkeys((*values.get("quantity", ()), *values.get("date", ()), *values.get("year", ()),
                                    *spans))),
    }
    kept = {kind: items for kind, items in found.items() if items}
    if find_needs_link and not links.entities:
        kept["entity"] = ()
    return kept


RELATE = "relate"
"""The candidate kind of a whole ``Relate`` bracket, ``relation | direction`` (``Reach``)."""


ANSWER = "answer"
"""The candidate kind of the types the whole program may end with (``generation.answer_type``);
no argument has it."""

ANSWER_SOURCES = ("free", "structural")
"""``generation.answer_type``: ``free``, any answer type; ``structural``, those of the structural
view's cases (``case_answer_types``)."""


def case_answer_types(cases: Iterable[Case]) -> tuple[str, ...]:
    """The answer types the programs of the structural view's cases end with, in case order
    (empty when no case of the view is given)."""
    found = []
    for case in cases:
        program = case.question.program
        if "structural" in case.views and program is not None and program.steps:
            spec = get_spec(program.final_function())
            if spec is not None and spec.output in ANSWER_TYPES:
                found.append(spec.output)
    return tuple(dict.fromkeys(found))


def closed_functions(candidates: Mapping[str, Sequence[str]]) -> frozenset[str]:
    """Names of the functions that take an argument of a closed kind (one given with no
    candidates): no program of the question may call them."""
    closed = {kind for kind, items in candidates.items() if kind in GROUNDED_KINDS and not items}
    return frozenset(name for name, spec in FUNCTIONS.items() if any(a.kind in closed for a in spec.args))


def _becomes(output: str, without: frozenset[str] = frozenset()) -> frozenset[str]:
    """The types a value of type ``output`` can become through one-input calls (itself included)
    other than those named in ``without``."""
    seen, todo = {output}, [output]
    while todo:
        have = todo.pop()
        for name, spec in FUNCTIONS.items():
            if name in without:
                continue
            if spec.arity == 1 and accepts(spec.inputs[0], have) and spec.output not in seen:
                seen.add(spec.output)
                todo.append(spec.output)
    return frozenset(seen)


def live_functions(answers: Iterable[str], without: frozenset[str] = frozenset()) -> frozenset[str]:
    """Names (aliases included) of the functions a program ending with one of ``answers`` may
    still call: those whose result is a set of entities or facts (a later call or join can turn
    it into anything) or can become one of ``answers``, with none of the functions named in
    ``without`` (``closed_functions``) called anywhere."""
    allowed = set(answers)
    live = {name for name, spec in FUNCTIONS.items() if name not in without
            and (spec.output in ENTITY_TYPES or _becomes(spec.output, without) & allowed)}
    return frozenset(live | {alias for alias, name in ALIASES.items() if name in live})


class Reach:
    """What the KB has within reach of a question's linked entities (``generation.narrow``).

    Args:
        kb: The knowledge base.
        hops: How far from a linked entity a ``Relate`` may go (``pool_hops``); 0 narrows nothing.
    """

    def __init__(self, kb: KB, hops: int):
        self.kb, self.hops = kb, hops
        self._ids: dict[str, list[str]] = defaultdict(list)
        pairs: set[str] = set()
        for eid, ent in kb.entities.items():
            self._ids[ent["name"]].append(eid)
            pairs.update(f"{rel['relation']} | {rel['direction']}" for rel in ent.get("relations", []))
        self._pairs = len(pairs)
        self._concept_names = len({c["name"] for c in kb.concepts.values()})
        self._lineage: dict[str, frozenset[str]] = {}

    def _concepts(self, concept_id: str) -> frozenset[str]:
        """The names of a concept and of all its superclasses."""
        if concept_id not in self._lineage:
            names, todo, seen = set(), [concept_id], set()
            while todo:
                cid = todo.pop()
                if cid in seen or cid not in self.kb.concepts:
                    continue
                seen.add(cid)
                names.add(self.kb.concepts[cid]["name"])
                todo += self.kb.concepts[cid].get("subclassOf", [])
            self._lineage[concept_id] = frozenset(names)
        return self._lineage[concept_id]

    def candidates(self, links: Links) -> dict[str, tuple[str, ...]]:
        """``relate`` and ``concept`` candidates of one question; none without linked entities, and
        none of a kind whose reach is all the KB has.

        Relation pairs are read off each entity's own facts, where the KB stores every relation on
        both ends with the direction a ``Relate`` from that end takes.
        """
        linked = {eid for name in links.entities for eid in self._ids.get(name, ())}
        if not linked or self.hops < 1:
            return {}
        seen, pairs, frontier = set(linked), {}, linked
        for _ in range(self.hops):
            step = set()
            for eid in sorted(frontier):
                for rel in self.kb.entities[eid].get("relations", []):
                    pairs.setdefault(f"{rel['relation']} | {rel['direction']}", None)
                    if rel["object"] in self.kb.entities and rel["object"] not in seen:
                        step.add(rel["object"])
            seen |= step
            frontier = step
        found = {RELATE: tuple(sorted(pairs))}
        concepts = dict.fromkeys(links.concepts)
        for eid in sorted(seen):
            for cid in self.kb.entities[eid].get("instanceOf", []):
                concepts.update(dict.fromkeys(sorted(self._concepts(cid))))
        found["concept"] = tuple(concepts)
        # A kind whose reach is the whole KB narrows nothing: left out, the question decodes (and
        # its prompt hashes) as without narrowing (mini-metaqa: every pair is within 3 hops).
        return {kind: items for kind, items in found.items()
                if items and len(items) < (self._pairs if kind == RELATE else self._concept_names)}


def pool_hops(programs: Iterable[Program]) -> int:
    """The longest chain of ``Relate`` steps from a ``Find`` in ``programs`` (0 without any):
    ``Reach``'s H. A chain from ``FindAll`` has no entity to start from and is not counted."""
    longest = 0
    for program in programs:
        for step, depth in zip(program.steps, find_depths(program), strict=True):
            if depth is not None and _is_relate(step.function):
                longest = max(longest, depth)
    return longest


def find_depths(program: Program) -> list[int | None]:
    """Per step, the ``Relate`` steps on the way from a ``Find`` to its result (a ``Relate`` step
    counts itself); None where a ``FindAll`` leads to it. A join takes its deeper input."""
    depths: list[int | None] = []
    for step in program.steps:
        spec = get_spec(step.function)
        name = spec.name if spec is not None else step.function
        inputs = [depths[i] for i in step.dependencies if i < len(depths)]
        if name == "Find":
            d: int | None = 0
        elif not inputs or any(x is None for x in inputs):
            d = None
        else:
            d = max(inputs) + (name == "Relate")
        depths.append(d)
    return depths


def current_slot(text: str) -> tuple[str, str] | None:
    """``(argument kind, argument text so far)`` when ``text`` ends inside an argument, else None."""
    m = _CALL.search(text)
    if m is None:
        return None
    spec = get_spec(m.group(1))
    if spec is None:
        return None
    parts = m.group(2).split(" | ")
    if len(parts) > len(spec.args):
        return None
    return spec.args[len(parts) - 1].kind, parts[-1]


def next_kind(text: str) -> str | None:
    """The kind of the argument that follows when ``text`` ends with an argument separator's " |"."""
    m = _CALL.search(text)
    if m is None or not text.endswith(" |"):
        return None
    spec = get_spec(m.group(1))
    done = len(m.group(2).split(" | "))
    return spec.args[done].kind if spec is not None and done < len(spec.args) else None


_COMPLETE_CALL = re.compile(r"([A-Za-z]+)\[[^\[\]]*\]")

_AFTER_CALL = re.compile(r"([A-Za-z]+)\[[^\[\]]*\]([^\[\]]*)$")
"""The last complete call of a text and what follows it."""

_NAME_AT_END = re.compile(r"(?:^|[ \n])([A-Z][A-Za-z]*)(\[[^\[\]]*\]?)?$")
"""A function name (or its start) a text ends with, and its bracket if opened (a token may also
write the arguments and close it)."""

_NAME_REACH = 40
"""Characters of generated text that can hold the start of the function name being written."""

_DAG_HEAD = re.compile(r"r\d+: ")
_DAG_JOIN = re.compile(r"r\d+: \(r\d+, r\d+\) \S+ ")
"""A DAG line's label, and its label and join head, before the line's first call."""


class TokenTable:
    """A vocabulary's token texts, indexed for continuing candidate strings.

    Args:
        texts: The text of each token id (None or "" for tokens that are not whole characters:
            special tokens, partial UTF-8 bytes).
    """

    def __init__(self, texts: Sequence[str | None]):
        self.size = len(texts)
        self.texts = list(texts)
        self.by_text: dict[str, list[int]] = defaultdict(list)
        ends, bars, openers = [], [], []
        for i, text in enumerate(texts):
            if not text:
                continue
            self.by_text[text].append(i)
            if "[" in text or "|" in text:
                openers.append(i)
            head = text.lstrip(" ")
            if head[:1] in ("]", "|"):
                ends.append(i)
            if text[:1] == "|":
                bars.append(i)
        self.ends, self.bars = ends, bars
        self.openers = openers
        """Tokens that may open an argument themselves (``[Net``, ``| 19``)."""

    def entering(self, opener: str, candidates: Sequence[str]) -> list[int]:
        """Token ids that write ``opener`` (or a start of it), or ``opener`` and a start of a candidate."""
        ids = [i for n in range(1, len(opener) + 1) for i in self.by_text.get(opener[:n], ())]
        for cand in candidates:
            for n in range(1, min(len(cand), MAX_TOKEN_CHARS) + 1):
                ids += self.by_text.get(opener + cand[:n], ())
        return ids

    def allowed(self, partial: str, candidates: Sequence[str]) -> list[int] | None:
        """Token ids that continue ``partial`` towards a candidate or close a complete one; None
        when ``partial`` is not on the way to any candidate (the grammar alone decides)."""
        ids: list[int] = []
        on_way = False
        for cand in candidates:
            if not cand.startswith(partial):
                continue
            on_way = True
            rest = cand[len(partial):]
            for n in range(1, min(len(rest), MAX_TOKEN_CHARS) + 1):
                ids += self.by_text.get(rest[:n], ())
            if not rest:
                ids += self.ends
        if on_way:
            return ids
        if partial.endswith(" ") and partial.rstrip(" ") in candidates:
            return list(self.bars)  # "name |": the separator goes on
        return None


class GroundedMask:
    """The per-question layer: applied to logits after the grammar's mask.

    Args:
        table: The vocabulary's ``TokenTable``.
        candidates: ``slot_candidates`` of the question.
        detokenize: Token ids → text (the generated part so far).
        fmt: The program form (``dag`` or ``chain``): what separates one call from the next.
    """

    def __init__(self, table: TokenTable, candidates: dict[str, Sequence[str]], detokenize: Any, fmt: str = "dag"):
        import numpy as np

        self.table, self.candidates, self.detokenize = table, candidates, detokenize
        self._openers = np.asarray(table.openers, dtype=np.int64)
        self.answers = frozenset(candidates.get(ANSWER, ()))
        closed = closed_functions(candidates)
        self._gated = bool(self.answers or closed)
        # Two tiers of names: those that can still lead to an allowed answer without a closed call,
        # and, where the grammar leaves none of those, those without a closed call.
        self._tiers = [self._by_arity(live_functions(self.answers or ANSWER_TYPES, closed))]
        if self.answers and closed:
            self._tiers.append(self._by_arity(live_functions(ANSWER_TYPES, closed)))
        # Allowed answers that no open one-input call takes further: the program ends there, as the
        # per-request grammar's root says (after " → " the grammar may leave only dead names).
        self._final = frozenset(t for t in (self.answers or ANSWER_TYPES)
                                if not any(accepts(get_spec(n).inputs[0], t) for n in self._tiers[0][1]))
        self._fmt = fmt
        self._sep = CALL_SEPARATORS[fmt]

    @staticmethod
    def _by_arity(names: frozenset[str]) -> dict[int, frozenset[str]]:
        return {arity: frozenset(n for n in names if get_spec(n).arity == arity) for arity in (0, 1, 2)}

    def __call__(self, generated: Sequence[int], scores: Any) -> Any:
        """The grammar-masked ``scores`` with the question's rules applied; where those rules would
        forbid every token the grammar allows (a closed kind's argument after a name the grammar
        left as the only way on), the grammar's choice stays."""
        import numpy as np

        grammar = scores.copy()
        scores = self._narrow(generated, scores)
        return scores if np.isfinite(scores).any() else grammar

    def _narrow(self, generated: Sequence[int], scores: Any) -> Any:
        # The last call is never far back; a bounded tail keeps each step's cost flat. Only the
        # names' layer reads farther back (the chain form counts the branches still open).
        full = self.detokenize(generated)
        text = full[-240:]
        bracket = self._relate_bracket(text)
        if bracket is not None:
            kind, partial = bracket
            return self._keep(scores, self.table.allowed(partial, self.candidates[kind]))
        kind = next_kind(text)
        if kind is not None:  # "key |": the next token writes " " and maybe the start of the value
            return self._keep(scores, self.table.entering(" ", self.candidates[kind])) if kind in self.candidates else scores
        slot = current_slot(text)
        if slot is not None and slot[0] in self.candidates:
            return self._keep(scores, self.table.allowed(slot[1], self.candidates[slot[0]]))
        scores = self._block_openers(text, scores)
        return self._gate_names(full, scores) if self._gated else scores

    def _gate_names(self, text: str, scores: Any) -> Any:
        """The layer over function names, for the answer type (``ANSWER``) and closed kinds
        (``closed_functions``): after a call whose result is an answer the question does not ask
        for, only the separator to a next call may follow (no end of the program); after one whose
        result is an allowed answer that no open one-input call takes, no separator; where a function
        name is being written, only names that take no argument of a closed kind and can still lead
        to an allowed answer (``live_functions``), or, where the grammar allows none of those, only
        names without a closed argument. Each keeps the grammar's choice when nothing it allows is
        left."""
        import numpy as np

        if _CALL.search(text):  # inside an argument
            return scores
        finite = np.flatnonzero(np.isfinite(scores))
        done = _AFTER_CALL.search(text)
        if done is not None and self._sep.startswith(done.group(2)):
            spec, gap = get_spec(done.group(1)), done.group(2)
            if spec is not None and spec.output in ANSWER_TYPES and self.answers and spec.output not in self.answers:
                return self._keep(scores, [i for i in finite if self.table.texts[i] and self._goes_on(gap + self.table.texts[i])])
            if spec is not None and spec.output in self._final:
                return self._keep(scores, [i for i in finite if not (self.table.texts[i] and self._goes_on(gap + self.table.texts[i]))])
        arities: dict[str, tuple[int, ...]] = {}
        for live in self._tiers:
            dead = [i for i in finite if self._dead(text, self.table.texts[i] or "", arities, live)]
            if 0 < len(dead) < len(finite):
                scores[dead] = -np.inf
                break
        return scores

    def _goes_on(self, gap: str) -> bool:
        """Whether ``gap``, written after a complete call, is (on the way to) the separator of a next
        call, and not the end of the program (the chain form's blank line)."""
        if len(gap) <= len(self._sep):
            return self._sep.startswith(gap)
        return gap.startswith(self._sep) and not gap[len(self._sep):].startswith("\n")

    def _dead(self, text: str, token: str, arities: dict[str, tuple[int, ...]],
              tier: dict[int, frozenset[str]]) -> bool:
        """Whether ``token``, written after ``text``, writes (part of) a function name whose every
        completion of the arity the place takes is not in ``tier`` (names by arity; ``arities``:
        the places' arities computed so far this step)."""
        if not token:
            return False
        tail = text[-_NAME_REACH:]  # a name and the separator before it; an argument ended the search earlier
        written = _NAME_AT_END.search(tail + token)  # outside an argument, only a name can end there
        if written is None:
            return False
        name = written.group(1)
        before = text[:len(text) - len(tail)] + (tail + token)[:written.start(1)]
        if before not in arities:
            arities[before] = self._arities(before)
        live = frozenset().union(*(tier[a] for a in arities[before]))
        if written.group(2):  # the bracket is open: the name is whole
            return get_spec(name) is not None and name not in live
        return not any(n.startswith(name) for n in live)

    def _arities(self, before: str) -> tuple[int, ...]:
        """The arities a call written after ``before`` may have. The DAG form says it by place: a
        line's first call starts a branch, the first after its ``(rA, rB) →`` head joins two, any
        other takes one. The chain form (post-order) says it by the branches still open."""
        if self._fmt == "dag":
            line = before.rpartition("\n")[2]
            if _DAG_HEAD.fullmatch(line):
                return (0,)
            return (2,) if _DAG_JOIN.fullmatch(line) else (1,)
        open_branches = 0
        for call in _COMPLETE_CALL.finditer(before):
            spec = get_spec(call.group(1))
            arity = spec.arity if spec is not None else 1
            open_branches += 1 if arity == 0 else -1 if arity == 2 else 0
        return (0, *((1,) if open_branches >= 1 else ()), *((2,) if open_branches >= 2 else ()))

    def _relate_bracket(self, text: str) -> tuple[str, str] | None:
        """``(RELATE, text so far)`` of a ``Relate`` bracket that ``text`` ends inside, when the
        question has narrowed pairs (``Reach``): the whole bracket is one candidate, so the
        direction is narrowed with its relation. None otherwise."""
        if RELATE not in self.candidates:
            return None
        m = _CALL.search(text)
        if m is None or not _is_relate(m.group(1)):
            return None
        return RELATE, m.group(2)

    def _keep(self, scores: Any, ids: list[int] | None) -> Any:
        """Only ``ids`` stay, if any of them survives the grammar; otherwise the grammar alone decides."""
        import numpy as np

        if not ids:
            return scores
        keep = np.zeros(len(scores), dtype=bool)
        keep[[i for i in ids if i < len(scores)]] = True
        if np.isfinite(scores[keep]).any():
            scores[~keep] = -np.inf
        return scores

    def _block_openers(self, text: str, scores: Any) -> Any:
        """Forbid a token that opens a grounded argument and starts it off every candidate (``Find`` +
        ``[Net`` when the question names Louis Pasteur), or that opens one of a closed kind:
        tokenizers merge brackets with what follows."""
        import numpy as np

        openers = self._openers[self._openers < len(scores)]
        for i in openers[np.isfinite(scores[openers])]:
            opened = text + self.table.texts[i]
            bracket = self._relate_bracket(opened)
            if bracket is not None:
                kind, partial = bracket
            else:
                slot = current_slot(opened)
                if slot is None:
                    continue
                kind, partial = slot
            if kind not in self.candidates:
                continue
            if not self.candidates[kind]:  # a closed kind: its argument may not be opened at all
                scores[i] = -np.inf
                continue
            if not partial:
                continue
            if self.table.allowed(partial, self.candidates[kind]) is None:
                scores[i] = -np.inf
        return scores


def _is_relate(function: str) -> bool:
    spec = get_spec(function)
    return spec is not None and spec.name == "Relate"


def grounded_arguments(program: Program | None, candidates: dict[str, Sequence[str]]) -> list[dict]:
    """Each argument of a grounded kind in ``program``: its value and whether the question's
    candidates held it (``linked``), for the prediction record. With narrowed candidates
    (``Reach``), each ``Relate`` bracket and concept argument is listed too."""
    if program is None:
        return []
    out = []
    for step in program.steps:
        spec = get_spec(step.function)
        if spec is None:
            continue
        if spec.name == "Relate" and RELATE in candidates and len(step.inputs) == 2:
            value = " | ".join(step.inputs)
            out.append({"function": spec.name, "kind": RELATE, "value": value, "linked": value in candidates[RELATE]})
            continue
        for arg, value in zip(spec.args, step.inputs, strict=False):
            if arg.kind in GROUNDED_KINDS or (arg.kind == "concept" and arg.kind in candidates):
                out.append({"function": spec.name, "kind": arg.kind, "value": value,
                            "linked": value in candidates.get(arg.kind, ())})
    return out
