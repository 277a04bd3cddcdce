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
    ("r1：Find[X]\nr2：Find[Y]\nr3：(r1, r2) → QueryRelation[]", "fix_calls"),  # full-width colons
    ("r 1: Find[X]\nr 2: Find[Y]\nr 3: (r1, r2) → QueryRelation[]", "fix_calls"),
    ("Find[X] → QueryName[]", "relabel"),
    ('r1: Find["X"] → QueryName[]', "fix_calls"),  # the only slip: a quoted argument
    ("r1: Find[“X”] → QueryName[]", "fix_calls"),
])
def test_minor_slips_are_repaired_and_recorded(bad, rule):
    assert not check_text(bad).ok
    fixed, applied = repair(bad)
    assert rule in applied
    assert check_text(fixed).ok, fixed


@pytest.mark.parametrize("text, code", [
    ("r1: Find[X]\nr2: Find[Y]\nr3: (r2, r3) → QueryRelation[]", "cyclic_reference"),  # its own line
    ("r1: Find[X]\nr2: Find[Y]\nr3: (r1, r9) → QueryRelation[]", "undefined_reference"),
    ("r1: Find[X]\nr2: r3 → QueryName[]\nr3: Find[Y]", "cyclic_reference"),  # a later line
    ("r1: Find[X]\nr1: Find[Y]\nr2: (r1, r1) → And[] → QueryName[]", "duplicate_label"),
    ("r1: Find[X]\nr2: (r1, r1) → Or[] → QueryName[]", "duplicate_reference"),
    ("r1: (r1, r1) → Or[] → QueryName[]", "duplicate_reference"),
])
def test_relabel_renames_only_and_never_guesses_a_reference(text, code):
    fixed, applied = repair(text)
    assert "relabel" not in applied
    result = check_text(fixed)
    assert not result.ok and result.error.code == code, result.error


def test_relabel_renumbers_by_position_when_every_reference_is_earlier():
    fixed, applied = repair("r5：Find[X]\nr7：Find[Y]\nr9：(r5, r7) → QueryRelation[]")
    assert applied == ["fix_calls", "relabel"]
    assert fixed == "r1: Find[X]\nr2: Find[Y]\nr3: (r1, r2) → QueryRelation[]"


@pytest.mark.parametrize("text, code", [
    ("r" + "9" * 5000 + ": Find[X] → QueryName[]", "bad_label"),  # int() refuses > 4300 digits
    ("r1: Find[X]\nr2: (r1, r" + "9" * 5000 + ") → And[] → QueryName[]", "bad_label"),
    ("r1: Find[" + "x" * 2000 + "] → QueryName[]", "too_long"),
    ("x" * 20_000, "too_long"),
    ("r1: Find[X]" + " → Relate[country | forward]" * 200 + " → QueryName[]", "too_long"),
])
def test_oversized_texts_are_named_syntax_errors(text, code):
    result = check_text(text, "dag")
    assert not result.ok and result.error.code == code, result.error
    assert len(result.error.to_dict()["message"]) < 300  # the message quotes a clip, not the text
    for fmt in ("dag", "chain"):
        check_text(repair(text, fmt)[0], fmt)  # repair and check end, whatever the outcome
    chain = "\n".join(["Find[X]"] + ["Relate[country | forward]"] * 200 + ["QueryName[]"])
    assert check_text(chain, "chain").error.code == "too_long"


def test_a_quoted_argument_is_a_recorded_slip_and_a_real_quote_survives():
    result = check_text('r1: Find["X"] → QueryName[]')
    assert result.error.code == "quoted_argument"
    assert repair('r1: Find["X"] → QueryName[]') == ("r1: Find[X] → QueryName[]", ["fix_calls"])
    assert check_text('r1: Find["X" and "Y"] → QueryName[]').ok  # inner quotes are part of a name
    assert check_text("r1: Find['Allo 'Allo!] → QueryName[]").ok


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
