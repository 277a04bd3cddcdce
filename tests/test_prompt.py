"""The prompt (paper Section 4.3), the ablation deltas and the balanced sample."""

import random
from collections import Counter

import pytest

from cbr2.config import ABLATIONS, CONFIG_DIR, ConfigError, ablation, compose, load_config
from cbr2.data.benchmarks import Benchmark
from cbr2.generation.prompt import PROGRAM_SLOT, PromptBuilder, program_text, prompt_hash, system_text
from cbr2.kb.triples import Triple
from cbr2.kopl import functions
from cbr2.kopl.text import to_text
from cbr2.retrieval.cases import Case, Query
from cbr2.retrieval.knowledge import Knowledge
from cbr2.run.runner import select_questions


@pytest.fixture(scope="module")
def train():
    return Benchmark("mini-kqapro").questions("train")


def _knowledge(tag, n=5):
    return Knowledge(tuple(Triple(f"c{tag}{i}", "has attribute", f"k{i}") for i in range(n)),
                     tuple(Triple(f"e{tag}{i}", "population", f"{i}") for i in range(n)))


def _build(train, fmt="dag", case_triples=3, knowledge=None):
    cases = [Case(train[0], ("semantic",), (0.9,)), Case(train[1], ("structural",), (0.8,))]
    return PromptBuilder(fmt, case_triples).build(
        Query("q1", "How many cities are there?"), knowledge or _knowledge("T"), cases,
        [_knowledge("A"), _knowledge("B")])


def test_the_prompt_has_the_four_parts_in_order(train):
    prompt = _build(train)
    text = prompt.text
    role, syntax, functions_at = text.index("You translate"), text.index("Program form"), text.index("Functions (")
    first_case, second_case = text.index(train[1].question), text.index(train[0].question)
    target = text.index("Question: How many cities are there?")
    assert role < syntax < functions_at < first_case < second_case < target
    # The most relevant case (first retrieved) sits next to the question.
    assert text.endswith(f"Question: How many cities are there?\nOntology:\n- cT0 | has attribute | k0\n"
                         f"- cT1 | has attribute | k1\n- cT2 | has attribute | k2\n- cT3 | has attribute | k3\n"
                         f"- cT4 | has attribute | k4\nFacts:\n- eT0 | population | 0\n- eT1 | population | 1\n"
                         f"- eT2 | population | 2\n- eT3 | population | 3\n- eT4 | population | 4\n{PROGRAM_SLOT}\n")
    # Each case shows its own triples (3 of each kind) and its program.
    assert f"{train[0].question}\nOntology:\n- cA0" in text and "cA2" in text and "cA3" not in text
    assert f"- eB2 | population | 2\n{PROGRAM_SLOT}\n{to_text(train[1].program)}\n\n" in text
    assert prompt.system == system_text("dag") and prompt.text == f"{prompt.system}\n\n{prompt.user}"


def test_every_function_of_the_table_is_defined_and_a_new_one_appears(monkeypatch):
    text = system_text("dag")
    for name, spec in functions.FUNCTIONS.items():
        assert f"- {name}[{' | '.join(a.name for a in spec.args)}]:" in text
    assert "op: one of =, !=, <, >" in text and "direction: one of forward, backward" in text
    new = functions.FunctionSpec("Median", ("entities",), (functions.Arg("key", "key"),), "values", "median of `key`")
    monkeypatch.setitem(functions.FUNCTIONS, "Median", new)
    assert "- Median[key]: entities → values. Median of `key` (key: attribute key)." in system_text("dag")


def test_chain_format_changes_the_syntax_and_the_case_programs(train):
    dag, chain = _build(train, "dag"), _build(train, "chain")
    assert "one branch per line" in dag.system and "one step per line" in chain.system
    assert to_text(train[0].program, "chain") in chain.user and to_text(train[0].program, "dag") in dag.user
    with pytest.raises(ValueError, match="unknown prompt.format 'tree'"):
        system_text("tree")


def test_empty_knowledge_leaves_no_section_and_case_triples_none_shows_all(train):
    bare = PromptBuilder("dag", 3).build(Query("q", "Who?"), Knowledge(), [Case(train[0], ("random",), (None,))],
                                         [Knowledge()])
    assert "Ontology:" not in bare.user and "Facts:" not in bare.user
    assert bare.user.endswith(f"Question: Who?\n{PROGRAM_SLOT}\n")
    assert "cA4" in _build(train, case_triples=None).user


def test_prompt_hash_and_program_text():
    from cbr2.common.records import Prompt

    a, b = Prompt("1", "sys", "user"), Prompt("2", "sys", "user")
    assert prompt_hash(a) == prompt_hash(b) != prompt_hash(Prompt("1", "sys", "user "))
    assert program_text("```\nr1: Find[X] → QueryName[]\n```") == "r1: Find[X] → QueryName[]"
    assert program_text("```kopl\nr1: Find[X]\nr2: r1 → Count[]\n```  ") == "r1: Find[X]\nr2: r1 → Count[]"
    assert program_text("  r1: Find[X]  \n") == "r1: Find[X]"


# ---------------------------------------------------------------- ablations


def test_every_ablation_is_a_small_delta_and_unknown_names_list_the_valid_ones():
    # Each setting is the full method's knowledge (K_o = K_f = 10) and its own delta, over a CPU
    # default that recalls none: so the default itself is w/o_knowledge.
    base = load_config([], files=[CONFIG_DIR / "evaluate.yaml"])
    knowledge = {"retrieval.k_ontology": 10, "retrieval.k_facts": 10}
    expected = {
        "full": knowledge,
        "chain": {"prompt.format": "chain", **knowledge},
        "w/o_reasoning_case": {"retrieval.cases": "semantic", **knowledge},
        "w/o_semantic_case": {"retrieval.cases": "structural", **knowledge},
        "random_case": {"retrieval.cases": "random", **knowledge},
        "w/o_act": {"retrieval.k_ontology": 10},
        "w/o_ont": {"retrieval.k_facts": 10},
        "w/o_knowledge": {},
    }
    assert set(expected) == set(ABLATIONS)
    for name, delta in expected.items():
        cfg = compose(ablation=name)
        changed = {f"{s}.{k}": cfg[s][k] for s in ("prompt", "retrieval", "llm", "eval", "data")
                   for k in cfg[s] if cfg[s][k] != base[s][k]}
        assert changed == delta, name
    with pytest.raises(ConfigError, match=r"unknown ablation 'w/o_case'; valid: full, chain, w/o_reasoning_case"):
        ablation("w/o_case")


# ---------------------------------------------------------------- the balanced sample

def _select(bench, overrides):
    cfg = load_config(overrides)
    return select_questions(bench, cfg.data.split, cfg.eval)


def test_per_category_sample_follows_the_literature_recipe():
    bench = Benchmark("mini-kqapro")
    cfg = load_config(["eval.per_category=7"])
    picked = select_questions(bench, cfg.data.split, cfg.eval)
    assert Counter(q.category for q in picked) == {c: 7 for c in {q.category for q in bench.questions("val")}}
    shuffled = list(bench.questions("val"))
    random.Random(123).shuffle(shuffled)
    assert [q.qid for q in picked] == [q.qid for q in shuffled if q in picked]  # shuffled order, first 7 of each
    assert [q.qid for q in _select(bench, ["eval.per_category=7"])] == [q.qid for q in picked]  # deterministic
    other = _select(bench, ["eval.per_category=7", "eval.sample_seed=1"])
    assert {q.qid for q in other} != {q.qid for q in picked}
    assert len(_select(bench, ["eval.per_category=null"])) == 450
    assert len(_select(bench, ["eval.per_category=7", "eval.limit=10"])) == 10


def test_a_skipped_sample_is_disjoint_from_the_one_it_skips():
    """Tune on eval.per_category=3, report on eval.per_category=10 eval.skip_per_category=3."""
    bench = Benchmark("mini-kqapro")
    tuned = {q.qid for q in _select(bench, ["eval.per_category=3"])}
    held = _select(bench, ["eval.per_category=10", "eval.skip_per_category=3"])
    both = {q.qid for q in _select(bench, ["eval.per_category=13"])}
    assert len(held) == 90 and not tuned & {q.qid for q in held} and tuned | {q.qid for q in held} == both
    for bad in (["eval.skip_per_category=-1"], ["eval.skip_per_category=3", "eval.per_category=null"]):
        with pytest.raises(ValueError, match="eval.skip_per_category"):
            _select(bench, bad)


def test_paper_yaml_holds_the_papers_setting():
    cfg = load_config([], files=[CONFIG_DIR / "evaluate.yaml", CONFIG_DIR / "paper.yaml"])
    r = cfg.retrieval
    assert (r.k_ontology, r.k_facts, r.k_semantic, r.k_structural, r.encoder) == (10, 10, 5, 5, "BAAI/bge-m3")
    assert (cfg.llm.backend, cfg.llm.temperature, cfg.eval.per_category, cfg.eval.sample_seed) == ("vllm", 0.0, 100, 123)
    # The paper's prompt and single pass: none of the CPU default's grounding.
    assert not (cfg.retrieval.link or cfg.retrieval.mask_mentions or cfg.generation.constrained or cfg.generation.grounded)


def test_the_correction_prompt_extends_the_original_with_the_failure():
    from cbr2.common.records import Prompt
    from cbr2.generation.prompt import correction_prompt

    original = Prompt("q1", "SYSTEM", f"Question: Where was Marie Curie born?\n{PROGRAM_SLOT}\n")
    fixed = correction_prompt(original, "r1: Find[Marie Curi] → QueryName[]", "execution error [unknown_entity]",
                              [("Find", "name", "Marie Curi", ["Marie Curie", 'The "Curie" Institute'])])
    assert fixed.qid == "q1" and fixed.system == original.system and fixed.user.startswith(original.user)
    added = fixed.user[len(original.user):].splitlines()
    assert added[0] == "r1: Find[Marie Curi] → QueryName[]" and added[2].endswith("execution error [unknown_entity]")
    assert '- Find name "Marie Curi": "Marie Curie", "The \\"Curie\\" Institute"' in added
    assert added[-1] == PROGRAM_SLOT and fixed.user.endswith("\n")
    bare = correction_prompt(original, "", "empty", [])
    assert "(nothing)" in bare.user and "closest" not in bare.user and prompt_hash(bare) != prompt_hash(fixed)


def test_linked_items_follow_each_question_and_the_candidates_key_the_hash(train):
    from cbr2.retrieval.linking import Links

    cases = [Case(train[0], ("semantic",), (0.9,))]
    target = Links(("Canberra",), ("country",), {"quantity": ("3715 metre",), "year": (), "date": (), "string": ()})
    case = Links(("Spain",), (), {})
    grounding = (("entity", ("Canberra",)),)
    prompt = PromptBuilder("dag", 3).build(Query("q1", "Which country has Canberra as capital?"), _knowledge("T"),
                                           cases, [_knowledge("A")], target, [case], grounding)
    assert ("Question: Which country has Canberra as capital?\nEntities in the question: Canberra\n"
            "Concepts in the question: country\nValues in the question: 3715 metre\nOntology:") in prompt.user
    assert f"{train[0].question}\nEntities in the question: Spain\nOntology:" in prompt.user
    assert prompt.grounding == grounding
    # The same text with other candidates is another cache entry.
    from cbr2.common.records import Prompt

    assert prompt_hash(prompt) != prompt_hash(Prompt(prompt.qid, prompt.system, prompt.user))


# ---------------------------------------------------------------- knowledge style


def _pasteur():
    """A hand-made retrieval result of each fact kind, as ``fact_triples`` makes them."""
    from cbr2.kb.triples import Triple as T

    ontology = (T("human", "has attribute", "date of birth (date)", terms=frozenset({("concept", "human")})),)
    facts = (
        T("Louis Pasteur", "native language", "French", terms=frozenset({("relation", "native language")})),
        T("Louis Pasteur", "date of birth", "1822-12-27", terms=frozenset({("key", "date of birth")})),
        T("Louis Pasteur", "instance of", "human", terms=frozenset({("concept", "human")})),
        T("Louis Pasteur", "award received", "Rumford Medal", (("point in time", "1856"),),
          frozenset({("relation", "award received"), ("qkey", "point in time")})),
        T("Louis Pasteur", "population", "12", (("point in time", "1874"),),
          frozenset({("key", "population"), ("qkey", "point in time")})),
    )
    return Knowledge(ontology, facts)


def test_triples_style_is_each_triples_text():
    from cbr2.generation.prompt import knowledge_text
    from cbr2.retrieval.linking import Links

    knowledge = _pasteur()
    expected = ("Ontology:\n- human | has attribute | date of birth (date)\nFacts:\n"
                "- Louis Pasteur | native language | French\n- Louis Pasteur | date of birth | 1822-12-27\n"
                "- Louis Pasteur | instance of | human\n"
                "- Louis Pasteur | award received | Rumford Medal (point in time: 1856)\n"
                "- Louis Pasteur | population | 12 (point in time: 1874)")
    assert knowledge_text(knowledge) == expected
    assert knowledge_text(knowledge, None, "triples", Links(("French",))) == expected  # links do not matter
    with pytest.raises(ValueError, match="unknown prompt.knowledge_style 'graph'"):
        knowledge_text(knowledge, None, "graph")
    with pytest.raises(ValueError, match="unknown prompt.knowledge_style 'graph'"):
        PromptBuilder("dag", 3, "graph")


def test_steps_style_writes_each_fact_kind_as_its_steps_oriented_from_the_linked_entity():
    from cbr2.generation.prompt import fact_steps, knowledge_text
    from cbr2.retrieval.linking import Links

    knowledge = _pasteur()
    # Without links (or with the subject linked) every relation fact reads forward.
    forward = knowledge_text(knowledge, None, "steps")
    assert forward == ("Ontology:\n- human | has attribute | date of birth (date)\nFacts:\n"
                       "- Find[Louis Pasteur] → Relate[native language | forward] = French\n"
                       "- Find[Louis Pasteur] → QueryAttr[date of birth] = 1822-12-27\n"
                       "- Find[Louis Pasteur] → FilterConcept[human]\n"
                       "- Find[Louis Pasteur] → Relate[award received | forward] = Rumford Medal (point in time: 1856)\n"
                       "- Find[Louis Pasteur] → QueryAttr[population] = 12 (point in time: 1874)")
    assert knowledge_text(knowledge, None, "steps", Links(("Louis Pasteur", "French"))) == forward
    # The object linked, the subject not: the chain starts at the object and goes backward.
    from_object = knowledge_text(knowledge, None, "steps", Links(("French", "Rumford Medal")))
    assert "- Find[French] → Relate[native language | backward] = Louis Pasteur\n" in from_object
    assert "- Find[Rumford Medal] → Relate[award received | backward] = Louis Pasteur (point in time: 1856)" in from_object
    # Attribute and concept facts have one orientation; the limit applies per kind as before.
    assert "- Find[Louis Pasteur] → QueryAttr[date of birth] = 1822-12-27\n" in from_object
    assert knowledge_text(knowledge, 1, "steps").endswith("Facts:\n- Find[Louis Pasteur] → Relate[native language | forward] = French")
    # A triple of no known kind is shown as its text.
    assert fact_steps(Triple("e", "population", "3"), ("e",)) == "e | population | 3"


def test_steps_style_reaches_every_block_of_the_built_prompt(train):
    from cbr2.retrieval.linking import Links

    cases = [Case(train[0], ("semantic",), (0.9,))]
    question = "What is the native language of the discoverer of pasteurisation?"
    for style in ("triples", "steps"):
        prompt = PromptBuilder("dag", 3, style).build(Query("q1", question), _pasteur(), cases, [_pasteur()],
                                                      Links(("French",)), [Links(("Louis Pasteur",))])
        case_block, target_block = prompt.user.split(f"Question: {question}\n")
        if style == "triples":
            assert prompt == PromptBuilder("dag", 3).build(Query("q1", question), _pasteur(), cases, [_pasteur()],
                                                           Links(("French",)), [Links(("Louis Pasteur",))])
            assert "- Louis Pasteur | native language | French\n" in target_block and "Relate[" not in prompt.user
            continue
        # The target names French: its fact reads backward; the case names Pasteur: forward.
        assert target_block.startswith("Entities in the question: French\nOntology:\n"
                                       "- human | has attribute | date of birth (date)\nFacts:\n"
                                       "- Find[French] → Relate[native language | backward] = Louis Pasteur\n"
                                       "- Find[Louis Pasteur] → QueryAttr[date of birth] = 1822-12-27\n")
        assert target_block.endswith(f"(point in time: 1874)\n{PROGRAM_SLOT}\n")
        assert "- Find[Louis Pasteur] → Relate[native language | forward] = French\n" in case_block
        assert "| native language |" not in prompt.user and prompt.system == system_text("dag")
