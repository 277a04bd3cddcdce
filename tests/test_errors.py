"""Error analysis (the paper's Section 6.5): each classification rule, its priority, the aggregate
block in metrics.json and its section in report.md, on hand-built prediction records."""

from __future__ import annotations

import pytest

from cbr2.data.questions import Question, question_record
from cbr2.evaluation.errors import analyze, classify
from cbr2.evaluation.metrics import compute_metrics
from cbr2.kopl.text import parse_text
from cbr2.report.run_report import render_report, write_report

EVEREST = "r1: Find[Mount Everest] → QueryAttr[elevation above sea level]"
CAPITAL = "r1: Find[France] → Relate[capital | forward] → FilterConcept[city] → QueryName[]"
TALLER = "r1: Find[Mont Blanc]\nr2: Find[Mount Everest]\nr3: (r1, r2) → SelectBetween[elevation above sea level | greater]"
HIGH = "r1: FindAll[] → FilterNum[elevation above sea level | 8000 metre | >] → FilterConcept[mountain] → Count[]"


def record(program, gold, *, qid="val-0", category="QueryAttr", unknown=(), correct=False, error_kind="wrong",
           error=None, generated=None):
    """A prediction record as ``score_generation`` writes it (fields the analysis does not read omitted)."""
    return {"id": qid, "question": f"question {qid}?", "category": category, "gold_answer": "8848 metre",
            "gold_program": gold, "generated": generated if generated is not None else program, "program": program,
            "unknown_arguments": None if program is None else list(unknown), "canonicalized": [],
            "answer": None, "correct": correct, "error_kind": None if correct else error_kind, "error": error,
            "syntax_error": program is None, "syntax_error_before_repair": program is None, "repairs": []}


def verdict(cls, reason):
    """The part of a classification the tests compare exactly (the detail is checked separately)."""
    return {"class": cls, "reason": reason}


def classified(rec):
    out = classify(rec)
    return {"class": out["class"], "reason": out["reason"]}


def test_correct_prediction_has_no_error():
    assert classify(record(EVEREST, EVEREST, correct=True)) is None


@pytest.mark.parametrize("kind", ["syntax", "type"])
def test_no_program_is_other_with_the_error_kind(kind):
    rec = record(None, EVEREST, error_kind=kind, generated="the answer is 8848",
                 error={"kind": kind, "code": "unparsable", "line": 1, "message": f"{kind} error [x]: bad"})
    out = classify(rec)
    assert out == {"class": "other", "reason": kind, "detail": f"{kind} error [x]: bad"}


def test_no_gold_program_is_other():
    rec = record(EVEREST.replace("elevation", "altitude"), None)
    assert classified(rec) == verdict("other", "no_gold")
    del rec["gold_program"]  # a record written before gold programs were recorded
    assert classified(rec) == verdict("other", "no_gold")


def test_argument_outside_the_schema_is_grounding():
    pred = EVEREST.replace("elevation", "altitude")
    unknown = [{"step": 1, "function": "QueryAttr", "arg": "key", "kind": "key", "value": "altitude above sea level"}]
    out = classify(record(pred, EVEREST, unknown=unknown))
    assert out == {"class": "grounding", "reason": "outside_schema",
                   "detail": "step 2 (QueryAttr) key: 'altitude above sea level' is not in the KB"}


def test_outside_schema_wins_over_a_logical_difference():
    # The pred also flips the direction, but naming a relation the KB lacks is checked first.
    pred = CAPITAL.replace("capital | forward", "capitol | backward")
    unknown = [{"step": 1, "function": "Relate", "arg": "relation", "kind": "relation", "value": "capitol"}]
    assert classified(record(pred, CAPITAL, unknown=unknown)) == verdict("grounding", "outside_schema")


def test_another_schema_item_is_grounding():
    out = classify(record(EVEREST.replace("elevation", "altitude"), EVEREST))
    assert out == {"class": "grounding", "reason": "schema_item",
                   "detail": "step 2 (QueryAttr) key: 'altitude above sea level' vs gold 'elevation above sea level'"}
    assert classified(record(CAPITAL.replace("[city]", "[town]"), CAPITAL)) == verdict("grounding", "schema_item")


def test_another_entity_is_grounding():
    out = classify(record(EVEREST.replace("Mount Everest", "K2"), EVEREST))
    assert out == {"class": "grounding", "reason": "entity", "detail": "step 1 (Find) name: 'K2' vs gold 'Mount Everest'"}


def test_schema_item_wins_over_entity_and_entity_over_value():
    both = EVEREST.replace("Mount Everest", "K2").replace("elevation", "altitude")
    assert classified(record(both, EVEREST)) == verdict("grounding", "schema_item")
    gold = EVEREST + " → VerifyNum[8848 metre | =]"
    pred = EVEREST.replace("Mount Everest", "K2") + " → VerifyNum[8611 metre | =]"
    assert classified(record(pred, gold, category="Verify")) == verdict("grounding", "entity")


def test_another_literal_value_is_grounding():
    out = classify(record(HIGH.replace("8000 metre", "8000 feet"), HIGH, category="Count"))
    assert out == {"class": "grounding", "reason": "value",
                   "detail": "step 2 (FilterNum) value: '8000 feet' vs gold '8000 metre'"}


def test_flipped_relation_direction_is_its_own_class():
    out = classify(record(CAPITAL.replace("forward", "backward"), CAPITAL, category="QueryName"))
    assert out == {"class": "direction", "reason": "direction_flipped",
                   "detail": "step 2 (Relate) direction: 'backward' vs gold 'forward'"}


def test_direction_with_another_relation_is_a_schema_item_not_a_flip():
    pred = CAPITAL.replace("capital | forward", "located in | backward")
    assert classified(record(pred, CAPITAL)) == verdict("grounding", "schema_item")


def test_flip_wins_over_an_argument_difference():
    pred = CAPITAL.replace("forward", "backward").replace("[city]", "[town]")
    assert classified(record(pred, CAPITAL)) == verdict("direction", "direction_flipped")


@pytest.mark.parametrize("pred, gold", [
    (HIGH.replace("| >]", "| <]"), HIGH),
    (TALLER.replace("greater", "less"), TALLER),
])
def test_reversed_comparison_is_logical(pred, gold):
    assert classified(record(pred, gold)) == verdict("logical", "comparison")


def test_missing_condition_is_logical():
    pred = "r1: Find[France] → Relate[capital | forward] → QueryName[]"
    out = classify(record(pred, CAPITAL))
    assert out["class"] == "logical" and out["reason"] == "condition_missing"
    assert out["detail"] == ("missing FilterConcept: Find → Relate → QueryName vs gold "
                             "Find → Relate → FilterConcept → QueryName")


def test_one_of_two_conditions_missing_is_still_condition_missing():
    pred = "r1: FindAll[] → FilterNum[elevation above sea level | 8000 metre | >] → Count[]"
    assert classified(record(pred, HIGH)) == verdict("logical", "condition_missing")
    pred = "r1: FindAll[] → FilterConcept[mountain] → Count[]"
    assert classify(record(pred, HIGH))["detail"].startswith("missing FilterNum:")


def test_extra_condition_is_logical():
    pred = CAPITAL.replace("QueryName[]", "FilterStr[official name | Paris] → QueryName[]")
    out = classify(record(pred, CAPITAL))
    assert out["class"] == "logical" and out["reason"] == "condition_extra"
    assert out["detail"].startswith("extra FilterStr: ")


def test_another_entity_in_another_shape_is_still_grounding():
    # Find[Canada] for a question about France: the program is about something else.
    pred = "r1: Find[Canada] → Relate[capital | forward] → Count[]"
    out = classify(record(pred, CAPITAL))
    assert out["class"] == "grounding" and out["reason"] == "entity" and out["detail"].startswith("'Canada'")
    pred = "r1: FindAll[] → FilterNum[elevation above sea level | 9000 metre | >] → QueryName[]"
    assert classified(record(pred, HIGH, category="Count")) == verdict("grounding", "value")


@pytest.mark.parametrize("pred", [
    "r1: Find[France] → Relate[capital | forward] → FilterConcept[city] → Count[]",  # other final function
    "r1: Find[France] → Relate[capital | forward] → Relate[twinned | forward] → FilterConcept[city] → QueryName[]",
    "r1: Find[France] → FilterConcept[city] → QueryName[]",  # a hop dropped: not a condition
    "r1: Find[France] → FilterConcept[city] → Relate[capital | forward] → QueryName[]",  # reordered
])
def test_other_shapes_are_structure_errors(pred):
    assert classified(record(pred, CAPITAL)) == verdict("logical", "structure")


def test_same_functions_wired_differently_is_structure():
    pred = TALLER.replace("(r1, r2)", "(r2, r1)")
    out = classify(record(pred, TALLER))
    assert out == {"class": "logical", "reason": "structure", "detail": "step 3 (SelectBetween) takes other inputs"}


def test_alias_spelling_is_not_a_difference():
    gold = "r1: Find[France] → Relate[capital | forward] → FilterConcept[city] → What[]"
    assert classified(record(CAPITAL, gold)) == verdict("other", "same_program")


def test_program_equal_to_gold_is_other():
    assert classified(record(EVEREST, EVEREST, error_kind="execution")) == verdict("other", "same_program")


def test_analyze_counts_categories_and_caps_examples():
    pred_key = EVEREST.replace("elevation", "altitude")
    records = [
        record(EVEREST, EVEREST, qid="a", correct=True),
        record(pred_key, EVEREST, qid="b"),
        record(CAPITAL.replace("forward", "backward"), CAPITAL, qid="c", category="QueryName"),
        record(EVEREST.replace("Mount Everest", "K2"), EVEREST, qid="d"),
        record(pred_key, EVEREST, qid="e", category=None),
        record(None, EVEREST, qid="f", error_kind="syntax", generated="no idea",
               error={"message": "syntax error [unparsable]"}),
        record(HIGH, HIGH, qid="g", category="Count", correct=True),
    ]
    out = analyze(records, categories=("Count", "QueryAttr", "QueryName", "Verify"), examples=2)
    assert out["n_wrong"] == 5
    assert out["classes"] == {"grounding": 3, "direction": 1, "logical": 0, "other": 1}
    assert out["reasons"] == {"schema_item": 2, "entity": 1, "direction_flipped": 1, "syntax": 1}
    assert list(out["per_category"]) == ["Count", "QueryAttr", "QueryName", "unknown"]
    assert out["per_category"]["Count"] == {"grounding": 0, "direction": 0, "logical": 0, "other": 0}
    assert out["per_category"]["QueryAttr"] == {"grounding": 2, "direction": 0, "logical": 0, "other": 1}
    assert out["per_category"]["QueryName"] == {"grounding": 0, "direction": 1, "logical": 0, "other": 0}
    assert out["per_category"]["unknown"] == {"grounding": 1, "direction": 0, "logical": 0, "other": 0}
    assert [e["id"] for e in out["examples"]["grounding"]] == ["b", "d"]
    assert [e["id"] for e in out["examples"]["direction"]] == ["c"]
    first = out["examples"]["grounding"][0]
    assert first == {"id": "b", "question": "question b?", "category": "QueryAttr", "reason": "schema_item",
                     "detail": "step 2 (QueryAttr) key: 'altitude above sea level' vs gold 'elevation above sea level'",
                     "gold_program": EVEREST, "program": pred_key, "error_kind": "wrong"}
    syntax = out["examples"]["other"][0]
    assert syntax["generated"] == "no idea" and "program" not in syntax
    assert analyze(records, examples=0)["examples"] == {"grounding": [], "direction": [], "logical": [], "other": []}


def test_analyze_of_all_correct_records():
    out = analyze([record(EVEREST, EVEREST, correct=True)])
    assert out["n_wrong"] == 0 and out["reasons"] == {} and out["classes"] == {"grounding": 0, "direction": 0, "logical": 0, "other": 0}


def test_compute_metrics_carries_the_analysis_and_keeps_its_keys():
    records = [record(EVEREST, EVEREST, qid="a", correct=True),
               record(CAPITAL.replace("forward", "backward"), CAPITAL, qid="b", category="QueryName")]
    metrics = compute_metrics(records, ("QueryAttr", "QueryName"))
    assert set(metrics) == {"hits@1", "ser", "ser_before_repair", "n", "answer_comparison", "per_category", "errors",
                            "emptied_at", "prompt_too_long", "error_analysis"}
    assert metrics["errors"]["wrong"] == 1 and metrics["hits@1"] == 0.5
    assert metrics["error_analysis"] == analyze(records, ("QueryAttr", "QueryName"))
    assert metrics["error_analysis"]["classes"]["direction"] == 1


def test_question_record_carries_the_gold_program():
    program = parse_text(CAPITAL, "dag")
    q = Question("val-1", "What is the capital of France?", program, "Paris", "QueryName")
    assert question_record(q)["gold_program"] == CAPITAL
    assert question_record(Question("test-1", "Why?", None, None, None))["gold_program"] is None


def test_report_has_the_error_analysis_section(tmp_path):
    fenced = "```python\nprint(42)\n```"
    records = [
        record(EVEREST, EVEREST, qid="val-1", correct=True),
        record(EVEREST.replace("elevation", "altitude"), EVEREST, qid="val-2"),
        record(CAPITAL.replace("forward", "backward"), CAPITAL, qid="val-3", category="QueryName"),
        record(None, EVEREST, qid="val-4", error_kind="syntax", generated=fenced, error={"message": "bad"}),
        record(None, EVEREST, qid="val-5", error_kind="type", generated="r1: Find[X] → Count[] → Count[]",
               error={"message": "step 3 (Count) needs entities, but its input is number"}),
    ]
    path = tmp_path / "report.md"
    write_report(path, compute_metrics(records, ("QueryAttr", "QueryName")))
    md = path.read_text(encoding="utf-8")
    assert md.index("## Errors") < md.index("## Error analysis")
    section = md[md.index("## Error analysis"):]
    assert ("4 wrong predictions of 5: **grounding** 1 (25.00%) · **direction** 1 (25.00%) · **logical** 0 (0.00%) "
            "· **other** 2 (50.00%) of the wrong ones.") in section
    assert "| category | grounding | direction | logical | other | wrong |" in section
    assert "| QueryAttr | 1 | 0 | 0 | 2 | 3 |" in section and "| QueryName | 0 | 1 | 0 | 0 | 1 |" in section
    assert "Reasons: `schema_item` 1 · `direction_flipped` 1 · `syntax` 1 · `type` 1." in section
    assert [h for h in section.splitlines() if h.startswith("### ")] == [
        "### Examples: grounding", "### Examples: direction", "### Examples: other"]
    assert ("**val-2** (QueryAttr) · `schema_item`: step 2 (QueryAttr) key: 'altitude above sea level' vs gold "
            "'elevation above sea level'") in section
    assert f"Gold program:\n\n```\n{CAPITAL}\n```" in section
    assert f"Predicted program:\n\n```\n{CAPITAL.replace('forward', 'backward')}\n```" in section
    # A generation with its own fences gets a longer fence, so the section's blocks stay closed.
    assert f"Generated text (it does not parse, even after repair):\n\n````\n{fenced}\n````" in section
    # A type error parsed: the heading says what failed (it said "no program parsed").
    assert "Generated text (it parses, but breaks KoPL's typing rules):\n\n```\nr1: Find[X]" in section
    assert "or the gold program itself" not in md


def test_report_without_wrong_predictions_says_so():
    md = render_report(compute_metrics([record(EVEREST, EVEREST, correct=True)]), "t")
    assert "## Error analysis\n\nNo wrong predictions." in md
    assert "## Error analysis" not in render_report({"n": 3, "retrieval": {"n": 3}}, "retrieval only")


@pytest.fixture(scope="module")
def mini_kqapro():
    from cbr2.data.benchmarks import Benchmark
    from cbr2.kopl.executor import Executor

    bench = Benchmark("mini-kqapro")
    return bench.questions("val")[0], bench, Executor(bench.kb)


@pytest.mark.parametrize("text, emptied_at", [
    # Hamburg is the place of birth of people: read from Hamburg, the relation goes backward.
    ("r1: Find[Hamburg] → Relate[place of birth | forward] → FilterConcept[human] → QueryName[]", (2, "Relate")),
    ("r1: Find[Hamburg] → Relate[place of birth | backward] → FilterConcept[country] → What[]", (3, "FilterConcept")),
    ("r1: Find[Hamburg] → Relate[place of birth | backward] → FilterConcept[human] → What[]", None),
])
def test_an_empty_answer_records_the_step_that_went_empty(mini_kqapro, text, emptied_at):
    from cbr2.evaluation.scoring import score_generation

    record = score_generation(text, *mini_kqapro)
    assert record["error_kind"] == ("empty" if emptied_at else "wrong")
    assert record.get("emptied_at") == (dict(zip(("step", "function"), emptied_at)) if emptied_at else None)
    metrics = compute_metrics([record])
    assert metrics["emptied_at"] == ({emptied_at[1]: 1} if emptied_at else {})
    line = f"the step whose result was empty first: {emptied_at[1]} 1." if emptied_at else "the step whose result"
    assert (line in render_report(metrics, "t")) == bool(emptied_at)
