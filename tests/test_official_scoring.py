"""Scoring as the field scores it: KQA Pro's official answer comparison, the nine categories on real
programs, the seven reasoning types, cached verdicts judged again, and test-split submissions."""

import json

import pytest
from conftest import TINY_KB

from cbr2.config import load_config
from cbr2.data.benchmarks import Benchmark
from cbr2.data.questions import DatasetFormatError, kqapro_category, kqapro_reasoning_types
from cbr2.evaluation.metrics import answers_match, compute_metrics, is_correct, judged
from cbr2.evaluation.records import load_predictions
from cbr2.kopl.text import parse_text
from cbr2.run.runner import run_evaluation

# (prediction, gold, equal under KQA Pro's official comparison, the rule it shows)
OFFICIAL_PAIRS = [
    ("100.0 metre", "100 metre", True, "a whole number is written as an integer, the unit kept"),
    ("100.000001 metre", "100 metre", True, "a fractional part below 1e-5 counts as none"),
    ("100.5 metre", "100 metre", False, "a real fractional part stays"),
    ("100 metre", "100 kilometre", False, "units are text: they must be equal"),
    ("1.50", "1.5", True, "both written by Python's float: 1.5"),
    ("1.5", "1.500001", False, "no tolerance beyond the integer rule"),
    ("-2.5 metre", "-2 metre", True, "negative decimals: int() truncates, as the official script does"),
    ("-2.5", "-3", False, "... towards zero, so -2.5 is -2, not -3"),
    ("-7", "-7.0", True, "a negative whole number"),
    ("1882-12-11", "1882", True, "a full date against a year: the years"),
    ("1882", "1882-12-11", True, "the comparison is symmetric"),
    ("1882-12-11", "1882-12-12", False, "two full dates: the dates"),
    ("1882-12-11", "1882-12-11", True, "the same date"),
    ("1882-1-5", "1882-01-05", True, "dates compare as dates, not as text"),
    ("1882/12/11", "1882-12-11", False, "yyyy/mm/dd does not read as a date: text, and the texts differ"),
    ("1882/12/11", "1882/12/11", True, "... equal as text"),
    ("1883", "1882-12-11", False, "another year"),
    ("1882", "1882.0", True, "a year written as a float is its integer"),
    ("2020-02-30", "2020", False, "an impossible date is text"),
    ("yes", "yes", True, "yes / no are text"),
    ("no", "yes", False, "... and never equal to each other"),
    ("No", "no", False, "text is case-sensitive"),
    ("  Warsaw ", "Warsaw", True, "surrounding white space is dropped (the official script strips a line)"),
    ("Warsaw", "Paris", False, "other text"),
    ("inf", "inf", True, "a number the integer rule cannot read stays text"),
    ("", "", True, "empty against empty is equal text (a missing answer is never scored: is_correct)"),
]


@pytest.mark.parametrize("pred, gold, equal, rule", OFFICIAL_PAIRS, ids=[r for *_, r in OFFICIAL_PAIRS])
def test_official_answer_comparison(pred, gold, equal, rule):
    assert answers_match(pred, gold) is equal


def test_missing_answers_are_wrong_and_metaqa_compares_names_as_text():
    assert is_correct(None, "no") is False
    assert is_correct(["1995", "x"], ["1995"]) and not is_correct(["1995.0"], ["1995"])
    assert not is_correct([], ["a"]) and is_correct(["Paris, Texas"], ["Paris, Texas", "b"])


def _record(answer, gold, correct, kind="wrong", **extra):
    return {"id": "q", "category": "QueryAttr", "gold_answer": gold, "answer": answer, "correct": correct,
            "error_kind": kind, "syntax_error": False, "syntax_error_before_repair": False, **extra}


def test_a_verdict_taken_by_an_earlier_comparison_is_taken_again():
    stale = _record("1882-12-11", "1882", False)
    assert judged(stale)["correct"] and judged(stale)["error_kind"] is None
    assert judged(_record("1.5", "2", True, kind=None)) == _record("1.5", "2", False)
    # What failed before any comparison stays failed; a question without gold stays as it is.
    failed = _record(None, "no", False, kind="execution")
    assert judged(failed) == failed
    assert judged(_record("x", None, None, kind=None))["correct"] is None
    fallback = _record("5", "5", True, kind=None, single_pass={"answer": "5.0", "correct": False, "error_kind": "wrong"})
    assert judged(fallback)["single_pass"]["correct"] is True


def test_the_writer_rewrites_a_file_judged_by_an_earlier_comparison(tmp_path):
    path = tmp_path / "predictions.jsonl"
    records = [_record("1882-12-11", "1882", False) | {"id": "a"}, _record("x", "x", True, kind=None) | {"id": "b"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    read = load_predictions(path)
    assert read["a"]["correct"] and json.loads(path.read_text().splitlines()[0])["correct"] is False  # a reader
    load_predictions(path, repair=True)  # the writer, about to append
    assert [json.loads(line)["correct"] for line in path.read_text().splitlines()] == [True, True]


@pytest.mark.parametrize("text, category", [
    ("r1: Find[Warsaw] → QueryAttrUnderCondition[population | point in time | 2021]", "QueryAttr"),
    ("r1: Find[Warsaw] → QueryAttrUnderCondition[population | point in time | 2021] → VerifyNum[5 | >]", "Verify"),
    ("r1: Find[Warsaw] → What[]", "QueryName"),
    ("r1: FindAll[] → FilterConcept[city] → SelectAmong[population | largest]", "SelectAmong"),
])
def test_every_program_falls_in_one_of_the_nine_categories(text, category):
    assert kqapro_category(parse_text(text, "dag")) == category


def test_a_last_function_of_no_category_is_an_error_at_load(tmp_path):
    program = [{"function": "Find", "dependencies": [], "inputs": ["Warsaw"]},
               {"function": "Relate", "dependencies": [0], "inputs": ["country", "forward"]}]
    (tmp_path / "val.json").write_text(json.dumps([{"question": "q?", "program": program, "choices": [],
                                                    "answer": "Poland"}]))
    from cbr2.data.questions import load_kqapro_questions

    with pytest.raises(DatasetFormatError, match=r"val\.json: \[0\]\.program: last function 'Relate'"):
        load_kqapro_questions(tmp_path / "val.json", "val")


@pytest.mark.parametrize("text, answer, types", [
    ("r1: Find[Warsaw] → QueryAttr[population]", "1", ()),
    ("r1: Find[Warsaw] → Relate[country | forward] → QueryName[]", "Poland", ("Multi-hop",)),
    ("r1: FindAll[] → FilterConcept[city] → Count[]", "2", ("Multi-hop", "Count")),
    ("r1: Find[Warsaw] → QueryAttrUnderCondition[population | point in time | 2021]", "new",
     ("Qualifier", "Zero-shot")),
    (("r1: Find[Marie Curie] → Relate[award received | forward] → QFilterYear[point in time | 1903 | =] → "
      "QueryName[]"), "Nobel Prize in Physics", ("Multi-hop", "Qualifier")),
    ("r1: Find[Warsaw]\nr2: Find[Paris]\nr3: (r1, r2) → SelectBetween[population | greater]", "Warsaw",
     ("Comparison",)),
    ("r1: Find[Warsaw]\nr2: Find[Paris]\nr3: (r1, r2) → Or[] → Count[]", "2", ("Logical", "Count")),
    ("r1: Find[Warsaw] → QueryAttr[population] → VerifyNum[5 | >]", "yes", ("Verify",)),
])
def test_reasoning_types_follow_their_definitions(text, answer, types):
    train_answers = frozenset({"1", "Poland", "2", "Warsaw", "yes", "Nobel Prize in Physics"})
    assert kqapro_reasoning_types(parse_text(text, "dag"), answer, train_answers) == types
    assert "Zero-shot" not in kqapro_reasoning_types(parse_text(text, "dag"), answer, None)


def test_metrics_per_reasoning_type_count_every_type_a_question_has():
    records = [_record("a", "a", True, kind=None) | {"id": "1"}, _record("b", "c", False) | {"id": "2"}]
    metrics = compute_metrics(records, reasoning_types={"1": ("Multi-hop", "Count"), "2": ("Multi-hop",)})
    assert metrics["per_reasoning_type"] == {
        "Multi-hop": {"hits@1": 0.5, "ser": 0.0, "ser_before_repair": 0.0, "n": 2},
        "Count": {"hits@1": 1.0, "ser": 0.0, "ser_before_repair": 0.0, "n": 1}}
    assert "per_reasoning_type" not in compute_metrics(records)


# ----------------------------------------------- a KQA Pro-format folder the project has never seen

def _item(question, program_text, answer):
    program = parse_text(program_text, "dag").to_json()
    return {"question": question, "sparql": "", "program": program, "choices": [answer], "answer": answer}


UNSEEN_VAL = [
    # A date written as its year, as real gold answers are.
    _item("When was Marie Curie born?", "r1: Find[Marie Curie] → QueryAttr[date of birth]", "1867"),
    _item("What was the population of Warsaw in 2021?",
          "r1: Find[Warsaw] → QueryAttrUnderCondition[population | point in time | 2021]", "1790658"),
    _item("How tall is Pierre Curie?", "r1: Find[Pierre Curie] → QueryAttr[height]", "180.0 centimetre"),
    _item("How many cities are there?", "r1: FindAll[] → FilterConcept[city] → Count[]", "2"),
    _item("Which country is Warsaw in?", "r1: Find[Warsaw] → Relate[country | forward] → QueryName[]", "Poland"),
    _item("Is the population of Warsaw in 2021 greater than 1000?",
          "r1: Find[Warsaw] → QueryAttrUnderCondition[population | point in time | 2021] → VerifyNum[1000 | >]",
          "yes"),
]
UNSEEN_TRAIN = [_item("How many cities are there?", "r1: FindAll[] → FilterConcept[city] → Count[]", "2"),
                _item("Which country is Warsaw in?", "r1: Find[Warsaw] → Relate[country | forward] → QueryName[]",
                      "Poland")]


@pytest.fixture()
def unseen_kqapro(tmp_path):
    root = tmp_path / "KQAPro"
    root.mkdir()
    (root / "kb.json").write_text(json.dumps(TINY_KB))
    (root / "val.json").write_text(json.dumps(UNSEEN_VAL))
    (root / "train.json").write_text(json.dumps(UNSEEN_TRAIN))
    test = [{"question": q["question"], "choices": q["choices"]} for q in UNSEEN_VAL]
    (root / "test.json").write_text(json.dumps(test))
    return root


def _run(tmp_path, root, *overrides):
    cfg = load_config([f"output_dir={tmp_path / 'run'}", "llm.backend=gold", "eval.per_category=null",
                       "wandb.mode=disabled", "generation.constrained=false", "retrieval.cases=none",
                       "retrieval.k_ontology=0", "retrieval.k_facts=0", "data.name=kqapro", f"data.root={root}",
                       *overrides])
    return run_evaluation(cfg), tmp_path / "run"


def test_gold_programs_of_an_unseen_folder_score_one(tmp_path, unseen_kqapro):
    metrics, out = _run(tmp_path, unseen_kqapro)
    assert (metrics["hits@1"], metrics["ser"], metrics["n"]) == (1.0, 0.0, 6)
    assert set(metrics["per_category"]) == {"QueryAttr", "Count", "QueryName", "Verify"}
    assert metrics["per_category"]["QueryAttr"]["n"] == 3  # QueryAttrUnderCondition counted there
    types = {t: m["n"] for t, m in metrics["per_reasoning_type"].items()}
    # Zero-shot: 1867, 1790658, 180.0 centimetre and yes are not training answers; 2 and Poland are.
    assert types == {"Multi-hop": 2, "Qualifier": 2, "Count": 1, "Verify": 1, "Zero-shot": 4}
    report = (out / "report.md").read_text()
    assert "## Per reasoning type" in report and "Zero-shot" in report
    lines = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert lines[0]["reasoning_types"] == ["Zero-shot"] and lines[0]["answer"] != lines[0]["gold_answer"]


def test_the_test_split_is_answered_and_written_for_submission(tmp_path, unseen_kqapro, fake_backend):
    fake_backend.reply = lambda prompt: ("r1: Find[Warsaw] → QueryAttr[population]" if "Warsaw" in prompt.text
                                         else "r1: Find[Nobody] → QueryName[]")
    metrics, out = _run(tmp_path, unseen_kqapro, "llm.backend=fake", "data.split=test")
    assert metrics["hits@1"] is None and metrics["gold_answers"] is False and metrics["n"] == 6
    assert metrics["errors"]["execution"] == 3  # the unknown entity: a grounding failure, never "no"
    submission = (out / "predict.txt").read_text().split("\n")
    test = json.loads((unseen_kqapro / "test.json").read_text())
    assert len(submission) == len(test) + 1 and submission[-1] == ""
    assert [bool(line) for line in submission[:-1]] == ["Warsaw" in q["question"] for q in test]
    assert "No gold answers" in (out / "report.md").read_text()


def test_a_test_run_of_part_of_the_split_writes_no_submission(tmp_path, unseen_kqapro, fake_backend):
    _, out = _run(tmp_path, unseen_kqapro, "llm.backend=fake", "data.split=test", "eval.limit=2")
    assert (out / "predictions.jsonl").is_file() and not (out / "predict.txt").exists()


def test_questions_of_a_split_are_read_once(unseen_kqapro):
    bench = Benchmark("kqapro", unseen_kqapro)
    assert bench.questions("val") == bench.questions("val")
    assert bench.questions("val") is not bench.questions("val")  # a copy: callers may reorder it
