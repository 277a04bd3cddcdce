"""Program model and text forms: lossless round trips, escapes, and parse errors."""

import pytest

from cbr2.kopl.functions import ALIASES, FUNCTIONS
from cbr2.kopl.program import Program, ProgramError
from cbr2.kopl.text import parse_chain_text, parse_dag_text, to_chain_text, to_dag_text

PAPER_EXAMPLE = (
    "r1: FindAll[] → FilterStr[local dialing code | 717] → FilterConcept[city of Pennsylvania] "
    "→ SelectAmong[elevation above sea level | smallest]"
)


def _p(*steps):
    return Program.from_json([{"function": f, "dependencies": list(d), "inputs": list(i)} for f, i, d in steps])


NESTED = _p(("FindAll", [], []), ("FilterConcept", ["city"], [0]),
            ("Find", ["Poland"], []), ("Relate", ["country", "backward"], [2]), ("And", [], [1, 3]),
            ("FindAll", [], []), ("FilterNum", ["population", "1000000", ">"], [5]), ("And", [], [4, 6]),
            ("What", [], [7]))


def test_function_table_has_the_27_functions_and_the_alias():
    assert len(FUNCTIONS) == 27
    assert ALIASES == {"What": "QueryName"}
    assert FUNCTIONS["QueryRelationQualifier"].arity == 2 and FUNCTIONS["Find"].arity == 0


def test_paper_example_parses_and_prints_back_identically():
    program = parse_dag_text(PAPER_EXAMPLE)
    assert program.functions == ["FindAll", "FilterStr", "FilterConcept", "SelectAmong"]
    assert to_dag_text(program) == PAPER_EXAMPLE


def test_nested_joins_round_trip_through_all_three_forms():
    text = to_dag_text(NESTED)
    assert text.splitlines() == [
        "r1: FindAll[] → FilterConcept[city]",
        "r2: Find[Poland] → Relate[country | backward]",
        "r3: (r1, r2) → And[]",
        "r4: FindAll[] → FilterNum[population | 1000000 | >]",
        "r5: (r3, r4) → And[] → What[]",
    ]
    assert parse_dag_text(text) == NESTED
    assert parse_chain_text(to_chain_text(NESTED)) == NESTED
    assert Program.from_json(NESTED.to_json()) == NESTED


def test_arguments_with_delimiters_survive_a_round_trip():
    program = _p(("Find", ["A | B [x] \\ y"], []), ("QueryName", [], [0]))
    assert parse_dag_text(to_dag_text(program)) == program
    assert parse_chain_text(to_chain_text(program)) == program


def test_a_result_used_twice_gets_its_own_line():
    program = _p(("Find", ["Paris"], []), ("Relate", ["country", "forward"], [0]),
                 ("QueryRelation", [], [0, 1]))
    text = to_dag_text(program)
    assert text == "r1: Find[Paris]\nr2: r1 → Relate[country | forward]\nr3: (r1, r2) → QueryRelation[]"
    assert parse_dag_text(text) == program
    with pytest.raises(ValueError, match="post-order"):
        to_chain_text(program)


@pytest.mark.parametrize("text, code", [
    ("", "empty_program"),
    ("Find[X] → QueryName[]", "unparsable"),
    ("r1: Find[X] → Frobnicate[]", "unknown_function"),
    ("r1: Find[X] → Relate[country]", "wrong_argument_count"),
    ("r1: Find[X] → And[]", "wrong_arity"),
    ("r1: Relate[country | forward] → Count[]", "wrong_arity"),
    ("r1: Find[X]\nr2: (r1, r7) → And[] → Count[]", "undefined_reference"),
    ("r1: Find[X]\nr2: (r1, r3) → And[] → Count[]\nr3: Find[Y]", "cyclic_reference"),
    ("r1: Find[X]\nr1: Find[Y]", "duplicate_label"),
    ("r1: Find[X] → QueryName[", "unparsable"),
    ("r1: Find[X] →  → Count[]", "unparsable"),
])
def test_syntax_errors_are_classified(text, code):
    with pytest.raises(ProgramError) as info:
        parse_dag_text(text)
    assert info.value.kind == "syntax" and info.value.code == code


def test_json_errors_name_the_step():
    with pytest.raises(ProgramError) as info:
        Program.from_json([{"function": "Find", "dependencies": [], "inputs": ["X"]},
                           {"function": "Relate", "dependencies": [3], "inputs": ["a", "forward"]}], where="[7].program")
    assert info.value.detail == "[7].program[1]: dependency 3 is not an earlier step"
    assert info.value.code == "cyclic_reference" and str(info.value).endswith(info.value.detail)


def test_chain_errors():
    with pytest.raises(ProgramError) as info:
        parse_chain_text("Find[X]\nAnd[]")
    assert info.value.code == "wrong_arity"
    with pytest.raises(ProgramError) as info:
        parse_chain_text("Find[X]\nFind[Y]\nCount[]")
    assert info.value.kind == "type" and info.value.code == "unused_result"
