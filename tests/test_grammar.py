"""The decoding grammar: it accepts every gold program of the bundled data, rejects ill-typed
programs, and everything it can produce parses and type-checks (SER 0 by construction)."""

from __future__ import annotations

import random

import pytest

from cbr2.config import load_config
from cbr2.data.benchmarks import Benchmark
from cbr2.generation.grammar import Bounds, ProgramGrammar, build_grammar
from cbr2.kb.model import Vocabulary
from cbr2.kopl.checker import check_text
from cbr2.kopl.text import to_text

xgr = pytest.importorskip("xgrammar")


@pytest.fixture(scope="module")
def kqapro():
    return Benchmark("mini-kqapro")


@pytest.fixture(scope="module")
def grammars(kqapro):
    return {fmt: ProgramGrammar(kqapro.kb.vocabulary, fmt) for fmt in ("dag", "chain")}


def _gold_programs(bench):
    for split in bench.family.splits:
        for q in bench.questions(split):
            if q.program is not None:
                yield q


@pytest.mark.parametrize("name", ["mini-kqapro", "mini-metaqa"])
@pytest.mark.parametrize("fmt", ["dag", "chain"])
def test_every_bundled_gold_program_is_accepted(name, fmt):
    bench = Benchmark(name)
    g = ProgramGrammar(bench.kb.vocabulary, fmt)
    questions = list(_gold_programs(bench))
    rejected = [q.qid for q in questions if not g.accepts(to_text(q.program, fmt))]
    assert len(questions) > 1000
    assert rejected == []


ILL_TYPED = {
    "qfilter after find (needs facts)": "r1: Find[Poland] → QFilterStr[start time | 1990] → QueryName[]",
    "verify without a queried value": "r1: Find[Poland] → VerifyStr[Warsaw]",
    "ends with entities, not an answer": "r1: Find[Poland] → Relate[capital | forward]",
    "a relation the KB does not have": "r1: Find[Poland] → Relate[capital city | forward] → QueryName[]",
    "an attribute key the KB does not have": "r1: Find[Poland] → QueryAttr[altitude above sea level]",
    "an op outside the table": "r1: FindAll[] → FilterNum[population | 5 | >=] → Count[]",
    "a direction outside the table": "r1: Find[Poland] → Relate[capital | up] → QueryName[]",
    "a date that does not exist": "r1: FindAll[] → FilterDate[date of birth | 2001-02-30 | =] → Count[]",
    "a year that is not a number": "r1: FindAll[] → FilterYear[date of birth | nineteen | =] → Count[]",
    "an empty argument": "r1: Find[] → QueryName[]",
    "an unknown function": "r1: Find[Poland] → Lookup[] → QueryName[]",
    "wrong argument count": "r1: Find[Poland] → Relate[capital] → QueryName[]",
    "a join with one input": "r1: Find[Poland] → And[] → QueryName[]",
    "a branch that is never used": "r1: Find[Poland] → QueryName[]\nr2: Find[Madrid] → QueryName[]",
    "a reference to a missing line": "r1: Find[Poland]\nr2: Find[Madrid]\nr3: (r1, r5) → And[] → Count[]",
    "labels out of order": "r2: Find[Poland] → QueryName[]",
}


@pytest.mark.parametrize("why", sorted(ILL_TYPED))
def test_ill_typed_programs_are_rejected(grammars, why):
    assert not grammars["dag"].accepts(ILL_TYPED[why])


def test_the_same_programs_pass_when_well_typed(grammars):
    g = grammars["dag"]
    assert g.accepts("r1: Find[Poland] → QueryName[]")
    assert g.accepts("r1: Find[Poland] → QueryName[]\n\n")  # the example separator may end it
    assert g.accepts("r1: FindAll[] → FilterDate[date of birth | 2001-02-28 | =] → Count[]")
    assert g.accepts("r1: Find[Poland]\nr2: Find[Madrid]\nr3: (r1, r2) → And[] → Count[]")
    assert grammars["chain"].accepts("Find[Poland]\nFind[Madrid]\nAnd[]\nCount[]")
    assert not grammars["chain"].accepts("Find[Poland]\nAnd[]\nCount[]")


def _char_tokenizer(g: ProgramGrammar):
    """A one-character-per-token vocabulary covering every character the grammar can emit."""
    chars = sorted(set(g.ebnf) | set(" →\n") | {chr(c) for c in range(32, 127)})
    return chars + ["<eos>"]


@pytest.mark.parametrize("fmt", ["dag", "chain"])
def test_every_program_the_grammar_can_produce_parses_and_type_checks(grammars, fmt):
    """Random walks through the grammar, one character at a time: each ends inside the byte
    bound with a program that the checker accepts, whatever the walk chose."""
    g = grammars[fmt]
    vocab = _char_tokenizer(g)
    eos = len(vocab) - 1
    info = xgr.TokenizerInfo(vocab, stop_token_ids=[eos])
    cg = xgr.GrammarCompiler(info, cache_enabled=False).compile_grammar(g.ebnf)
    mask = xgr.allocate_token_bitmask(1, len(vocab))
    rng = random.Random(0)
    lengths = []
    for _ in range(40):
        matcher = xgr.GrammarMatcher(cg)
        out = []
        while not matcher.is_terminated():
            matcher.fill_next_token_bitmask(mask)
            allowed = [t for t in range(len(vocab)) if (int(mask[0, t // 32]) >> (t % 32)) & 1]
            # Lean towards ending so walks stay short, but take every kind of branch.
            token = eos if eos in allowed and rng.random() < 0.5 else rng.choice(allowed)
            assert matcher.accept_token(token)
            if token != eos:
                out.append(vocab[token])
            assert len(out) <= g.max_bytes
        text = "".join(out)
        result = check_text(text.rstrip("\n"), fmt)
        assert result.ok, (text, result.error)
        lengths.append(len(text.encode()))
    assert max(lengths) <= g.max_bytes
    assert len(set(lengths)) > 5  # the walks really differ


def test_a_kb_without_qualifiers_drops_the_qualifier_functions():
    g = ProgramGrammar(Benchmark("mini-metaqa").kb.vocabulary, "dag")
    names = {s.name for s in g.functions}
    assert "Relate" in names and "QFilterStr" not in names and "QueryAttr" not in names
    assert g.accepts("r1: Find[wim wenders] → Relate[has_tags | backward] → QueryName[]")
    assert not g.accepts("r1: Find[wim wenders] → QueryAttr[has_tags]")


def test_find_is_free_text_above_the_closed_entity_limit():
    vocab = Vocabulary(names={"Poland", "Warsaw"}, concepts={"country"}, keys={"population": "quantity"},
                       relations={"capital"})
    closed = ProgramGrammar(vocab, "dag")
    open_ = ProgramGrammar(vocab, "dag", Bounds(closed_entities=1))
    assert not closed.accepts("r1: Find[Atlantis] → QueryName[]")
    assert open_.accepts("r1: Find[Atlantis] → QueryName[]")
    assert not open_.accepts("r1: Find[" + "x" * 60 + "] → QueryName[]")  # max_literal_chars


def test_build_grammar_follows_the_config(kqapro):
    cfg = load_config(["prompt.format=chain", "generation.max_lines=3"])
    g = build_grammar(cfg.generation, cfg.prompt.format, kqapro)
    assert g.fmt == "chain" and g.bounds.max_lines == 3
    assert g.max_bytes < ProgramGrammar(kqapro.kb.vocabulary, "chain").max_bytes


def test_the_backends_get_the_grammar_as_data_and_a_grounded_prompt_its_own_text(kqapro):
    from dataclasses import replace

    from cbr2.common.records import Prompt
    from cbr2.generation.prompt import prompt_hash

    g = ProgramGrammar(kqapro.kb.vocabulary, "dag")
    record = g.record()
    assert (record.ebnf, record.max_bytes, record.identity) == (g.ebnf, g.max_bytes, g.identity())
    plain = Prompt("q", "S", "U")
    assert g.request_prompt(plain) is plain
    grounded = Prompt("q", "S", "U", grounding=(("entity", ("Abuja",)),))
    own = g.request_prompt(grounded)
    assert own.grammar == g.grounded_ebnf({"entity": ("Abuja",)}) != g.ebnf
    # The text rides along: what the prompt says, and so its cache key, is the same.
    assert replace(own, grammar=None) == grounded and prompt_hash(own) == prompt_hash(grounded)
    assert "grammar" not in repr(own)
    # Candidates the grammar does not accept narrow nothing: the prompt decodes under the run's grammar.
    unknown = Prompt("q", "S", "U", grounding=(("entity", ("Nowhere At All",)),))
    assert g.request_prompt(unknown) is unknown


@pytest.mark.slow
def test_compiled_grammars_are_cached_on_disk(tmp_path, grammars, monkeypatch):
    from cbr2.llm import xgrammar_masks
    from cbr2.llm.hf import HFBackend
    from cbr2.llm.xgrammar_masks import compiled

    g = grammars["dag"]
    tok = HFBackend(load_config([]).llm).tokenizer()  # the packaged CPU model's tokenizer
    for cache in ("_COMPILED", "_COMPILERS", "_TOKENIZERS"):
        monkeypatch.setattr(xgrammar_masks, cache, {})
    first = compiled(g.ebnf, tok, cache_dir=tmp_path)
    files = list((tmp_path / "grammars").glob("*.json"))
    assert len(files) == 1

    # A new process (empty memory caches) must not compile again: break the compiler to prove it.
    for cache in ("_COMPILED", "_COMPILERS", "_TOKENIZERS"):
        monkeypatch.setattr(xgrammar_masks, cache, {})

    class _NoCompiler:
        def __init__(self, *a, **k):
            raise AssertionError("compiled again despite the disk cache")

    monkeypatch.setattr(xgr, "GrammarCompiler", _NoCompiler)
    second = compiled(g.ebnf, tok, cache_dir=tmp_path)
    assert second.serialize_json() == first.serialize_json()
