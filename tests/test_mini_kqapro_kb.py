"""Tests for the hand-written mini-kqapro KB and its builder."""

import contextlib
import copy
import io
from collections import defaultdict
from pathlib import Path

import pytest

from cbr2.data.builders.mini_kqapro_kb import KBSourceError, build_kb, kb_stats

SOURCE = Path(__file__).resolve().parents[1] / "cbr2" / "data" / "sources" / "mini_kqapro_kb.yaml"


@pytest.fixture(scope="module")
def kb():
    return build_kb(SOURCE)


@pytest.fixture(scope="module")
def engine(kb):
    kopl = pytest.importorskip("kopl.kopl")
    # The engine prints progress and tqdm bars, and mutates the dict it gets.
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return kopl.KoPLEngine(copy.deepcopy(kb))


def test_ids_are_sequential_in_file_order(kb):
    assert list(kb["concepts"]) == [f"C{i}" for i in range(1, len(kb["concepts"]) + 1)]
    assert list(kb["entities"]) == [f"Q{i}" for i in range(1, len(kb["entities"]) + 1)]
    assert kb["entities"]["Q1"]["name"] == "Africa"


def test_coverage(kb):
    s = kb_stats(kb)
    assert s["entities"] >= 300 and s["concepts"] >= 50
    assert s["max_hierarchy_depth"] >= 3
    assert set(s["attribute_values_by_type"]) == {"string", "quantity", "date", "year"}
    assert s["attribute_values"] >= 1500 and s["relation_facts"] >= 1000
    assert s["attribute_qualifier_values"] > 0 and s["relation_qualifier_values"] > 0
    assert s["attribute_keys"] >= 40 and s["relations"] >= 30 and s["qualifier_keys"] >= 8
    units = {a["value"]["unit"] for e in kb["entities"].values() for a in e["attributes"]
             if a["value"]["type"] == "quantity"}
    assert {"1", "metre", "square kilometre", "United States dollar", "minute"} <= units


def test_names_unique_and_clean(kb):
    names = [c["name"] for c in kb["concepts"].values()] + [e["name"] for e in kb["entities"].values()]
    assert len(names) == len(set(names))
    assert all(n == n.lower() for n in (c["name"] for c in kb["concepts"].values()))
    for n in names:
        assert not any(ch in n for ch in "[]|→\n"), n


def test_each_key_has_one_type_and_unit(kb):
    signatures = defaultdict(set)  # attribute and qualifier keys share the engine's key_type table
    for ent in kb["entities"].values():
        facts = ent["attributes"] + ent["relations"]
        for a in ent["attributes"]:
            signatures[a["key"]].add((a["value"]["type"], a["value"].get("unit")))
        for f in facts:
            for qk, qvs in f["qualifiers"].items():
                signatures[qk].update((v["type"], v.get("unit")) for v in qvs)
    assert {k: v for k, v in signatures.items() if len(v) != 1} == {}
    assert signatures["date of birth"] == {("date", None)}
    assert signatures["inception"] == {("year", None)}
    assert signatures["height"] == {("quantity", "metre")}


def test_relations_are_mirrored(kb):
    ents = kb["entities"]
    forward, backward = set(), set()
    for eid, ent in ents.items():
        for r in ent["relations"]:
            assert r["object"] in ents or r["object"] in kb["concepts"]
            key = (r["relation"], repr(sorted(r["qualifiers"].items())))
            if r["direction"] == "forward":
                forward.add((eid, r["object"]) + key)
            else:
                backward.add((r["object"], eid) + key)
    assert forward == backward


def test_some_relations_are_asymmetric(kb):
    ents, concepts = kb["entities"], kb["concepts"]

    def types(eid):  # names of all concepts an entity belongs to, ancestors included
        todo, seen = list(ents[eid]["instanceOf"]), set()
        while todo:
            c = todo.pop()
            if c not in seen:
                seen.add(c)
                todo += concepts[c]["subclassOf"]
        return {concepts[c]["name"] for c in seen}

    pairs = defaultdict(set)
    for eid, ent in ents.items():
        for r in ent["relations"]:
            if r["direction"] == "forward":
                pairs[r["relation"]].add((eid, r["object"]))
    for rel, subj, obj in [("director", "film", "human"), ("capital", "country", "capital city"),
                           ("author", "literary work", "human"), ("mouth of the watercourse", "river", "body of water")]:
        assert pairs[rel] and not any((o, s) in pairs[rel] for s, o in pairs[rel]), rel
        assert all(subj in types(s) and obj in types(o) and subj not in types(o) for s, o in pairs[rel]), rel
    # a symmetric relation, for contrast, is stored in both directions
    assert all((b, a) in pairs["shares border with"] for a, b in pairs["shares border with"])


@pytest.mark.parametrize("funcs, inputs, expected", [
    (["Find", "QueryAttr"], [["Paris"], ["population"]], ["2145906"]),
    (["Find", "QueryAttr"], [["Mount Everest"], ["elevation above sea level"]], ["8849 metre"]),
    (["Find", "QueryAttr"], [["Dead Sea"], ["elevation above sea level"]], ["-430 metre"]),
    (["Find", "QueryAttr"], [["Albert Einstein"], ["date of birth"]], ["1879-03-14"]),
    (["Find", "Relate", "QueryName"], [["The Godfather"], ["director", "forward"]], ["Francis Ford Coppola"]),
    (["Find", "Relate", "QueryName"], [["Lake Geneva"], ["located in or next to body of water", "backward"]],
     ["Geneva"]),
    (["Find", "Find", "QueryRelation"], [["Paris"], ["France"]], ["country"]),
    (["Find", "Find", "QueryRelationQualifier"],
     [["Marie Curie"], ["Nobel Prize in Chemistry"], ["award received", "point in time"]], ["1911"]),
    (["Find", "QueryAttrQualifier"], [["France"], ["population", "67750000", "point in time"]], ["2021"]),
    (["Find", "Relate", "QFilterStr", "QueryName"],
     [["The Dark Knight"], ["cast member", "forward"], ["character role", "Joker"]], ["Heath Ledger"]),
    (["FindAll", "FilterConcept", "SelectAmong"], [[], ["mountain"], ["elevation above sea level", "largest"]],
     ["Mount Everest"]),
    (["FindAll", "FilterConcept", "FilterYear", "Count"], [[], ["university"], ["inception", "1400", "<"]], "5"),
])
def test_engine_answers(engine, funcs, inputs, expected):
    assert engine.forward(funcs, inputs) == expected


def test_engine_concept_hierarchy(engine):
    # "capital city" < "city" < "human settlement": Find + FilterConcept walks the hierarchy.
    got = engine.forward(["Find", "FilterConcept", "QueryName"], [["Tokyo"], ["human settlement"]])
    assert got == ["Tokyo"]


BASE = "concepts: {human: [], city: []}\nunits: {height: metre}\n"


@pytest.mark.parametrize("body, fragment", [
    ("entities:\n  Ann: {is: [person]}\n", "Ann > is: unknown concept 'person'"),
    ("entities:\n  Ann: {is: [human], rels: {spouse: Bob}}\n", "Ann > rels > spouse: unknown relation object 'Bob'"),
    ("entities:\n  Ann: {is: [human], attrs: {nick: x}}\n  Bob: {is: [human], attrs: {nick: 3}}\n",
     "Bob > attrs > nick"),
    ("entities:\n  Ann: {is: [human], attrs: {height: 1.7}}\n  Bob: {is: [human], attrs: {height: {q: 170, unit: cm}}}\n",
     "Bob > attrs > height"),
    ("entities:\n  Ann: {is: [human], attrs: {weight: 60}}\n", "no unit for 'weight'"),
    ("entities:\n  Ann: {is: [human], attrs: {code: NO}}\n", "Ann > attrs > code"),
    ("entities:\n  'A|nn': {is: [human]}\n", "entities > A|nn"),
    ("entities:\n  Ann: {is: [human], attrs: {nick: 'x [y]'}}\n", "Ann > attrs > nick"),
    ("entities:\n  Ann: {is: [human]}\n  Ann: {is: [city]}\n", "duplicate key 'Ann'"),
    ("entities:\n  city: {is: [human]}\n", "entities > city: name also used by a concept"),
    ("entitys:\n  Ann: {is: [human]}\n", "top level"),
    ("entities:\n  Ann: {is: [human], rels: {spouse: {to: Ann, qual: {}}}}\n", "Ann > rels > spouse: unknown field"),
    ("entities:\n  Ann: {is: [human], attrs: {start time: 1990-01-01}, "
     + "rels: {spouse: {to: Ann, quals: {start time: {year: 1990}}}}}\n", "spouse > quals > start time"),
])
def test_malformed_source_names_the_key(tmp_path, body, fragment):
    path = tmp_path / "kb.yaml"
    path.write_text(BASE + body, encoding="utf-8")
    with pytest.raises(KBSourceError) as err:
        build_kb(path)
    assert fragment in str(err.value)
