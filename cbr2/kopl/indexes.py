"""The indexes the project's KoPL engine (``cbr2.kopl.engine``) answers from, built once from a ``KB``.

``build_indexes(kb)`` gives a dict of plain containers (what the KB store, ``cbr2.data.kb_store``, saves
and maps back in): node ids in the reference engine's order (concepts, then entities) as small
integers, concept → members (the reference engine's subclass closure), per-(key, node) attribute
facts with parsed values and qualifiers, per-(relation, direction, node) neighbours with
qualifiers, forward facts by subject and by object, key → value type.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from cbr2.kb.model import KB
from cbr2.kopl.values import DATE, YEAR, Value, kb_value

INDEX_FORMAT = 1
"""Version of what ``build_indexes`` returns; the KB store keys its entries on it (bump on change)."""

Fact = tuple[int, dict[str, tuple[Value, ...]]]
"""A selected node and the qualifiers of the fact that selected it."""

_EMPTY: dict[str, tuple[Value, ...]] = {}  # the qualifiers of most facts (never written to)


def by_name(names: list[str | None]) -> dict[str | None, frozenset[int]]:
    """Name → the nodes so named."""
    out: dict[str | None, list[int]] = defaultdict(list)
    for n, name in enumerate(names):
        out[name].append(n)
    return {name: frozenset(ns) for name, ns in out.items()}


def build_indexes(kb: KB) -> dict[str, Any]:
    """The engine's indexes of ``kb`` (read, never written).

    Returns:
        ``{"ids", "nodes", "names", "members", "attrs", "rels", "forward", "backward", "key_type"}``:
        ``ids`` the node ids in node order, ``nodes`` how many of them are the KB's (the objects
        of relations the KB lacks come after them), ``names`` the node names (None for such an
        object); the rest are the indexes themselves (read-only once built). ``INDEX_FORMAT``
        names this layout.

    Raises:
        ValueError: On a date value that is neither a date nor a year (naming the KB file and entity).
    """
    parents, ids, node, node_names = _nodes(kb)
    n_nodes = len(ids)
    members = _members(parents, node)
    attrs, rels, forward, backward, key_type = _facts(kb, ids, node, node_names)
    return {"ids": ids, "nodes": n_nodes, "names": node_names, "members": members, "attrs": attrs,
            "rels": rels, "forward": forward, "backward": backward,
            "key_type": {k: DATE if t == YEAR else t for k, t in key_type.items()}}


def _nodes(kb: KB) -> tuple[dict[str, list[str]], list[str], dict[str, int], list[str | None]]:
    """Each id's parents, the ids in node order, each id's node and the nodes' names."""
    # The reference engine's one id space: concepts, then entities (an id that is both is
    # the entity, at the concept's place, as a dict update leaves it).
    parents: dict[str, list[str]] = {cid: con.get("subclassOf", []) for cid, con in kb.concepts.items()}
    names = {cid: con["name"] for cid, con in kb.concepts.items()}
    for eid, ent in kb.entities.items():
        parents[eid] = ent.get("instanceOf", [])
        names[eid] = ent["name"]
    ids = list(parents)
    node = {i: n for n, i in enumerate(ids)}
    node_names: list[str | None] = [names[i] for i in ids]
    return parents, ids, node, node_names


def _members(parents: dict[str, list[str]], node: dict[str, int]) -> dict[int, set[int]]:
    """Each concept's member nodes."""
    # Concept membership: every node is a member of each node reachable from its parents
    # (a parent that is the node itself is skipped; a cycle still reaches it).
    reach: dict[str, frozenset[int]] = {}

    def closure(p: str) -> frozenset[int]:
        if p not in reach:
            seen, todo = set(), [p]
            while todo:
                c = todo.pop()
                if c in node and c not in seen:
                    seen.add(c)
                    todo.extend(parents[c])
            reach[p] = frozenset(node[c] for c in seen)
        return reach[p]

    members: dict[int, set[int]] = defaultdict(set)
    ancestors_of: dict[tuple[str, ...], frozenset[int]] = {}
    for i, ps in parents.items():
        key = tuple(ps)
        if i in key:
            anc = frozenset().union(*(closure(p) for p in key if p != i and p in node))
        else:
            if key not in ancestors_of:
                ancestors_of[key] = frozenset().union(*(closure(p) for p in key if p in node))
            anc = ancestors_of[key]
        n = node[i]
        for c in anc:
            members[c].add(n)
    return dict(members)


def _facts(kb: KB, ids: list[str], node: dict[str, int], node_names: list[str | None]) -> tuple[Any, ...]:
    """The attribute and relation indexes, and the key types (``ids``, ``node`` and ``node_names``
    grow by the dangling objects of relations, nodes without a name)."""

    def node_of(item_id: str) -> int:
        n = node.get(item_id)
        if n is None:  # a dangling object (the schema check forbids it): a node without a name
            n = node[item_id] = len(node_names)
            ids.append(item_id)
            node_names.append(None)
        return n

    # Attribute and relation facts, and the key types the reference engine reads its
    # literals with (last value in KB order wins; years are dates).
    attrs: dict[str, dict[int, list[tuple[Value, dict[str, tuple[Value, ...]]]]]] = defaultdict(dict)
    rels: dict[tuple[str, str], dict[int, list[Fact]]] = defaultdict(dict)
    forward: dict[int, list[tuple[str, int, dict[str, tuple[Value, ...]]]]] = defaultdict(list)
    backward: dict[int, list[tuple[str, int, dict[str, tuple[Value, ...]]]]] = defaultdict(list)
    key_type: dict[str, str] = {}

    def qualifiers(raw: dict[str, list[dict[str, Any]]] | None) -> dict[str, tuple[Value, ...]]:
        if not raw:
            return _EMPTY
        for qk, qvs in raw.items():
            for qv in qvs:
                key_type[qk] = qv["type"]
        return {qk: tuple(kb_value(qv) for qv in qvs) for qk, qvs in raw.items()}

    def add_relation(n: int, rel: dict[str, Any], quals: dict[str, tuple[Value, ...]]) -> None:
        obj = node_of(rel["object"])
        rels[(rel["relation"], rel["direction"])].setdefault(n, []).append((obj, quals))
        if rel["direction"] == "forward":
            forward[n].append((rel["relation"], obj, quals))
            backward[obj].append((rel["relation"], n, quals))

    concepts = kb.concepts
    for eid, ent in kb.entities.items():
        n = node[eid]
        try:
            for attr in ent.get("attributes", ()):
                key = attr["key"]
                key_type[key] = attr["value"]["type"]
                value = kb_value(attr["value"])
                attrs[key].setdefault(n, []).append((value, qualifiers(attr.get("qualifiers"))))
            rel_quals = [qualifiers(rel.get("qualifiers")) for rel in ent.get("relations", ())]
        except ValueError as err:
            raise ValueError(f"{kb.source}: entity {eid!r}: {err}") from None
        for rel, quals in zip(ent.get("relations", ()), rel_quals):
            add_relation(n, rel, quals)
            if rel["object"] in concepts:
                # The reference engine stores a concept's relations on the concept, reversed.
                flipped = "backward" if rel["direction"] == "forward" else "forward"
                add_relation(node[rel["object"]], {"relation": rel["relation"], "direction": flipped,
                                                   "object": eid}, quals)
    return dict(attrs), dict(rels), dict(forward), dict(backward), key_type

