"""The executor: answers in the dataset's form, grounding, and failures that never become answers."""

import pytest

from cbr2.kopl.checker import check_text
from cbr2.kopl.executor import ExecutionError


def run(executor, text):
    result = check_text(text)
    assert result.ok, result.error
    return executor.run(result.program)


ANSWERS = [
    ("r1: Find[Marie Curie] → QueryAttr[height]", ["155 centimetre"]),
    ("r1: Find[Marie Curie] → QueryAttr[date of birth]", ["1867-11-07"]),
    ("r1: FindAll[] → FilterConcept[city] → Count[]", ["2"]),
    # The engine counts subconcepts too (FindAll returns concepts): 3 entities + city + country.
    ("r1: FindAll[] → FilterConcept[geographic location] → Count[]", ["5"]),
    ("r1: FindAll[] → FilterConcept[city] → SelectAmong[population | largest]", ["Paris"]),
    ("r1: Find[Marie Curie]\nr2: Find[Pierre Curie]\nr3: (r1, r2) → SelectBetween[height | greater]", ["Pierre Curie"]),
    (("r1: Find[Nobel Prize in Physics] → Relate[award received | backward] "
      "→ QFilterYear[point in time | 1903 | =] → QueryName[]"), ["Marie Curie", "Pierre Curie"]),
    (("r1: Find[Marie Curie]\nr2: Find[Nobel Prize in Physics]\n"
      "r3: (r1, r2) → QueryRelationQualifier[award received | point in time]"), ["1903"]),
    ("r1: Find[Marie Curie]\nr2: Find[Warsaw]\nr3: (r1, r2) → QueryRelation[]", ["place of birth"]),
    ("r1: Find[Warsaw] → QueryAttrUnderCondition[population | point in time | 2021] → VerifyNum[1000000 | >]", ["yes"]),
    ("r1: Find[Poland] → QueryAttr[inception] → VerifyYear[1000 | >]", ["no"]),
    ("r1: Find[Warsaw] → QueryAttr[elevation above sea level]", ["-2.5 metre"]),  # the engine would print -2
]

FAILURES = [
    ("r1: Find[Maria Curie] → QueryAttr[height] → VerifyNum[150 centimetre | >]", "unknown_entity"),
    ("r1: FindAll[] → FilterConcept[town] → Count[]", "unknown_concept"),
    ("r1: Find[Marie Curie] → QueryAttr[altitude]", "unknown_key"),
    ("r1: Find[Marie Curie] → Relate[born in | forward] → QueryName[]", "unknown_relation"),
    ("r1: Find[Marie Curie] → Relate[award received | forward] → QFilterYear[year | 1903 | =] → Count[]",
     "unknown_qualifier"),
    ("r1: FindAll[] → FilterConcept[human] → SelectAmong[sex or gender | largest]", "IndexError"),
]


@pytest.fixture(scope="module")
def kopl_executor(tiny_kb):
    from cbr2.kopl.executor import Executor

    return Executor(tiny_kb, engine="kopl")


@pytest.mark.parametrize("text, expected", ANSWERS)
def test_answers(tiny_executor, text, expected):
    assert run(tiny_executor, text) == expected


@pytest.mark.parametrize("text, expected", ANSWERS)
def test_answers_of_the_official_engine(kopl_executor, text, expected):
    assert run(kopl_executor, text) == expected


@pytest.mark.parametrize("text, code", FAILURES)
def test_failures_are_execution_errors_not_answers(tiny_executor, text, code):
    with pytest.raises(ExecutionError) as info:
        run(tiny_executor, text)
    assert info.value.code == code


@pytest.mark.parametrize("text, code", FAILURES)
def test_failures_of_the_official_engine(kopl_executor, text, code):
    with pytest.raises(ExecutionError) as info:
        run(kopl_executor, text)
    assert info.value.code == code


def test_the_default_engine_is_cbr2(tiny_executor, kopl_executor):
    from kopl.kopl import KoPLEngine

    from cbr2.kopl.engine import Engine

    assert (tiny_executor.engine_name, type(tiny_executor.engine)) == ("cbr2", Engine)
    assert (kopl_executor.engine_name, type(kopl_executor.engine)) == ("kopl", KoPLEngine)


@pytest.mark.parametrize("engine", ["cbr2", "kopl"])
def test_timeout(tiny_kb, monkeypatch, engine):
    import time

    from cbr2.kopl.executor import Executor

    executor = Executor(tiny_kb, timeout_s=0.2, engine=engine)
    monkeypatch.setattr(executor.engine, "Count", lambda entities: time.sleep(5))
    with pytest.raises(ExecutionError) as info:
        run(executor, "r1: FindAll[] → Count[]")
    assert info.value.code == "timeout"


def test_the_engine_kb_is_a_copy(tiny_kb):
    from cbr2.kopl.executor import Executor

    Executor(tiny_kb, engine="kopl")
    Executor(tiny_kb, engine="kopl")  # the engine mutates what it gets; a second engine from the same KB must work
    Executor(tiny_kb)
    assert "subclassOf" in tiny_kb.concepts["C3"]


EMPTIED = [
    # Warsaw is Marie Curie's place of birth: from Warsaw the relation is read backward.
    ("r1: Find[Warsaw] → Relate[place of birth | forward] → FilterConcept[human] → QueryName[]", 1),
    ("r1: FindAll[] → FilterConcept[city] → FilterNum[population | 5 | <] → QueryName[]", 2),
    ("r1: Find[Marie Curie]\nr2: Find[Poland]\nr3: (r1, r2) → QueryRelation[]", 2),
    ("r1: Find[Warsaw] → Relate[place of birth | backward] → FilterConcept[human] → QueryName[]", None),
]


@pytest.mark.parametrize("engine", ["cbr2", "kopl"])
@pytest.mark.parametrize("text, step", EMPTIED)
def test_first_empty_step_names_where_an_empty_answer_went_empty(tiny_kb, engine, text, step):
    from cbr2.kopl.executor import Executor

    program = check_text(text).program
    executor = Executor(tiny_kb, engine=engine)
    assert executor.first_empty_step(executor.results(program)) == step
    assert (executor.run(program) == []) == (step is not None)
