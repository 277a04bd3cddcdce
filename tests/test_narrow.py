"""Narrowed grounded decoding (``generation.narrow``): ``Relate`` pairs and concepts drawn from the KB
around the question's linked entities, in the question's grammar on every engine (its text, as
``vllm``/``openai`` get it, and the ``llamacpp`` backend's compiled form)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf
from test_grounded_grammar import xgrammar_accepts
from test_llm_llamacpp import llamacpp_accepts, llamacpp_allowed

from cbr2.config import Config
from cbr2.data.benchmarks import Benchmark
from cbr2.generation.grammar import ProgramGrammar
from cbr2.generation.grounded import RELATE, Reach, pool_hops
from cbr2.kb.model import KB
from cbr2.kopl.text import parse_text
from cbr2.retrieval.cases import Query
from cbr2.retrieval.knowledge import Knowledge
from cbr2.retrieval.linking import Links
from cbr2.retrieval.retriever import Retrieved
from cbr2.run.runner import build_prompts, reach_of


def _kb() -> KB:
    concepts = {"c1": {"name": "place", "subclassOf": []}, "c2": {"name": "country", "subclassOf": ["c1"]},
                "c3": {"name": "city", "subclassOf": ["c1"]}, "c4": {"name": "human", "subclassOf": []},
                "c5": {"name": "river", "subclassOf": ["c1"]}}

    def rel(relation, direction, obj):
        return {"relation": relation, "direction": direction, "object": obj, "qualifiers": {}}

    ents = {
        "e1": {"name": "Australia", "instanceOf": ["c2"], "attributes": [],
               "relations": [rel("capital", "forward", "e2")]},
        "e2": {"name": "Canberra", "instanceOf": ["c3"], "attributes": [],
               "relations": [rel("capital", "backward", "e1"), rel("place of birth", "backward", "e3")]},
        "e3": {"name": "Ann", "instanceOf": ["c4"], "attributes": [],
               "relations": [rel("place of birth", "forward", "e2")]},
    }
    return KB(concepts, ents)


def test_pool_hops_is_the_longest_relate_chain_from_a_find():
    programs = [parse_text(t) for t in (
        "r1: Find[Ann] → Relate[place of birth | forward] → Relate[capital | backward] → QueryName[]",
        "r1: Find[Ann] → Relate[place of birth | forward] → QueryName[]",
        # From FindAll there is no entity to reach from: not counted, however long.
        "r1: FindAll[] → Relate[capital | forward] → Relate[capital | forward] → Relate[capital | forward] → Count[]",
        "r1: Find[Ann]\nr2: Find[Canberra] → Relate[capital | backward]\nr3: (r1, r2) → And[] → Relate[capital | forward] → Count[]",
    )]
    assert pool_hops(programs[1:2]) == 1
    assert pool_hops(programs[:2]) == 2
    assert pool_hops(programs[2:3]) == 0
    assert pool_hops(programs[3:]) == 2  # a join takes its deeper input
    assert pool_hops([]) == 0


def test_reach_reads_pairs_with_their_direction_and_concepts_with_superclasses():
    reach = Reach(_kb(), hops=1)
    found = reach.candidates(Links(("Australia",), ("human",), {}))
    assert found[RELATE] == ("capital | forward",)  # Canberra's own facts are a hop further
    assert set(found["concept"]) == {"human", "country", "city", "place"}
    two = Reach(_kb(), hops=2).candidates(Links(("Australia",), (), {}))
    assert two[RELATE] == ("capital | backward", "capital | forward", "place of birth | backward")
    # A kind whose reach covers all the KB has narrows nothing: left out.
    three = Reach(_kb(), hops=3)
    assert set(three.candidates(Links(("Australia",), (), {}))) == {"concept"}  # all 4 pairs; river missing
    assert three.candidates(Links(("Australia",), ("river",), {})) == {}
    # Nothing linked, or no hop allowed: nothing narrowed (the grammar alone decides).
    assert reach.candidates(Links((), ("human",), {})) == {}
    assert Reach(_kb(), hops=0).candidates(Links(("Australia",), (), {})) == {}


@pytest.fixture(scope="module")
def bench():
    return Benchmark("mini-kqapro")


def test_the_grammar_narrows_relate_the_same_way(bench):
    kb = bench.kb
    grammar = ProgramGrammar(kb.vocabulary, "dag")
    name = next(e["name"] for e in kb.entities.values() if e.get("relations"))
    cands = Reach(kb, hops=1).candidates(Links((name,), (), {}))
    on_vllm = xgrammar_accepts(grammar.grounded_ebnf({"entity": (name,), **cands}))
    on_llama = llamacpp_accepts(grammar, {"entity": (name,), **cands})

    def accepts(text: str) -> bool:
        assert on_vllm(text) == on_llama(text), text
        return on_vllm(text)

    pairs = set(cands[RELATE])
    for relation in sorted(kb.vocabulary.relations):
        for direction in ("forward", "backward"):
            text = f"r1: Find[{name}] → Relate[{relation} | {direction}] → QueryName[]"
            assert grammar.accepts(text)
            assert accepts(text) == (f"{relation} | {direction}" in pairs), text
    outside = sorted(kb.vocabulary.concepts - set(cands["concept"]))
    inside = sorted(cands["concept"])
    assert outside and inside
    concept = "r1: FindAll[] → FilterConcept[{}] → Count[]"
    assert accepts(concept.format(inside[0])) and not accepts(concept.format(outside[0]))
    # Pairs the KB grammar refuses are dropped; with none left, Relate keeps the KB grammar's rule.
    assert grammar.grounded_ebnf({RELATE: ("no such relation | forward", "capital | sideways")}) is grammar.ebnf


def test_a_relate_bracket_is_one_candidate_whatever_the_tokens(bench):
    """The whole bracket is one choice, so the direction goes with its relation, and a token that
    opens the bracket with the start of a relation out of reach is refused with the rest."""
    grammar = ProgramGrammar(bench.kb.vocabulary, "dag")
    cands = {"entity": ("Africa",), RELATE: ("continent | backward", "highest point | forward")}
    texts = [" forward", " backward", "[cont", "[high", "[capital", "continent |", "capital"]
    assert llamacpp_allowed(grammar, cands, texts, "r1: Find[Africa] → Relate[continent |") == {" backward"}
    assert llamacpp_allowed(grammar, cands, texts, "r1: Find[Africa] → Relate[highest point |") == {" forward"}
    assert llamacpp_allowed(grammar, cands, texts, "r1: Find[Africa] → Relate") == {"[cont", "[high"}
    assert llamacpp_allowed(grammar, cands, texts, "r1: Find[Africa] → Relate[") == {"continent |"}
    # Without narrowed pairs the KB grammar's relations and directions stay.
    free = llamacpp_allowed(grammar, {"entity": ("Africa",)}, texts, "r1: Find[Africa] → Relate[continent |")
    assert free == {" forward", " backward"}
    assert llamacpp_allowed(grammar, {"entity": ("Africa",)}, texts, "r1: Find[Africa] → Relate") == {
        "[cont", "[high", "[capital"}


def test_prompts_carry_the_narrowed_candidates_only_when_asked(bench):
    on = OmegaConf.structured(Config)
    assert on.generation.narrow  # the default
    question = bench.questions("val")[0]
    links = Links((next(iter(bench.kb.entities.values()))["name"],), (), {})
    retrieved = {question.qid: Retrieved(Query(question.qid, question.question), Knowledge(), [], links=links)}
    (plain,) = build_prompts(on.prompt, on.generation, [question], retrieved)
    assert RELATE not in dict(plain.grounding)  # no Reach given: nothing narrowed
    assert reach_of(OmegaConf.merge(on.generation, {"narrow": False}), on.retrieval.link, bench) is None
    reach = reach_of(on.generation, on.retrieval.link, bench)
    assert reach is not None and reach.hops == pool_hops(q.program for q in bench.questions("train"))
    (narrowed,) = build_prompts(on.prompt, on.generation, [question], retrieved, reach)
    grounding = dict(narrowed.grounding)
    assert grounding[RELATE] == reach.candidates(links)[RELATE]
    # Grounded decoding off: narrowing does not act either.
    assert reach_of(OmegaConf.merge(on.generation, {"grounded": False}), on.retrieval.link, bench) is None


def test_predictions_record_whether_each_relate_and_concept_was_in_reach():
    from cbr2.generation.grounded import grounded_arguments

    program = parse_text("r1: Find[Canberra] → Relate[capital | forward] → FilterConcept[country] → QueryName[]")
    cands = {"entity": ("Canberra",), RELATE: ("capital | backward",), "concept": ("country",)}
    assert grounded_arguments(program, cands) == [
        {"function": "Find", "kind": "entity", "value": "Canberra", "linked": True},
        {"function": "Relate", "kind": RELATE, "value": "capital | forward", "linked": False},
        {"function": "FilterConcept", "kind": "concept", "value": "country", "linked": True}]
    # Without narrowed candidates the record is what grounded decoding alone lists.
    assert [a["kind"] for a in grounded_arguments(program, {"entity": ("Canberra",)})] == ["entity"]
