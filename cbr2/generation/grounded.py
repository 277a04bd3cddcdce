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
- a kind present with no candidates is closed: no argument of it may be opened
  (``generation.find_needs_link``: no ``Find`` in a question that names no KB entity).

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

The candidates are recorded with the prompt (``Prompt.grounding``), so the predictions cache
keys on them, and each prediction records which of its arguments were grounded
(``grounded_arguments``).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from cbr2.kb.model import KB
from cbr2.kopl.functions import get_spec
from cbr2.kopl.program import Program
from cbr2.retrieval.linking import Links, question_spans

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
        frontier = {eid for name in links.entities for eid in self._ids.get(name, ())}
        if not frontier or self.hops < 1:
            return {}
        seen, pairs = set(frontier), {}
        for _ in range(self.hops):
            step = set()
            for eid in sorted(frontier):
                for rel in self.kb.entities[eid].get("relations", []):
                    pairs.setdefault(f"{rel['relation']} | {rel['direction']}", None)
                    if rel["object"] in self.kb.entities and rel["object"] not in seen:
                        step.add(rel["object"])
            seen |= step
            frontier = step
        concepts = dict.fromkeys(links.concepts)
        for eid in sorted(seen):
            for cid in self.kb.entities[eid].get("instanceOf", []):
                concepts.update(dict.fromkeys(sorted(self._concepts(cid))))
        # A kind whose reach is the whole KB narrows nothing: left out, the question decodes (and
        # its prompt hashes) as without narrowing (mini-metaqa: every pair is within 3 hops).
        found = {RELATE: tuple(sorted(pairs)), "concept": tuple(concepts)}
        return {kind: items for kind, items in found.items()
                if items and len(items) < (self._pairs if kind == RELATE else self._concept_names)}


def pool_hops(programs: Iterable[Program]) -> int:
    """The longest chain of ``Relate`` steps from a ``Find`` in ``programs`` (0 without any):
    ``Reach``'s H. A chain from ``FindAll`` has no entity to start from and is not counted."""
    longest = 0
    for program in programs:
        depth: list[int | None] = []
        for step in program.steps:
            spec = get_spec(step.function)
            name = spec.name if spec is not None else step.function
            inputs = [depth[i] for i in step.dependencies if i < len(depth)]
            if name == "Find":
                d: int | None = 0
            elif not inputs or any(x is None for x in inputs):
                d = None
            else:
                d = max(inputs) + (name == "Relate")
            depth.append(d)
            if name == "Relate" and d is not None:
                longest = max(longest, d)
    return longest


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
    """

    def __init__(self, table: TokenTable, candidates: dict[str, Sequence[str]], detokenize: Any):
        import numpy as np

        self.table, self.candidates, self.detokenize = table, candidates, detokenize
        self._openers = np.asarray(table.openers, dtype=np.int64)

    def __call__(self, generated: Sequence[int], scores: Any) -> Any:
        # The last call is never far back; a bounded tail keeps each step's cost flat.
        text = self.detokenize(generated)[-240:]
        bracket = self._relate_bracket(text)
        if bracket is not None:
            return self._keep(scores, self.table.allowed(bracket, self.candidates[RELATE]))
        kind = next_kind(text)
        if kind is not None:  # "key |": the next token writes " " and maybe the start of the value
            return self._keep(scores, self.table.entering(" ", self.candidates[kind])) if kind in self.candidates else scores
        slot = current_slot(text)
        if slot is not None and slot[0] in self.candidates:
            return self._keep(scores, self.table.allowed(slot[1], self.candidates[slot[0]]))
        return self._block_openers(text, scores)

    def _relate_bracket(self, text: str) -> str | None:
        """The text so far of a ``Relate`` bracket that ``text`` ends inside, when the question has
        narrowed pairs: the whole bracket is one candidate, so the direction is narrowed with its
        relation. None otherwise."""
        if RELATE not in self.candidates:
            return None
        m = _CALL.search(text)
        return m.group(2) if m is not None and _is_relate(m.group(1)) else None

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
                kind, partial = RELATE, bracket
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
    (``Reach``), each ``Relate`` bracket (kind ``relate``) and concept argument is listed too."""
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
