"""Build the ``mini-kqapro`` KB from its hand-written YAML source.

The output follows the newer official KQA Pro ``kb.json`` schema, i.e. exactly
what ``kopl.kopl.KoPLEngine`` consumes. The YAML format is documented at the
top of ``cbr2/data/sources/mini_kqapro_kb.yaml``.
"""

from __future__ import annotations

import copy
import datetime as dt
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

FORBIDDEN = ("[", "]", "|", "→", "\n")


class KBSourceError(ValueError):
    """A malformed KB source; the message names the offending YAML key."""


class _UniqueKeyLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # C parser: ~10x faster
    """Safe loader that rejects duplicate mapping keys (PyYAML keeps the last)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise KBSourceError(f"duplicate key {key!r} (line {key_node.start_mark.line + 1})")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _check_text(text: Any, where: str) -> str:
    """Return ``text`` if it is a usable name/key/value, else raise naming ``where``."""
    if not isinstance(text, str) or not text:
        raise KBSourceError(f"{where}: expected a non-empty string, got {text!r}")
    bad = [c for c in FORBIDDEN if c in text]
    if bad:
        raise KBSourceError(f"{where}: {text!r} contains forbidden character {bad[0]!r}")
    return text


class _Builder:
    """Turns YAML values into kb.json value dicts and enforces one type/unit per key."""

    def __init__(self, units: dict):
        self.units = units
        # The engine keeps a single key -> type table shared by attribute and
        # qualifier keys, so the signature check spans both namespaces.
        self.signature: dict[str, tuple] = {}

    def value(self, key: str, raw: Any, where: str) -> tuple[dict, dict]:
        """Parse one YAML value into a (value dict, raw qualifiers) pair."""
        quals = {}
        if isinstance(raw, dict):
            raw = dict(raw)
            quals = raw.pop("quals", {}) or {}
            if len(raw) != 1 and not (set(raw) == {"q", "unit"}):
                raise KBSourceError(f"{where}: cannot parse value {raw!r}")
        if isinstance(raw, bool) or raw is None:  # YAML 1.1 turns NO/yes/~ into these
            raise KBSourceError(f"{where}: ambiguous value {raw!r}; quote it")
        if isinstance(raw, str):
            val = {"type": "string", "value": _check_text(raw, where)}
        elif isinstance(raw, (int, float)):
            val = self._quantity(key, raw, None, where)
        elif isinstance(raw, dt.date):
            val = {"type": "date", "value": raw.isoformat()}
        elif "s" in raw:
            val = {"type": "string", "value": _check_text(raw["s"], where)}
        elif "q" in raw:
            val = self._quantity(key, raw["q"], raw.get("unit"), where)
        elif "year" in raw and isinstance(raw["year"], int) and not isinstance(raw["year"], bool):
            val = {"type": "year", "value": raw["year"]}
        elif "date" in raw:
            try:
                val = {"type": "date", "value": dt.date.fromisoformat(str(raw["date"])).isoformat()}
            except ValueError as exc:
                raise KBSourceError(f"{where}: bad date {raw['date']!r}") from exc
        else:
            raise KBSourceError(f"{where}: cannot parse value {raw!r}")
        sig = (val["type"], val.get("unit"))
        if self.signature.setdefault(key, sig) != sig:
            raise KBSourceError(f"{where}: key {key!r} used as {sig} and as {self.signature[key]}")
        return val, quals

    def _quantity(self, key, q, unit, where) -> dict:
        if isinstance(q, bool) or not isinstance(q, (int, float)):
            raise KBSourceError(f"{where}: quantity {q!r} is not a number")
        # The engine prints quantities via int(); a negative fraction would lose its sign part.
        if q < 0 and q != int(q):
            raise KBSourceError(f"{where}: negative non-integer {q!r} is not supported")
        unit = unit or self.units.get(key)
        if unit is None:
            raise KBSourceError(f"{where}: no unit for {key!r}; give one or declare it in units:")
        return {"type": "quantity", "value": q, "unit": _check_text(str(unit), where)}

    def values(self, key: str, raw: Any, where: str) -> list[tuple[dict, dict]]:
        _check_text(key, where)
        return [self.value(key, r, where) for r in (raw if isinstance(raw, list) else [raw])]

    def qualifiers(self, raw: Any, where: str) -> dict:
        if not isinstance(raw, dict):
            raise KBSourceError(f"{where}: quals must be a mapping")
        out = {}
        for qk, qraw in raw.items():
            pairs = self.values(qk, qraw, f"{where} > quals > {qk}")
            if any(q for _, q in pairs):
                raise KBSourceError(f"{where} > quals > {qk}: qualifiers cannot be nested")
            out[qk] = [v for v, _ in pairs]
        return out


def build_kb(source: str | Path) -> dict:
    """Read the YAML source and return a KB dict in the KQA Pro ``kb.json`` schema.

    Args:
        source: Path to the YAML file.

    Returns:
        ``{"concepts": {cid: ...}, "entities": {eid: ...}}`` with ids ``C1..``/``Q1..``
        in file order and every forward relation mirrored as a backward one.

    Raises:
        KBSourceError: If the source is malformed; the message names the YAML key.
    """
    doc = yaml.load(Path(source).read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    if not isinstance(doc, dict) or set(doc) - {"units", "concepts", "entities"}:
        raise KBSourceError(f"top level: expected units/concepts/entities, got {sorted(doc or [])!r}")
    concepts_src, entities_src = doc.get("concepts") or {}, doc.get("entities") or {}
    b = _Builder(doc.get("units") or {})
    cid = {_check_text(n, f"concepts > {n}"): f"C{i}" for i, n in enumerate(concepts_src, 1)}
    eid = {_check_text(n, f"entities > {n}"): f"Q{i}" for i, n in enumerate(entities_src, 1)}
    clash = set(cid) & set(eid)
    if clash:  # the engine resolves Find() over concepts and entities together
        raise KBSourceError(f"entities > {min(clash)}: name also used by a concept")

    def concept_ids(names, where):
        names = names if isinstance(names, list) else [names]
        for n in names:
            if n not in cid:
                raise KBSourceError(f"{where}: unknown concept {n!r}")
        return [cid[n] for n in names]

    concepts = {cid[n]: {"name": n, "subclassOf": concept_ids(p or [], f"concepts > {n}")}
                for n, p in concepts_src.items()}
    entities = {eid[n]: {"name": n, "instanceOf": [], "attributes": [], "relations": []}
                for n in entities_src}
    backward = []
    for name, spec in entities_src.items():
        where, ent = f"entities > {name}", entities[eid[name]]
        spec = spec or {}
        unknown = set(spec) - {"is", "attrs", "rels"}
        if unknown:
            raise KBSourceError(f"{where}: unknown field {min(unknown)!r}")
        if not spec.get("is"):
            raise KBSourceError(f"{where} > is: at least one concept is required")
        ent["instanceOf"] = concept_ids(spec["is"], f"{where} > is")
        for key, raw in (spec.get("attrs") or {}).items():
            for val, quals in b.values(key, raw, f"{where} > attrs > {key}"):
                ent["attributes"].append({"key": key, "value": val,
                                          "qualifiers": b.qualifiers(quals, f"{where} > attrs > {key}")})
        for rel, raw in (spec.get("rels") or {}).items():
            rwhere = f"{where} > rels > {_check_text(rel, f'{where} > rels')}"
            for item in raw if isinstance(raw, list) else [raw]:
                if isinstance(item, dict) and set(item) - {"to", "quals"}:
                    raise KBSourceError(f"{rwhere}: unknown field {min(set(item) - {'to', 'quals'})!r}")
                target, quals = (item.get("to"), item.get("quals") or {}) if isinstance(item, dict) else (item, {})
                if target not in eid and target not in cid:
                    raise KBSourceError(f"{rwhere}: unknown relation object {target!r}")
                fact = {"relation": rel, "direction": "forward", "object": eid.get(target) or cid[target],
                        "qualifiers": b.qualifiers(quals, rwhere)}
                ent["relations"].append(fact)
                if target in eid:  # the engine mirrors concept objects itself
                    backward.append((eid[target], dict(copy.deepcopy(fact), direction="backward", object=eid[name])))
    for target, fact in backward:
        entities[target]["relations"].append(fact)
    return {"concepts": concepts, "entities": entities}


def kb_stats(kb: dict) -> dict:
    """Count what a KB holds, to check the coverage of the source.

    Args:
        kb: A KB dict as returned by :func:`build_kb`.

    Returns:
        A flat dict of counts (entities, concepts, hierarchy depth, values by type, ...).
    """
    concepts = kb["concepts"]

    def depth(c, seen=()):  # longest subclassOf chain; ``seen`` guards against cycles
        parents = [p for p in concepts[c]["subclassOf"] if p not in seen]
        return 1 + max((depth(p, seen + (c,)) for p in parents), default=-1) if parents else 0

    by_type, attr_q, rel_q, rels = Counter(), 0, 0, 0
    keys, rel_names, qkeys = set(), set(), set()
    for ent in kb["entities"].values():
        for a in ent["attributes"]:
            by_type[a["value"]["type"]] += 1
            keys.add(a["key"])
            qkeys.update(a["qualifiers"])
            attr_q += sum(map(len, a["qualifiers"].values()))
        for r in ent["relations"]:
            if r["direction"] == "forward":
                rels += 1
                rel_names.add(r["relation"])
                qkeys.update(r["qualifiers"])
                rel_q += sum(map(len, r["qualifiers"].values()))
    return {
        "entities": len(kb["entities"]), "concepts": len(concepts),
        "max_hierarchy_depth": max((depth(c) for c in concepts), default=0),
        "attribute_values": sum(by_type.values()),
        "attribute_values_by_type": dict(sorted(by_type.items())),
        "relation_facts": rels, "attribute_qualifier_values": attr_q, "relation_qualifier_values": rel_q,
        "attribute_keys": len(keys), "relations": len(rel_names), "qualifier_keys": len(qkeys),
    }
