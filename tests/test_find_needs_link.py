"""``generation.find_needs_link``: a question in which linking found no KB entity gets no ``Find``,
with the same meaning on both engines (the token layer of ``llamacpp`` and the per-request grammar
of ``vllm``/``openai``)."""

from __future__ import annotations

import numpy as np
import pytest
from omegaconf import OmegaConf
from test_grounded_grammar import xgrammar_accepts

from cbr2.config import Config
from cbr2.data.benchmarks import Benchmark
from cbr2.evaluation.runner import build_prompts
from cbr2.generation.grammar import ProgramGrammar
from cbr2.generation.grounded import GroundedMask, TokenTable, slot_candidates
from cbr2.retrieval.cases import Query
from cbr2.retrieval.knowledge import Knowledge
from cbr2.retrieval.linking import Links
from cbr2.retrieval.retriever import Retrieved

QUESTION = "How many rock bands whose inception is in 1970 are there?"


def test_the_entity_kind_is_closed_only_when_asked_and_nothing_is_linked():
    nothing = Links((), ("rock band",), {"year": ("1970",)})
    assert "entity" not in slot_candidates(nothing, QUESTION)  # left to the grammar
    closed = slot_candidates(nothing, QUESTION, find_needs_link=True)
    assert closed["entity"] == () and closed["year"] == ("1970",)
    linked = Links(("Queen",), (), {})
    assert slot_candidates(linked, "Who founded Queen?", find_needs_link=True)["entity"] == ("Queen",)


def test_the_token_layer_opens_no_find_argument_of_a_closed_kind():
    texts = ["Find", "[", "All", "[]", "[Qu", "Find[", " →", "Count"]
    table = TokenTable(texts)
    text_of = {(): "r1: ", (0,): "r1: Find", (0, 2): "r1: FindAll"}

    def allowed(candidates, ids):
        mask = GroundedMask(table, candidates, lambda got: text_of[tuple(got)])
        return {texts[i] for i in np.flatnonzero(np.isfinite(mask(ids, np.zeros(table.size))))}

    closed = {"entity": (), "year": ("1970",)}
    assert "Find[" not in allowed(closed, ()) and "Find" in allowed(closed, ())  # FindAll stays possible
    after_find = allowed(closed, (0,))
    assert "[" not in after_find and "[Qu" not in after_find and "All" in after_find
    assert "[]" in allowed(closed, (0, 2))  # FindAll's own bracket is not an entity argument
    # Not closed: the same tokens stay (the grammar alone decides, or the candidates do).
    assert {"[", "[Qu"} <= allowed({"year": ("1970",)}, (0,))
    assert "[Qu" in allowed({"entity": ("Queen",)}, (0,)) and "[" in allowed({"entity": ("Queen",)}, (0,))


@pytest.fixture(scope="module")
def bench():
    return Benchmark("mini-kqapro")


def test_the_grammar_closes_find_the_same_way(bench):
    grammar = ProgramGrammar(bench.kb.vocabulary, "dag")
    name = min(bench.kb.vocabulary.names)
    closed = grammar.grounded_ebnf({"entity": (), "year": ("1970",)})
    assert closed != grammar.ebnf
    accepts = xgrammar_accepts(closed)
    count = "r1: FindAll[] → FilterYear[inception | 1970 | =] → Count[]"
    find = f"r1: Find[{name}] → QueryName[]"
    two = f"r1: FindAll[] → FilterYear[inception | 1970 | =]\nr2: Find[{name}]\nr3: (r1, r2) → And[] → Count[]"
    assert grammar.accepts(count) and grammar.accepts(find) and grammar.accepts(two)
    assert accepts(count)
    assert not accepts(find) and not accepts(two)  # on no line, first or later
    # The entity kind absent (nothing asked): Find stays.
    assert xgrammar_accepts(grammar.grounded_ebnf({"year": ("1970",)}))(find)


def test_prompts_carry_the_closed_kind_only_when_asked(bench):
    on = OmegaConf.structured(Config)
    assert on.generation.find_needs_link  # the default
    question = bench.questions("val")[0]
    links = Links((), (), {})
    retrieved = {question.qid: Retrieved(Query(question.qid, question.question), Knowledge(), [], links=links)}
    (closed,) = build_prompts(on.prompt, on.generation, [question], retrieved)
    assert dict(closed.grounding)["entity"] == ()
    off = OmegaConf.merge(on, {"generation": {"find_needs_link": False}})
    (plain,) = build_prompts(off.prompt, off.generation, [question], retrieved)
    assert "entity" not in dict(plain.grounding)
    # Grounded decoding off: nothing is closed either.
    ungrounded = OmegaConf.merge(on, {"generation": {"grounded": False}})
    assert build_prompts(ungrounded.prompt, ungrounded.generation, [question], retrieved)[0].grounding == ()
