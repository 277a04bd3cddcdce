"""The validation layer of the data files: each broken file, made from a valid minimal one,
is rejected with one ``DataError`` that reads ``<file>: <item>: <what is wrong>``; valid files
load unchanged."""

from __future__ import annotations

import copy
import json

import pytest
from conftest import TINY_KB, to_old_schema

from cbr2.data.kb_loaders import KBFormatError, kqapro_kb_from_dict, load_kqapro_kb, load_metaqa_kb
from cbr2.data.questions import DatasetFormatError, load_kqapro_questions, load_metaqa_questions
from cbr2.data.schema import DataError


def _raises(load, *args) -> str:
    """The message of the DataError that ``load(*args)`` raises."""
    with pytest.raises(DataError) as info:
        load(*args)
    return str(info.value)


def test_one_exception_type():
    assert KBFormatError is DataError and DatasetFormatError is DataError and issubclass(DataError, ValueError)


# ------------------------------------------------------------------------ kb.json

def _entity(kb, eid="Q1"):
    return kb["entities"][eid]


KB_CASES = {
    "attribute without key": (
        lambda kb: _entity(kb)["attributes"][1].pop("key"),
        """entities["Q1"].attributes[1]: missing key 'key'"""),
    "entities a list": (
        lambda kb: kb.update(entities=list(kb["entities"].values())),
        "entities: expected an object, got a list"),
    "attributes a dict": (
        lambda kb: _entity(kb).update(attributes={"height": 155}),
        """entities["Q1"].attributes: expected a list, got an object"""),
    "relations not a list": (
        lambda kb: _entity(kb).update(relations="Q3"),
        """entities["Q1"].relations: expected a list, got the string 'Q3'"""),
    "qualifiers not a dict": (
        lambda kb: _entity(kb)["relations"][1].update(qualifiers=[{"type": "year", "value": 1903}]),
        """entities["Q1"].relations[1].qualifiers: expected an object, got a list"""),
    "attribute qualifiers not a dict": (
        lambda kb: _entity(kb, "Q3")["attributes"][0].update(qualifiers="point in time"),
        """entities["Q3"].attributes[0].qualifiers: expected an object, got the string 'point in time'"""),
    "relation to an unknown entity": (
        lambda kb: _entity(kb)["relations"][0].update(object="Q99"),
        """entities["Q1"].relations[0].object: unknown entity or concept 'Q99'"""),
    "non-numeric quantity": (
        lambda kb: _entity(kb)["attributes"][1].update(value={"type": "quantity", "value": "abc"}),
        """entities["Q1"].attributes[1].value.value: expected a number, got the string 'abc'"""),
    "entity name not a string": (
        lambda kb: _entity(kb).update(name=5),
        """entities["Q1"].name: expected a string, got the number 5"""),
    "instanceOf an unknown concept": (
        lambda kb: _entity(kb).update(instanceOf=["C1", "C9"]),
        """entities["Q1"].instanceOf[1]: unknown concept 'C9'"""),
    "unknown value type": (
        lambda kb: _entity(kb)["attributes"][2].update(value={"type": "colour", "value": "red"}),
        """entities["Q1"].attributes[2].value: unknown type 'colour'; expected 'string', 'quantity', 'date', 'year'"""),
    "string subclassOf": (
        lambda kb: kb["concepts"]["C3"].update(subclassOf="C2"),
        """concepts["C3"].subclassOf: expected a list, got the string 'C2'"""),
    "subclassOf an unknown concept": (
        lambda kb: kb["concepts"]["C3"].update(subclassOf=["C9"]),
        """concepts["C3"].subclassOf[0]: unknown concept 'C9'"""),
    "relation without direction": (
        lambda kb: _entity(kb)["relations"][0].pop("direction"),
        """entities["Q1"].relations[0]: missing key 'direction'"""),
    "relation without a name": (
        lambda kb: _entity(kb)["relations"][0].pop("relation"),
        """entities["Q1"].relations[0]: missing key 'relation' (or 'predicate', the older schema's name)"""),
    "string year in a qualifier": (
        lambda kb: _entity(kb, "Q3")["attributes"][0]["qualifiers"]["point in time"][0].update(value="2021"),
        ("""entities["Q3"].attributes[0].qualifiers["point in time"][0].value: expected an integer, """
         "got the string '2021'")),
    "value without type": (
        lambda kb: _entity(kb)["attributes"][0]["value"].pop("type"),
        """entities["Q1"].attributes[0].value: missing key 'type'"""),
    "no concepts": (
        lambda kb: kb.pop("concepts"),
        "top level: missing key 'concepts'"),
}


@pytest.mark.parametrize("case", KB_CASES)
def test_broken_kb_json_is_rejected_with_file_and_item(tmp_path, case):
    break_it, expected = KB_CASES[case]
    kb = copy.deepcopy(TINY_KB)
    break_it(kb)
    path = tmp_path / "kb.json"
    path.write_text(json.dumps(kb))
    assert _raises(load_kqapro_kb, path) == f"{path}: {expected}"


@pytest.mark.parametrize("break_it, expected", [
    (lambda kb: kb["entities"]["Q1"]["relations"][0].update(object="Q99"),
     """entities["Q1"].relations[0].object: unknown entity or concept 'Q99'"""),
    (lambda kb: kb["concepts"]["C3"].update(instanceOf=["C9"]),
     """concepts["C3"].instanceOf[0]: unknown concept 'C9'"""),
    (lambda kb: kb["concepts"]["C3"].pop("instanceOf"),
     """concepts["C3"]: missing key 'subclassOf' (or 'instanceOf', the older schema's name)"""),
], ids=["relation to an unknown entity", "instanceOf an unknown concept", "concept without parents"])
def test_the_older_kb_schema_is_checked_too(break_it, expected):
    kb = to_old_schema(TINY_KB)
    break_it(kb)
    assert _raises(kqapro_kb_from_dict, kb, "old.json") == f"old.json: {expected}"


def test_invalid_json_names_line_and_column(tmp_path):
    path = tmp_path / "kb.json"
    path.write_text('{"concepts": {},\n "entities": {"Q1": {"name": "x",}}}')
    assert _raises(load_kqapro_kb, path) == (
        f"{path}: line 2, column 34: not valid JSON (Expecting property name enclosed in double quotes)")


def test_valid_kb_loads_as_written(tmp_path):
    raw = copy.deepcopy(TINY_KB)
    kb = kqapro_kb_from_dict(raw)
    assert raw == TINY_KB  # validation changed nothing in what it was given
    assert kb.entities == TINY_KB["entities"] and kb.concepts == TINY_KB["concepts"]
    height = kb.entities["Q1"]["attributes"][1]["value"]["value"]
    assert height == 155 and type(height) is int  # no coercion: an integer stays one


# ------------------------------------------------------------------ question files

def _question(**changes):
    q = {"question": "How many things are there?", "sparql": "SELECT ...",
         "program": [{"function": "FindAll", "dependencies": [], "inputs": []},
                     {"function": "Count", "dependencies": [0], "inputs": []}],
         "choices": ["6", "7"], "answer": "6"}
    return {k: v for k, v in {**q, **changes}.items() if v is not ...}


QUESTION_CASES = {
    "non-string answer": ([_question(), _question(answer=6)], "[1].answer: expected a string, got the number 6"),
    "one question missing its answer": (
        [_question(), _question(), _question(answer=...)],
        ("[2]: missing key 'answer' (present in 2 of the 3 questions; only a test file leaves it out, "
         "and then for all of them)")),
    "one question missing its program": (
        [_question(program=...), _question()],
        ("[0]: missing key 'program' (present in 1 of the 2 questions; only a test file leaves it out, "
         "and then for all of them)")),
    "no question text": (
        [_question(question=...)], "[0]: no question text: missing key 'question' (or 'rewrite' / 'origin')"),
    "a question that is not an object": ([_question(), "What?"], "[1]: expected an object, got the string 'What?'"),
    "not a list": ({"questions": []}, "top level: expected a list, got an object"),
    "choices a string": ([_question(choices="6")], "[0].choices: expected a list, got the string '6'"),
    "step inputs not strings": (
        [_question(program=[{"function": "Find", "dependencies": [], "inputs": [42]}])],
        "[0].program[0].inputs[0]: expected a string, got the number 42"),
    "unknown function": (
        [_question(program=[{"function": "FindEverything", "dependencies": [], "inputs": []}])],
        "[0].program[0]: unknown function 'FindEverything'"),
    "a step without its input": (
        [_question(), _question(program=[{"function": "FindAll", "dependencies": [], "inputs": []},
                                         {"function": "Count", "dependencies": [], "inputs": []}])],
        "[1].program[1]: Count takes 1 inputs, got 0"),
}


@pytest.mark.parametrize("case", QUESTION_CASES)
def test_broken_question_file_is_rejected_with_file_and_item(tmp_path, case):
    items, expected = QUESTION_CASES[case]
    path = tmp_path / "val.json"
    path.write_text(json.dumps(items))
    assert _raises(load_kqapro_questions, path, "val") == f"{path}: {expected}"


def test_question_files_in_the_official_layouts_load(tmp_path):
    path = tmp_path / "test.json"
    path.write_text(json.dumps([{"question": "Q?", "choices": ["a", "b"]}, {"rewrite": "R?", "choices": []}]))
    test = load_kqapro_questions(path, "test")  # the test file: no answers, no programs, for all
    assert [(q.question, q.answer, q.program) for q in test] == [("Q?", None, None), ("R?", None, None)]
    path.write_text(json.dumps([_question(), _question(question="", origin="Origin?")]))
    val = load_kqapro_questions(path, "val")
    assert [(q.question, q.answer, q.category) for q in val] == [("How many things are there?", "6", "Count"),
                                                                ("Origin?", "6", "Count")]


# ------------------------------------------------------------------------ MetaQA

@pytest.mark.parametrize("text, expected", [
    ("A|directed_by|B\n\nA|directed_by\n", "line 3: expected 'head|relation|tail' (two '|'), got 'A|directed_by'"),
    ("A|directed_by|B|C\n", "line 1: expected 'head|relation|tail' (two '|'), got 'A|directed_by|B|C'"),
    ("A|directed_by|B\nA|has_genre| \n", "line 2: tail: must not be empty"),
    ("A|produced_by|B\n", ("line 1: relation: expected 'directed_by', 'written_by', 'starred_actors', "
                          "'release_year', 'in_language', 'has_tags', 'has_genre', 'has_imdb_votes' or "
                          "'has_imdb_rating', got the string 'produced_by'")),
    ("\n", "no triples (the file is empty)"),
], ids=["one '|'", "three '|'", "empty tail", "unknown relation", "empty file"])
def test_broken_metaqa_kb_names_the_line(tmp_path, text, expected):
    path = tmp_path / "kb.txt"
    path.write_text(text)
    assert _raises(load_metaqa_kb, path) == f"{path}: {expected}"


def _metaqa_root(tmp_path, lines: str):
    (tmp_path / "1-hop" / "vanilla").mkdir(parents=True)
    (tmp_path / "1-hop" / "vanilla" / "qa_test.txt").write_text(lines)
    (tmp_path / "1-hop" / "qa_test_qtype.txt").write_text("movie_to_director\n" * lines.count("\n"))
    return tmp_path


@pytest.mark.parametrize("lines, expected", [
    ("who directed [Memento]\tChristopher Nolan\nwho directed [Heat] Michael Mann\n",
     "line 2: expected 'question<TAB>answers' (no tab), got 'who directed [Heat] Michael Mann'"),
    ("who directed [Memento] and [Heat]\tChristopher Nolan\n",
     "line 1: expected one [topic entity] in the question, found 2: 'who directed [Memento] and [Heat]'"),
    ("who directed [Memento]\tChristopher Nolan|\n", "line 1: answers[1]: must not be empty"),
], ids=["no tab", "two topics", "empty answer"])
def test_broken_metaqa_question_file_names_the_line(tmp_path, lines, expected):
    root = _metaqa_root(tmp_path, lines)
    path = root / "1-hop" / "vanilla" / "qa_test.txt"
    assert _raises(load_metaqa_questions, root, "test", (1,)) == f"{path}: {expected}"


# ----------------------------------------------------------------------- encoding

# Each file carries one Latin-1 "é" (byte 0xe9) on its second line, where UTF-8 is expected:
# (where the file goes, its bytes, how it is loaded).
ENCODING_CASES = {
    "kb.json": ("kb.json", b'{"concepts": {},\n "entities": {"Q1": {"name": "Caf\xe9"}}}', load_kqapro_kb),
    "val.json": ("val.json", b'[{"question": "Who?", "choices": []},\n {"question": "Caf\xe9?", "choices": []}]',
                 lambda path: load_kqapro_questions(path, "val")),
    "kb.txt": ("kb.txt", b"A|directed_by|B\nCaf\xe9|directed_by|B\n", load_metaqa_kb),
    "qa_test.txt": ("1-hop/vanilla/qa_test.txt",
                    b"who directed [Memento]\tChristopher Nolan\nwho directed [Caf\xe9]\tMichael Mann\n",
                    lambda path: load_metaqa_questions(path.parents[2], "test", (1,))),
}


@pytest.mark.parametrize("case", ENCODING_CASES)
def test_non_utf8_file_names_line_and_byte(tmp_path, case):
    where, content, load = ENCODING_CASES[case]
    _metaqa_root(tmp_path, "q [a]\tb\nq [c]\td\n")  # the qtype file the MetaQA case needs
    path = tmp_path / where
    path.write_bytes(content)
    assert _raises(load, path) == (
        f"{path}: line 2, byte {content.index(0xE9)}: not UTF-8 text (invalid continuation byte 0xe9)")
