"""The KB model shared by KQA Pro and MetaQA.

Both KBs become the newer official KQA Pro ``kb.json`` schema (concepts with ``subclassOf``,
entity relations with ``relation`` and ``direction``), which is also what the reference KoPL
engine reads. The derived vocabulary (names, concepts, keys, relations, qualifier keys) is
what grounding checks and, later, canonicalisation and constrained decoding need.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from datetime import date
from functools import cached_property
from typing import Any


def format_value(value: dict[str, Any]) -> str:
    """Render a KB value dict (``{type, value, unit}``) as answers and triples write it.

    Quantities print as ``"206 centimetre"`` (no unit when it is ``"1"``), dates as
    ``yyyy-mm-dd``, years as the number.
    """
    typ, raw = value["type"], value["value"]
    if typ == "quantity":
        number = format_number(float(raw))
        unit = value.get("unit", "1")
        return number if unit == "1" else f"{number} {unit}"
    if typ == "date":
        return _iso_date(str(raw))
    if typ == "year":
        return str(int(raw))
    return str(raw)


def _iso_date(text: str) -> str:
    """``1998/7/16`` → ``1998-07-16``; text that is not a date is returned unchanged."""
    parts = re.split(r"[-/]", text.lstrip("-"))
    try:
        return date(*(int(p) for p in parts)).isoformat() if len(parts) == 3 else text
    except ValueError:
        return text


def format_number(x: float) -> str:
    """Integral values without decimals, others as Python prints them.

    The reference engine decides integrality with ``x - int(x) < 1e-5``, which is also true
    for every negative non-integer and prints -2.5 as -2; the symmetric test keeps the sign
    of the fraction right and agrees with the engine on all non-negative values.
    """
    if abs(x - int(x)) < 1e-5:
        return str(int(x))
    return str(x)


@dataclass
class Vocabulary:
    """Every schema item a program may name, by argument kind.

    Attributes:
        names: Entity and concept names (``Find`` accepts both, as in the engine).
        concepts: Concept names.
        keys: Attribute key → value type (``string``, ``quantity``, ``date``, ``year``).
        qualifier_keys: Qualifier key → value type.
        relations: Relation names.
        units: Attribute or qualifier key → units seen with it.
        relation_pairs: The ``(relation, direction)`` pairs on the entities' facts: what a
            ``Relate`` may be given.
    """

    names: set[str] = field(default_factory=set)
    concepts: set[str] = field(default_factory=set)
    keys: dict[str, str] = field(default_factory=dict)
    qualifier_keys: dict[str, str] = field(default_factory=dict)
    relations: set[str] = field(default_factory=set)
    units: dict[str, set[str]] = field(default_factory=dict)
    relation_pairs: set[tuple[str, str]] = field(default_factory=set)


@dataclass
class KB:
    """A knowledge base in the newer KQA Pro schema.

    Attributes:
        concepts: Concept id → ``{"name", "subclassOf": [ids]}``.
        entities: Entity id → ``{"name", "instanceOf", "attributes", "relations"}``; every
            relation is stored on both ends (``forward`` on the subject, ``backward`` on the
            object), as in the official file.
        source: Where it was read from, for messages.

    ``cbr2.data.kb_store.StoredKB`` is a KB read from the KB store (what ``Benchmark.kb`` returns):
    the same interface, with ``entities`` unpickled per access from the store entry.
    """

    concepts: dict[str, dict[str, Any]]
    entities: dict[str, dict[str, Any]]
    source: str = "<memory>"

    def to_kopl_dict(self) -> dict[str, Any]:
        """A deep copy in the engine's input form (the engine mutates what it is given)."""
        return {"concepts": copy.deepcopy(self.concepts), "entities": copy.deepcopy(self.entities)}

    def name_of(self, item_id: str) -> str:
        """Name of an entity or concept id."""
        item = self.entities.get(item_id) or self.concepts[item_id]
        return item["name"]

    def entity_ids_by_name(self) -> dict[str, list[str]]:
        """Each entity name's ids (names are not unique), in the KB's order."""
        ids: dict[str, list[str]] = {}
        for eid, ent in self.entities.items():
            ids.setdefault(ent["name"], []).append(eid)
        return ids

    @cached_property
    def vocabulary(self) -> Vocabulary:
        """The schema vocabulary, computed once."""
        voc = Vocabulary()
        voc.concepts = {c["name"] for c in self.concepts.values()}
        voc.names = voc.concepts | {e["name"] for e in self.entities.values()}
        for ent in self.entities.values():
            for attr in ent.get("attributes", []):
                _note(voc.keys, voc.units, attr["key"], attr["value"])
                for qk, qvs in attr.get("qualifiers", {}).items():
                    for qv in qvs:
                        _note(voc.qualifier_keys, voc.units, qk, qv)
            for rel in ent.get("relations", []):
                voc.relations.add(rel["relation"])
                voc.relation_pairs.add((rel["relation"], rel["direction"]))
                for qk, qvs in rel.get("qualifiers", {}).items():
                    for qv in qvs:
                        _note(voc.qualifier_keys, voc.units, qk, qv)
        return voc

    def stats(self) -> dict[str, int]:
        """Sizes for reports and logs."""
        voc = self.vocabulary
        return {
            "entities": len(self.entities),
            "concepts": len(self.concepts),
            "attribute_keys": len(voc.keys),
            "relations": len(voc.relations),
            "qualifier_keys": len(voc.qualifier_keys),
            "attribute_facts": sum(len(e.get("attributes", [])) for e in self.entities.values()),
            "relation_facts": sum(
                1 for e in self.entities.values() for r in e.get("relations", []) if r["direction"] == "forward"),
        }


def _note(types: dict[str, str], units: dict[str, set[str]], key: str, value: dict[str, Any]) -> None:
    typ = value["type"]
    # Years and dates share comparisons in KoPL; a key with both is a date key.
    if types.get(key) in ("date", "year") and typ in ("date", "year") and types[key] != typ:
        typ = "date"
    types[key] = typ
    if typ == "quantity":
        units.setdefault(key, set()).add(value.get("unit", "1"))
