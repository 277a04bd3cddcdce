"""Readers of the KB files: KQA Pro ``kb.json`` (both schemas), MetaQA ``kb.txt``, and a KB of your
own (``load_custom_kb``: KoPL JSON, or a triples file in the TAB or MetaQA's ``|`` form)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cbr2.data.reading import DataError, Problems, read_json, read_text
from cbr2.data.schema import (
    INSTANCE_OF,
    METAQA_RELATIONS,
    SUBCLASS_OF,
    Triple,
    parse_metaqa_kb,
    parse_triples,
    validate_kqapro_kb,
)
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
    return metaqa_kb_from_triples(parse_metaqa_kb(read_text(path), str(path)), str(path))


def metaqa_kb_from_triples(triples: list[tuple[str, str, str]], source: str) -> KB:
    """MetaQA's checked ``(head, relation, tail)`` triples as ``load_metaqa_kb`` models them."""
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
    for head, rel, tail in triples:
        if (head, rel, tail) in seen:
            continue
        seen.add((head, rel, tail))
        h, t = entity(head, "movie"), entity(tail, METAQA_RELATIONS[rel])
        h["relations"].append({"relation": rel, "direction": "forward", "object": ids[tail], "qualifiers": {}})
        t["relations"].append({"relation": rel, "direction": "backward", "object": ids[head], "qualifiers": {}})
    return KB(concepts, entities, source)


# ----------------------------------------------------------------------- your own KB

CUSTOM_KB_KINDS = ("kqapro", "triples")
"""What a KB file of your own is (``custom_kb_kind``): KoPL JSON, read as KQA Pro's ``kb.json``
(either schema), or a triples file."""


def custom_kb_kind(path: str | Path) -> str:
    """``kqapro`` for KoPL JSON (a ``.json`` file, or one whose text starts with ``{``), else ``triples``.

    Raises:
        DataError: If the file does not exist.
    """
    path = Path(path)
    if path.suffix.lower() == ".json":
        return "kqapro"
    try:
        with path.open("rb") as handle:
            head = handle.read(256).lstrip(b"\xef\xbb\xbf \t\r\n")
    except FileNotFoundError as err:
        raise DataError(f"{path}: file not found") from err
    return "kqapro" if head.startswith(b"{") else "triples"


def load_custom_kb(path: str | Path) -> KB:
    """Read a KB of your own: KoPL JSON (``load_kqapro_kb``) or a triples file (``load_triples_kb``),
    as ``custom_kb_kind`` tells them apart.

    Raises:
        KBFormatError: Naming the file and the line (or item) of the first problem.
    """
    return load_kqapro_kb(path) if custom_kb_kind(path) == "kqapro" else load_triples_kb(path)


def load_triples_kb(path: str | Path) -> KB:
    """Read a triples file (``cbr2.data.schema.parse_triples`` gives the format) into the KB model.

    Raises:
        KBFormatError: ``<file>:<line>: <what is wrong>`` at the first problem.
    """
    path = Path(path)
    return triples_kb(*parse_triples(read_text(path), str(path)), str(path))


def is_metaqa(form: str | None, triples: list[Triple]) -> bool:
    """Whether a triples file is MetaQA's KB: the ``|`` form, every relation one of MetaQA's."""
    return form == "pipe" and bool(triples) and all(t.relation in METAQA_RELATIONS for t in triples)


def triples_kb(form: str | None, triples: list[Triple], source: str) -> KB:
    """The KB of a triples file's checked triples (``parse_triples``).

    A ``|`` file whose relations are all MetaQA's is MetaQA's KB and is modelled as
    ``load_metaqa_kb`` models it (its tails' concepts come from their relation). Otherwise:
    every subject is an entity (a concept for ``subclass of``); ``instance of`` adds its object,
    a concept, to the subject's ``instanceOf``; ``subclass of`` to the subject concept's
    ``subclassOf``; an object that is a value (a date or a quantity of the TAB form) is an
    attribute of the subject under the relation's name; any other object is the entity of that
    name, related to the subject forward on the subject and backward on the object, as KQA Pro
    stores relations. Ids follow the order of first appearance (``c1`` ..., ``e1`` ...); a triple
    given twice is one fact, as in ``load_metaqa_kb``.
    """
    if is_metaqa(form, triples):
        return metaqa_kb_from_triples([(t.subject, t.relation, t.object) for t in triples], source)
    concepts: dict[str, dict[str, Any]] = {}
    entities: dict[str, dict[str, Any]] = {}
    concept_ids: dict[str, str] = {}
    entity_ids: dict[str, str] = {}

    def concept(name: str) -> str:
        if name not in concept_ids:
            concept_ids[name] = f"c{len(concept_ids) + 1}"
            concepts[concept_ids[name]] = {"name": name, "subclassOf": []}
        return concept_ids[name]

    def entity(name: str) -> str:
        if name not in entity_ids:
            entity_ids[name] = f"e{len(entity_ids) + 1}"
            entities[entity_ids[name]] = {"name": name, "instanceOf": [], "attributes": [], "relations": []}
        return entity_ids[name]

    def add(items: list[str], item: str) -> None:
        if item not in items:
            items.append(item)

    seen: set[tuple[str, str, str]] = set()
    for t in triples:
        if (t.subject, t.relation, t.object) in seen:
            continue
        seen.add((t.subject, t.relation, t.object))
        if t.relation == INSTANCE_OF:
            add(entities[entity(t.subject)]["instanceOf"], concept(t.object))
        elif t.relation == SUBCLASS_OF:
            add(concepts[concept(t.subject)]["subclassOf"], concept(t.object))
        elif t.value is not None:
            entities[entity(t.subject)]["attributes"].append({"key": t.relation, "value": dict(t.value),
                                                               "qualifiers": {}})
        else:
            s, o = entity(t.subject), entity(t.object)
            entities[s]["relations"].append({"relation": t.relation, "direction": "forward", "object": o,
                                             "qualifiers": {}})
            entities[o]["relations"].append({"relation": t.relation, "direction": "backward", "object": s,
                                             "qualifiers": {}})
    return KB(concepts, entities, source)


def check_triples_kb(path: str | Path, problems: Problems) -> tuple[str | None, KB | None]:
    """Every problem of a triples file (``problems`` collects), and its form and KB when it has none.

    The form is ``tab``, ``pipe`` or ``metaqa`` (a ``|`` file of MetaQA's relations).
    """
    before = len(problems.found)
    text = problems.guard(lambda: read_text(path))
    if text is None:
        return None, None
    form, triples = parse_triples(text, str(path), problems)
    if len(problems.found) > before:
        return form, None
    return ("metaqa" if is_metaqa(form, triples) else form), triples_kb(form, triples, str(path))
