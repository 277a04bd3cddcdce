"""A seeded generator of random well-typed KoPL programs over a KB, for the differential test.

A program is a random walk over the function table that follows a *witness*: an entity the
current set is meant to hold. It starts with ``Find[witness]``, ``FindAll[]`` or ``FindAll[] →
FilterConcept[a concept of the witness]``, then applies filters built from the witness's own
facts (so the witness survives them), ``Relate`` along one of its relations (the object
becomes the witness), ``QFilter*`` on a qualifier of the fact that selected it, ``And`` /
``Or`` with a second branch, and ends with a query whose arguments come from the witness
(its keys, values, qualifiers, neighbours). That keeps most answers non-empty. A share of
the choices is deliberately off: an argument drawn from the whole vocabulary, a literal
perturbed (another number, unit, year; a year for a date key and back; garbage for the
untyped value slots), a random operator, so empty sets, ``not sure``, unit mismatches and
execution errors are covered too.

Every argument naming a KB item is one of the KB's, so grounding passes; programs the type
checker rejects are dropped (``ProgramGenerator.programs`` yields checked programs only).
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from cbr2.kb.model import KB, format_number, format_value
from cbr2.kopl.checker import check_program
from cbr2.kopl.functions import AMONG_OPS, BETWEEN_OPS, COMPARISON_OPS
from cbr2.kopl.program import Program, Step

_GARBAGE = ["abc", "", " ", "12abc", "1998-13-01", "1998-02", "5 5 5", "-", "1e3", "nan metre", "1_000"]


@dataclass
class Node:
    """One step of the program tree; ``children`` are the steps it consumes, in order."""

    function: str
    args: list[str] = field(default_factory=list)
    children: list[Node] = field(default_factory=list)


def flatten(root: Node) -> Program:
    """The tree in post-order (children left to right, then the node): KoPL's step order."""
    steps: list[Step] = []

    def visit(node: Node) -> int:
        deps = tuple(visit(c) for c in node.children)
        steps.append(Step(node.function, tuple(node.args), deps))
        return len(steps) - 1

    visit(root)
    return Program(tuple(steps))


@dataclass
class _Walk:
    node: Node
    typ: str  # entities | facts
    witness: str | None  # an entity or concept id the set should hold
    fact: dict[str, Any] | None  # the attribute or relation fact that selected the witness


class ProgramGenerator:
    """Random programs over one KB, reproducible from ``seed``.

    Args:
        kb: The KB whose vocabulary and facts the arguments come from.
        seed: Seed of the generator's own ``random.Random``.
        off: Probability of each deliberately off choice (vocabulary-wide argument,
            perturbed literal, random operator).
    """

    def __init__(self, kb: KB, seed: int = 0, off: float = 0.08):
        self.kb, self.rng, self.off = kb, random.Random(seed), off
        voc = kb.vocabulary
        self.entity_ids = list(kb.entities)
        self.concept_names = sorted(voc.concepts)
        self.names = sorted(voc.names)
        self.keys = sorted(voc.keys)
        self.qkeys = sorted(voc.qualifier_keys)
        self.relations = sorted(voc.relations)
        self.key_values: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.qkey_values: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.holders: dict[str, list[str]] = defaultdict(list)  # key -> entities with a value of it
        self.units = sorted({u for us in voc.units.values() for u in us} | {"1"})
        for eid, ent in kb.entities.items():
            for attr in ent.get("attributes", ()):
                self.key_values[attr["key"]].append(attr["value"])
                self.holders[attr["key"]].append(eid)
                for qk, qvs in attr.get("qualifiers", {}).items():
                    self.qkey_values[qk].extend(qvs)
            for rel in ent.get("relations", ()):
                for qk, qvs in rel.get("qualifiers", {}).items():
                    self.qkey_values[qk].extend(qvs)
        self.quantity_keys = [k for k in self.keys if voc.keys[k] == "quantity"]
        # Entities able to witness each kind of query (so the query has something to find).
        self.pools: dict[str, list[str]] = defaultdict(list)
        for eid, ent in kb.entities.items():
            attrs, rels = ent.get("attributes", ()), ent.get("relations", ())
            for kind, ok in (("attr", attrs), ("qualified attr", any(a.get("qualifiers") for a in attrs)),
                             ("quantity", any(a["value"]["type"] == "quantity" for a in attrs)),
                             ("forward", any(r["direction"] == "forward" for r in rels)),
                             ("qualified forward", any(r["direction"] == "forward" and r.get("qualifiers")
                                                       for r in rels))):
                if ok:
                    self.pools[kind].append(eid)

    # ------------------------------------------------------------------ public

    def programs(self, n: int) -> Iterator[Program]:
        """``n`` type-checked programs (ill-typed draws are dropped and drawn again)."""
        made = 0
        while made < n:
            program = flatten(self.query())
            if check_program(program).ok:
                made += 1
                yield program

    # ------------------------------------------------------------------ helpers

    def _chance(self, p: float) -> bool:
        return self.rng.random() < p

    def _item(self, item_id: str | None) -> dict[str, Any]:
        if item_id is None:
            return {}
        return self.kb.entities.get(item_id) or self.kb.concepts.get(item_id) or {}

    def _name(self, item_id: str) -> str:
        return self._item(item_id)["name"]

    def _entity(self) -> str:
        return self.rng.choice(self.entity_ids)

    def _op(self, default: str = "=") -> str:
        return self.rng.choice(COMPARISON_OPS) if self._chance(0.3) else default

    def _concept_of(self, witness: str | None) -> str:
        parents = self._item(witness).get("instanceOf") or self._item(witness).get("subclassOf") or []
        if parents and not self._chance(self.off):
            cid = self.rng.choice(parents)
            # Sometimes a parent of the parent: membership is transitive.
            grand = self.kb.concepts[cid].get("subclassOf", [])
            if grand and self._chance(0.3):
                cid = self.rng.choice(grand)
            return self.kb.concepts[cid]["name"]
        return self.rng.choice(self.concept_names)

    def literal(self, value: dict[str, Any], as_type: str | None = None) -> str:
        """A KB value as a program literal (``as_type``: render a date as a year or back)."""
        typ = value["type"]
        if typ == "quantity":
            x = float(value["value"])
            unit = value.get("unit", "1")
            if self._chance(self.off):
                x = self.rng.choice([x + 1, x - 1, x * 2, 0.0, -x, x + 0.5])
            if self._chance(self.off):
                unit = self.rng.choice(self.units)
            number = format_number(x)
            return number if unit == "1" else f"{number} {unit}"
        text = format_value(value)
        if typ in ("date", "year"):
            year = int(text[:-6] if typ == "date" and len(text) > 6 else text)
            if self._chance(self.off):
                year += self.rng.choice([-1, 1, 10])
                text = f"{year:04d}{text[4:]}" if typ == "date" else str(year)
            if as_type == "year" and typ == "date":
                return str(year)
            if as_type == "date" and typ == "year":
                return f"{year:04d}-{self.rng.randint(1, 12):02d}-01" if year > 0 else str(year)
        return text

    def _garbage_or(self, text: str) -> str:
        return self.rng.choice(_GARBAGE) if self._chance(self.off / 3) else text

    # ------------------------------------------------------------------ entity sets

    def start(self, witness: str | None = None) -> _Walk:
        roll = self.rng.random()
        if witness is None:
            witness = self._entity()
        elif roll < 0.05:
            roll = 0.5  # a given witness is found by name, not replaced by a concept
        if roll < 0.05 and self.kb.concepts:
            cid = self.rng.choice(list(self.kb.concepts))
            return _Walk(Node("Find", [self.kb.concepts[cid]["name"]]), "entities", cid, None)
        if roll < 0.6:
            return _Walk(Node("Find", [self._name(witness)]), "entities", witness, None)
        if roll < 0.72:
            return _Walk(Node("FindAll"), "entities", witness, None)
        node = Node("FilterConcept", [self._concept_of(witness)], [Node("FindAll")])
        return _Walk(node, "entities", witness, None)

    def entity_set(self, depth: int = 0, max_steps: int = 3, witness: str | None = None) -> _Walk:
        """A walk of up to ``max_steps`` steps; from ``witness`` it never leaves it (no Relate)."""
        walk = self.start(witness)
        for _ in range(self.rng.randint(0, max_steps)):
            walk = self.extend(walk, depth, moving=witness is None)
        return walk

    def extend(self, walk: _Walk, depth: int, moving: bool = True) -> _Walk:
        item = self._item(walk.witness)
        # Steps the witness survives; the others only now and then.
        choices = ["concept"]
        if item.get("attributes") or (self.keys and self._chance(self.off)):
            choices += ["filter", "filter"]
        if item.get("relations") and moving:
            choices += ["relate"] * 3
        if walk.typ == "facts" and ((walk.fact or {}).get("qualifiers") or (self.qkeys and self._chance(self.off))):
            choices += ["qfilter"] * 3
        if depth < 2:
            choices += ["and", "or"]
        kind = self.rng.choice(choices)
        if kind == "concept":
            return _Walk(Node("FilterConcept", [self._concept_of(walk.witness)], [walk.node]), "entities",
                         walk.witness, None)
        if kind == "filter":
            return self.filter(walk)
        if kind == "relate":
            rel = self.rng.choice(item["relations"])
            relation, direction = rel["relation"], rel["direction"]
            if self._chance(self.off):
                relation = self.rng.choice(self.relations)
            if self._chance(self.off):
                direction = "backward" if direction == "forward" else "forward"
            return _Walk(Node("Relate", [relation, direction], [walk.node]), "facts", rel["object"], rel)
        if kind == "qfilter":
            return self.qfilter(walk)
        other = self.entity_set(depth + 1, max_steps=2)
        if kind == "and" and self._chance(0.6) and walk.witness is not None:
            # A second branch that holds the witness too, so the intersection keeps it.
            other = _Walk(Node("Find", [self._name(walk.witness)]), "entities", walk.witness, None)
            if self._chance(0.5):
                other.node = Node("FilterConcept", [self._concept_of(walk.witness)], [Node("FindAll")])
        children = [walk.node, other.node] if self._chance(0.5) else [other.node, walk.node]
        return _Walk(Node("And" if kind == "and" else "Or", [], children), "entities", walk.witness, None)

    def filter(self, walk: _Walk) -> _Walk:
        attrs = self._item(walk.witness).get("attributes") or []
        if attrs and not self._chance(self.off):
            attr = self.rng.choice(attrs)
            key, value = attr["key"], attr["value"]
        else:
            key = self.rng.choice(self.keys) if self.keys else "name"
            values = self.key_values.get(key) or [{"type": "string", "value": "x"}]
            value, attr = self.rng.choice(values), None
        node = self._compare_node(key, value, walk.node, prefix="Filter")
        return _Walk(node, "facts", walk.witness, attr)

    def qfilter(self, walk: _Walk) -> _Walk:
        quals = (walk.fact or {}).get("qualifiers") or {}
        if quals and not self._chance(self.off):
            qk = self.rng.choice(sorted(quals))
            value = self.rng.choice(quals[qk])
        else:
            qk = self.rng.choice(self.qkeys) if self.qkeys else "point in time"
            values = self.qkey_values.get(qk) or [{"type": "year", "value": 2000}]
            value = self.rng.choice(values)
        return _Walk(self._compare_node(qk, value, walk.node, prefix="QFilter"), "facts", walk.witness, walk.fact)

    def _compare_node(self, key: str, value: dict[str, Any], child: Node, prefix: str) -> Node:
        """``{prefix}Str/Num/Year/Date[key | literal | op]`` for a value (sometimes the other time form)."""
        typ = value["type"]
        if typ == "string":
            return Node(f"{prefix}Str", [key, value["value"]], [child])
        if typ == "quantity":
            return Node(f"{prefix}Num", [key, self.literal(value), self._op()], [child])
        as_type = typ if not self._chance(0.3) else ("date" if typ == "year" else "year")
        function = f"{prefix}Year" if as_type == "year" else f"{prefix}Date"
        text = self.literal(value, as_type)
        if function.endswith("Year") and "-" in text.lstrip("-"):
            text = text.split("-")[0] or text  # keep FilterYear's literal a year
        return Node(function, [key, text, self._op()], [child])

    # ------------------------------------------------------------------ queries

    def query(self) -> Node:
        roll = self.rng.random()
        if not self.keys:  # a KB of relations only (MetaQA)
            roll = self.rng.choice([0.0, 0.2, 0.9])
        needs = ("" if roll < 0.24 else "attr" if roll < 0.44 else "qualified attr" if roll < 0.62
                 else "quantity" if roll < 0.80 else "forward" if roll < 0.88 else "qualified forward")
        walk = self.entity_set()
        pool = self.pools.get(needs)
        if needs and pool and walk.witness not in pool and not self._chance(self.off):
            walk = self.entity_set(max_steps=1, witness=self.rng.choice(pool))
        item = self._item(walk.witness)
        attrs = item.get("attributes") or []
        if roll < 0.14:
            return Node(self.rng.choice(["QueryName", "QueryName", "What"]), [], [walk.node])
        if roll < 0.24:
            return Node("Count", [], [walk.node])
        if roll < 0.44:
            return self.query_attr(walk, attrs)
        if roll < 0.54:
            return self.under_condition(walk, attrs)
        if roll < 0.62:
            return self.attr_qualifier(walk, attrs)
        if roll < 0.70:
            key = self._quantity_key(attrs)
            return Node("SelectAmong", [key, self.rng.choice(AMONG_OPS)], [walk.node])
        if roll < 0.80:
            key = self._quantity_key(attrs)
            holders = self.holders.get(key) or self.entity_ids
            other = Node("Find", [self._name(self.rng.choice(holders))])
            if self._chance(0.2):
                other = self.entity_set(1, max_steps=1).node
            children = [walk.node, other] if self._chance(0.5) else [other, walk.node]
            return Node("SelectBetween", [key, self.rng.choice(BETWEEN_OPS)], children)
        return self.relation_query(walk, item, qualified=needs == "qualified forward")

    def _quantity_key(self, attrs: list[dict[str, Any]]) -> str:
        mine = [a["key"] for a in attrs if a["value"]["type"] == "quantity"]
        if mine and not self._chance(self.off):
            return self.rng.choice(mine)
        if self.quantity_keys and not self._chance(self.off):
            return self.rng.choice(self.quantity_keys)
        return self.rng.choice(self.keys) if self.keys else "name"  # may hold no quantity: IndexError

    def _attr(self, attrs: list[dict[str, Any]], with_qualifiers: bool = False) -> dict[str, Any] | None:
        pool = [a for a in attrs if a.get("qualifiers")] if with_qualifiers else attrs
        if pool and not self._chance(self.off):
            return self.rng.choice(pool)
        if not self.keys:
            return None
        key = self.rng.choice(self.keys)
        holder = self._item(self.rng.choice(self.holders[key]))
        pool = [a for a in holder["attributes"] if a["key"] == key]
        return self.rng.choice(pool)

    def query_attr(self, walk: _Walk, attrs: list[dict[str, Any]]) -> Node:
        attr = self._attr(attrs)
        if attr is None:
            return Node("Count", [], [walk.node])
        node = Node("QueryAttr", [attr["key"]], [walk.node])
        return self.verify(node, attr["value"]) if self._chance(0.5) else node

    def verify(self, values: Node, value: dict[str, Any]) -> Node:
        if self._chance(self.off):  # a value of another key, maybe of another type
            key = self.rng.choice(self.keys)
            value = self.rng.choice(self.key_values[key])
        typ = value["type"]
        if typ == "string":
            return Node("VerifyStr", [value["value"]], [values])
        if typ == "quantity":
            return Node("VerifyNum", [self.literal(value), self._op()], [values])
        as_type = typ if not self._chance(0.3) else ("date" if typ == "year" else "year")
        text = self.literal(value, as_type)
        if as_type == "year" and "-" in text.lstrip("-"):
            text = text.split("-")[0] or text
        return Node("VerifyYear" if as_type == "year" else "VerifyDate", [text, self._op()], [values])

    def under_condition(self, walk: _Walk, attrs: list[dict[str, Any]]) -> Node:
        attr = self._attr(attrs, with_qualifiers=True)
        if attr is None or not attr.get("qualifiers"):
            if not self.qkeys or attr is None:
                return Node("Count", [], [walk.node])
            qk = self.rng.choice(self.qkeys)
            qv = self.rng.choice(self.qkey_values[qk])
        else:
            qk = self.rng.choice(sorted(attr["qualifiers"]))
            qv = self.rng.choice(attr["qualifiers"][qk])
        node = Node("QueryAttrUnderCondition", [attr["key"], qk, self._garbage_or(self.literal(qv))], [walk.node])
        return self.verify(node, attr["value"]) if self._chance(0.4) else node

    def attr_qualifier(self, walk: _Walk, attrs: list[dict[str, Any]]) -> Node:
        attr = self._attr(attrs, with_qualifiers=True)
        if attr is None:
            return Node("QueryName", [], [walk.node])
        quals = attr.get("qualifiers") or {}
        qk = self.rng.choice(sorted(quals)) if quals and not self._chance(self.off) else (
            self.rng.choice(self.qkeys) if self.qkeys else attr["key"])
        value = self._garbage_or(self.literal(attr["value"]))
        return Node("QueryAttrQualifier", [attr["key"], value, qk], [walk.node])

    def relation_query(self, walk: _Walk, item: dict[str, Any], qualified: bool) -> Node:
        forward = [r for r in item.get("relations") or []
                   if r["direction"] == "forward" and (r.get("qualifiers") or not qualified)]
        if forward and not self._chance(self.off):
            rel = self.rng.choice(forward)
            other = Node("Find", [self._name(rel["object"])])
        else:
            rel = None
            other = Node("Find", [self.rng.choice(self.names)])
        if self._chance(0.15):  # a second branch of a few steps (kept small: both engines pair up inputs)
            other = Node("FilterConcept", [self._concept_of(rel["object"] if rel else None)], [other])
        swap = self._chance(self.off)  # the relation read backwards: usually nothing
        children = [other, walk.node] if swap else [walk.node, other]
        quals = (rel or {}).get("qualifiers") or {}
        if not qualified:
            return Node("QueryRelation", [], children)
        relation = rel["relation"] if rel and not self._chance(self.off) else self.rng.choice(self.relations)
        qk = self.rng.choice(sorted(quals)) if quals and not self._chance(self.off) else (
            self.rng.choice(self.qkeys) if self.qkeys else None)
        if qk is None:
            return Node("QueryRelation", [], children)
        return Node("QueryRelationQualifier", [relation, qk], children)
