"""Linearisation of a KB into ontology triples and fact triples, the text retrieval indexes.

Ontology triples describe the schema: the concept hierarchy and, per concept, which
attributes (with value type and unit), relations (with direction and the concept at the other
end) and qualifier keys its direct instances have. Fact triples are entity-level statements,
one per attribute value or forward relation, with qualifiers inline.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

from cbr2.kb.model import KB, format_value


@dataclass(frozen=True)
class Triple:
    """A (subject, predicate, object) statement and its sentence for the encoder.

    Attributes:
        subject: Entity or concept name.
        predicate: Relation, attribute key or schema predicate (``subclass of`` ...).
        object: Name or value text.
        qualifiers: ``(key, value)`` pairs attached to the fact.
        terms: The schema items the triple mentions, as ``(kind, name)`` with kind ``concept``,
            ``key``, ``qkey`` or ``relation`` (the kinds of ``kopl.sketch.schema_items``);
            knowledge recall compares them with a gold program's items.
    """

    subject: str
    predicate: str
    object: str
    qualifiers: tuple[tuple[str, str], ...] = ()
    terms: frozenset[tuple[str, str]] = field(default=frozenset(), compare=False, repr=False)

    @property
    def text(self) -> str:
        """``subject | predicate | object`` with qualifiers in brackets: short and unambiguous."""
        base = f"{self.subject} | {self.predicate} | {self.object}"
        if self.qualifiers:
            base += " (" + "; ".join(f"{k}: {v}" for k, v in self.qualifiers) + ")"
        return base


def _qualifiers(raw: dict) -> tuple[tuple[str, str], ...]:
    return tuple((k, format_value(v)) for k in sorted(raw) for v in raw[k])


def fact_triples(kb: KB) -> Iterator[Triple]:
    """Entity-level facts: ``is a`` per concept, each attribute value and forward relation.

    Backward relations are the same facts seen from the object, so they are skipped.
    """
    for ent in kb.entities.values():
        name = ent["name"]
        for cid in ent.get("instanceOf", []):
            if cid in kb.concepts:
                cname = kb.concepts[cid]["name"]
                yield Triple(name, "instance of", cname, terms=frozenset({("concept", cname)}))
        for attr in ent.get("attributes", []):
            quals = attr.get("qualifiers", {})
            yield Triple(name, attr["key"], format_value(attr["value"]), _qualifiers(quals),
                         frozenset({("key", attr["key"])} | {("qkey", k) for k in quals}))
        for rel in ent.get("relations", []):
            if rel["direction"] == "forward":
                quals = rel.get("qualifiers", {})
                yield Triple(name, rel["relation"], kb.name_of(rel["object"]), _qualifiers(quals),
                             frozenset({("relation", rel["relation"])} | {("qkey", k) for k in quals}))


def ontology_triples(kb: KB) -> list[Triple]:
    """Schema-level triples, sorted for a stable index.

    Relation triples name the concept at the other end, e.g. ``human | educated at (forward) |
    university``, so the model learns the direction from the schema rather than by guessing.
    """
    out: set[Triple] = set()
    for con in kb.concepts.values():
        for parent in con.get("subclassOf", []):
            if parent in kb.concepts:
                pname = kb.concepts[parent]["name"]
                out.add(Triple(con["name"], "subclass of", pname,
                               terms=frozenset({("concept", con["name"]), ("concept", pname)})))
    concepts_of = {eid: [kb.concepts[c]["name"] for c in ent.get("instanceOf", []) if c in kb.concepts]
                   for eid, ent in kb.entities.items()}
    for eid, ent in kb.entities.items():
        for cname in concepts_of[eid]:
            con_term = ("concept", cname)
            for attr in ent.get("attributes", []):
                key = ("key", attr["key"])
                out.add(Triple(cname, "has attribute", f"{attr['key']} ({_value_kind(attr['value'])})",
                               terms=frozenset({con_term, key})))
                for qk in attr.get("qualifiers", {}):
                    out.add(Triple(cname, "attribute qualifier", f"{attr['key']} → {qk}",
                                   terms=frozenset({con_term, key, ("qkey", qk)})))
            for rel in ent.get("relations", []):
                rel_term = ("relation", rel["relation"])
                for other in concepts_of.get(rel["object"], ["entity"]) or ["entity"]:
                    out.add(Triple(cname, f"{rel['relation']} ({rel['direction']})", other,
                                   terms=frozenset({con_term, rel_term, ("concept", other)})))
                for qk in rel.get("qualifiers", {}):
                    out.add(Triple(cname, "relation qualifier", f"{rel['relation']} → {qk}",
                                   terms=frozenset({con_term, rel_term, ("qkey", qk)})))
    return sorted(out, key=lambda t: (t.subject, t.predicate, t.object))


def _value_kind(value: dict) -> str:
    unit = value.get("unit", "1")
    return f"quantity, {unit}" if value["type"] == "quantity" and unit != "1" else value["type"]


def triple_counts(kb: KB) -> dict[str, int]:
    """Numbers of ontology and fact triples (for logs and the closing stats)."""
    counts: dict[str, int] = defaultdict(int)
    counts["ontology"] = len(ontology_triples(kb))
    counts["facts"] = sum(1 for _ in fact_triples(kb))
    return dict(counts)
