"""Grounded decoding as one grammar per question (``ProgramGrammar.grounded_ebnf``), for engines
that take a grammar per request (vLLM): a grounded kind's arguments are the question's candidates
that the KB grammar accepts, a kind with none keeps the KB grammar's rule, and the language is a
subset of the KB grammar's (its byte bound holds)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from cbr2.common.records import Prompt
from cbr2.data.benchmarks import Benchmark
from cbr2.generation.grammar import ProgramGrammar
from cbr2.generation.grounded import ANSWER, GROUNDED_KINDS, GroundedMask, TokenTable, closed_functions
from cbr2.llm.base import request_grammar


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
    assert request_grammar(grammar, Prompt("q", "S", "U")) is grammar.ebnf
    grounded = Prompt("q", "S", "U", grounding=(("string", ("volcano",)),))
    assert request_grammar(grammar, grounded) == grammar.grounded_ebnf({"string": ("volcano",)}) != grammar.ebnf


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


def xgrammar_accepts(ebnf: str):
    """Whether xgrammar, reading ``ebnf`` itself, accepts a whole text (skips without xgrammar)."""
    xgr = pytest.importorskip("xgrammar")
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo([]), cache_enabled=False)
    matcher = xgr.GrammarMatcher(compiler.compile_grammar(xgr.Grammar.from_ebnf(ebnf, root_rule_name="root")),
                                 terminate_without_stop_token=True)

    def accepts(text: str) -> bool:
        matcher.reset()
        return bool(matcher.accept_string(text) and matcher.is_terminated())

    return accepts


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


def test_only_a_start_calls_kind_may_be_closed(grammar):
    assert closed_functions({"quantity": ("5",), "entity": ()}) == {"Find"}
    assert closed_functions({ANSWER: ()}) == frozenset()  # not an argument's kind
    # A closed kind taken after a branch's start would need every tail rule rewritten: refused, so
    # the per-request grammar never means less than the token layer does.
    with pytest.raises(ValueError, match="closes only start calls' kinds; closed here: .*FilterNum"):
        grammar.grounded_ebnf({"quantity": ()})


def test_a_grounded_grammar_accepts_the_candidates_and_refuses_the_rest(grammar, vocab):
    names = sorted(vocab.names)
    accepts = xgrammar_accepts(grammar.grounded_ebnf({"entity": (names[0],), "year": ("2019",)}))

    on = f"r1: Find[{names[0]}] → QueryName[]"
    off = f"r1: Find[{names[1]}] → QueryName[]"
    assert accepts(on) and grammar.accepts(on)
    assert not accepts(off) and grammar.accepts(off)  # a KB name, but not the question's
    year = "r1: FindAll[] → FilterYear[date of birth | {} | =] → Count[]"
    assert grammar.accepts(year.format("2019")) and grammar.accepts(year.format("1990"))
    assert accepts(year.format("2019")) and not accepts(year.format("1990"))
