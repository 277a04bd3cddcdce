"""Tests of the mini-kqapro question generator.

They run on the hand-written KB with the project's executor (the official engine underneath),
which is also what the build uses to compute the answers.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from cbr2.data.builders.mini_kqapro_kb import build_kb
from cbr2.data.builders.mini_kqapro_questions import CATEGORIES, generate
from cbr2.data.kb_loaders import kqapro_kb_from_dict
from cbr2.data.questions import kqapro_category
from cbr2.kopl.executor import Executor
from cbr2.kopl.program import Program

KB_SOURCE = Path(__file__).resolve().parents[1] / "cbr2/data/sources/mini_kqapro_kb.yaml"


def make_execute(kb: dict):
    """The project's executor (the official engine underneath) behind the generator's contract."""
    executor = Executor(kqapro_kb_from_dict(kb), timeout_s=None)
    return lambda program: executor.run(Program.from_json(program))


SIZES = {"n_train": 2000, "val_per_category": 50, "test_per_category": 50}
MIN_SKETCHES = 45


@pytest.fixture(scope="module")
def kb():
    return build_kb(KB_SOURCE)


@pytest.fixture(scope="module")
def execute(kb):
    return make_execute(kb)


@pytest.fixture(scope="module")
def run(kb, execute):
    return generate(kb, execute, seed=0, **SIZES)


def _category(item: dict) -> str:
    return kqapro_category(Program.from_json(item["program"]))


def test_sizes_and_categories(run):
    splits, stats = run
    assert len(splits["train"]) == SIZES["n_train"]
    floor = min(100, SIZES["n_train"] // len(CATEGORIES))
    assert all(n >= floor for n in Counter(map(_category, splits["train"])).values())
    assert set(Counter(map(_category, splits["train"]))) == set(CATEGORIES)
    assert Counter(map(_category, splits["val"])) == {c: SIZES["val_per_category"] for c in CATEGORIES}
    assert len(splits["test"]) == SIZES["test_per_category"] * len(CATEGORIES)
    assert stats["per_category"]["test"] == {c: SIZES["test_per_category"] for c in CATEGORIES}


def test_formats(run):
    splits, _ = run
    for item in splits["train"] + splits["val"]:
        assert set(item) == {"question", "program", "choices", "answer"}
        for i, step in enumerate(item["program"]):
            assert set(step) == {"function", "dependencies", "inputs"}
            assert all(isinstance(x, str) for x in step["inputs"])
            if step["function"] in ("Find", "FindAll"):
                assert step["dependencies"] == []
            elif len(step["dependencies"]) == 1:
                assert step["dependencies"] == [i - 1]
    assert all(set(item) == {"question", "choices"} for item in splits["test"])


def test_sketches_and_phrasings(run):
    splits, stats = run
    sketches = {tuple("QueryName" if s["function"] == "What" else s["function"] for s in item["program"])
                for item in splits["train"] + splits["val"]}
    assert len(sketches) >= MIN_SKETCHES
    assert stats["sketches"]["train+val"] == len(sketches)
    assert stats["min_phrasings_per_shape"] >= 3


def test_choices(run):
    splits, _ = run
    for item in splits["train"] + splits["val"]:
        assert len(item["choices"]) == 10 and len(set(item["choices"])) == 10
        assert item["answer"] in item["choices"]
    for item in splits["test"]:
        assert len(item["choices"]) == 10 and len(set(item["choices"])) == 10


def test_no_duplicates(run):
    splits, _ = run
    texts = [item["question"] for name in ("train", "val", "test") for item in splits[name]]
    assert len(texts) == len(set(texts))


def test_answers_reproduce(run, execute):
    splits, _ = run
    for item in splits["train"] + splits["val"]:
        assert execute(item["program"]) == [item["answer"]], item["question"]
        assert item["answer"] not in ("", "not sure")


def test_deterministic(kb, execute, run):
    assert generate(kb, execute, seed=0, **SIZES) == run
    assert generate(kb, execute, seed=1, **SIZES)[0] != run[0]
