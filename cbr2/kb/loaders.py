"""Readers of the official KB files: KQA Pro ``kb.json`` (both schemas) and MetaQA ``kb.txt``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cbr2.kb.model import KB

METAQA_RELATIONS = {
    # relation -> concept of the tail (the head is always a movie)
    "directed_by": "person",
    "written_by": "person",
    "starred_actors": "person",
    "release_year": "year",
    "in_language": "language",
    "has_tags": "tag",
    "has_genre": "genre",
    "has_imdb_votes": "imdb votes",
    "has_imdb_rating": "imdb rating",
}
"""MetaQA's nine relations and the concept their tails get in the KB model."""


class KBFormatError(ValueError):
    """A KB file that does not follow the official format; the message names file and place."""


def load_kqapro_kb(path: str | Path) -> KB:
    """Read a KQA Pro ``kb.json`` in either published schema.

    The older schema writes a concept's parents as ``instanceOf`` and a relation's name as
    ``predicate``; the newer one (what the reference engine reads) ``subclassOf`` and
    ``relation``. Both become the newer one.

    Raises:
        KBFormatError: If the file is not JSON or lacks the expected keys.
    """
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise KBFormatError(f"{path}: not valid JSON ({err})") from err
    return kqapro_kb_from_dict(raw, str(path))


def kqapro_kb_from_dict(raw: dict[str, Any], source: str = "<memory>") -> KB:
    """Normalise an in-memory KQA Pro KB dict (either schema) into a ``KB``."""
    if not isinstance(raw, dict) or not {"concepts", "entities"} <= raw.keys():
        raise KBFormatError(f"{source}: expected an object with 'concepts' and 'entities'")
    concepts = {}
    for cid, con in raw["concepts"].items():
        parents = con.get("subclassOf", con.get("instanceOf"))
        if "name" not in con or parents is None:
            raise KBFormatError(f"{source}: concepts.{cid} needs 'name' and 'subclassOf' (or 'instanceOf')")
        concepts[cid] = {"name": con["name"], "subclassOf": list(parents)}
    entities = {}
    for eid, ent in raw["entities"].items():
        if "name" not in ent:
            raise KBFormatError(f"{source}: entities.{eid} has no 'name'")
        relations = []
        for k, rel in enumerate(ent.get("relations", [])):
            name = rel.get("relation", rel.get("predicate"))
            if name is None or "object" not in rel or rel.get("direction") not in ("forward", "backward"):
                raise KBFormatError(
                    f"{source}: entities.{eid}.relations[{k}] needs 'relation' (or 'predicate'), "
                    "'object' and a direction forward/backward")
            relations.append({"relation": name, "direction": rel["direction"], "object": rel["object"],
                              "qualifiers": rel.get("qualifiers", {})})
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
        KBFormatError: Naming the file and line of a malformed triple or unknown relation.
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
    with path.open(encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, 1):
            line = line.rstrip("\n").rstrip("\r")
            if not line.strip():
                continue
            parts = line.split("|")
            if len(parts) != 3 or not all(p.strip() for p in parts):
                raise KBFormatError(f"{path}:{lineno}: expected 'head|relation|tail', got {line!r}")
            head, rel, tail = (p.strip() for p in parts)
            if rel not in METAQA_RELATIONS:
                raise KBFormatError(f"{path}:{lineno}: unknown relation {rel!r}; MetaQA has {sorted(METAQA_RELATIONS)}")
            if (head, rel, tail) in seen:
                continue
            seen.add((head, rel, tail))
            h, t = entity(head, "movie"), entity(tail, METAQA_RELATIONS[rel])
            h["relations"].append({"relation": rel, "direction": "forward", "object": ids[tail], "qualifiers": {}})
            t["relations"].append({"relation": rel, "direction": "backward", "object": ids[head], "qualifiers": {}})
    if not entities:
        raise KBFormatError(f"{path}: no triples")
    return KB(concepts, entities, str(path))
