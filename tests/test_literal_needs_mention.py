"""``generation.literal_needs_mention``: a question in which linking read no value gets no call that
takes one, with the same meaning on both engines (the token layer of ``llamacpp`` and the
per-request grammar of ``vllm``/``openai``)."""

from __future__ import annotations

import numpy as np
import pytest
from omegaconf import OmegaConf
from test_grounded_grammar import xgrammar_accepts
from test_narrow_by_hop import mask_accepts

from cbr2.config import Config
from cbr2.data.benchmarks import Benchmark
from cbr2.evaluation.runner import build_prompts
from cbr2.generation.grammar import ProgramGrammar
from cbr2.generation.grounded import (
    ANSWER,
    LITERAL_KINDS,
    GroundedMask,
    TokenTable,
    closed_functions,
    live_functions,
    slot_candidates,
)
from cbr2.retrieval.cases import Query
from cbr2.retrieval.knowledge import Knowledge
from cbr2.retrieval.linking import Links
from cbr2.retrieval.retriever import Retrieved


def test_literal_kinds_are_closed_only_when_asked_and_no_value_is_read():
    none = Links(("Oceania",), (), {})
    question = "What is the population of Oceania?"
    assert not set(LITERAL_KINDS) & set(slot_candidates(none, question))  # left to the grammar
    closed = slot_candidates(none, question, literal_needs_mention=True)
    assert all(closed[kind] == () for kind in LITERAL_KINDS) and closed["entity"] == ("Oceania",)
    # One value read: the kinds it has none of stay with the grammar (a year may be a quantity).
    year = slot_candidates(Links((), ("rock band",), {"year": ("1970",)}),
                           "How many rock bands whose inception is in 1970 are there?", literal_needs_mention=True)
    assert year["year"] == ("1970",) and "quantity" not in year


def test_the_closed_functions_are_those_taking_a_closed_kind():
    shut = closed_functions({kind: () for kind in LITERAL_KINDS})
    assert {"FilterNum", "FilterYear", "FilterDate", "QFilterNum", "VerifyNum", "VerifyYear", "VerifyDate"} <= shut
    assert not {"FilterStr", "VerifyStr", "QueryAttr", "QueryAttrUnderCondition", "Find"} & shut
    assert closed_functions({"quantity": ("5",), "entity": ()}) == {"Find"}
    assert closed_functions({ANSWER: ()}) == frozenset()  # not an argument's kind
    assert "VerifyNum" not in live_functions(("bool",), shut) and "VerifyStr" in live_functions(("bool",), shut)


@pytest.fixture(scope="module")
def kqapro():
    return Benchmark("mini-kqapro")


@pytest.mark.parametrize("fmt", ["dag", "chain"])
@pytest.mark.parametrize("answers", [(), ("bool", "values")])
def test_both_engines_write_no_value_the_question_does_not_mention(kqapro, fmt, answers):
    vocab = kqapro.kb.vocabulary
    grammar = ProgramGrammar(vocab, fmt)
    entity = min(vocab.names)
    quantity = min(k for k, kind in vocab.keys.items() if kind == "quantity")
    string = min(k for k, kind in vocab.keys.items() if kind == "string")
    concept = min(vocab.concepts)
    open_ = {"entity": (entity,), **({ANSWER: answers} if answers else {})}
    shut = {**open_, **{kind: () for kind in LITERAL_KINDS}}
    sep = " → " if fmt == "dag" else "\n"
    label = "r1: " if fmt == "dag" else ""
    texts = {  # name → (program, written with every kind closed)
        "attr": (f"Find[{entity}]{sep}QueryAttr[{quantity}]", True),
        "verify str": (f"Find[{entity}]{sep}QueryAttr[{string}]{sep}VerifyStr[x]", True),
        "verify num": (f"Find[{entity}]{sep}QueryAttr[{quantity}]{sep}VerifyNum[5 | =]", False),
        "filter num": ((f"FindAll[]{sep}FilterNum[{quantity} | 5 | =]{sep}FilterConcept[{concept}]{sep}"
                        f"QueryAttr[{quantity}]"), False),
        "filter year": (f"Find[{entity}]{sep}FilterYear[{quantity} | 1970 | =]{sep}QueryAttr[{quantity}]", False),
    }
    for key, (text, kept) in texts.items():
        text = label + text
        assert grammar.accepts(text), text
        for cands, expected in ((open_, True), (shut, kept)):
            xgr = xgrammar_accepts(grammar.grounded_ebnf(cands))
            mask = mask_accepts(cands, fmt, ends=True)
            assert xgr(text) == mask(text) == expected, (key, cands, text)


def test_prompts_carry_the_closed_kinds_only_when_asked(kqapro):
    on = OmegaConf.merge(OmegaConf.structured(Config), {"generation": {"literal_needs_mention": True}})
    question = next(q for q in kqapro.questions("val") if q.question == q.question)
    links = Links(("Oceania",), (), {})
    retrieved = {question.qid: Retrieved(Query(question.qid, question.question), Knowledge(), [], links=links)}
    (closed,) = build_prompts(on.prompt, on.generation, [question], retrieved)
    assert all(dict(closed.grounding)[kind] == () for kind in LITERAL_KINDS)
    off = OmegaConf.merge(on, {"generation": {"literal_needs_mention": False}})
    (plain,) = build_prompts(off.prompt, off.generation, [question], retrieved)
    assert not set(LITERAL_KINDS) & set(dict(plain.grounding))
    valued = {question.qid: Retrieved(Query(question.qid, question.question), Knowledge(), [],
                                      links=Links(("Oceania",), (), {"quantity": ("5",)}))}
    assert dict(build_prompts(on.prompt, on.generation, [question], valued)[0].grounding)["quantity"] == ("5",)


def test_the_token_layer_never_forbids_every_token_the_grammar_allows():
    # "What box office does Gladiator have?": no value, so VerifyNum is closed, and the values the
    # cases end with make every Verify* a dead end. The grammar, after "→ Verify", allows VerifyStr
    # (open) and VerifyNum (closed): the layer keeps the open one. After "VerifyNum", where the grammar
    # allows only its bracket, the grammar's choice stays rather than no token at all.
    chars = [chr(c) for c in range(32, 127)] + ["\n", "→", None]
    table = TokenTable(chars)
    candidates = {"entity": ("Gladiator",), **{kind: () for kind in LITERAL_KINDS}, ANSWER: ("values",)}
    prefix = "r1: Find[Gladiator] → QueryAttr[box office] → Verify"
    mask = GroundedMask(table, candidates, lambda got: "".join(chars[i] for i in got))

    def allowed(text, grammar):
        scores = np.full(table.size, -np.inf)
        scores[[chars.index(c) for c in grammar]] = 0.0
        return {chars[i] for i in np.flatnonzero(np.isfinite(mask([chars.index(c) for c in text], scores)))}

    assert allowed(prefix, "SNYD") == {"S"}
    assert allowed(prefix + "Num", "[") == {"["}


def test_a_token_outside_the_grammar_ends_the_output_and_raises_after_it():
    import xgrammar as xgr

    from cbr2.llm.llamacpp import _GrammarMask

    vocab = ["a", "b", "</s>"]
    info = xgr.TokenizerInfo(vocab, stop_token_ids=[2])
    mask = _GrammarMask(xgr.GrammarCompiler(info).compile_grammar('root ::= "ab"'), 0, len(vocab), eos=2)
    scores = mask([0], np.zeros(len(vocab), dtype=np.float32))
    assert np.isfinite(scores).tolist() == [False, True, False] and mask.error is None
    _GrammarMask.raise_if_failed([mask])  # nothing to raise
    scores = mask([0, 0], np.zeros(len(vocab), dtype=np.float32))  # "aa": outside the grammar
    assert np.isfinite(scores).tolist() == [False, False, True]  # only the end of the output
    with pytest.raises(RuntimeError, match="token 0 was chosen outside the grammar"):
        _GrammarMask.raise_if_failed([mask])
