"""The bundled benchmarks: official formats, lossless round trips, categories, and the executor
agreeing with the official engine's own ``forward`` on every gold program."""

import contextlib
import io
import json
from collections import Counter
from pathlib import Path

import pytest

from cbr2.data.benchmarks import KQAPRO
from cbr2.data.questions import KQAPRO_CATEGORIES
from cbr2.data.schema import parse_metaqa_question_line
from cbr2.evaluation.metrics import is_correct
from cbr2.kopl.checker import check_program
from cbr2.kopl.executor import Executor
from cbr2.kopl.sketch import sketch
from cbr2.kopl.text import parse_chain_text, parse_dag_text, to_chain_text, to_dag_text

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "metaqa-test-questions"


def _programs(splits):
    return [q for qs in splits.values() for q in qs if q.program is not None]


def test_every_program_round_trips_through_json_dag_and_chain(embedded):
    bench, splits = embedded
    questions = _programs(splits)
    assert questions
    if bench.family is KQAPRO:  # compare with the file's own JSON, not just our reading of it
        raw = {s: json.loads((bench.root / f"{s}.json").read_text()) for s in ("train", "val")}
        for q in questions:
            split, idx = q.qid.rsplit("-", 1)
            assert q.program.to_json() == raw[split][int(idx)]["program"]
    for q in questions:
        assert parse_dag_text(to_dag_text(q.program)) == q.program, q.qid
        assert parse_chain_text(to_chain_text(q.program)) == q.program, q.qid
        assert check_program(q.program).ok, q.qid


def test_executor_matches_the_official_engine_and_the_gold_answers(embedded):
    bench, splits = embedded
    executor = Executor(bench.kb, engine="kopl")
    engine = executor.engine  # the official engine object; `forward` is its own post-order driver
    for q in _programs(splits):
        with contextlib.redirect_stdout(io.StringIO()):
            official = engine.forward([s.function for s in q.program.steps], [list(s.inputs) for s in q.program.steps])
        ours = executor.run(q.program)
        assert ours == sorted({official} if isinstance(official, str) else set(official)), q.qid
        assert is_correct(bench.answer_from_values(ours, q.program), q.answer), q.qid


def test_mini_kqapro_sizes_categories_and_sketches():
    from cbr2.data.benchmarks import Benchmark

    bench = Benchmark("mini-kqapro")
    train, val, test = (bench.questions(s) for s in ("train", "val", "test"))
    assert len(train) >= 2000 and len(val) == 450 and len(test) == 450
    assert Counter(q.category for q in val) == {c: 50 for c in KQAPRO_CATEGORIES}
    assert all(q.program is None and q.answer is None and len(q.choices) == 10 for q in test)
    assert all(len(set(q.choices)) == 10 and q.answer in q.choices for q in train + val)
    assert len({sketch(q.program) for q in train + val}) >= 40
    texts = [q.question for q in train + val + test]
    assert len(texts) == len(set(texts))


def test_mini_metaqa_layout_and_categories():
    from cbr2.data.benchmarks import Benchmark

    bench = Benchmark("mini-metaqa")
    for split in ("train", "dev", "test"):
        cats = Counter(q.category for q in bench.questions(split))
        assert set(cats) == {"1-hop", "2-hop", "3-hop"}
    names = {e["name"] for e in bench.kb.entities.values()}
    assert "Paris, Texas" in names


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared MetaQA test questions are not beside the checkout")
def test_real_metaqa_question_lines_parse():
    counts, comma_lines, comma_topics = {}, 0, 0
    for k in (1, 2, 3):
        lines = (SHARED / f"{k}-hop" / "vanilla" / "qa_test.txt").read_text(encoding="utf-8").splitlines()
        rows = [parse_metaqa_question_line(line) for line in lines]
        parsed = [(r["question"], r["topic"], r["answers"]) for r in rows]
        counts[k] = len(parsed)
        if k == 1:  # counted in the real file: commas inside names must never split them
            comma_topics = sum("," in topic for _, topic, _ in parsed)
            comma_lines = sum("," in topic or any("," in a for a in answers) for _, topic, answers in parsed)
        assert all(answers and all("|" not in a for a in answers) for _, _, answers in parsed)
    assert counts == {1: 9947, 2: 14872, 3: 14274}
    assert (comma_lines, comma_topics) == (192, 100)
    row = parse_metaqa_question_line("what does [Grégoire Colin] appear in\tBefore the Rain")
    assert row["topic"] == "Grégoire Colin" and row["answers"] == ["Before the Rain"]


def test_embedded_files_are_what_the_generator_writes(tmp_path):
    from cbr2.data.benchmarks import EMBEDDED_ROOT
    from cbr2.data.builders.build import build_all

    build_all(tmp_path)
    ours = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    shipped = sorted(p.relative_to(EMBEDDED_ROOT) for p in EMBEDDED_ROOT.rglob("*") if p.is_file())
    assert ours == shipped
    for rel in ours:
        assert (tmp_path / rel).read_bytes() == (EMBEDDED_ROOT / rel).read_bytes(), rel
