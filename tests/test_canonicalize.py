"""Argument canonicalisation: snapping arguments outside the KB vocabulary to the nearest item."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cbr2.generation.canonicalize import Canonicalizer, build_canonicalizer, key_value_types, lexical_similarity
from cbr2.kb.model import Vocabulary
from cbr2.kopl.program import Program
from cbr2.kopl.text import parse_text


@pytest.fixture
def vocab():
    concepts = {"human", "city", "country", "award"}
    return Vocabulary(
        names=concepts | {"Marie Curie", "Pierre Curie", "Warsaw", "Paris", "Poland", "Nobel Prize in Physics"},
        concepts=concepts,
        keys={"inception": "year", "inspection": "string", "date of birth": "date", "height": "quantity",
              "elevation above sea level": "quantity", "sex or gender": "string"},
        qualifier_keys={"point in time": "year", "character role": "string"},
        relations={"place of birth", "award received", "country", "spouse"},
    )


def dag(text: str) -> Program:
    return parse_text(text, "dag")


def test_lexical_similarity_ignores_case_punctuation_and_word_order():
    assert lexical_similarity("PARIS", "Paris") == 1.0
    assert lexical_similarity("ISO 3166-1 code", "iso 3166 1 code") == 1.0
    assert lexical_similarity("birth date", "date of birth") > 0.85
    assert lexical_similarity("height", "elevation above sea level") < 0.2


@pytest.mark.parametrize(("function", "types"), [
    ("FilterNum", {"quantity"}), ("QFilterNum", {"quantity"}), ("VerifyNum", {"quantity"}),
    ("SelectBetween", {"quantity"}), ("SelectAmong", {"quantity"}),
    ("FilterYear", {"year", "date"}), ("QFilterYear", {"year", "date"}),
    ("FilterDate", {"date", "year"}), ("QFilterDate", {"date", "year"}),
    ("FilterStr", {"string"}), ("QFilterStr", {"string"}),
    ("QueryAttr", None), ("QueryAttrUnderCondition", None), ("QueryAttrQualifier", None), (None, None),
    ("NoSuchFunction", None),
])
def test_key_value_types_follow_the_function(function, types):
    assert key_value_types(function) == (frozenset(types) if types else None)


def test_nearest_ranks_valid_items_with_scores_in_unit_interval(vocab):
    canon = Canonicalizer(vocab)
    found = canon.nearest("Marie Curei", "entity", k=3)
    assert [name for name, _ in found][:2] == ["Marie Curie", "Pierre Curie"]
    assert len(found) == 3
    scores = [s for _, s in found]
    assert scores == sorted(scores, reverse=True) and all(0.0 <= s <= 1.0 for s in scores)
    assert canon.nearest("Marie Curei", "entity", k=0) == []
    assert len(canon.nearest("x", "relation", k=50)) == len(vocab.relations)
    with pytest.raises(KeyError):
        canon.nearest("x", "string")


def test_nearest_key_is_type_aware(vocab):
    canon = Canonicalizer(vocab)
    assert canon.nearest("incepton", "key", k=1)[0][0] == "inception"
    assert canon.nearest("incepton", "key", k=1, function="FilterYear")[0][0] == "inception"
    assert canon.nearest("incepton", "key", k=1, function="FilterStr")[0][0] == "inspection"
    # Year and date compare with each other: a date key is a candidate of FilterYear.
    assert canon.nearest("date of brth", "key", k=1, function="FilterYear")[0][0] == "date of birth"
    quantity = canon.nearest("date of brth", "key", k=10, function="FilterNum")
    assert {name for name, _ in quantity} == {"height", "elevation above sea level"}
    # No quantity qualifier keys: every qualifier key stays a candidate.
    assert {name for name, _ in canon.nearest("pont in time", "qkey", k=10, function="QFilterNum")} == {
        "point in time", "character role"}


def test_snap_above_threshold_rebuilds_only_that_argument(vocab):
    program = dag("r1: Find[Marie Curei] → Relate[place of birth | forward] → QueryAttr[height]")
    new, snaps = Canonicalizer(vocab, threshold=0.8)(program)
    assert snaps == [{"step": 0, "function": "Find", "arg": "name", "kind": "entity", "from": "Marie Curei",
                      "to": "Marie Curie", "score": pytest.approx(0.9091, abs=1e-4), "snapped": True}]
    assert new.steps[0].inputs == ("Marie Curie",)
    assert new.steps[0].function == "Find" and new.steps[0].dependencies == ()
    assert new.steps[1:] == program.steps[1:]
    assert new.steps[1] is program.steps[1]  # untouched steps are reused as they are
    assert program.steps[0].inputs == ("Marie Curei",)  # the input program is not modified


def test_below_threshold_is_kept_and_recorded(vocab):
    program = dag("r1: Find[Napoleon] → QueryAttr[height]")
    new, snaps = Canonicalizer(vocab, threshold=0.8)(program)
    assert new is program
    assert len(snaps) == 1
    assert snaps[0]["to"] is None and snaps[0]["snapped"] is False and snaps[0]["from"] == "Napoleon"
    assert 0.0 <= snaps[0]["score"] < 0.8


def test_threshold_decides(vocab):
    program = dag("r1: Find[Paris] → FilterStr[incepton | x]")
    strict, snaps_strict = Canonicalizer(vocab, threshold=0.7)(program)
    loose, snaps_loose = Canonicalizer(vocab, threshold=0.6)(program)
    assert strict is program and not snaps_strict[0]["snapped"]
    assert snaps_strict[0]["score"] == snaps_loose[0]["score"] == pytest.approx(2 / 3, abs=1e-4)
    # FilterStr takes string keys only, so the typo snaps to the string key, not to "inception".
    assert loose.steps[1].inputs == ("inspection", "x")


def test_known_arguments_and_literals_are_untouched(vocab):
    program = dag("r1: Find[Paris] → FilterNum[height | 35 metre | >] → QueryName[]")
    new, snaps = Canonicalizer(vocab, threshold=0.0)(program)
    assert new is program and snaps == []
    # Value literals and operators are not slot arguments even when the threshold admits anything.
    program = dag("r1: Find[Paris] → FilterNum[heigth | 35 metre | >] → QueryName[]")
    new, snaps = Canonicalizer(vocab, threshold=0.0)(program)
    assert [s["arg"] for s in snaps] == ["key"]
    assert new.steps[1].inputs == ("height", "35 metre", ">")


def test_every_slot_kind_snaps_in_program_order(vocab):
    program = dag("r1: Find[PARIS] → Relate[place of brith | backward] → FilterConcept[humen]"
                  " → QFilterYear[pont in time | 1903 | =] → QueryAttr[heigth]")
    new, snaps = Canonicalizer(vocab, threshold=0.8)(program)
    assert [(s["kind"], s["from"], s["to"]) for s in snaps] == [
        ("entity", "PARIS", "Paris"), ("relation", "place of brith", "place of birth"),
        ("concept", "humen", "human"), ("qkey", "pont in time", "point in time"), ("key", "heigth", "height")]
    assert [s["step"] for s in snaps] == [0, 1, 2, 3, 4]
    assert all(s["snapped"] for s in snaps)
    assert [s.inputs for s in new.steps] == [("Paris",), ("place of birth", "backward"), ("human",),
                                             ("point in time", "1903", "="), ("height",)]
    assert [s.dependencies for s in new.steps] == [s.dependencies for s in program.steps]


def test_embeddings_join_candidates_and_score_as_mean(vocab, monkeypatch):
    # One candidate per retriever: "spouse" can only come from the embedding side.
    monkeypatch.setattr("cbr2.generation.canonicalize.CANDIDATE_DEPTH", 1)
    # A stand-in encoder: "married to" and "spouse" share a direction, everything else is orthogonal.
    texts = sorted(vocab.relations | {"married to"})
    basis = {t: np.eye(len(texts), dtype=np.float32)[i] for i, t in enumerate(texts)}
    basis["married to"] = basis["spouse"]
    calls = []

    def embed(batch):
        calls.append(len(batch))
        return np.stack([basis[t] for t in batch])

    lexical = Canonicalizer(vocab).nearest("married to", "relation", k=1)
    assert lexical[0][0] != "spouse"
    canon = Canonicalizer(vocab, embed=embed, threshold=0.5)
    (item, score), = canon.nearest("married to", "relation", k=1)
    assert item == "spouse"
    assert score == pytest.approx((lexical_similarity("married to", "spouse") + 1.0) / 2)
    program = dag("r1: Find[Paris] → Relate[married to | forward] → QueryName[]")
    new, snaps = canon(program)
    assert new.steps[1].inputs == ("spouse", "forward") and snaps[0]["snapped"]
    assert calls.count(len(vocab.relations)) == 1  # the slot's items were embedded once, then reused
    assert calls.count(1) == 1  # and the argument once, for nearest and the program alike


@pytest.mark.slow
def test_real_encoder_snaps_a_paraphrased_key(tmp_path):
    """The paper's error study's case, on the embedded KQA Pro KB with the MiniLM encoder."""
    from cbr2.config import load_config
    from cbr2.data.benchmarks import Benchmark
    from cbr2.evaluation.scoring import score_generation
    from cbr2.kopl.executor import Executor

    bench = Benchmark("mini-kqapro")
    cfg = load_config(["data.name=mini-kqapro", "retrieval.device=cpu", f"cache_dir={tmp_path}",
                       "generation.canonicalize=true"])
    # As the run loop hands it on.
    canon = build_canonicalizer(cfg.retrieval, cfg.generation.canonicalize_threshold, bench, cfg.cache_dir)
    assert canon.threshold == 0.8
    assert "altitude above sea level" not in bench.kb.vocabulary.keys

    (item, score), = canon.nearest("altitude above sea level", "key", k=1, function="QueryAttr")
    assert item == "elevation above sea level" and score >= 0.8
    # An unrelated key stays as written.
    assert canon.nearest("favourite colour", "key", k=1)[0][1] < 0.8

    question = next(q for q in bench.questions("train") if q.qid == "train-7")  # Lake Baikal's elevation
    text = "r1: Find[Lake Baikal] → QueryAttr[altitude above sea level]"
    executor = Executor(bench.kb)
    plain = score_generation(text, question, bench, executor)
    assert not plain["correct"] and plain["canonicalized"] == []
    fixed = score_generation(text, question, bench, executor, canonicalize=canon)
    assert fixed["correct"], fixed
    assert fixed["program"] == "r1: Find[Lake Baikal] → QueryAttr[elevation above sea level]"
    assert [(s["from"], s["to"], s["snapped"]) for s in fixed["canonicalized"]] == [
        ("altitude above sea level", "elevation above sea level", True)]

    # A second run loads every slot's embeddings from the cache instead of encoding them again.
    entries = sorted(p.name.split("-")[1] for p in tmp_path.iterdir() if p.name.startswith("vocab-"))
    assert entries == sorted(["entity", "concept", "key", "qkey", "relation"])
    def entries() -> dict[Path, int]:
        return {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if "vocab-" in str(p.relative_to(tmp_path))}

    written = entries()
    again = build_canonicalizer(cfg.retrieval, cfg.generation.canonicalize_threshold, bench, cfg.cache_dir)
    assert entries() == written  # every slot read from its entry, none encoded and written again
    assert again.nearest("altitude above sea level", "key", k=1)[0][0] == "elevation above sea level"
