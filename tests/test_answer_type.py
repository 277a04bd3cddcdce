"""The program's answer type from the structural view's cases (``generation.answer_type``): what
the cases end with, and the question's grammar that ends every program with one of them, on every
engine (its text, as ``vllm``/``openai`` get it, and the ``llamacpp`` backend's compiled form)."""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf
from test_grounded_grammar import xgrammar_accepts
from test_llm_llamacpp import llamacpp_accepts

from cbr2.config import Config
from cbr2.data.benchmarks import Benchmark
from cbr2.generation.grammar import Bounds, ProgramGrammar
from cbr2.generation.grounded import ANSWER, case_answer_types
from cbr2.kopl.text import parse_text
from cbr2.retrieval.cases import Case, Query
from cbr2.retrieval.knowledge import Knowledge
from cbr2.retrieval.linking import Links
from cbr2.retrieval.retriever import Retrieved
from cbr2.run.runner import build_prompts


@pytest.fixture(scope="module")
def kqapro():
    return Benchmark("mini-kqapro")


def _case(bench, text: str, views: tuple[str, ...], i: int = 0) -> Case:
    question = dataclasses.replace(bench.questions("train")[i], program=parse_text(text))
    return Case(question, views, tuple(0.5 for _ in views))


def test_the_answer_types_are_those_the_structural_cases_end_with(kqapro):
    cases = [
        _case(kqapro, "r1: FindAll[] → FilterConcept[city] → Count[]", ("semantic",)),
        _case(kqapro, "r1: FindAll[] → QueryAttr[population] → VerifyNum[5 | =]", ("semantic", "structural")),
        _case(kqapro, "r1: FindAll[] → What[]", ("structural",)),
        _case(kqapro, "r1: FindAll[] → FilterConcept[city] → QueryName[]", ("structural",)),
    ]
    # The semantic case's Count is not among them; What and QueryName are one type.
    assert case_answer_types(cases) == ("bool", "names")
    assert case_answer_types(cases[:1]) == ()


@pytest.mark.parametrize("fmt", ["dag", "chain"])
@pytest.mark.parametrize(("answers", "expected"), [
    (("count",), {"count"}),
    (("bool",), {"verify"}),
    (("values",), {"attr"}),
    (("names", "count"), {"count", "name", "what"}),
    (("names", "name", "count", "bool", "relations", "qualifiers", "values"),
     {"count", "verify", "attr", "name", "what", "between"}),
])
def test_both_engines_end_the_program_as_the_cases_do(kqapro, fmt, answers, expected):
    grammar = ProgramGrammar(kqapro.kb.vocabulary, fmt)
    entity = min(kqapro.kb.vocabulary.names)
    keys = kqapro.kb.vocabulary.keys
    attribute = min(k for k, kind in keys.items() if kind == "string")
    quantity = min(k for k, kind in keys.items() if kind == "quantity")
    cands = {"entity": (entity,), ANSWER: answers}
    sep = " → " if fmt == "dag" else "\n"
    label = "r1: " if fmt == "dag" else ""
    texts = {
        "count": f"FindAll[]{sep}Count[]",
        "verify": f"Find[{entity}]{sep}QueryAttr[{attribute}]{sep}VerifyStr[x]",
        "attr": f"Find[{entity}]{sep}QueryAttr[{attribute}]",
        "name": f"FindAll[]{sep}QueryName[]",
        "what": f"Find[{entity}]{sep}What[]",
    }
    texts = {key: label + text for key, text in texts.items()}
    between = (f"r1: Find[{entity}]\nr2: FindAll[]\nr3: (r1, r2) → SelectBetween[{quantity} | greater]" if fmt == "dag"
               else f"Find[{entity}]\nFindAll[]\nSelectBetween[{quantity} | greater]")
    texts["between"] = between
    xgr = xgrammar_accepts(grammar.grounded_ebnf(cands))
    llama = llamacpp_accepts(grammar, cands)
    for key, text in texts.items():
        assert grammar.accepts(text), text
        assert xgr(text) == llama(text) == (key in expected), (key, text)


def _both(grammar: ProgramGrammar, cands, ends: bool = True):
    """Whether both forms of the question's grammar accept a text (or with ``ends=False`` a start of
    one), asserting that they agree."""
    xgr, llama = xgrammar_accepts(grammar.grounded_ebnf(cands), ends), llamacpp_accepts(grammar, cands, ends)

    def accepts(text: str) -> bool:
        assert xgr(text) == llama(text), text
        return xgr(text)

    return accepts


def test_the_question_grammar_counts_the_bounds(kqapro):
    """A step after which no allowed ending fits in the lines and calls left is refused when it is
    written, not after it."""
    vocab = kqapro.kb.vocabulary
    concept = min(vocab.concepts)
    attribute = min(k for k, kind in vocab.keys.items() if kind == "string")
    grammar = ProgramGrammar(vocab, "dag", Bounds(max_lines=1, max_calls_per_line=2))
    late = f"r1: FindAll[] → FilterConcept[{concept}] → QueryAttr["
    assert grammar.accepts(f"r1: FindAll[] → FilterConcept[{concept}] → QueryAttr[{attribute}]")
    assert not grammar.accepts(f"r1: FindAll[] → FilterConcept[{concept}] → QueryAttr[{attribute}] → VerifyStr[x]")
    # A yes or no asked: the QueryAttr that leaves no room for its Verify* cannot be opened.
    asked = _both(grammar, {ANSWER: ("bool",)}, ends=False)
    assert not asked(late) and asked("r1: FindAll[] → QueryAttr[")
    assert _both(grammar, {ANSWER: ("values",)}, ends=False)(late)


def test_an_answer_no_program_can_give_narrows_nothing(kqapro):
    metaqa = ProgramGrammar(Benchmark("mini-metaqa").kb.vocabulary, "dag")
    assert metaqa.grounded_ebnf({ANSWER: ("values",)}) is metaqa.ebnf  # no attribute to query
    # With Find closed and an attribute's values asked, FindAll's branches still give them.
    grammar = ProgramGrammar(kqapro.kb.vocabulary, "dag")
    attribute = min(k for k, kind in kqapro.kb.vocabulary.keys.items() if kind == "string")
    accepts = _both(grammar, {"entity": (), ANSWER: ("values",)})
    assert accepts(f"r1: FindAll[] → QueryAttr[{attribute}]")
    assert not accepts(f"r1: FindAll[] → QueryAttr[{attribute}] → VerifyStr[x]")
    assert not accepts(f"r1: Find[Oceania] → QueryAttr[{attribute}]")


def test_prompts_carry_the_answer_types_only_when_asked_and_never_from_the_gold_program(kqapro):
    on = OmegaConf.structured(Config)
    question = kqapro.questions("val")[0]
    cases = [_case(kqapro, "r1: FindAll[] → Count[]", ("structural",)),
             _case(kqapro, "r1: FindAll[] → What[]", ("semantic",), 1)]
    links = Links((), (), {})
    retrieved = {question.qid: Retrieved(Query(question.qid, question.question), Knowledge(), cases,
                                         [Knowledge()] * len(cases), links=links)}
    (prompt,) = build_prompts(on.prompt, on.generation, [question], retrieved)
    assert dict(prompt.grounding)[ANSWER] == ("count",)
    # Another gold program for the same question changes nothing.
    other = dataclasses.replace(question, program=parse_text("r1: FindAll[] → QueryName[]"))
    (again,) = build_prompts(on.prompt, on.generation, [other], retrieved)
    assert again.grounding == prompt.grounding
    assert OmegaConf.structured(Config).generation.answer_type == "structural"  # the CPU default
    free = OmegaConf.merge(on, {"generation": {"answer_type": "free"}})
    (plain,) = build_prompts(free.prompt, free.generation, [question], retrieved)
    assert ANSWER not in dict(plain.grounding)
    # Without structural cases the kind is absent.
    semantic = {question.qid: dataclasses.replace(retrieved[question.qid], cases=cases[1:], case_knowledge=[Knowledge()])}
    (none,) = build_prompts(on.prompt, on.generation, [question], semantic)
    assert ANSWER not in dict(none.grounding)


@pytest.mark.parametrize(("fmt", "before", "answers", "kept"), [
    # After a join head only a two-input call may come: "Select" can only become SelectBetween.
    ("dag", "r1: FindAll[]\nr2: FindAll[]\nr3: (r1, r2) → Select", ("names",), False),
    ("dag", "r1: FindAll[]\nr2: FindAll[]\nr3: (r1, r2) → Select", ("name",), True),
    # After a call only a one-input call: SelectAmong.
    ("dag", "r1: FindAll[] → Select", ("names",), True),
    ("dag", "r1: FindAll[] → Select", ("name",), False),
    # The chain form counts the open branches: with two, SelectBetween may come. SelectAmong may not
    # where names are asked: its names would leave two branches that no join takes.
    ("chain", "FindAll[]\nSelect", ("name",), False),
    ("chain", "FindAll[]\nFindAll[]\nSelect", ("name",), True),
    ("chain", "FindAll[]\nFindAll[]\nSelect", ("names",), False),
    ("chain", "FindAll[]\nSelect", ("names",), True),
])
def test_a_name_is_judged_by_the_calls_its_place_takes(kqapro, fmt, before, answers, kept):
    grammar = ProgramGrammar(kqapro.kb.vocabulary, fmt)
    assert _both(grammar, {ANSWER: answers}, ends=False)(before) == kept


@pytest.mark.parametrize(("fmt", "before", "going_on"), [
    ("dag", "r1: Find[Oceania] → QueryAttr[population]", " → V"),
    ("chain", "Find[Oceania]\nQueryAttr[population]", "\nV"),
])
@pytest.mark.parametrize(("answers", "ends"), [(("values",), True), (("values", "bool"), False)])
def test_an_allowed_answer_no_open_call_takes_ends_the_program(kqapro, fmt, before, going_on, answers, ends):
    # The KB grammar allows going on after QueryAttr, and then only Verify* names: with values alone
    # asked, the program ends there.
    grammar = ProgramGrammar(kqapro.kb.vocabulary, fmt)
    assert grammar.accepts(before) and _both(grammar, {ANSWER: answers})(before)
    assert _both(grammar, {ANSWER: answers}, ends=False)(before + going_on) != ends
