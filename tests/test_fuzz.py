"""Fuzz tier: malformed and adversarial generated texts through the whole scoring path.

Every text goes through ``score_generation`` (parse, repair, check, canonicalise, execute,
render) and the predictions writer and reader. Asserted for each: nothing escapes, the
scoring takes less than ``BOUND_S`` seconds, the record stays under ``MAX_RECORD_BYTES``
and reads back identical. Meaning-preserving edits of gold programs must still score correct.
The generator is seeded (``tests/fuzzing.py``), so a failure reproduces.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter

import fuzzing
import pytest

from cbr2.evaluation.records import append_record, read_records, record_line
from cbr2.evaluation.scoring import INTERNAL_ERROR, score_completion, score_generation
from cbr2.generation.canonicalize import Canonicalizer
from cbr2.kopl.executor import Executor
from cbr2.kopl.text import FORMATS, MAX_TEXT_CHARS, to_text

pytestmark = pytest.mark.fuzz

BOUND_S = 2.0
"""Seconds one text may take through the whole path. Execution alone is capped at
``EXEC_TIMEOUT_S``; everything before it is linear in the text, which is at most
``MAX_TEXT_CHARS`` long, so a text takes milliseconds and the bound leaves a wide margin for
a busy machine."""
EXEC_TIMEOUT_S = 1.0
MAX_RECORD_BYTES = 8 * MAX_TEXT_CHARS + 65_536
"""A record holds the question, the (capped) generated text, the program and the answer."""
MUTATIONS_PER_CASE = 2_500  # x 2 benchmarks x 2 forms = 10,000 mutated gold programs


@pytest.fixture(scope="module", params=["mini-kqapro", "mini-metaqa"])
def setting(request):
    from cbr2.data.benchmarks import Benchmark

    bench = Benchmark(request.param)
    questions = [q for s in ("train", bench.family.eval_split if bench.family.name == "metaqa" else "val")
                 for q in bench.questions(s)]
    executor = Executor(bench.kb, timeout_s=EXEC_TIMEOUT_S)
    return bench, questions, executor, Canonicalizer(bench.kb.vocabulary)


def _golds(questions, fmt):
    out = []
    for q in questions:
        try:
            out.append((q, to_text(q.program, fmt)))
        except ValueError:  # not post-order: the chain form cannot express it
            continue
    return out


def _judge(text, question, setting, fmt):
    """Score one text; return (record or None, seconds, escape description or None)."""
    bench, _, executor, canon = setting
    start = time.perf_counter()
    try:
        record = score_completion(text, question, bench, executor, fmt, canonicalize=canon)
    except BaseException as err:  # noqa: BLE001 - anything escaping is what this tier counts
        return None, time.perf_counter() - start, f"{type(err).__name__}: {err!s:.200}"
    seconds = time.perf_counter() - start
    if (record.get("error") or {}).get("code") == INTERNAL_ERROR:
        return record, seconds, record["error"]["message"][:200]
    return record, seconds, None


def _run(cases, setting, fmt, path):
    """Judge every case; return the failures of each kind the tier asserts away."""
    escapes, slow, big, records = [], [], [], []
    for question, text in cases:
        record, seconds, escape = _judge(text, question, setting, fmt)
        tag = repr(text[:80])
        if escape:
            escapes.append(f"{tag}: {escape}")
        if seconds > BOUND_S:
            slow.append(f"{tag}: {seconds:.1f} s")
        if record is None:
            continue
        if len(record_line(record).encode("utf-8")) > MAX_RECORD_BYTES:
            big.append(tag)
        records.append(record)
    with path.open("w", encoding="utf-8") as sink:  # through the predictions writer and reader
        for record in records:
            append_record(sink, record)
    back = [r for _, r in read_records(path)]
    unreadable = [i for i, (a, b) in enumerate(zip(records, back))
                  if json.dumps(a, sort_keys=True) != json.dumps(b, sort_keys=True)]
    assert len(back) == len(records)
    return escapes, slow, big, unreadable


@pytest.mark.parametrize("fmt", FORMATS)
def test_mutated_gold_programs_never_escape_and_stay_bounded(setting, fmt, tmp_path):
    _, questions, _, _ = setting
    golds = _golds(questions, fmt)
    texts = [t for _, t in golds]
    kinds = Counter()
    mutated = list(fuzzing.mutations(texts, MUTATIONS_PER_CASE, seed=FORMATS.index(fmt) + 1, kinds=kinds))
    # The generator did its work: many golds, every kind of edit often, texts that differ from their gold.
    assert len(texts) >= 50 and len(mutated) == MUTATIONS_PER_CASE
    assert set(kinds) == set(fuzzing.EDITS) and min(kinds.values()) >= MUTATIONS_PER_CASE // 20, kinds
    assert sum(text != texts[k] for k, text in mutated) >= 0.9 * MUTATIONS_PER_CASE
    cases = [(golds[k][0], text) for k, text in mutated]
    escapes, slow, big, unreadable = _run(cases, setting, fmt, tmp_path / "predictions.jsonl")
    assert (escapes, slow, big, unreadable) == ([], [], [], [])


@pytest.mark.parametrize("fmt", FORMATS)
def test_adversarial_texts_never_escape_and_stay_bounded(setting, fmt, tmp_path):
    _, questions, _, _ = setting
    cases = [(questions[0], text) for text in fuzzing.adversarial()]
    escapes, slow, big, unreadable = _run(cases, setting, fmt, tmp_path / "predictions.jsonl")
    assert (escapes, slow, big, unreadable) == ([], [], [], [])


@pytest.mark.parametrize("fmt", FORMATS)
def test_meaning_preserving_edits_still_score_correct(setting, fmt):
    _, questions, _, _ = setting
    rng = random.Random(7)
    checked, wrong = 0, []
    for question, gold in _golds(questions, fmt):
        if not score_generation(gold, question, setting[0], setting[2], fmt)["correct"]:
            continue  # a gold program the engine gets wrong is another test's business
        edited = fuzzing.preserving(gold, fmt, rng)
        record, _, escape = _judge(edited, question, setting, fmt)
        checked += 1
        if escape or not record["correct"]:
            wrong.append((edited, record and record["error"]))
    assert checked >= 50
    assert wrong == []


def test_each_kind_of_edit_changes_a_text_as_named():
    text = "r1: Find[Big Ben] → Relate[country | forward] → QueryName[]\nr2: Find[X] → QueryName[]"
    kinds = Counter()
    changed = Counter()
    for seed in range(300):
        counted = Counter()
        edited = fuzzing.mutate(text, random.Random(seed), counted)
        if edited != text and sum(counted.values()) == 1:
            changed.update(counted)  # a text hit by one edit only, and changed by it
        kinds.update(counted)
    assert set(kinds) == set(changed) == set(fuzzing.EDITS)


def test_the_generator_is_reproducible():
    texts = ["r1: Find[X] → QueryName[]", "Find[X]\nQueryName[]"]
    assert list(fuzzing.mutations(texts, 50, seed=3)) == list(fuzzing.mutations(texts, 50, seed=3))
