"""Grounded decoding as one grammar per question (``ProgramGrammar.grounded_ebnf``), the one
definition every engine decodes a grounded prompt under (``request_grammar``: vLLM and an
``openai`` server get its text, ``llamacpp`` compiles it for the GGUF vocabulary): a grounded
kind's arguments are the question's candidates that the KB grammar accepts, a kind with none
keeps the KB grammar's rule, and the language is a subset of the KB grammar's (its byte bound
holds). Every gold program of the bundled data decodes on ``llamacpp`` under its own question's
grammar exactly when the question's candidates hold its arguments."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
from test_llm_llamacpp import llamacpp_accepts

from cbr2.common.records import Prompt
from cbr2.data.benchmarks import Benchmark
from cbr2.generation.grammar import ProgramGrammar
from cbr2.generation.grounded import (
    ANSWER,
    GROUNDED_KINDS,
    RELATE,
    Reach,
    closed_functions,
    grounded_arguments,
    pool_hops,
    slot_candidates,
)
from cbr2.kopl.functions import get_spec
from cbr2.kopl.text import escape_arg, to_text
from cbr2.llm.base import request_grammar
from cbr2.retrieval.linking import Linker


@pytest.fixture(scope="module")
def vocab():
    return Benchmark("mini-kqapro").kb.vocabulary


@pytest.fixture(scope="module")
def grammar(vocab):
    return ProgramGrammar(vocab, "dag")


def _rules(ebnf: str) -> dict[str, str]:
    return dict(line.split(" ::= ", 1) for line in ebnf.splitlines())


def _alternatives(body: str) -> list[str]:
    return [json.loads(lit) for lit in re.findall(r'"(?:[^"\\]|\\.)*"', body)]  # the grammar writes JSON literals


def test_candidates_the_grammar_accepts_become_the_only_arguments(grammar, vocab):
    name = min(vocab.names)
    rules = _rules(grammar.grounded_ebnf({"entity": (name, "Nowhere Land"), "year": ("2019", "MMXIX"),
                                          "quantity": ("3715 metre", "12 furlongs"), "date": ("2019-02-30",)}))
    # A name the KB lacks, a year that is no number, a unit the KB lacks: dropped, as the grammar would.
    assert _alternatives(rules["g_entity"]) == [name]
    assert _alternatives(rules["g_year"]) == ["2019"]
    assert _alternatives(rules["g_quantity"]) == ["3715 metre"]
    # No valid date candidate: the kind keeps the KB grammar's rule.
    assert "g_date" not in rules and "date" in rules["f_VerifyDate"]
    assert rules["f_Find"] == '("Find") "[" g_entity "]"' and "g_year" in rules["f_FilterYear"]
    # Find was the closed list's only user: the list is left out of the question's grammar.
    assert "k_entity" in _rules(grammar.ebnf) and not any("k_entity" in body for body in rules.values())
    assert next(iter(rules)) == "root"


def test_without_a_valid_candidate_the_grammar_is_the_kbs(grammar):
    assert grammar.grounded_ebnf({}) is grammar.ebnf
    assert grammar.grounded_ebnf({"entity": ("Nowhere Land",), "year": ("soon",)}) is grammar.ebnf
    # What a backend decodes a prompt under, as the runner hands it on (ProgramGrammar.request_prompt).
    record = grammar.record()
    assert request_grammar(record, grammar.request_prompt(Prompt("q", "S", "U"))) is grammar.ebnf
    unknown = grammar.request_prompt(Prompt("q", "S", "U", grounding=(("entity", ("Nowhere Land",)),)))
    assert unknown.grammar is None and request_grammar(record, unknown) is grammar.ebnf
    grounded = grammar.request_prompt(Prompt("q", "S", "U", grounding=(("string", ("volcano",)),)))
    assert request_grammar(record, grounded) == grammar.grounded_ebnf({"string": ("volcano",)}) != grammar.ebnf


def test_free_text_kinds_keep_what_free_text_may_hold(grammar):
    long = "x" * (grammar.bounds.max_literal_chars + 1)
    rules = _rules(grammar.grounded_ebnf({"string": ("the volcano", " padded", "a | b", long, "volcano"),
                                          "any": ("3715 metre", "high")}))
    # Surrounding spaces, a separator inside and an over-long value are what the text rule forbids.
    assert _alternatives(rules["g_string"]) == ["the volcano", "volcano"]
    assert _alternatives(rules["g_any"]) == ["3715 metre", "high"]


def _probes(vocab) -> dict[str, list[str]]:
    names = sorted(vocab.names)
    return {
        "entity": [*names[:5], "Nowhere Land", names[0].lower()],
        "quantity": ["12", "-3.5", "3715 metre", "12 furlongs", "1.", "1e5", "12  metre"],
        "year": ["2019", "-44", "12345", "19a", ""],
        "date": ["2019-02-28", "2019-02-29", "2019-13-01", "0019-01-01", "1990", "1990-1-1"],
        "string": ["volcano", "the volcano", " volcano", "volcano ", "a|b", "a[b", "x" * 48, "x" * 49, "é"],
        "any": ["3715 metre", "2019-02-30", "y" * 47],
    }


def test_each_kinds_check_is_the_language_of_its_rule(grammar, vocab):
    """``grounded_ebnf`` keeps a candidate by a Python check beside each argument rule: it must
    accept exactly what the rule derives (xgrammar reads the rule itself)."""
    xgr = pytest.importorskip("xgrammar")
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo([]), cache_enabled=False)
    probes = _probes(vocab)
    assert set(probes) == set(GROUNDED_KINDS)
    for kind, values in probes.items():
        rule = grammar._args[kind]
        matcher = xgr.GrammarMatcher(compiler.compile_grammar(xgr.Grammar.from_ebnf(grammar.ebnf, root_rule_name=rule)),
                                     terminate_without_stop_token=True)
        for value in values:
            matcher.reset()
            derived = bool(matcher.accept_string(value) and matcher.is_terminated()) if value else False
            assert bool(grammar._valid[kind](value)) == derived, (kind, value)


def xgrammar_accepts(ebnf: str, ends: bool = True):
    """Whether xgrammar, reading ``ebnf`` itself (the text vLLM and an ``openai`` server get), accepts
    a whole text, or with ``ends=False`` a start of one (skips without xgrammar)."""
    xgr = pytest.importorskip("xgrammar")
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo([]), cache_enabled=False)
    matcher = xgr.GrammarMatcher(compiler.compile_grammar(xgr.Grammar.from_ebnf(ebnf, root_rule_name="root")),
                                 terminate_without_stop_token=True)

    def accepts(text: str) -> bool:
        matcher.reset()
        return bool(matcher.accept_string(text) and (not ends or matcher.is_terminated()))

    return accepts


def test_only_a_start_calls_kind_may_be_closed(grammar):
    assert closed_functions({"quantity": ("5",), "entity": ()}) == {"Find"}
    assert closed_functions({ANSWER: ()}) == frozenset()  # not an argument's kind
    # A closed kind taken after a branch's start would need every tail rule rewritten: refused
    # rather than decoded as if it were open.
    with pytest.raises(ValueError, match="closes only start calls' kinds; closed here: .*FilterNum"):
        grammar.grounded_ebnf({"quantity": ()})


def test_a_grounded_grammar_accepts_the_candidates_and_refuses_the_rest(grammar, vocab):
    names = sorted(vocab.names)
    cands = {"entity": (names[0],), "year": ("2019",)}
    on_vllm, on_llama = xgrammar_accepts(grammar.grounded_ebnf(cands)), llamacpp_accepts(grammar, cands)

    def accepts(text: str) -> bool:
        assert on_vllm(text) == on_llama(text), text
        return on_vllm(text)

    on = f"r1: Find[{names[0]}] → QueryName[]"
    off = f"r1: Find[{names[1]}] → QueryName[]"
    assert accepts(on) and grammar.accepts(on)
    assert not accepts(off) and grammar.accepts(off)  # a KB name, but not the question's
    year = "r1: FindAll[] → FilterYear[date of birth | {} | =] → Count[]"
    assert grammar.accepts(year.format("2019")) and grammar.accepts(year.format("1990"))
    assert accepts(year.format("2019")) and not accepts(year.format("1990"))


def _within(grammar: ProgramGrammar, program, candidates) -> bool:
    """Whether the question's candidates hold every argument of ``program`` that grounded decoding
    draws from them: each of a kind with a candidate the KB grammar accepts is one of those (as the
    program text writes it), and no function takes a kind given with none (closed)."""
    for arg in grounded_arguments(program, candidates):
        kind = arg["kind"]
        if kind == RELATE:
            relation, _, direction = arg["value"].rpartition(" | ")
            valid, written = grammar._relate_pairs(candidates[RELATE]), f"{escape_arg(relation)} | {direction}"
        else:
            valid = [t for t in (escape_arg(v) for v in candidates.get(kind, ()) if v) if grammar._valid[kind](t)]
            written = escape_arg(arg["value"])
        if (kind in candidates and not candidates[kind]) or (valid and written not in valid):
            return False
    return True


def _questions_with_candidates(name: str, stride: int):
    """Every ``stride``-th question of a bundled benchmark with a gold program, and its candidates
    as the default's prompt carries them: linking (a closed ``entity`` kind when nothing is linked),
    the KB around the linked entities, and the answer type of the gold program's end (standing in
    for its structural cases')."""
    bench = Benchmark(name)
    linker = Linker(bench.kb)
    reach = Reach(bench.kb, pool_hops(q.program for q in bench.questions(bench.family.train_split)))
    questions = [q for split in bench.family.splits for q in bench.questions(split) if q.program is not None]
    for q in questions[::stride]:
        links = linker.link(q.question)
        candidates = slot_candidates(links, q.question, find_needs_link=True) | reach.candidates(links)
        candidates[ANSWER] = (get_spec(q.program.final_function()).output,)
        yield bench, q, candidates


def _outside(bench, program, candidates) -> str | None:
    """``program``'s text with its first ``Find`` naming a KB entity that is not a candidate, or None
    without a ``Find`` or entity candidates."""
    finds = [i for i, step in enumerate(program.steps) if step.function == "Find"]
    if not finds or not candidates.get("entity"):
        return None
    other = next(n for n in sorted(bench.kb.vocabulary.names) if n not in candidates["entity"])
    steps = list(program.steps)
    steps[finds[0]] = dataclasses.replace(steps[finds[0]], inputs=(other,))
    return to_text(dataclasses.replace(program, steps=tuple(steps)), "dag")


@pytest.mark.parametrize("name", ["mini-kqapro", "mini-metaqa"])
@pytest.mark.parametrize("stride", [pytest.param(1, marks=pytest.mark.slow), 20])
def test_llamacpp_decodes_a_gold_program_exactly_when_its_questions_candidates_hold_it(name, stride):
    """The ``llamacpp`` backend's grammar of each question (its ``request_grammar``, compiled for the
    vocabulary) accepts the gold program where the candidates hold its arguments and refuses it
    where they do not, and refuses the program with its entity swapped for one the question does
    not name. The fast tier takes every 20th question, the slow tier all of them."""
    held = refused = swapped = 0
    grammar = chars = None
    for bench, q, candidates in _questions_with_candidates(name, stride):
        if grammar is None:
            grammar = ProgramGrammar(bench.kb.vocabulary, "dag")
            chars = "".join({c for split in bench.family.splits for g in bench.questions(split) if g.program
                             for c in to_text(g.program, "dag")})
        accepts = llamacpp_accepts(grammar, candidates, extra=chars)
        text = to_text(q.program, "dag")
        within = _within(grammar, q.program, candidates)
        assert accepts(text) == within, (q.qid, text, candidates)
        held += within
        refused += not within
        if within and (other := _outside(bench, q.program, candidates)) is not None:
            assert not accepts(other), (q.qid, other)
            swapped += 1
    # Linking holds most gold arguments; both outcomes and the swap are exercised.
    assert held > 0.9 * (held + refused) and swapped > 10
