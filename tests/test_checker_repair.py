"""Type checking and deterministic repair of generated program text."""

import pytest

from cbr2.kopl.checker import check_text
from cbr2.kopl.repair import repair
from cbr2.kopl.sketch import sketch


@pytest.mark.parametrize("text, code", [
    ("r1: Find[X] → QFilterStr[start time | 2000] → QueryName[]", "qfilter_needs_facts"),
    ("r1: Find[X] → Relate[a | forward] → VerifyStr[yes]", "verify_needs_values"),
    ("r1: Find[X] → FilterNum[height | 3 | ≥] → Count[]", "invalid_op"),
    ("r1: Find[X] → Relate[child | downward] → Count[]", "invalid_direction"),
    ("r1: FindAll[] → SelectAmong[height | tallest]", "invalid_among_op"),
    ("r1: Find[X] → QueryAttr[date of birth] → VerifyDate[16 July 2010 | =]", "bad_literal"),
    ("r1: FindAll[] → FilterYear[inception | nineteen | >] → Count[]", "bad_literal"),
    ("r1: Find[X] → Relate[a | forward]", "no_answer"),
    ("r1: Find[X]\nr2: Find[Y] → Count[]", "unused_result"),
    ("r1: Find[X] → Count[] → QueryName[]", "input_type"),
])
def test_type_errors_are_classified(text, code):
    result = check_text(text)
    assert not result.ok and result.error.kind == "type" and result.error.code == code


@pytest.mark.parametrize("text", [
    "r1: Find[X] → Relate[award received | forward] → QFilterYear[point in time | 1903 | =] → Count[]",
    "r1: Find[X] → QueryAttrUnderCondition[population | point in time | 2020] → VerifyNum[2000000 | >]",
    "r1: Find[X] → QueryAttr[date of birth] → VerifyDate[1867-11-07 | =]",
    "r1: Find[X]\nr2: Find[Y]\nr3: (r1, r2) → SelectBetween[height | greater]",
])
def test_well_typed_programs_pass(text):
    assert check_text(text).ok


@pytest.mark.parametrize("bad, rule", [
    ("r1: Find[X] -> Relate[country | forward] -> QueryName[]", "normalise_arrows"),
    ("r1: Find[X] → QueryName[", "fix_calls"),
    ("r1: Find[X] → Count", "fix_calls"),
    ('r1: Find["X"] → Relate[ country |  forward ] → QueryName []', "fix_calls"),
    ("r1: Find[X] → QueryName[]\nQuestion: Who founded Y?\nr1: Find[Y]", "drop_trailing_text"),
    ("r1: Find[X] → QueryName[]   # the names", "drop_trailing_text"),
    ("```\nProgram: r1: Find[X] → QueryName[]\n```", "strip_wrappers"),
    ("r1: Find[X]\nr2: Find[Y]\nr3: (r2, r3) → QueryRelation[]", "relabel"),
    ("r0: Find[X]\nr1: Find[Y]\nr2: (r1, r2) → QueryRelation[]", "relabel"),
    ("Find[X] → QueryName[]", "relabel"),
])
def test_minor_slips_are_repaired_and_recorded(bad, rule):
    assert not check_text(bad).ok
    fixed, applied = repair(bad)
    assert rule in applied
    assert check_text(fixed).ok, fixed


def test_relabel_shifts_an_off_by_one_head_and_otherwise_takes_the_latest_unused_line():
    fixed, _ = repair("r1: Find[X]\nr2: Find[Y]\nr3: (r2, r3) → QueryRelation[]")
    assert fixed.splitlines()[-1] == "r3: (r1, r2) → QueryRelation[]"
    fixed, _ = repair("r1: Find[X]\nr2: Find[Y]\nr3: (r1, r9) → QueryRelation[]")
    assert fixed.splitlines()[-1] == "r3: (r1, r2) → QueryRelation[]"
    fixed, _ = repair("r1: Find[X]\nr2: (r1, r2) → QueryRelation[]")  # no second input exists: stays wrong
    assert not check_text(fixed).ok


def test_repair_records_nothing_for_a_valid_program_and_never_invents_steps():
    good = "r1: Find[X] → QueryName[]"
    assert repair(good) == (good, [])
    fixed, _ = repair("r1: Find[X] → Relate[country]")  # a missing argument is not a slip
    assert not check_text(fixed).ok


def test_chain_repairs():
    fixed, applied = repair("1. Find[X\n2. Relate['country' | forward]\n3. Count\nQuestion: next", "chain")
    assert fixed == "Find[X]\nRelate[country | forward]\nCount[]"
    assert {"strip_enumeration", "fix_calls", "drop_trailing_text"} <= set(applied)
    assert check_text(fixed, "chain").ok


def test_sketch_resolves_what():
    program = check_text("r1: Find[X] → Relate[a | forward] → What[]").program
    assert sketch(program) == ("Find", "Relate", "QueryName")
