"""Grounded decoding: ``Find`` arguments and literal values drawn from what the question mentions.

The KB grammar (``cbr2.generation.grammar``) makes every output a well-typed program over the
KB's vocabulary. It cannot know the question: a small model under it still writes
``Find[Canada]`` for "the country whose capital is Canberra", copying an entity of a retrieved
case. This module finds, per question, what its arguments may be (the candidates); the grammar
turns them into the question's own grammar (``ProgramGrammar.grounded_ebnf``), the one
definition of grounded decoding, which every engine decodes a grounded prompt under:

- an argument of a grounded kind is one of the question's candidates for that kind
  (``slot_candidates``) that the KB grammar accepts;
- a kind without candidates, or with none the KB grammar accepts, keeps the KB grammar's rule
  (the fallback when linking found nothing);
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
structural view end with (``case_answer_types``): the program must end with one of them (the
question's grammar has a root of those programs only). The structural retriever ranks the pool
by how alike the programs are, from the question text alone, so its cases' last functions say
what kind of answer the question asks for; a small model instead copies the last function of the
case most like the question in wording (``SelectBetween`` for "which has the lowest",
``QueryAttrQualifier`` for "what visitors per year"). Without the structural view in the prompt
(``retrieval.cases``) the kind is absent.

The candidates are recorded with the prompt (``Prompt.grounding``), so the predictions cache
keys on them, and each prediction records which of its arguments were grounded
(``grounded_arguments``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from cbr2.kb.model import KB
from cbr2.kopl.functions import ANSWER_TYPES, FUNCTIONS, get_spec
from cbr2.kopl.program import Program
from cbr2.retrieval.linking import Links, question_spans

if TYPE_CHECKING:
    from cbr2.retrieval.cases import Case

GROUNDED_KINDS = ("entity", "quantity", "year", "date", "string", "any")
"""Argument kinds whose values come from the question."""


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


class Reach:
    """What the KB has within reach of a question's linked entities (``generation.narrow``).

    Args:
        kb: The knowledge base.
        hops: How far from a linked entity a ``Relate`` may go (``pool_hops``); 0 narrows nothing.
    """

    def __init__(self, kb: KB, hops: int):
        self.kb, self.hops = kb, hops
        # From the vocabulary and the name index, not a walk of the entities: the KB store
        # keeps both in its header, so only the entities near a question's links are read.
        self._ids = kb.entity_ids_by_name()
        self._pairs = len(kb.vocabulary.relation_pairs)
        self._concept_names = len(kb.vocabulary.concepts)
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
