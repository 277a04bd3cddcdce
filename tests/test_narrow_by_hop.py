"""Narrowing by hop (``generation.narrow_by_hop``): a ``Relate`` on a branch from ``Find`` takes a
pair of the entities at its own hop, with the same language on both engines (the token-level layer
of ``llamacpp`` and the per-request grammar of ``vllm``/``openai``, read by xgrammar)."""

from __future__ import annotations

import numpy as np
import pytest
from omegaconf import OmegaConf
from test_grounded_grammar import xgrammar_accepts
from test_narrow import _kb

from cbr2.config import Config
from cbr2.data.benchmarks import Benchmark
from cbr2.evaluation.runner import build_prompts, reach_of
from cbr2.generation.grammar import ProgramGrammar
from cbr2.generation.grounded import RELATE, GroundedMask, Reach, TokenTable, grounded_arguments, hop_kind, relate_hop
from cbr2.kopl.text import parse_text
from cbr2.retrieval.cases import Query
from cbr2.retrieval.knowledge import Knowledge
from cbr2.retrieval.linking import Links
from cbr2.retrieval.retriever import Retrieved


def test_each_hop_has_the_pairs_of_the_entities_a_walk_reaches_there():
    found = Reach(_kb(), hops=3, by_hop=True).candidates(Links(("Australia",), (), {}))
    # All four pairs are within 3 hops: the whole reach narrows nothing, each hop still does.
    assert RELATE not in found
    assert found[hop_kind(1)] == ("capital | forward",)
    assert found[hop_kind(2)] == ("capital | backward", "place of birth | backward")
    # A walk goes back: from Canberra to Australia again, and on to Ann.
    assert found[hop_kind(3)] == ("capital | forward", "place of birth | forward")
    # Not asked: no hop kinds.
    assert not any("@" in kind for kind in Reach(_kb(), hops=3).candidates(Links(("Australia",), (), {})))
    # One hop: the first hop's pairs are the whole reach's, left out as narrowing nothing more.
    one = Reach(_kb(), hops=1, by_hop=True).candidates(Links(("Australia",), (), {}))
    assert one[RELATE] == ("capital | forward",) and hop_kind(1) not in one


@pytest.mark.parametrize(("text", "hop"), [
    ("r1: Find[Ann] → ", 1),
    ("r1: Find[Ann] → Relate[place of birth | forward] → FilterConcept[city] → ", 2),
    ("r1: Find[Ann] → Relate[place of birth | forward] → Relate[capital | backward] → ", 3),
    ("r1: FindAll[] → Relate[capital | forward] → ", None),
    ("r1: Find[Ann]\nr2: Find[Canberra]\nr3: (r1, r2) → Or[] → ", None),
    ("r1: Find[Ann] → Relate[place of birth | forward]\nr2: Find[Canberra] → ", 1),
    ("Find[Ann]\nRelate[place of birth | forward]\n", 2),  # the chain form
    ("Find[Ann]\nFind[Canberra]\nAnd[]\n", None),
])
def test_the_hop_is_read_back_to_the_start_of_the_branch(text, hop):
    assert relate_hop(text) == hop


def test_predictions_record_the_kind_each_relate_was_narrowed_by():
    cands = {hop_kind(1): ("place of birth | forward",), hop_kind(2): ("capital | backward",)}
    program = parse_text("r1: Find[Ann] → Relate[place of birth | forward] → Relate[capital | forward] → QueryName[]")
    assert [(a["kind"], a["linked"]) for a in grounded_arguments(program, cands)] == [
        ("entity", False), (hop_kind(1), True), (hop_kind(2), False)]
    # After a join, the whole reach's kind (absent here: not recorded).
    joined = parse_text("r1: Find[Ann]\nr2: Find[Ann]\nr3: (r1, r2) → And[] → Relate[capital | forward] → Count[]")
    assert [a["kind"] for a in grounded_arguments(joined, cands)] == ["entity", "entity"]


def mask_accepts(candidates, fmt="dag", ends=False):
    """Whether the token layer lets a text be written one character at a time (a vocabulary of
    single characters: every text can be spelt, and the layer decides at every character), and
    with ``ends`` then end (an end token, as the model's end of text), every token allowed by the
    grammar."""
    chars = [chr(c) for c in range(32, 127)] + ["\n", "→", None]
    table = TokenTable(chars)
    index = {c: i for i, c in enumerate(chars)}

    def accepts(text: str) -> bool:
        ids = [index[c] for c in text] + ([len(chars) - 1] if ends else [])
        mask = GroundedMask(table, candidates, lambda got: "".join(chars[i] for i in got), fmt)
        return all(np.isfinite(mask(ids[:i], np.zeros(table.size))[ids[i]]) for i in range(len(ids)))

    return accepts


@pytest.fixture(scope="module")
def metaqa():
    return Benchmark("mini-metaqa")


@pytest.mark.parametrize("fmt", ["dag", "chain"])
def test_both_engines_narrow_each_hop_the_same_way(metaqa, fmt):
    kb = metaqa.kb
    grammar = ProgramGrammar(kb.vocabulary, fmt)
    reach = Reach(kb, hops=3, by_hop=True)
    name = next(e["name"] for e in kb.entities.values() if len(e.get("relations", [])) > 2)
    cands = {"entity": (name,), **reach.candidates(Links((name,), (), {}))}
    first, second = set(cands[hop_kind(1)]), set(cands.get(hop_kind(2), ()))
    assert first and second != first
    assert RELATE not in cands  # mini-metaqa: the whole KB is within 3 hops
    xgr = xgrammar_accepts(grammar.grounded_ebnf(cands))
    mask = mask_accepts(cands, fmt)
    pairs = sorted(f"{r} | {d}" for r in kb.vocabulary.relations for d in ("forward", "backward"))
    next(e["name"] for e in kb.entities.values() if e["name"] != name)
    sep = " → " if fmt == "dag" else "\n"
    label = (lambda n: f"r{n}: ") if fmt == "dag" else (lambda n: "")

    def program(*calls, start=None):
        return label(1) + sep.join([start or f"Find[{name}]", *calls, "QueryName[]"])

    texts = [program(f"Relate[{p}]") for p in pairs]
    texts += [program(f"Relate[{p}]", f"Relate[{q}]") for p in sorted(first)[:2] for q in pairs]
    texts += [program(f"Relate[{p}]", start="FindAll[]") for p in pairs[:4]]
    texts += [program("FilterConcept[" + min(kb.vocabulary.concepts) + "]", f"Relate[{p}]") for p in pairs]
    if fmt == "dag":  # after a join the hop is not counted; another Find counts from 1 again
        texts += [f"r1: Find[{name}]\nr2: Find[{name}]\nr3: (r1, r2) → Or[] → Relate[{p}] → Count[]" for p in pairs]
        texts += [f"r1: Find[{name}] → Relate[{min(first)}]\nr2: Find[{name}] → Relate[{p}]\n"
                  f"r3: (r1, r2) → And[] → Count[]" for p in pairs]
    accepted = 0
    for text in texts:
        assert grammar.accepts(text), text
        assert xgr(text) == mask(text), text
        accepted += xgr(text)
    assert 0 < accepted < len(texts)
    # What the layer means, spelt out on the first two hops.
    assert {p for p in pairs if xgr(program(f"Relate[{p}]"))} == first
    p = min(first)
    assert {q for q in pairs if xgr(program(f"Relate[{p}]", f"Relate[{q}]"))} == second
    assert all(xgr(program(f"Relate[{p}]", start="FindAll[]")) for p in pairs[:4])
    assert xgr(program("FilterConcept[" + min(kb.vocabulary.concepts) + "]", f"Relate[{p}]"))


def test_prompts_carry_each_hop_only_when_asked(metaqa):
    on = OmegaConf.structured(Config)
    question = metaqa.questions("dev")[0]
    name = next(e["name"] for e in metaqa.kb.entities.values() if e.get("relations"))
    links = Links((name,), (), {})
    retrieved = {question.qid: Retrieved(Query(question.qid, question.question), Knowledge(), [], links=links)}
    by_hop = OmegaConf.merge(on, {"generation": {"narrow_by_hop": True}})
    reach = reach_of(by_hop, metaqa)
    assert reach is not None and reach.by_hop and reach.hops == 3
    (prompt,) = build_prompts(by_hop.prompt, by_hop.generation, [question], retrieved, reach)
    assert hop_kind(1) in dict(prompt.grounding)
    plain = reach_of(OmegaConf.merge(on, {"generation": {"narrow_by_hop": False}}), metaqa)
    (prompt,) = build_prompts(on.prompt, on.generation, [question], retrieved, plain)
    assert not any("@" in kind for kind in dict(prompt.grounding))
