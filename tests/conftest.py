"""Shared fixtures: a tiny hand-written KB in both official schemas, the embedded benchmarks, and a
fake LLM backend."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Sequence

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session", autouse=True)
def _embedding_cache(tmp_path_factory):
    """One embedding cache per test session (subprocesses inherit it), never the user's."""
    os.environ["CBR2_CACHE_DIR"] = str(tmp_path_factory.mktemp("cbr2-cache"))


def _val(typ, value, unit=None):
    v = {"type": typ, "value": value}
    if unit is not None:
        v["unit"] = unit
    return v


TINY_KB = {
    "concepts": {
        "C1": {"name": "human", "subclassOf": []},
        "C2": {"name": "geographic location", "subclassOf": []},
        "C3": {"name": "city", "subclassOf": ["C2"]},
        "C4": {"name": "country", "subclassOf": ["C2"]},
        "C5": {"name": "award", "subclassOf": []},
    },
    "entities": {
        "Q1": {"name": "Marie Curie", "instanceOf": ["C1"],
               "attributes": [{"key": "date of birth", "value": _val("date", "1867-11-07"), "qualifiers": {}},
                              {"key": "height", "value": _val("quantity", 155, "centimetre"), "qualifiers": {}},
                              {"key": "sex or gender", "value": _val("string", "female"), "qualifiers": {}}],
               "relations": [{"relation": "place of birth", "direction": "forward", "object": "Q3", "qualifiers": {}},
                             {"relation": "award received", "direction": "forward", "object": "Q5",
                              "qualifiers": {"point in time": [_val("year", 1903)]}}]},
        "Q2": {"name": "Pierre Curie", "instanceOf": ["C1"],
               "attributes": [{"key": "date of birth", "value": _val("date", "1859-05-15"), "qualifiers": {}},
                              {"key": "height", "value": _val("quantity", 180, "centimetre"), "qualifiers": {}}],
               "relations": [{"relation": "place of birth", "direction": "forward", "object": "Q4", "qualifiers": {}},
                             {"relation": "award received", "direction": "forward", "object": "Q5",
                              "qualifiers": {"point in time": [_val("year", 1903)]}}]},
        "Q3": {"name": "Warsaw", "instanceOf": ["C3"],
               "attributes": [{"key": "population", "value": _val("quantity", 1790658, "1"),
                               "qualifiers": {"point in time": [_val("year", 2021)]}},
                              {"key": "elevation above sea level", "value": _val("quantity", -2.5, "metre"),
                               "qualifiers": {}}],
               "relations": [{"relation": "place of birth", "direction": "backward", "object": "Q1", "qualifiers": {}},
                             {"relation": "country", "direction": "forward", "object": "Q6", "qualifiers": {}}]},
        "Q4": {"name": "Paris", "instanceOf": ["C3"],
               "attributes": [{"key": "population", "value": _val("quantity", 2145906, "1"),
                               "qualifiers": {"point in time": [_val("year", 2020)]}},
                              {"key": "elevation above sea level", "value": _val("quantity", 35, "metre"),
                               "qualifiers": {}}],
               "relations": [{"relation": "place of birth", "direction": "backward", "object": "Q2", "qualifiers": {}}]},
        "Q5": {"name": "Nobel Prize in Physics", "instanceOf": ["C5"], "attributes": [],
               "relations": [{"relation": "award received", "direction": "backward", "object": "Q1",
                              "qualifiers": {"point in time": [_val("year", 1903)]}},
                             {"relation": "award received", "direction": "backward", "object": "Q2",
                              "qualifiers": {"point in time": [_val("year", 1903)]}}]},
        "Q6": {"name": "Poland", "instanceOf": ["C4"],
               "attributes": [{"key": "inception", "value": _val("year", 966), "qualifiers": {}}],
               "relations": [{"relation": "country", "direction": "backward", "object": "Q3", "qualifiers": {}}]},
    },
}


def to_old_schema(kb: dict) -> dict:
    """The older published kb.json schema: concept parents as instanceOf, relations as predicate."""
    old = copy.deepcopy(kb)
    for con in old["concepts"].values():
        con["instanceOf"] = con.pop("subclassOf")
    for ent in old["entities"].values():
        for rel in ent["relations"]:
            rel["predicate"] = rel.pop("relation")
    return old


@pytest.fixture()
def tiny_kb_dict() -> dict:
    return copy.deepcopy(TINY_KB)


@pytest.fixture(scope="session")
def tiny_kb():
    from cbr2.data.kb_loaders import kqapro_kb_from_dict

    return kqapro_kb_from_dict(copy.deepcopy(TINY_KB), "tiny")


@pytest.fixture(scope="session")
def tiny_executor(tiny_kb):
    from cbr2.kopl.executor import Executor

    return Executor(tiny_kb)


@pytest.fixture(scope="session", params=["mini-kqapro", "mini-metaqa"])
def embedded(request):
    """Each embedded benchmark with its KB and every split's questions, loaded once."""
    from cbr2.data.benchmarks import Benchmark

    bench = Benchmark(request.param)
    splits = {s: bench.questions(s) for s in bench.family.splits}
    return bench, splits


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A real single-node Slurm for the whole session, or a skip saying why it cannot run."""
    from slurm_cluster import SlurmUnavailable, start_cluster

    try:
        cluster = start_cluster(tmp_path_factory.mktemp("slurm"))
    except SlurmUnavailable as e:
        pytest.skip(f"Slurm tier skipped: {e}")
    try:
        yield cluster
    finally:
        cluster.stop()


# --------------------------------------------------------------- a fake LLM backend


FAKE_REPLY = "r1: FindAll[] → Count[]"
"""What the fake backend answers unless a test says otherwise (parses, executes, answers a number)."""


class FakeBackend:
    """An LLM backend (``cbr2.llm.base.Backend``) that answers ``reply(prompt)`` and records every prompt.

    ``reply`` returns the generated text or a whole ``Completion`` (to set token counts). The
    registry builds the backend for each run (``make_backend``); calling this object is that
    constructor and returns the object itself, so a test reads what every run of it got.

    Attributes:
        reply: The answer to one prompt.
        prompts: Every prompt ``generate`` received, in order, across runs.
        cfg: The ``llm`` section of the latest build.
        grammar: The grammar of the latest build (``generation.constrained``), else None.
        builds: How many times the registry built it.
    """

    name = "fake"
    uses_chat = False
    capabilities = frozenset({"constrained", "grounded"})
    """It takes the grammar and the prompts' candidates (recording them) and answers ``reply``."""

    def __init__(self, reply: Callable[..., object] | None = None):
        self.reply = reply or (lambda prompt: FAKE_REPLY)
        self.prompts: list = []
        self.cfg = None
        self.grammar = None
        self.builds = 0

    def __call__(self, cfg, grammar=None) -> FakeBackend:
        self.cfg, self.grammar = cfg, grammar
        self.builds += 1
        return self

    @property
    def qids(self) -> list[str]:
        """The question id of every prompt received, in order."""
        return [p.qid for p in self.prompts]

    def identity(self) -> dict:
        return {"backend": self.name}

    def render(self, prompt) -> str:
        return prompt.text

    def generate(self, prompts: Sequence, on_result=None) -> list:
        from cbr2.common.records import Completion

        out = []
        for i, prompt in enumerate(prompts):
            self.prompts.append(prompt)
            answer = self.reply(prompt)
            out.append(answer if isinstance(answer, Completion) else Completion(answer))
            if on_result is not None:
                on_result(i, out[-1])
        return out


_registered_fake: FakeBackend | None = None
"""The fake that ``llm.backend=fake`` builds during a test (``fake_backend`` sets it)."""


@pytest.fixture()
def fake_backend(monkeypatch) -> FakeBackend:
    """A ``FakeBackend`` registered as ``llm.backend=fake`` for this test (answers ``FAKE_REPLY``
    until the test sets ``reply``)."""
    import sys

    from cbr2 import llm

    fake = FakeBackend()
    monkeypatch.setattr(sys.modules[__name__], "_registered_fake", fake)
    monkeypatch.setitem(llm.BACKENDS, "fake", f"{__name__}:_registered_fake")
    return fake
