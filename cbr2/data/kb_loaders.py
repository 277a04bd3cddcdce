"""Readers of the official KB files: KQA Pro ``kb.json`` (both schemas) and MetaQA ``kb.txt``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cbr2.data.reading import DataError, read_json, read_text
from cbr2.data.schema import METAQA_RELATIONS, parse_metaqa_kb, validate_kqapro_kb
from cbr2.kb.model import KB

KBFormatError = DataError
"""The name this module's callers know; every data file problem is one ``DataError``."""


def load_kqapro_kb(path: str | Path) -> KB:
    """Read a KQA Pro ``kb.json`` in either published schema.

    The older schema writes a concept's parents as ``instanceOf`` and a relation's name as
    ``predicate``; the newer one (what the reference engine reads) ``subclassOf`` and
    ``relation``. Both become the newer one.

    Raises:
        KBFormatError: Naming the file and the item (or line and column) at the first problem:
            not UTF-8, not JSON, or not the official schema (see ``cbr2.data.schema``).
    """
    return kqapro_kb_from_dict(read_json(path), str(path))


def kqapro_kb_from_dict(raw: dict[str, Any], source: str = "<memory>") -> KB:
    """Validate an in-memory KQA Pro KB dict (either schema) and normalise it into a ``KB``.

    Raises:
        KBFormatError: Naming ``source`` and the item at the first problem.
    """
    validate_kqapro_kb(raw, source)
    # From here on the data is known to be well formed: this only renames the older schema's fields.
    concepts = {cid: {"name": con["name"], "subclassOf": list(con.get("subclassOf", con.get("instanceOf")))}
                for cid, con in raw["concepts"].items()}
    entities = {}
    for eid, ent in raw["entities"].items():
        relations = [{"relation": rel.get("relation", rel.get("predicate")), "direction": rel["direction"],
                      "object": rel["object"], "qualifiers": rel.get("qualifiers", {})}
                     for rel in ent.get("relations", [])]
        entities[eid] = {"name": ent["name"], "instanceOf": list(ent.get("instanceOf", [])),
                         "attributes": [dict(a, qualifiers=a.get("qualifiers", {})) for a in ent.get("attributes", [])],
                         "relations": relations}
    return KB(concepts, entities, source)


def load_metaqa_kb(path: str | Path) -> KB:
    """Read MetaQA's ``kb.txt`` (``head|relation|tail`` per line) into the KB model.

    Every distinct name becomes one entity (names with commas stay whole: only ``|``
    separates fields). Heads are instances of ``movie``; tails of the concept their
    relation implies (``person``, ``year``, ...). Each triple is stored forward on the head
    and backward on the tail, as KQA Pro stores relations.

    Raises:
        KBFormatError: Naming the file and line of a malformed triple or unknown relation, or
            the line and byte offset of text that is not UTF-8.
    """
    path = Path(path)
    concept_ids = {"movie": "c0"}
    for concept in dict.fromkeys(METAQA_RELATIONS.values()):
        concept_ids.setdefault(concept, f"c{len(concept_ids)}")
    concepts = {cid: {"name": name, "subclassOf": []} for name, cid in concept_ids.items()}
    entities: dict[str, dict[str, Any]] = {}
    ids: dict[str, str] = {}

    def entity(name: str, concept: str) -> dict[str, Any]:
        if name not in ids:
            ids[name] = f"m{len(ids)}"
            entities[ids[name]] = {"name": name, "instanceOf": [], "attributes": [], "relations": []}
        ent = entities[ids[name]]
        if concept_ids[concept] not in ent["instanceOf"]:
            ent["instanceOf"].append(concept_ids[concept])
        return ent

    seen: set[tuple[str, str, str]] = set()
    for head, rel, tail in parse_metaqa_kb(read_text(path), str(path)):
        if (head, rel, tail) in seen:
            continue
        seen.add((head, rel, tail))
        h, t = entity(head, "movie"), entity(tail, METAQA_RELATIONS[rel])
        h["relations"].append({"relation": rel, "direction": "forward", "object": ids[tail], "qualifiers": {}})
        t["relations"].append({"relation": rel, "direction": "backward", "object": ids[head], "qualifiers": {}})
    return KB(concepts, entities, str(path))
