"""Linearisation of a KB into ontology triples and fact triples, the text retrieval indexes.

Ontology triples describe the schema: the concept hierarchy and, per concept, which
attributes (with value type and unit), relations (with direction and the concept at the other
end) and qualifier keys its direct instances have. Fact triples are entity-level statements,
one per attribute value or forward relation, with qualifiers inline.

The ontology grows with the schema, not with the facts: each concept lists at most
``MAX_PER_CONCEPT`` items of each of its four kinds (attribute keys, attribute qualifiers,
relation ends, relation qualifiers), the ones most of its instances' facts use. A
KQA Pro-sized KB whose concepts each see hundreds of keys and concept pairs (as a KB with
random facts does) would otherwise list every combination any single fact shows: 800,897
ontology triples on a 17,000-entity synthetic KB, against the ~10,000-50,000 of a schema.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

from cbr2.kb.model import KB, format_value

MAX_PER_CONCEPT = 96
"""Most items of one kind an ontology lists for one concept (by support, then by text).

It bounds the ontology by ``len(kb.concepts) * (parents + 4 * MAX_PER_CONCEPT)`` whatever the
number of facts. The embedded benchmarks stay under it (their largest list: the 65 relation
ends of ``human`` in mini-kqapro, one of them the only fact about ``notable work`` of a tower,
which val questions ask about), so their ontology is what it was before the bound.
"""


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
        return f"{self.subject} | {self.predicate} | {self.object}{self.qualifier_text}"

    @property
    def qualifier_text(self) -> str:
        """`` (key: value; ...)`` of the fact's qualifiers, or "" without any."""
        return " (" + "; ".join(f"{k}: {v}" for k, v in self.qualifiers) + ")" if self.qualifiers else ""


def _qualifiers(raw: dict) -> tuple[tuple[str, str], ...]:
    return tuple((k, format_value(v)) for k in sorted(raw) for v in raw[k])


def fact_triples(kb: KB) -> Iterator[Triple]:
    """Entity-level facts: ``is a`` per concept, each attribute value and forward relation.

    Backward relations are the same facts seen from the object, so they are skipped.
    """
    # A KQA Pro-sized KB has ~650,000 facts over ~1,000 keys and relations: share each
    # distinct term set instead of building one per fact.
    terms: dict[tuple, frozenset[tuple[str, str]]] = {}

    def terms_of(kind: str, name: str, quals: dict) -> frozenset[tuple[str, str]]:
        memo = (kind, name, *sorted(quals)) if quals else (kind, name)
        found = terms.get(memo)
        if found is None:
            found = terms[memo] = frozenset({(kind, name)} | {("qkey", k) for k in quals})
        return found

    for ent in kb.entities.values():
        name = ent["name"]
        for cid in ent.get("instanceOf", []):
            if cid in kb.concepts:
                cname = kb.concepts[cid]["name"]
                yield Triple(name, "instance of", cname, terms=terms_of("concept", cname, {}))
        for attr in ent.get("attributes", []):
            quals = attr.get("qualifiers", {})
            yield Triple(name, attr["key"], format_value(attr["value"]), _qualifiers(quals) if quals else (),
                         terms_of("key", attr["key"], quals))
        for rel in ent.get("relations", []):
            if rel["direction"] == "forward":
                quals = rel.get("qualifiers", {})
                yield Triple(name, rel["relation"], kb.name_of(rel["object"]), _qualifiers(quals) if quals else (),
                             terms_of("relation", rel["relation"], quals))


def ontology_triples(kb: KB, max_per_concept: int = MAX_PER_CONCEPT) -> list[Triple]:
    """Schema-level triples, sorted for a stable index.

    Relation triples name the concept at the other end, e.g. ``human | educated at (forward) |
    university``, so the model learns the direction from the schema rather than by guessing.

    One pass over the facts counts, per concept of their subject, how often each schema item
    occurs (as plain tuples); triples are made only for the items kept. Per concept and kind
    at most ``max_per_concept`` items are kept, the most frequent first (ties by text), so the
    result is bounded by the schema (see ``MAX_PER_CONCEPT``).
    """
    out: set[Triple] = set()
    for con in kb.concepts.values():
        for parent in con.get("subclassOf", []):
            if parent in kb.concepts:
                pname = kb.concepts[parent]["name"]
                out.add(Triple(con["name"], "subclass of", pname,
                               terms=frozenset({("concept", con["name"]), ("concept", pname)})))
    concept_name = {cid: con["name"] for cid, con in kb.concepts.items()}
    concepts_of = {eid: [concept_name[c] for c in ent.get("instanceOf", []) if c in concept_name]
                   for eid, ent in kb.entities.items()}
    # Per concept: Counter of ("attr", key, kind) / ("attrq", key, qk) / ("rel", relation, direction,
    # other concept) / ("relq", relation, qk), counted over the facts of its direct instances.
    seen: dict[str, Counter] = defaultdict(Counter)
    for eid, ent in kb.entities.items():
        own = concepts_of[eid]
        if not own:
            continue
        items: list[tuple] = []
        for attr in ent.get("attributes", []):
            key = attr["key"]
            items.append(("attr", key, _value_kind(attr["value"])))
            items.extend(("attrq", key, qk) for qk in attr.get("qualifiers", {}))
        for rel in ent.get("relations", []):
            name, direction = rel["relation"], rel["direction"]
            items.extend(("rel", name, direction, other) for other in concepts_of.get(rel["object"]) or ["entity"])
            items.extend(("relq", name, qk) for qk in rel.get("qualifiers", {}))
        for cname in own:
            seen[cname].update(items)
    for cname, counts in seen.items():
        by_kind: dict[str, list[tuple]] = defaultdict(list)
        for item, n in counts.items():
            by_kind[item[0]].append((-n, item))
        for ranked in by_kind.values():
            ranked.sort()
            for _, item in ranked[:max_per_concept]:
                out.add(_schema_triple(cname, item))
    return sorted(out, key=lambda t: (t.subject, t.predicate, t.object))


def _schema_triple(cname: str, item: tuple) -> Triple:
    """The ontology triple of one counted schema item of concept ``cname``."""
    con = ("concept", cname)
    kind = item[0]
    if kind == "attr":
        _, key, value_kind = item
        return Triple(cname, "has attribute", f"{key} ({value_kind})", terms=frozenset({con, ("key", key)}))
    if kind == "attrq":
        _, key, qk = item
        return Triple(cname, "attribute qualifier", f"{key} → {qk}",
                      terms=frozenset({con, ("key", key), ("qkey", qk)}))
    if kind == "rel":
        _, name, direction, other = item
        return Triple(cname, f"{name} ({direction})", other,
                      terms=frozenset({con, ("relation", name), ("concept", other)}))
    _, name, qk = item
    return Triple(cname, "relation qualifier", f"{name} → {qk}",
                  terms=frozenset({con, ("relation", name), ("qkey", qk)}))


def _value_kind(value: dict) -> str:
    unit = value.get("unit", "1")
    return f"quantity, {unit}" if value["type"] == "quantity" and unit != "1" else value["type"]


def triple_counts(kb: KB) -> dict[str, int]:
    """Numbers of ontology and fact triples (for logs and the closing stats)."""
    counts: dict[str, int] = defaultdict(int)
    counts["ontology"] = len(ontology_triples(kb))
    counts["facts"] = sum(1 for _ in fact_triples(kb))
    return dict(counts)
