"""``generation.find_needs_link``: a question in which linking found no KB entity gets no ``Find``,
in the question's grammar on every engine (its text, as ``vllm``/``openai`` get it, and the
``llamacpp`` backend's compiled form)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf
from test_grounded_grammar import xgrammar_accepts
from test_llm_llamacpp import llamacpp_accepts, llamacpp_allowed

from cbr2.config import Config
from cbr2.data.benchmarks import Benchmark
from cbr2.generation.grammar import ProgramGrammar
from cbr2.generation.grounded import slot_candidates
from cbr2.retrieval.cases import Query
from cbr2.retrieval.knowledge import Knowledge
from cbr2.retrieval.linking import Links
from cbr2.retrieval.retriever import Retrieved
from cbr2.run.runner import build_prompts

QUESTION = "How many rock bands whose inception is in 1970 are there?"


def test_the_entity_kind_is_closed_only_when_asked_and_nothing_is_linked():
    nothing = Links((), ("rock band",), {"year": ("1970",)})
    assert "entity" not in slot_candidates(nothing, QUESTION)  # left to the grammar
    closed = slot_candidates(nothing, QUESTION, find_needs_link=True)
    assert closed["entity"] == () and closed["year"] == ("1970",)
    linked = Links(("Queen",), (), {})
    assert slot_candidates(linked, "Who founded Queen?", find_needs_link=True)["entity"] == ("Queen",)


@pytest.fixture(scope="module")
def bench():
    return Benchmark("mini-kqapro")


def test_the_grammar_closes_find_the_same_way(bench):
    grammar = ProgramGrammar(bench.kb.vocabulary, "dag")
    name = min(bench.kb.vocabulary.names)
    closed = grammar.grounded_ebnf({"entity": (), "year": ("1970",)})
    assert closed != grammar.ebnf
    on_vllm, on_llama = xgrammar_accepts(closed), llamacpp_accepts(grammar, {"entity": (), "year": ("1970",)})

    def accepts(text: str) -> bool:
        assert on_vllm(text) == on_llama(text), text
        return on_vllm(text)
    count = "r1: FindAll[] → FilterYear[inception | 1970 | =] → Count[]"
    find = f"r1: Find[{name}] → QueryName[]"
    two = f"r1: FindAll[] → FilterYear[inception | 1970 | =]\nr2: Find[{name}]\nr3: (r1, r2) → And[] → Count[]"
    assert grammar.accepts(count) and grammar.accepts(find) and grammar.accepts(two)
    assert accepts(count)
    assert not accepts(find) and not accepts(two)  # on no line, first or later
    # The entity kind absent (nothing asked): Find stays.
    assert xgrammar_accepts(grammar.grounded_ebnf({"year": ("1970",)}))(find)
    assert llamacpp_accepts(grammar, {"year": ("1970",)})(find)


def test_no_token_opens_a_find_argument_of_a_closed_kind(bench):
    """Tokenizers merge a bracket with what follows: with ``Find`` closed, neither ``Find[`` nor a
    ``[`` that would open its argument is allowed, while ``FindAll``'s own bracket is."""
    grammar = ProgramGrammar(bench.kb.vocabulary, "dag")
    texts = ["Find", "Find[", "[", "All", "[]", "[Ab", "Count"]
    closed = {"entity": (), "year": ("1970",)}
    assert llamacpp_allowed(grammar, closed, texts, "r1: ") == {"Find"}  # not "Find["
    assert llamacpp_allowed(grammar, closed, texts, "r1: Find") == {"All"}
    assert llamacpp_allowed(grammar, closed, texts, "r1: FindAll") == {"[", "[]"}
    # Not closed: the same tokens stay (the KB grammar decides, or the candidates do).
    assert llamacpp_allowed(grammar, {"year": ("1970",)}, texts, "r1: Find") == {"[", "All", "[Ab"}
    assert llamacpp_allowed(grammar, {"entity": ("Abuja",)}, texts, "r1: Find") == {"[", "All", "[Ab"}
    assert llamacpp_allowed(grammar, {"entity": ("Oceania",)}, texts, "r1: Find") == {"[", "All"}


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
