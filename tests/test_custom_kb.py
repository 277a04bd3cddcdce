"""Your own KB and cases (``data.name=custom``): the readers of a triples file (TAB and ``|`` forms)
and of KoPL JSON, the cases file checked against the KB, every message of a bad input, the
benchmark and its config keys, ``python -m cbr2.data check --kb --cases``, the case views of a
run, and retrieval, linking and narrowing over such a KB; the walk-through files of
``examples/university``."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
from conftest import TINY_KB, to_old_schema

from cbr2.common.errors import ConfigError
from cbr2.config import Config, TrainConfig, compose
from cbr2.data.__main__ import main
from cbr2.data.benchmarks import EMBEDDED_ROOT, Benchmark, structural_name
from cbr2.data.cases import MIN_STRUCTURAL_CASES, load_cases
from cbr2.data.kb_loaders import (
    custom_kb_kind,
    kqapro_kb_from_dict,
    load_custom_kb,
    load_metaqa_kb,
    load_triples_kb,
)
from cbr2.data.reading import DataError

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "university"
KB_FILE, CASES_FILE, QUESTIONS_FILE = EXAMPLE / "kb.tsv", EXAMPLE / "cases.yaml", EXAMPLE / "questions.yaml"

SMALL_KB = """\
# a comment, then a blank line

professor\tsubclass of\tteacher
Ada Lovelace\tinstance of\tprofessor
Databases\tinstance of\tcourse
Databases\ttaught by\tAda Lovelace
Databases\tcredits\t5
Databases\tlength\t3.5 km
Databases\tfirst taught\t1998-09-01
Databases\ttaught by\tAda Lovelace
Databases\tprerequisite\tProgramming 101
"""

SMALL_CASES = """\
- question: Who teaches Databases?
  program: "r1: Find[Databases] → Relate[taught by | forward] → QueryName[]"
  answer: Ada Lovelace
- question: How many credits is Databases worth?
  program: |
    r1: Find[Databases]
    r2: r1 → QueryAttr[credits]
  answer: [5]
- question: Is Databases worth more than 4 credits?
  program: "r1: Find[Databases] → QueryAttr[credits] → VerifyNum[4 | >]"
  answer: yes
- question: What does Ada Lovelace teach?
  program: "r1: Find[Ada Lovelace] → Relate[taught by | backward] → QueryName[]"
"""


@pytest.fixture(autouse=True)
def _test_logging(monkeypatch):
    monkeypatch.setattr("cbr2.data.__main__.setup_logging", lambda: None)  # the test process keeps its logging


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def _message(excinfo: pytest.ExceptionInfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message  # one line, as every entry point prints it
    return message


# ---------------------------------------------------------------- the KB readers

def test_the_tab_form_reads_concepts_literals_and_relations_on_both_ends(tmp_path):
    kb = load_custom_kb(_write(tmp_path, "kb.tsv", SMALL_KB))
    concepts = {c["name"]: c for c in kb.concepts.values()}
    ids = {c["name"]: cid for cid, c in kb.concepts.items()}
    assert concepts["professor"]["subclassOf"] == [ids["teacher"]] and concepts["course"]["subclassOf"] == []
    ents = {e["name"]: e for e in kb.entities.values()}
    eid = {e["name"]: k for k, e in kb.entities.items()}
    assert set(ents) == {"Ada Lovelace", "Databases", "Programming 101"}  # concepts are no entities
    assert ents["Ada Lovelace"]["instanceOf"] == [ids["professor"]]
    assert {a["key"]: a["value"] for a in ents["Databases"]["attributes"]} == {
        "credits": {"type": "quantity", "value": 5, "unit": "1"},
        "length": {"type": "quantity", "value": 3.5, "unit": "km"},
        "first taught": {"type": "date", "value": "1998-09-01"},
    }
    # Forward on the subject, backward on the object; the repeated line is one fact.
    assert ents["Databases"]["relations"][0] == {"relation": "taught by", "direction": "forward",
                                                 "object": eid["Ada Lovelace"], "qualifiers": {}}
    assert ents["Ada Lovelace"]["relations"] == [{"relation": "taught by", "direction": "backward",
                                                  "object": eid["Databases"], "qualifiers": {}}]
    assert kb.vocabulary.keys == {"credits": "quantity", "length": "quantity", "first taught": "date"}
    assert kb.vocabulary.relations == {"taught by", "prerequisite"}


def test_the_pipe_form_makes_every_object_an_entity(tmp_path):
    kb = load_triples_kb(_write(tmp_path, "kb.txt", "Databases|credits|5\nDatabases|instance of|course\n"
                                                    "Databases | taught by | Ada Lovelace\n"))
    assert {e["name"] for e in kb.entities.values()} == {"Databases", "5", "Ada Lovelace"}
    assert not any(e["attributes"] for e in kb.entities.values())
    assert [c["name"] for c in kb.concepts.values()] == ["course"]  # instance of makes concepts here too
    assert kb.vocabulary.relations == {"credits", "taught by"}


def test_metaqas_kb_is_read_as_metaqas_loader_reads_it():
    path = EMBEDDED_ROOT / "mini-metaqa" / "kb.txt"
    as_custom, as_metaqa = load_custom_kb(path), load_metaqa_kb(path)
    assert custom_kb_kind(path) == "triples"
    assert as_custom.concepts == as_metaqa.concepts and as_custom.entities == as_metaqa.entities


@pytest.mark.parametrize("schema", ["newer", "older"])
def test_kopl_json_of_either_schema_is_read_as_kqa_pros_kb(tmp_path, schema):
    raw = copy.deepcopy(TINY_KB) if schema == "newer" else to_old_schema(TINY_KB)
    path = _write(tmp_path, "kb.json", json.dumps(raw))
    expected = kqapro_kb_from_dict(copy.deepcopy(TINY_KB), "tiny")
    kb = load_custom_kb(path)
    assert (kb.concepts, kb.entities) == (expected.concepts, expected.entities)
    other = _write(tmp_path, "kb.kopl", json.dumps(raw))  # told by its content as well
    assert custom_kb_kind(other) == "kqapro" and load_custom_kb(other).entities == expected.entities


@pytest.mark.parametrize(("text", "expected"), [
    ("a b c\n", "kb.tsv:1: expected subject<TAB>relation<TAB>object or subject|relation|object"),
    ("a\tb\tc\n\nd\te\n", "kb.tsv:3: expected subject<TAB>relation<TAB>object (2 TABs), got 1"),
    ("a\tb\tc\nd\te\tf\tg\n", "kb.tsv:2: expected subject<TAB>relation<TAB>object (2 TABs), got 3"),
    ("a\t\tc\n", "kb.tsv:1: empty relation"),
    ("a|b|c\nd|e|f|g\n", "kb.tsv:2: expected subject|relation|object (2 '|'), got 3"),
    ("a\tb\tc\nd|e|f\n", "kb.tsv:2: '|'-separated, but this file is TAB-separated (its first triple, line 1, is)"),
    ("a|b|c\nd\te\tf\n", "kb.tsv:2: TAB-separated, but this file is '|'-separated (its first triple, line 1, is)"),
    ("a\tstart\t2023-02-30\n", "kb.tsv:1: '2023-02-30' has the form of a date (yyyy-mm-dd) but is none"),
    ("a\tinstance of\tcourse\ncourse\ttaught by\tb\n",
     "kb.tsv:2: 'course' is a concept (line 1) and cannot be an entity too"),
    ("a\tcredits\t5\nb\tcredits\t2020-01-01\n",
     "kb.tsv:2: 'credits' holds a date here and a quantity on line 1: an attribute key holds one type of value"),
    ("a\tcredits\tb\nc\tcredits\t5\n",
     "kb.tsv:2: 'credits' holds a quantity here but relates two entities on line 1"),
    ("# nothing\n\n", "kb.tsv: no triples"),
])
def test_a_bad_triples_file_is_named_with_its_line(tmp_path, text, expected):
    path = _write(tmp_path, "kb.tsv", text)
    with pytest.raises(DataError) as excinfo:
        load_custom_kb(path)
    assert _message(excinfo).startswith(f"{path.parent}/{expected}")


# ---------------------------------------------------------------- the cases file

def test_cases_are_checked_executed_and_answered(tmp_path):
    kb = load_custom_kb(_write(tmp_path, "kb.tsv", SMALL_KB))
    questions = load_cases(_write(tmp_path, "cases.yaml", SMALL_CASES), kb)
    assert [(q.qid, q.category, q.answer) for q in questions] == [
        ("case-1", "QueryName", ["Ada Lovelace"]), ("case-2", "QueryAttr", ["5"]),
        ("case-3", "Verify", ["yes"]),  # YAML's yes stays the text "yes"
        ("case-4", "QueryName", ["Databases"]),  # no answer given: the computed one
    ]
    assert questions[0].question == "Who teaches Databases?"
    assert [s.function for s in questions[1].program.steps] == ["Find", "QueryAttr"]


def _bad_case(program: str, answer: str = "") -> str:
    return SMALL_CASES + f"- question: A bad case\n  program: {program}\n{answer}"


@pytest.mark.parametrize(("case", "expected"), [
    (_bad_case('"r1: Find[Databases] → Relate[teaches | forward] → QueryName[]"'),
     "cases.yaml:15 (case 5): relation 'teaches' is not in the KB (the KB's relations: prerequisite, taught by)"),
    (_bad_case('"r1: Find[Databses] → QueryName[]"'),
     "cases.yaml:15 (case 5): entity 'Databses' is not in the KB (did you mean 'Databases'?)"),
    (_bad_case('"r1: FindAll[] → FilterConcept[courses] → Count[]"'),
     "cases.yaml:15 (case 5): concept 'courses' is not in the KB (did you mean 'course'?)"),
    (_bad_case('"r1: Find[Databases] → QueryAttr[credit]"'),
     "cases.yaml:15 (case 5): attribute key 'credit' is not in the KB (did you mean 'credits'?)"),
    (_bad_case('"r1: Find[Databases] → VerifyNum[4 | >]"'),
     "cases.yaml:15 (case 5): the program does not type-check: step 2 (VerifyNum) must follow QueryAttr"),
    (_bad_case('"r1: Find[Databases] → Fnd[x]"'), ("cases.yaml:15 (case 5): the program does not parse: unknown "
                                                 "function 'Fnd'")),
    # A literal block: the line of the program's own line that fails.
    (_bad_case("|\n    r1: Find[Databases]\n    r2: r1 → Relate[teaches | forward] → QueryName[]"),
     "cases.yaml:17 (case 5): relation 'teaches' is not in the KB"),
    (_bad_case("|\n    r1: Find[Databases]\n    r2: r1 → Frobnicate[]"),
     "cases.yaml:17 (case 5): the program does not parse: unknown function 'Frobnicate'"),
    (_bad_case('"r1: FindAll[] → FilterConcept[course] → SelectAmong[first taught | largest]"'),
     "cases.yaml:15 (case 5): the program fails on the KB: execution error [IndexError]: SelectAmong: no entity"),
    (_bad_case('"r1: Find[Ada Lovelace] → Relate[taught by | forward] → QueryName[]"'),
     "cases.yaml:15 (case 5): the program answers nothing (an empty set)"),
    (_bad_case('"r1: Find[Databases] → QueryAttr[credits]"', "  answer: 6\n"),
     "cases.yaml:16 (case 5): the given answer '6' is not the program's, '5'"),
    (_bad_case('"r1: FindAll[] → FilterConcept[course] → QueryName[]"', "  answer: [Databases, Ada]\n"),
     "cases.yaml:16 (case 5): the given answer ['Ada', 'Databases'] is not the program's, 'Databases'"),
    (SMALL_CASES + "- question: A bad case\n  programme: x\n",
     "cases.yaml:15 (case 5): unknown key 'programme' (did you mean program?)"),
    (SMALL_CASES + "- question: A bad case\n", "cases.yaml:14 (case 5): missing key 'program'"),
    (SMALL_CASES + "- question: [a, b]\n  program: x\n", "cases.yaml:14 (case 5): question must be text, got a list"),
    (SMALL_CASES + "- question: A\n  program: x\n  answer: []\n", "cases.yaml:16 (case 5): answer must be a value"),
    (SMALL_CASES + "- just text\n", "cases.yaml:14 (case 5): expected a case (question:, program:, answer:)"),
    ("question: x\nprogram: y\n", "cases.yaml:1: expected a list of cases"),
    ("- question: [x\n", "cases.yaml:2: not valid YAML"),
    ("", "cases.yaml: no cases"),
])
def test_a_bad_case_is_named_with_its_line_and_number(tmp_path, case, expected):
    kb = load_custom_kb(_write(tmp_path, "kb.tsv", SMALL_KB))
    path = _write(tmp_path, "cases.yaml", case)
    with pytest.raises(DataError) as excinfo:
        load_cases(path, kb)
    assert _message(excinfo).startswith(f"{tmp_path}/{expected}")


# ---------------------------------------------------------------- the benchmark and its keys

def test_the_custom_benchmark_reads_its_kb_through_the_store_and_its_cases_as_questions(tmp_path):
    bench = Benchmark("custom", kb=KB_FILE, cases=CASES_FILE, cache_dir=tmp_path)
    assert type(bench.kb).__name__ == "StoredKB" and bench.kb.stats()["entities"] == 31
    questions = bench.questions()
    assert bench.family.splits == ("train",) and questions == bench.questions("train")
    assert [q.qid for q in questions] == [f"case-{i}" for i in range(1, len(questions) + 1)]
    assert questions[1].answer == ["Ada Lovelace", "Alan Turing"] and questions[1].category == "QueryName"
    assert bench.answer_from_values(["Ada Lovelace", "Alan Turing"], questions[1].program) == ["Ada Lovelace",
                                                                                                  "Alan Turing"]
    assert bench.root == EXAMPLE
    with pytest.raises(ConfigError, match="data.split='val' is not a custom split"):
        compose(Config, overrides=["data.name=custom", f"data.kb={KB_FILE}", f"data.cases={CASES_FILE}",
                                   "data.split=val"])


def test_the_structural_name_follows_the_cases_files_content(tmp_path):
    cases = tmp_path / "cases.yaml"
    shutil.copy(CASES_FILE, cases)
    first = structural_name({"name": "custom", "cases": str(cases)})
    assert first.startswith("custom-") and len(first) == len("custom-") + 12
    assert Benchmark("custom", kb=KB_FILE, cases=cases).structural_name == first
    cases.write_text(cases.read_text() + "\n# changed\n")
    assert structural_name({"name": "custom", "cases": str(cases)}) != first
    assert structural_name({"name": "mini-kqapro", "cases": None}) == "mini-kqapro"


def test_the_config_keys_are_both_given_for_custom_and_only_for_it():
    ok = compose(Config, overrides=["data.name=custom", f"data.kb={KB_FILE}", f"data.cases={CASES_FILE}"])
    assert Benchmark.from_config(ok.data).cases_path == CASES_FILE
    train = compose(TrainConfig, overrides=["data.name=custom", f"data.kb={KB_FILE}", f"data.cases={CASES_FILE}"])
    assert train.data.cases == str(CASES_FILE)
    for overrides, expected in [
        (["data.name=custom"], ("data.name=custom needs data.kb=FILE (a triples file or KoPL JSON) and "
                               "data.cases=FILE (solved cases, YAML)")),
        (["data.name=custom", "data.kb=kb.tsv"], "data.name=custom needs data.kb=FILE"),
        (["data.name=custom", "data.kb=a", "data.cases=b", "data.root=c"], ("data.root='c': data.name=custom does "
                                                                           "not read it")),
        (["data.kb=kb.tsv", "data.cases=c.yaml"], "data.kb and data.cases: read with data.name=custom only"),
    ]:
        for schema in (Config, TrainConfig):
            with pytest.raises(ConfigError, match=expected.replace("(", r"\(").replace(")", r"\)")):
                compose(schema, overrides=overrides)
    with pytest.raises(ConfigError, match="needs data.kb"):
        Benchmark("custom", cases=CASES_FILE)
    with pytest.raises(ConfigError, match="with data.name=custom only"):
        Benchmark("mini-kqapro", kb=KB_FILE)
    with pytest.raises(DataError, match="nowhere.tsv: file not found"):
        Benchmark("custom", kb="nowhere.tsv", cases=CASES_FILE)


def test_the_walk_through_files_are_clean_and_the_new_questions_are_new():
    kb = load_custom_kb(KB_FILE)
    cases = load_cases(CASES_FILE, kb)
    questions = load_cases(QUESTIONS_FILE, kb)
    assert 25 <= len(cases) <= 40 and 10 <= len(questions)
    assert not {q.question for q in questions} & {q.question for q in cases}
    assert all(q.answer for q in questions)
    # The cases cover what the walk-through says they do.
    functions = {s.function for q in cases for s in q.program.steps}
    assert {"Relate", "Count", "QueryAttr", "FilterNum", "And", "Or", "VerifyNum", "SelectBetween"} <= functions
    directions = {s.inputs[1] for q in cases for s in q.program.steps if s.function == "Relate"}
    assert directions == {"forward", "backward"}
    assert any(sum(s.function == "Relate" and s.inputs[0] == "prerequisite" for s in q.program.steps) == 2
               for q in cases)


# ---------------------------------------------------------------- data check

def test_check_of_the_walk_through_is_clean_and_lists_the_answers(capsys):
    assert main(["check", "--kb", str(KB_FILE), "--cases", str(CASES_FILE)]) == 0
    out = capsys.readouterr().out
    assert f"KB {KB_FILE} (triples, TAB-separated)" in out
    assert "KB: 31 entities, 6 concepts, 6 relations, 4 attribute keys, 70 relation facts, 40 attribute facts" in out
    assert "  attribute keys: credits (quantity), enrolment (quantity), founded (date), height (quantity, metre)" in out
    assert "cases: 39 (Count 5, QueryAttr 5, QueryName 21" in out
    assert f"structural retriever: trained on them (39 cases, at least {MIN_STRUCTURAL_CASES})" in out
    assert "  case-2   Who teaches Machine Learning? → Ada Lovelace; Alan Turing" in out
    assert out.endswith("result: clean\n")


def test_check_names_every_problem_of_broken_copies(tmp_path, capsys):
    kb_lines = KB_FILE.read_text().splitlines()
    kb_lines[10] = "Physics\tfounded"  # line 11: two fields
    kb_lines.append("teacher\tmember of\tPhysics")  # a concept as an entity
    broken_kb = _write(tmp_path, "kb.tsv", "\n".join(kb_lines) + "\n")
    cases = CASES_FILE.read_text()
    cases = cases.replace("Relate[taught by | forward] → QueryName[]\"\n  answer: Ada Lovelace",
                          "Relate[teaches | forward] → QueryName[]\"\n  answer: Ada Lovelace", 1)
    cases = cases.replace("answer: 45", "answer: 46")
    cases = cases.replace("r2: Find[Mechanics]", "r2: Find[Mechanix]")
    cases = cases.replace("QueryAttr[credits] → VerifyNum[4 | >]", "VerifyNum[4 | >]")
    broken_cases = _write(tmp_path, "cases.yaml", cases)

    assert main(["check", "--kb", str(broken_kb), "--cases", str(broken_cases)]) == 1
    out = capsys.readouterr().out
    assert f"  {broken_kb}:11: expected subject<TAB>relation<TAB>object (2 TABs), got 1" in out
    assert f"  {broken_kb}:{len(kb_lines)}: 'teacher' is a concept (line 7)" in out
    # With a broken KB the cases are parsed and type-checked, not run.
    assert f"  {broken_cases}:138 (case 35): the program does not type-check" in out
    assert "teaches" not in out and "parsed and type-checked only" in out
    assert out.endswith("result: 3 problems\n")

    assert main(["check", "--kb", str(KB_FILE), "--cases", str(broken_cases)]) == 1
    out = capsys.readouterr().out
    problems = [line.strip() for line in out.splitlines() if line.startswith(f"  {broken_cases}")]
    assert problems == [
        (f"{broken_cases}:7 (case 1): relation 'teaches' is not in the KB (the KB's relations: head, located in, "
        "member of, offered by, prerequisite, taught by)"),
        f"{broken_cases}:75 (case 21): the given answer '46' is not the program's, '45'",
        f"{broken_cases}:103 (case 29): entity 'Mechanix' is not in the KB (did you mean 'Mechanics'?)",
        (f"{broken_cases}:138 (case 35): the program does not type-check: step 2 (VerifyNum) must follow QueryAttr "
        "or QueryAttrUnderCondition, but its input is entities"),
    ]
    assert "cases: 39 (" in out and "; 4 with problems" in out and "  case-2 " in out and "  case-1 " not in out


def test_check_of_a_kb_alone_and_the_commands_own_errors(tmp_path, capsys):
    assert main(["check", "--kb", str(KB_FILE)]) == 0
    assert "cases" not in capsys.readouterr().out
    assert main(["check", "--kb", str(tmp_path / "none.tsv")]) == 2
    assert "none.tsv: no such file" in capsys.readouterr().err
    for argv in (["check"], ["check", str(tmp_path), "--kb", str(KB_FILE)], ["check", "--cases", str(CASES_FILE)]):
        with pytest.raises(SystemExit) as excinfo:
            main(argv)
        assert excinfo.value.code == 2


def test_check_of_kopl_json_and_of_a_broken_one(tmp_path, capsys):
    good = _write(tmp_path, "kb.json", json.dumps(TINY_KB))
    cases = _write(tmp_path, "cases.yaml", '- question: Where was Marie Curie born?\n'
                                           '  program: "r1: Find[Marie Curie] → Relate[place of birth | forward] → '
                                           'QueryName[]"\n  answer: Warsaw\n')
    assert main(["check", "--kb", str(good), "--cases", str(cases)]) == 0
    out = capsys.readouterr().out
    assert "(KoPL JSON)" in out and "case-1  Where was Marie Curie born? → Warsaw" in out
    raw = copy.deepcopy(TINY_KB)
    raw["entities"]["Q1"]["name"] = 5
    raw["entities"]["Q2"]["instanceOf"] = ["C9"]
    bad = _write(tmp_path, "bad.json", json.dumps(raw))
    assert main(["check", "--kb", str(bad)]) == 1
    out = capsys.readouterr().out
    assert f'{bad}: entities["Q1"].name: expected a string' in out and "unknown concept 'C9'" in out


# ---------------------------------------------------------------- the run: case views, retrieval, narrowing

def _few_cases(tmp_path: Path, n: int) -> Path:
    entries = CASES_FILE.read_text().split("\n- question:")
    return _write(tmp_path, "few.yaml", "\n- question:".join(entries[:n + 1]) + "\n")


def test_case_views_follow_the_number_of_cases(tmp_path, caplog):
    from cbr2.structural.on_demand import case_views_for, resolve_structural

    def cfg(cases, *more):
        return compose(Config, overrides=["data.name=custom", f"data.kb={KB_FILE}", f"data.cases={cases}",
                                          f"structural.checkpoints_dir={tmp_path / 'ckpt'}", *more])

    enough = cfg(CASES_FILE)
    assert case_views_for(enough.retrieval, Benchmark.from_config(enough.data))[0] == "dual"
    few = cfg(_few_cases(tmp_path, 5))
    bench = Benchmark.from_config(few.data)
    assert len(bench.questions()) == 5
    with caplog.at_level("INFO", logger="cbr2.structural.on_demand"):
        mode, why = case_views_for(few.retrieval, bench)
    assert mode == "semantic" and f"holds 5 cases, fewer than the {MIN_STRUCTURAL_CASES}" in why and why in caplog.text
    assert case_views_for(cfg(bench.cases_path, "retrieval.cases=random").retrieval, bench)[0] == "random"
    assert case_views_for(compose(Config).retrieval, Benchmark("mini-kqapro"))[0] == "dual"
    # An evaluation never changes retrieval.cases: it refuses in one line, saying what to set.
    with pytest.raises(ConfigError, match="holds 5 cases, fewer than the 30 a structural retriever is trained on: "
                                          "set retrieval.cases=semantic"):
        resolve_structural(few.structural, few.data, bench)
    given = cfg(bench.cases_path, "structural.checkpoint=some/folder")
    assert resolve_structural(given.structural, given.data, bench) == "some/folder"


def test_the_threshold_leaves_two_held_out_cases_at_the_default_holdout():
    from cbr2.config import StructuralTrainConfig
    from cbr2.structural.data import is_heldout

    holdout = StructuralTrainConfig().holdout
    for n in range(MIN_STRUCTURAL_CASES, MIN_STRUCTURAL_CASES + 200):
        held = sum(is_heldout(f"case-{i}", holdout) for i in range(1, n + 1))
        assert held >= 2 and n - held >= 2, n
    assert len(load_cases(CASES_FILE, load_custom_kb(KB_FILE))) >= MIN_STRUCTURAL_CASES  # the walk-through trains


def test_linking_and_narrowing_ground_a_custom_question_in_the_kb(monkeypatch):
    from test_retrieval import KeywordEncoder

    from cbr2.data.questions import Question
    from cbr2.generation.grounded import RELATE
    from cbr2.retrieval.cases import Query
    from cbr2.retrieval.retriever import Retriever
    from cbr2.run.runner import build_prompts, reach_of

    monkeypatch.setattr("cbr2.retrieval.retriever.load_encoder",
                        lambda *a, **k: KeywordEncoder(["who", "teaches", "which", "courses", "require", "how", "many"]))
    cfg = compose(Config, overrides=["data.name=custom", f"data.kb={KB_FILE}", f"data.cases={CASES_FILE}",
                                     "retrieval.cases=semantic"])
    bench = Benchmark.from_config(cfg.data)
    retriever = Retriever(bench, cfg.retrieval)
    question = Question("q", "Which courses require Data Structures?", None, None, None)
    (retrieved,) = retriever.retrieve([Query(question.qid, question.question)])
    assert retrieved.links.entities == ("Data Structures",) and retrieved.links.concepts == ("course",)
    assert retrieved.cases and all(c.question.qid.startswith("case-") for c in retrieved.cases)
    reach = reach_of(cfg.generation, cfg.retrieval.link, bench)
    assert reach is not None and reach.hops == 2  # the cases' longest Relate chain
    (prompt,) = build_prompts(cfg.prompt, cfg.generation, [question], {question.qid: retrieved}, reach)
    grounding = dict(prompt.grounding)
    assert grounding["entity"] == ("Data Structures",)
    # The KB's relations around it, with their directions, and nothing it cannot reach in 2 hops.
    assert {"prerequisite | backward", "prerequisite | forward", "taught by | forward",
            "offered by | forward"} <= set(grounding[RELATE])
    assert not {"located in | backward", "head | backward"} & set(grounding[RELATE])  # a building's, a head's
    assert "concept" not in grounding  # every concept is within 2 hops: a kind that narrows nothing is left out
    assert "Data Structures" in prompt.user


# ---------------------------------------------------------------- slow: the structural retriever trained on them

@pytest.mark.slow
def test_the_structural_retriever_trains_on_the_walk_through_and_is_found_by_its_content(tmp_path, monkeypatch):
    from cbr2.structural.on_demand import resolve_structural
    from cbr2.structural.train import train

    cases = tmp_path / "cases.yaml"
    shutil.copy(CASES_FILE, cases)
    where = tmp_path / "ckpt"
    data = ["data.name=custom", f"data.kb={KB_FILE}", f"data.cases={cases}"]
    result = train(compose(TrainConfig, overrides=[*data, f"structural.checkpoints_dir={where}",
                                                   f"output_dir={tmp_path / 'run'}", "trainer.max_steps=4",
                                                   "structural.pairs_per_epoch=32", "structural.val_pairs=8"]))
    name = structural_name({"name": "custom", "cases": str(cases)})
    assert Path(result["checkpoint"]).name == f"structural-{name}-{result['run_id']}"
    cfg = compose(Config, overrides=[*data, f"structural.checkpoints_dir={where}"])
    monkeypatch.setattr("cbr2.structural.train.train", lambda *a: pytest.fail("trained again"))
    assert resolve_structural(cfg.structural, cfg.data, Benchmark.from_config(cfg.data)) == result["checkpoint"]
    cases.write_text(cases.read_text() + "\n# changed\n")  # another content: that retriever is not this one's
    with pytest.raises(pytest.fail.Exception, match="trained again"):
        resolve_structural(cfg.structural, cfg.data, Benchmark.from_config(cfg.data))

