"""Linking (cbr2.retrieval.linking) and grounded decoding's candidates (cbr2.generation.grounded)."""

from __future__ import annotations

import pytest

from cbr2.data.benchmarks import Benchmark
from cbr2.generation.grounded import grounded_arguments, slot_candidates
from cbr2.kb.model import KB
from cbr2.kopl.text import parse_text
from cbr2.retrieval.linking import Linker, Links, question_spans
from cbr2.retrieval.metrics import linking_metrics


def _kb() -> KB:
    concepts = {"c1": {"name": "river", "subclassOf": []}, "c2": {"name": "country", "subclassOf": []},
                "c3": {"name": "city", "subclassOf": []}}
    ents = {
        "e1": {"name": "Paris", "instanceOf": ["c3"], "attributes": [], "relations": []},
        "e2": {"name": "Paris, Texas", "instanceOf": ["c3"], "attributes": [], "relations": []},
        "e3": {"name": "Texas", "instanceOf": [], "attributes": [], "relations": []},
        "e4": {"name": "Inception", "instanceOf": [], "attributes": [], "relations": []},
        "e5": {"name": "Switzerland", "instanceOf": ["c2"], "relations": [],
               "attributes": [{"key": "area", "value": {"type": "quantity", "value": "41285", "unit": "square kilometre"},
                               "qualifiers": {}},
                              {"key": "nominal GDP", "value": {"type": "quantity", "value": "9", "unit": "United States dollar"},
                               "qualifiers": {}},
                              {"key": "language family", "value": {"type": "string", "value": "Niger-Congo"},
                               "qualifiers": {}}]},
        "e6": {"name": "United States dollar", "instanceOf": [], "attributes": [], "relations": []},
    }
    return KB(concepts, ents)


def test_entities_casing_nesting_and_values():
    linker = Linker(_kb())
    links = linker.link("Which rivers of Switzerland are longer than 1,200 square kilometre, unlike Paris, Texas?")
    assert links.entities == ("Switzerland", "Paris, Texas")  # the longest of nested matches
    assert links.concepts == ("river",)  # plural
    assert links.values["quantity"] == ("1200 square kilometre",)
    # Lower case inside a cased question is not a name ("inception" the attribute, not the film).
    assert linker.link("Which city has an inception after 1912?").entities == ()
    assert linker.link("Which city has an inception after 1912?").values["year"] == ("1912",)
    # A unit is part of the value, not an entity.
    assert linker.link("Which film cost 5 United States dollar?").entities == ()


def test_dates_strings_and_brackets():
    linker = Linker(_kb())
    links = linker.link('Who was born before 1 January 1980 and speaks a Niger-Congo language called "Zulu"?')
    assert links.values["date"] == ("1980-01-01",)
    assert links.values["string"] == ("Niger-Congo", "Zulu")
    assert "1" not in links.values["quantity"]  # numbers inside a date are not quantities
    # MetaQA: the bracketed topic, case-insensitively; nothing else.
    assert linker.link("what films were shot in [paris, texas] near texas").entities == ("Paris, Texas",)


def test_mask_writes_each_mention_as_its_type():
    linker = Linker(_kb())
    # Entities become their first concept (or "entity"), values their kind; concepts stay.
    assert (linker.mask("Which rivers of Switzerland are longer than 1,200 square kilometre, unlike Paris, Texas?")
            == "Which rivers of [country] are longer than [quantity], unlike [city]?")
    assert linker.mask("Was Texas founded in 1845?") == "Was [entity] founded in [year]?"
    assert (linker.mask('Who was born before 1 January 1980 and speaks "Zulu"?')
            == 'Who was born before [date] and speaks "[text]"?')
    # MetaQA: the bracketed topic, brackets included; a bracket the KB lacks stays as written.
    assert linker.mask("what films were shot in [paris, texas]") == "what films were shot in [city]"
    assert linker.mask("who directed [Nowhere]") == "who directed [Nowhere]"
    assert linker.mask("") == ""


def test_masked_questions_of_one_template_read_alike():
    """What masking is for: two MetaQA questions of one template about different movies become one text."""
    bench = Benchmark("mini-metaqa")
    linker = Linker(bench.kb)
    questions = bench.questions("dev")
    by_text: dict[str, list[str]] = {}
    for q in questions:
        by_text.setdefault(linker.mask(q.question), []).append(str(q.program.steps[1:]))
    shared = [programs for programs in by_text.values() if len(programs) > 1]
    # Unmasked, every question is its own text; masked, a third of them coincide (198 texts for
    # 300 questions when written), and a text shared by several questions means one program shape.
    assert len({q.question for q in questions}) == len(questions)
    assert len(by_text) < 0.8 * len(questions) and len(shared) > 30
    assert sum(len(set(p)) == 1 for p in shared) > 0.9 * len(shared)


def test_question_spans():
    spans = question_spans("Is Niger-Congo big?", max_words=2)
    assert "Niger-Congo" in spans and "Is Niger" in spans and "big" in spans
    assert all(not s.endswith("?") for s in spans)


def test_linking_metrics_count_find_and_literals():
    gold = [parse_text("r1: Find[Switzerland] → QueryAttr[area] → VerifyNum[10 square kilometre | >]")]
    out = linking_metrics(gold, [{"entities": ["Switzerland", "Texas"], "values": ["10 square kilometre"]}])
    assert out["entities"] == {"precision": 0.5, "recall": 1.0, "true": 1, "linked": 2, "gold": 1}
    assert out["values"]["recall"] == 1.0


def test_linking_on_the_embedded_validation_split():
    bench = Benchmark("mini-kqapro")
    questions = bench.questions("val")
    linker = Linker(bench.kb)
    links = [linker.link(q.question) for q in questions]
    m = linking_metrics([q.program for q in questions],
                        [{"entities": lk.entities, "values": lk.all_values()} for lk in links])
    assert m["entities"]["recall"] > 0.95 and m["entities"]["precision"] > 0.9
    assert m["values"]["recall"] > 0.95 and m["values"]["precision"] > 0.8


def test_slot_candidates_and_record():
    links = Links(("Spain",), (), {"quantity": ("3715 metre",), "year": ("2019",), "date": (), "string": ()})
    cands = slot_candidates(links, "Is the volcano of Spain 3715 metre high in 2019?")
    assert cands["entity"] == ("Spain",) and cands["date"] == ("2019",) and "volcano" in cands["string"]
    program = parse_text("r1: Find[Canada] → QueryAttr[elevation above sea level] → VerifyNum[3715 metre | =]")
    recorded = grounded_arguments(program, cands)
    assert recorded == [{"function": "Find", "kind": "entity", "value": "Canada", "linked": False},
                        {"function": "VerifyNum", "kind": "quantity", "value": "3715 metre", "linked": True}]


@pytest.mark.parametrize("question", ["", "?", "1"])
def test_degenerate_questions(question):
    assert isinstance(Linker(_kb()).link(question), Links)


def test_linking_counts_merge_across_shards():
    from cbr2.retrieval.metrics import merge_retrieval

    gold = [parse_text("r1: Find[Switzerland] → QueryName[]"), parse_text("r1: Find[Spain] → QueryName[]")]
    found = [{"entities": ["Switzerland"], "values": []}, {"entities": ["Spain", "Texas"], "values": []}]
    blocks = [{"n": 1, "cases": {}, "encoders": {}, "linking": linking_metrics(gold[i:i + 1], found[i:i + 1])}
              for i in range(2)]
    assert merge_retrieval(blocks)["linking"] == linking_metrics(gold, found)
