"""The KB store (``cbr2.data.kb_store``): a stored KB answers as the parsed one, entries are keyed by
content, damaged entries are rebuilt with a warning, concurrent builders build once, and tests
never write into the user's cache."""

from __future__ import annotations

import json
import logging
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cbr2.common.files import file_sha256
from cbr2.data import kb_store as store_module
from cbr2.data.benchmarks import EMBEDDED_ROOT, Benchmark
from cbr2.data.kb_loaders import load_kqapro_kb, load_metaqa_kb
from cbr2.data.kb_store import StoredEntities, StoredKB, load_kb
from cbr2.data.kb_store_layout import ENGINE_SECTIONS
from cbr2.data.schema import DataError
from cbr2.kopl.checker import check_text
from cbr2.kopl.engine import Engine
from cbr2.kopl.executor import ExecutionError, Executor

MINI_KQAPRO = EMBEDDED_ROOT / "mini-kqapro" / "kb.json"
MINI_METAQA = EMBEDDED_ROOT / "mini-metaqa" / "kb.txt"
ROOT = Path(__file__).resolve().parents[1]


def outcome(executor: Executor, program) -> object:
    try:
        return executor.run(program)
    except ExecutionError as err:
        return ("error", err.code)


def program(text: str):
    result = check_text(text)
    assert result.ok, result.error
    return result.program


def gold_programs(bench: Benchmark) -> list:
    return [q.program for split in bench.family.splits for q in bench.questions(split) if q.program is not None]


def store_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "cbr2.data.kb_store" and r.levelno >= logging.WARNING]


@pytest.fixture(scope="module")
def mini_parsed():
    return load_kqapro_kb(MINI_KQAPRO)


@pytest.fixture(scope="module")
def mini_sample(mini_parsed) -> tuple[list, list]:
    """200 gold programs of mini-kqapro and what the parsed KB answers to them."""
    programs = gold_programs(Benchmark("mini-kqapro"))[:200]
    reference = Executor(mini_parsed, None)
    return programs, [outcome(reference, p) for p in programs]


@pytest.fixture
def cache(tmp_path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def kb_file(tmp_path) -> Path:
    """A private copy of mini-kqapro's kb.json (tests edit it)."""
    path = tmp_path / "kb" / "kb.json"
    path.parent.mkdir()
    shutil.copyfile(MINI_KQAPRO, path)
    return path


def entry_of(cache: Path, path: Path) -> Path:
    return cache / "kb" / file_sha256(path)


# ----------------------------------------------------------------------------- round trip

@pytest.mark.parametrize("name, loader", [("mini-kqapro", load_kqapro_kb), ("mini-metaqa", load_metaqa_kb)])
def test_a_stored_kb_answers_every_gold_program_as_the_parsed_one(name, loader, cache):
    bench = Benchmark(name)
    path = bench.root / bench.family.kb_file
    parsed = loader(path)
    load_kb(path, bench.family.name, cache)  # builds the entry
    stored = load_kb(path, bench.family.name, cache)  # reads it
    assert isinstance(stored, StoredKB) and stored.store.entry == entry_of(cache, path)
    assert stored.concepts == parsed.concepts and dict(stored.entities.items()) == parsed.entities
    assert stored.vocabulary == parsed.vocabulary and stored.stats() == parsed.stats()
    assert all(stored.name_of(i) == parsed.name_of(i) for i in [*parsed.entities, *parsed.concepts])
    assert stored.entity_ids_by_name() == parsed.entity_ids_by_name() and parsed.vocabulary.relation_pairs
    programs = gold_programs(bench)
    assert len(programs) > 400
    for engine in ("cbr2", "kopl"):
        mine, reference = Executor(stored, None, engine), Executor(parsed, None, engine)
        assert [outcome(mine, p) for p in programs] == [outcome(reference, p) for p in programs], engine


def test_the_engine_of_a_stored_kb_reads_no_entity(kb_file, cache, monkeypatch, mini_sample):
    programs, expected = mini_sample
    load_kb(kb_file, cache_dir=cache)
    stored = load_kb(kb_file, cache_dir=cache)
    monkeypatch.setattr(StoredEntities, "_load", lambda self, i: pytest.fail("the engine read an entity"))
    monkeypatch.setattr(Engine, "_build", lambda self, kb: pytest.fail("the engine built its indexes"))
    mine = Executor(stored)
    assert [outcome(mine, p) for p in programs] == expected
    # The indexes are loaded once per entry and shared by every engine of the KB.
    assert Engine(stored)._attrs is Engine(stored)._attrs


def test_stored_entities_are_a_read_only_mapping_of_fresh_dicts(kb_file, cache):
    parsed = load_kqapro_kb(kb_file)
    stored = load_kb(kb_file, cache_dir=cache)
    assert isinstance(stored, StoredKB)
    ents = stored.entities
    eid = next(iter(parsed.entities))
    assert len(ents) == len(parsed.entities) and list(ents) == list(parsed.entities)
    assert eid in ents and "no such id" not in ents and ents.get("no such id") is None
    first = ents[eid]
    first["name"] = "changed"
    assert ents[eid] == parsed.entities[eid]  # a fresh dict each time: the store is never written
    assert [e for _, e in ents.items()] == list(parsed.entities.values())
    with pytest.raises(KeyError):
        ents["no such id"]
    with pytest.raises(KeyError):
        stored.name_of("no such id")
    assert "StoredKB" in repr(stored) and len(repr(stored)) < 300


def test_a_stored_kb_pickles_as_its_entry(kb_file, cache):
    stored = load_kb(kb_file, cache_dir=cache)
    again = pickle.loads(pickle.dumps(stored))
    assert isinstance(again, StoredKB) and again.store.entry == stored.store.entry
    assert again.vocabulary == stored.vocabulary and again.source == stored.source


def test_benchmark_kb_uses_the_store_under_the_test_cache():
    # conftest points CBR2_CACHE_DIR at a session folder: nothing is written into the user's cache.
    session_cache = Path(os.environ["CBR2_CACHE_DIR"])
    assert session_cache.resolve() != (Path.home() / ".cache" / "cbr2").resolve()
    for name in ("mini-kqapro", "mini-metaqa"):
        kb = Benchmark(name).kb
        assert isinstance(kb, StoredKB)
        assert kb.store.entry.parent == session_cache / "kb"


def test_benchmark_kb_takes_a_cache_dir(cache):
    kb = Benchmark("mini-kqapro", cache_dir=cache).kb
    assert isinstance(kb, StoredKB) and kb.store.entry.parent == cache / "kb"


# ----------------------------------------------------------------------------- keyed by content

def test_entries_are_keyed_by_content(kb_file, cache, tmp_path):
    first = load_kb(kb_file, cache_dir=cache)
    assert isinstance(first, StoredKB)
    # The same bytes elsewhere: the same entry, not rebuilt.
    elsewhere = tmp_path / "elsewhere" / "kb.json"
    elsewhere.parent.mkdir()
    shutil.copyfile(kb_file, elsewhere)
    written = {p: p.stat().st_mtime_ns for p in Path(first.store.entry).rglob("*")}
    same = load_kb(elsewhere, cache_dir=cache)
    assert same.store.entry == first.store.entry and same.source == str(elsewhere)
    assert {p: p.stat().st_mtime_ns for p in Path(first.store.entry).rglob("*")} == written  # not rebuilt
    # An edited file: a new entry beside the old one, with the edit.
    raw = json.loads(kb_file.read_text(encoding="utf-8"))
    eid = next(iter(raw["entities"]))
    old_name = raw["entities"][eid]["name"]
    raw["entities"][eid]["name"] = "Renamed Entity"
    kb_file.write_text(json.dumps(raw), encoding="utf-8")
    edited = load_kb(kb_file, cache_dir=cache)
    assert isinstance(edited, StoredKB) and edited.store.entry != first.store.entry
    assert sorted(p.name for p in (cache / "kb").iterdir() if not p.name.startswith(".")) == sorted(
        [first.store.entry.name, edited.store.entry.name])
    assert "Renamed Entity" in edited.vocabulary.names and "Renamed Entity" not in first.vocabulary.names
    assert edited.entities[eid]["name"] == "Renamed Entity" and first.entities[eid]["name"] == old_name
    assert Executor(edited).run(program("r1: Find[Renamed Entity] → QueryName[]")) == ["Renamed Entity"]


# ----------------------------------------------------------------------------- damaged entries

def _rewrite_meta(entry: Path, edit) -> None:
    meta = json.loads((entry / "meta.json").read_text())
    edit(meta)
    (entry / "meta.json").write_text(json.dumps(meta))


def _flip_byte(entry: Path) -> None:
    data = bytearray((entry / "store.bin").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (entry / "store.bin").write_bytes(bytes(data))


def _truncate(entry: Path) -> None:
    data = (entry / "store.bin").read_bytes()
    (entry / "store.bin").write_bytes(data[: len(data) // 2])


def _file_instead_of_folder(entry: Path) -> None:
    shutil.rmtree(entry)
    entry.write_text("not a store")


def _sections_out_of_range(entry: Path) -> None:
    _rewrite_meta(entry, lambda m: m["sections"]["entities"].__setitem__(1, 10**9))


def _offsets_cut_short(entry: Path) -> None:
    _rewrite_meta(entry, lambda m: m["sections"]["entity_offsets"].__setitem__(1, 8))


def _planted_pickle(entry: Path) -> None:
    # A consistent entry (sizes and checksum match) whose header would run a command when unpickled.
    marker = entry.parent.parent / "planted-pickle-ran"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    evil = pickle.dumps(Evil(), protocol=5)
    data = store_module.MAGIC + evil
    (entry / "store.bin").write_bytes(data)
    start = len(store_module.MAGIC)

    def edit(meta: dict) -> None:
        meta["sections"] = {name: [start, len(evil) if name == "header" else 0] for name in store_module.SECTIONS}
        meta["store_bytes"] = len(data)
        meta["store_sha256"] = file_sha256(entry / "store.bin")

    _rewrite_meta(entry, edit)


DAMAGE = {
    "a flipped byte": _flip_byte,
    "a truncated store.bin": _truncate,
    "no store.bin": lambda e: (e / "store.bin").unlink(),
    "no meta.json": lambda e: (e / "meta.json").unlink(),
    "meta.json not JSON": lambda e: (e / "meta.json").write_text("{"),
    "meta.json a list": lambda e: (e / "meta.json").write_text("[]"),
    "another format": lambda e: _rewrite_meta(e, lambda m: m.update(format=-1)),
    "another kind": lambda e: _rewrite_meta(e, lambda m: m.update(kind="metaqa")),
    "sections out of range": _sections_out_of_range,
    "entity offsets cut short": _offsets_cut_short,
    "a file instead of the folder": _file_instead_of_folder,
    "an empty folder": lambda e: [p.unlink() for p in e.iterdir()],
    "a planted pickle": _planted_pickle,
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_entry_is_removed_and_rebuilt_with_a_warning(damage, kb_file, cache, caplog, mini_parsed,
                                                              mini_sample):
    parsed = mini_parsed
    entry = load_kb(kb_file, cache_dir=cache).store.entry
    DAMAGE[damage](entry)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="cbr2.data.kb_store"):
        kb = load_kb(kb_file, cache_dir=cache)
    warnings = store_warnings(caplog)
    assert len(warnings) == 1 and "unusable" in warnings[0] and str(entry) in warnings[0], warnings
    assert isinstance(kb, StoredKB) and kb.store.entry == entry and entry.is_dir()
    assert not (cache / "planted-pickle-ran").exists()
    assert kb.vocabulary == parsed.vocabulary and kb.stats() == parsed.stats()
    programs, expected = mini_sample
    mine = Executor(kb, None)
    assert [outcome(mine, p) for p in programs] == expected
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="cbr2.data.kb_store"):
        assert isinstance(load_kb(kb_file, cache_dir=cache), StoredKB)  # the rebuilt entry is reused
    assert not store_warnings(caplog)


# ----------------------------------------------------------------------------- fallbacks

def test_an_unusable_cache_folder_falls_back_to_parsing(kb_file, tmp_path, caplog):
    not_a_folder = tmp_path / "a-file"
    not_a_folder.write_text("")
    with caplog.at_level(logging.WARNING, logger="cbr2.data.kb_store"):
        kb = load_kb(kb_file, cache_dir=not_a_folder)
    assert not isinstance(kb, StoredKB) and kb.entities == load_kqapro_kb(kb_file).entities
    assert store_warnings(caplog)


def test_a_kb_the_engine_cannot_index_is_not_stored(kb_file, cache, caplog):
    raw = json.loads(kb_file.read_text(encoding="utf-8"))
    eid = next(iter(raw["entities"]))
    raw["entities"][eid]["attributes"].append({"key": "founded", "value": {"type": "date", "value": "1990-13-01"},
                                               "qualifiers": {}})
    kb_file.write_text(json.dumps(raw), encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="cbr2.data.kb_store"):
        kb = load_kb(kb_file, cache_dir=cache)
    assert not isinstance(kb, StoredKB) and any("cannot index" in w for w in store_warnings(caplog))
    with pytest.raises(ValueError, match="'1990-13-01' is neither a date"):
        Executor(kb)  # as without the store
    assert not (cache / "kb" / file_sha256(kb_file)).exists()


def test_a_missing_or_malformed_file_raises_as_the_loader(tmp_path, cache):
    with pytest.raises(DataError, match="file not found"):
        load_kb(tmp_path / "nothing.json", cache_dir=cache)
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(DataError, match="not valid JSON"):
        load_kb(bad, cache_dir=cache)
    assert not any(p for p in (cache / "kb").glob("*") if not p.name.startswith("."))


def test_a_program_reads_only_the_index_keys_it_touches(kb_file, cache, mini_sample):
    programs, expected = mini_sample
    load_kb(kb_file, cache_dir=cache)
    stored = load_kb(kb_file, cache_dir=cache)
    mine = Executor(stored)
    indexes = {name: stored.engine_indexes()[name] for name in ENGINE_SECTIONS}
    assert all(index.read == 0 and len(index) > 0 for index in indexes.values())  # the engine is built
    assert outcome(mine, programs[0]) == expected[0]
    touched = sum(index.read for index in indexes.values())
    assert 0 < touched < sum(len(index) for index in indexes.values()) / 4
    assert [outcome(mine, p) for p in programs] == expected  # what was read is kept and right


def test_large_kbs_freeze_their_indexes_for_the_collector(kb_file, cache, monkeypatch, mini_sample):
    import gc

    programs, _ = mini_sample
    frozen = []
    monkeypatch.setattr(gc, "freeze", lambda: frozen.append(True))
    load_kb(kb_file, cache_dir=cache)
    outcome(Executor(load_kb(kb_file, cache_dir=cache)), programs[0])
    assert not frozen  # mini-kqapro is below FREEZE_FACTS
    monkeypatch.setattr(store_module, "FREEZE_FACTS", 0)
    executor = Executor(load_kb(kb_file, cache_dir=cache))
    assert not frozen  # nothing read yet
    outcome(executor, programs[0])
    assert frozen and all(frozen)  # once per index value the program read


# ----------------------------------------------------------------------------- concurrency

WORKER = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    import cbr2.data.kb_store as store

    kb_file, cache, ready, go = sys.argv[1:5]
    built = []
    real_build = store._parse_and_store

    def slow_build(*args):
        built.append(True)
        time.sleep(1.5)  # keep the build open while the other process arrives
        return real_build(*args)

    store._parse_and_store = slow_build
    Path(ready).write_text("")
    while not Path(go).exists():
        time.sleep(0.01)
    kb = store.load_kb(kb_file, cache_dir=cache)
    print(json.dumps({"built": bool(built), "stored": isinstance(kb, store.StoredKB),
                      "entry": str(kb.store.entry), "names": len(kb.vocabulary.names)}))
""")


def test_concurrent_builders_build_one_entry(kb_file, cache, tmp_path):
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs, readies = [], []
    for i in range(2):
        ready = tmp_path / f"ready-{i}"
        readies.append(ready)
        procs.append(subprocess.Popen([sys.executable, "-c", WORKER, str(kb_file), str(cache), str(ready), str(go)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    deadline = time.monotonic() + 120
    while not all(r.exists() for r in readies):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.05)
    go.write_text("")
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(r["built"] for r in results) == [False, True]
    assert all(r["stored"] for r in results) and len({r["entry"] for r in results}) == 1
    entries = [p for p in (cache / "kb").iterdir() if not p.name.startswith(".")]
    assert entries == [Path(results[0]["entry"])]
    assert not [p for p in (cache / "kb").iterdir() if p.is_dir() and p.name.startswith(".")]  # no temporary folder left
    assert isinstance(load_kb(kb_file, cache_dir=cache), StoredKB)


# ----------------------------------------------------------------------------- random programs

@pytest.mark.parametrize("kb_name", ["mini-kqapro", "quirky"])
def test_random_programs_agree_on_the_stored_and_the_parsed_kb(kb_name, tmp_path, cache):
    from program_generator import ProgramGenerator

    if kb_name == "quirky":  # the differential test's KB of what trips engines up, as a file
        import copy

        from conftest import TINY_KB
        from test_engine_differential import quirky

        raw = copy.deepcopy(TINY_KB)
        quirky(raw)
        path = tmp_path / "kb.json"
        path.write_text(json.dumps(raw), encoding="utf-8")
    else:
        path = MINI_KQAPRO
    parsed = load_kqapro_kb(path)
    load_kb(path, cache_dir=cache)
    stored = load_kb(path, cache_dir=cache)
    assert isinstance(stored, StoredKB)
    programs = list(ProgramGenerator(parsed, seed=7).programs(1500))
    mine, reference = Executor(stored, None), Executor(parsed, None)
    assert [outcome(mine, p) for p in programs] == [outcome(reference, p) for p in programs]
