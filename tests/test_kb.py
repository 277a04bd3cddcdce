"""KB readers (both KQA Pro schemas, MetaQA kb.txt) and triple linearisation."""

import json

import pytest
from conftest import to_old_schema

from cbr2.data.kb_loaders import KBFormatError, load_kqapro_kb, load_metaqa_kb
from cbr2.kb.model import format_value
from cbr2.kb.triples import fact_triples, ontology_triples


def test_both_kqapro_schemas_give_the_same_kb(tmp_path, tiny_kb_dict):
    new, old = tmp_path / "new.json", tmp_path / "old.json"
    new.write_text(json.dumps(tiny_kb_dict))
    old.write_text(json.dumps(to_old_schema(tiny_kb_dict)))
    a, b = load_kqapro_kb(new), load_kqapro_kb(old)
    assert a.concepts == b.concepts and a.entities == b.entities
    assert a.concepts["C3"] == {"name": "city", "subclassOf": ["C2"]}
    assert a.vocabulary.relations == {"place of birth", "award received", "country"}
    assert a.vocabulary.keys["height"] == "quantity" and a.vocabulary.units["height"] == {"centimetre"}
    assert a.vocabulary.qualifier_keys == {"point in time": "year"}


def test_malformed_kb_errors_name_the_place(tmp_path, tiny_kb_dict):
    del tiny_kb_dict["entities"]["Q1"]["relations"][0]["direction"]
    path = tmp_path / "kb.json"
    path.write_text(json.dumps(tiny_kb_dict))
    with pytest.raises(KBFormatError, match=r"""kb\.json: entities\["Q1"\]\.relations\[0\]: missing key 'direction'"""):
        load_kqapro_kb(path)
    path.write_text("{not json")
    with pytest.raises(KBFormatError, match="not valid JSON"):
        load_kqapro_kb(path)


def test_metaqa_kb_keeps_names_with_commas_whole(tmp_path):
    path = tmp_path / "kb.txt"
    path.write_text("Paris, Texas|directed_by|Wim Wenders\nParis, Texas|release_year|1984\n"
                    "Wings of Desire|directed_by|Wim Wenders\nGirl, Interrupted|starred_actors|Winona Ryder\n")
    kb = load_metaqa_kb(path)
    names = {e["name"] for e in kb.entities.values()}
    assert {"Paris, Texas", "Girl, Interrupted", "Wim Wenders", "1984"} <= names
    wenders = next(e for e in kb.entities.values() if e["name"] == "Wim Wenders")
    assert sorted(kb.name_of(r["object"]) for r in wenders["relations"]) == ["Paris, Texas", "Wings of Desire"]
    assert {r["direction"] for r in wenders["relations"]} == {"backward"}


def test_metaqa_kb_errors_name_file_and_line(tmp_path):
    path = tmp_path / "kb.txt"
    path.write_text("A|directed_by|B\nA|directed_by\n")
    with pytest.raises(KBFormatError, match=r"kb\.txt: line 2: "):
        load_metaqa_kb(path)
    path.write_text("A|produced_by|B\n")
    with pytest.raises(KBFormatError, match=r"kb\.txt: line 1: relation: expected .* got the string 'produced_by'"):
        load_metaqa_kb(path)


def test_triples(tiny_kb):
    facts = {t.text for t in fact_triples(tiny_kb)}
    assert "Marie Curie | instance of | human" in facts
    assert "Marie Curie | height | 155 centimetre" in facts
    assert "Marie Curie | award received | Nobel Prize in Physics (point in time: 1903)" in facts
    assert "Warsaw | population | 1790658 (point in time: 2021)" in facts
    assert not any(t.startswith("Nobel Prize in Physics | award received") for t in facts)  # backward = duplicate
    onto = {t.text for t in ontology_triples(tiny_kb)}
    assert "city | subclass of | geographic location" in onto
    assert "human | has attribute | height (quantity, centimetre)" in onto
    assert "human | award received (forward) | award" in onto
    assert "award | award received (backward) | human" in onto
    assert "human | relation qualifier | award received → point in time" in onto
    assert "city | attribute qualifier | population → point in time" in onto


@pytest.mark.parametrize("value, text", [
    ({"type": "quantity", "value": 206, "unit": "centimetre"}, "206 centimetre"),
    ({"type": "quantity", "value": 5.0, "unit": "1"}, "5"),
    ({"type": "quantity", "value": -2.5, "unit": "metre"}, "-2.5 metre"),
    ({"type": "date", "value": "1867/11/07"}, "1867-11-07"),
    ({"type": "date", "value": "1998/7/6"}, "1998-07-06"),
    ({"type": "year", "value": 966}, "966"),
    ({"type": "string", "value": "female"}, "female"),
])
def test_format_value(value, text):
    assert format_value(value) == text
