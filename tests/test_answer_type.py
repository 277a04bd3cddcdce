"""The program's answer type from the structural view's cases (``generation.answer_type``): what
the cases end with, the functions that stay open, and the same language on both engines (the
token-level layer of ``llamacpp`` and the per-request grammar of ``vllm``/``openai``)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from omegaconf import OmegaConf
from test_grounded_grammar import mask_accepts, xgrammar_accepts

from cbr2.config import Config
from cbr2.data.benchmarks import Benchmark
from cbr2.evaluation.runner import build_prompts
from cbr2.generation.grammar import ProgramGrammar
from cbr2.generation.grounded import ANSWER, GroundedMask, TokenTable, case_answer_types, live_functions
from cbr2.kopl.text import parse_text
from cbr2.retrieval.cases import Case, Query
from cbr2.retrieval.knowledge import Knowledge
from cbr2.retrieval.linking import Links
from cbr2.retrieval.retriever import Retrieved


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


def test_only_functions_that_can_still_end_as_asked_stay_open():
    count = live_functions(["count"])
    assert {"Count", "Find", "FindAll", "Relate", "FilterStr", "And", "QFilterStr"} <= count
    assert not {"QueryName", "What", "QueryAttr", "VerifyNum", "SelectBetween", "QueryRelation"} & count
    # An attribute's values can still become a yes or no; a yes or no cannot become values.
    assert {"QueryAttr", "VerifyNum", "VerifyStr"} <= live_functions(["bool"])
    assert "QueryAttr" in live_functions(["values"]) and "VerifyNum" not in live_functions(["values"])
    # A closed function (no entity linked: no Find) is never live, whatever the answer.
    assert "Find" not in live_functions(["count"], frozenset({"Find"})) and "FindAll" in live_functions(["count"])


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
    mask = mask_accepts(cands, fmt, ends=True)
    for key, text in texts.items():
        assert grammar.accepts(text), text
        assert xgr(text) == mask(text) == (key in expected), (key, text)


def test_a_step_with_nothing_allowed_left_keeps_the_grammar_choice():
    chars = ["r1: ", "FindAll[]", " → ", "What[]", "Count[]", None]
    table = TokenTable(chars)
    mask = GroundedMask(table, {ANSWER: ("count",)}, lambda got: "".join(chars[i] for i in got))
    scores = np.full(len(chars), -np.inf)
    scores[3] = 0.0  # the grammar allows What alone: the layer leaves it
    assert np.isfinite(mask([0, 1, 2], scores.copy())[3])
    scores[4] = 0.0  # with Count allowed too, What goes
    out = mask([0, 1, 2], scores.copy())
    assert not np.isfinite(out[3]) and np.isfinite(out[4])
    # After What[], the end is all the grammar allows: it stays.
    ended = np.full(len(chars), -np.inf)
    ended[5] = 0.0
    assert np.isfinite(mask([0, 1, 2, 3], ended.copy())[5])


def test_the_token_layer_never_forbids_every_token_the_grammar_allows():
    # A question with no linked entity (Find closed) whose cases end with an attribute's values.
    chars = [chr(c) for c in range(32, 127)] + ["\n", "→", None]
    table = TokenTable(chars)
    mask = GroundedMask(table, {"entity": (), ANSWER: ("values",)}, lambda got: "".join(chars[i] for i in got))

    def allowed(text, grammar):
        scores = np.full(table.size, -np.inf)
        scores[[chars.index(c) for c in grammar]] = 0.0
        return {chars[i] for i in np.flatnonzero(np.isfinite(mask([chars.index(c) for c in text], scores)))}

    # Every Verify* ends with a yes or no, not the values asked; where the grammar allows only those, they stay.
    assert allowed("r1: FindAll[] → QueryAttr[box office] → Verify", "SNYD") == set("SNYD")
    # Find's bracket opens the closed kind: forbidden while FindAll is possible, the grammar's choice when it is all.
    assert allowed("r1: Find", "[A") == {"A"}
    assert allowed("r1: Find", "[") == {"["}


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
    ("dag", "r1: FindAll[]\nr2: FindAll[]\nr3: (r1, r2) → ", ("names",), False),
    ("dag", "r1: FindAll[]\nr2: FindAll[]\nr3: (r1, r2) → ", ("name",), True),
    # After a call only a one-input call: SelectAmong.
    ("dag", "r1: FindAll[] → ", ("names",), True),
    ("dag", "r1: FindAll[] → ", ("name",), False),
    # The chain form counts the open branches: with two, both may come.
    ("chain", "FindAll[]\n", ("name",), False),
    ("chain", "FindAll[]\nFindAll[]\n", ("name",), True),
    ("chain", "FindAll[]\nFindAll[]\n", ("names",), True),
])
def test_a_name_is_judged_by_the_calls_its_place_takes(fmt, before, answers, kept):
    chars = [before, "Select", "(", None]  # "(": no name, so the layer has a token left either way
    table = TokenTable(chars)
    mask = GroundedMask(table, {ANSWER: answers}, lambda got: "".join(chars[i] for i in got), fmt)
    out = mask([0], np.zeros(len(chars)))
    assert np.isfinite(out[1]) == kept
    assert np.isfinite(out[2])


@pytest.mark.parametrize(("fmt", "chars", "going_on"), [
    ("dag", ["r1: Find[Oceania] → QueryAttr[population]", " → ", " →", "\n", None], {1, 2}),
    ("chain", ["Find[Oceania]\nQueryAttr[population]", "\n", "\nVerifyNum", "\n\n", None], {1, 2}),
])
@pytest.mark.parametrize(("answers", "ends"), [(("values",), True), (("values", "bool"), False)])
def test_an_allowed_answer_no_open_call_takes_ends_the_program(fmt, chars, going_on, answers, ends):
    # The KB grammar allows going on after QueryAttr, and then only Verify* names: with values alone
    # asked, each of those is dead, so the layer must end the program here rather than leave the
    # grammar's choice one step later (the per-request grammar's root already ends it).
    table = TokenTable(chars)
    mask = GroundedMask(table, {ANSWER: answers}, lambda got: "".join(chars[i] for i in got), fmt)
    out = mask([0], np.zeros(len(chars)))
    kept = {i for i in range(1, len(chars)) if np.isfinite(out[i])}
    assert kept == (set(range(1, len(chars))) - going_on if ends else set(range(1, len(chars))))
