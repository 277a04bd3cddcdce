"""What the scale benchmark rests on: the synthetic KQA Pro-sized KB and its questions, ontology
triples bounded by the schema, and embedding builds that resume after a kill."""

from __future__ import annotations

import json
import logging
import random

import numpy as np
import pytest

from cbr2.data.builders import synthetic_kqapro as syn
from cbr2.data.kb_loaders import kqapro_kb_from_dict, load_kqapro_kb
from cbr2.data.questions import KQAPRO_CATEGORIES, load_kqapro_questions
from cbr2.kb.model import KB
from cbr2.kb.triples import MAX_PER_CONCEPT, ontology_triples
from cbr2.retrieval.cache import EmbeddingStore

SCALE = 0.02  # the floors: 340 entities, 24 concepts


@pytest.fixture(scope="module")
def synthetic():
    return syn.generate(SCALE, seed=3, per_category=4)


def test_synthetic_kb_is_official_schema_and_sized(tmp_path, synthetic):
    kb_dict, _ = synthetic
    path = tmp_path / "kb.json"
    path.write_text(json.dumps(kb_dict))
    kb = load_kqapro_kb(path)  # validates the official schema
    sizes = syn.sizes_at(SCALE)
    stats = kb.stats()
    assert stats["entities"] == sizes.entities and stats["concepts"] == sizes.concepts
    assert stats["attribute_facts"] >= 0.9 * sizes.entities * sizes.attributes_per_entity
    assert 0.8 < stats["relation_facts"] / (sizes.entities * sizes.forward_relations_per_entity) < 1.2
    assert set(kb.vocabulary.keys.values()) == {"string", "quantity", "date", "year"}
    # Every forward fact is mirrored backward on its object, as in the official file.
    forward = {(e, r["relation"], r["object"]) for e, ent in kb.entities.items() for r in ent["relations"]
               if r["direction"] == "forward"}
    backward = {(r["object"], r["relation"], e) for e, ent in kb.entities.items() for r in ent["relations"]
                if r["direction"] == "backward"}
    assert forward == backward
    assert syn.build_kb(SCALE, seed=3) == kb_dict, "a pure function of (scale, seed)"


def test_synthetic_questions_cover_every_category_with_gold_answers(tmp_path, synthetic):
    kb_dict, questions = synthetic
    path = tmp_path / "val.json"
    path.write_text(json.dumps(questions))
    loaded = load_kqapro_questions(path, "val")  # the official question-file format
    assert {q.category for q in loaded} == set(KQAPRO_CATEGORIES)
    assert all(q.answer and q.answer in q.choices and len(q.choices) == 10 for q in loaded)
    # The gold answers are what the official engine gives, and the project's engine agrees.
    kb = kqapro_kb_from_dict(kb_dict)
    for engine in ("kopl", "cbr2"):
        executor = syn.make_executor(kb, engine)
        for q in loaded:
            values = executor.run(q.program)
            assert values == [q.answer], (engine, q.question)


def test_split_counts_are_kqa_pros_mix():
    from cbr2.data.builders.mini_kqapro_questions import KQAPRO_MIX

    assert syn.split_counts(syn.VAL_SIZE) == KQAPRO_MIX  # the official validation counts
    train = syn.split_counts(syn.TRAIN_SIZE)
    assert sum(train.values()) == syn.TRAIN_SIZE
    assert all(abs(train[c] / syn.TRAIN_SIZE - KQAPRO_MIX[c] / syn.VAL_SIZE) < 1e-4 for c in KQAPRO_CATEGORIES)


def test_benchmark_folder_has_both_splits_in_the_mix_with_gold_answers(tmp_path):
    from cbr2.data.benchmarks import Benchmark

    stats = syn.write_benchmark(tmp_path, SCALE, seed=5, n_train=90, n_val=45)
    bench = Benchmark("kqapro", tmp_path)  # the folder reads as a KQA Pro release
    train, val = bench.questions("train"), bench.questions("val")
    assert (len(train), len(val)) == (stats["train"], stats["val"]) == (90, 45)
    for split, questions in (("train", train), ("val", val)):
        counts = {c: sum(q.category == c for q in questions) for c in KQAPRO_CATEGORIES}
        assert counts == syn.split_counts(len(questions)) == stats["per_category"][split]
    assert not {q.question for q in train} & {q.question for q in val}
    assert stats["sketches"]["train"] > 20
    kb_dict = json.loads((tmp_path / "kb.json").read_text(encoding="utf-8"))
    items = json.loads((tmp_path / "train.json").read_text(encoding="utf-8"))
    assert syn.check_answers(kb_dict, items, "kopl", sample=40) == []  # the reference engine agrees
    wrong = [dict(items[0], answer=items[0]["answer"] + " (wrong)")]
    assert syn.check_answers(kb_dict, wrong, "kopl") == [items[0]["question"]]


def test_sizes_scale_and_refuse_nonpositive():
    assert syn.sizes_at(1.0) == syn.FULL
    assert syn.sizes_at(0.5).entities == 8500 and syn.sizes_at(0.5).concepts == 397
    with pytest.raises(ValueError, match="scale must be positive"):
        syn.sizes_at(0)


# ---------------------------------------------------------------- ontology bound


def _random_shape_kb(n_entities: int, seed: int = 0) -> KB:
    """Entities with random keys and relations to random entities (the issue's KB shape), where
    every concept sees almost every key and concept pair."""
    rng = random.Random(seed)
    concepts = {f"C{i}": {"name": f"concept {i}", "subclassOf": []} for i in range(4)}
    keys = [f"key {i}" for i in range(300)]
    ids = [f"Q{i}" for i in range(n_entities)]
    entities = {}
    for eid in ids:
        entities[eid] = {"name": f"entity {eid}", "instanceOf": [rng.choice(sorted(concepts))],
                         "attributes": [{"key": k, "value": {"type": "string", "value": "v"}, "qualifiers": {}}
                                        for k in rng.sample(keys, 10)],
                         "relations": [{"relation": f"relation {rng.randrange(200)}", "direction": "forward",
                                        "object": rng.choice(ids), "qualifiers": {}} for _ in range(5)]}
    return KB(concepts, entities)


def test_ontology_grows_with_the_schema_not_the_facts():
    small, large = _random_shape_kb(200), _random_shape_kb(2000)
    bound = 4 * (1 + 4 * MAX_PER_CONCEPT)
    n_small, n_large = len(ontology_triples(small)), len(ontology_triples(large))
    assert n_small <= n_large <= bound
    assert len(ontology_triples(large, max_per_concept=10**9)) > 2 * n_large, "unbounded, it follows the facts"
    # The kept items are each concept's most used ones.
    kept = {t.object for t in ontology_triples(large) if t.subject == "concept 0" and t.predicate == "has attribute"}
    counts: dict[str, int] = {}
    for ent in large.entities.values():
        if ent["instanceOf"] == ["C0"]:
            for a in ent["attributes"]:
                counts[a["key"]] = counts.get(a["key"], 0) + 1
    ranked = sorted(counts, key=lambda k: (-counts[k], f"{k} (string)"))
    assert kept == {f"{k} (string)" for k in ranked[:MAX_PER_CONCEPT]}


# ---------------------------------------------------------------- resumable encoding


def _unit_rows(texts):
    rows = np.stack([np.random.default_rng(int(t[1:])).normal(size=8) for t in texts]).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


class _Encoder:
    """Records how many texts each call encodes; raises (a kill) once ``fail_after`` calls are done."""

    def __init__(self, fail_after: int | None = None):
        self.calls: list[int] = []
        self.fail_after = fail_after

    def __call__(self, texts):
        if self.fail_after is not None and len(self.calls) >= self.fail_after:
            raise KeyboardInterrupt("killed mid-way")
        self.calls.append(len(texts))
        return _unit_rows(texts)


TEXTS = [f"t{i}" for i in range(2500)]


def test_a_killed_encoding_resumes_from_the_written_parts(tmp_path):
    store = EmbeddingStore(tmp_path, chunk_size=1000)
    killed = _Encoder(fail_after=2)
    with pytest.raises(KeyboardInterrupt):
        store.get("facts", TEXTS, "enc", "w", killed, "hnsw")
    assert killed.calls == [1000, 1000]
    resumed = _Encoder()
    emb, index = store.get("facts", TEXTS, "enc", "w", resumed, "hnsw")
    assert resumed.calls == [500], "only the rest is encoded"
    assert np.array_equal(emb, _unit_rows(TEXTS)) and index.ntotal == 2500
    assert not list(tmp_path.glob("*.partial")), "the partial build is removed once the entry is in place"
    again = _Encoder()
    store.get("facts", TEXTS, "enc", "w", again, "hnsw")
    assert again.calls == [], "the assembled entry is reused"


def test_a_damaged_part_is_encoded_again_with_a_warning(tmp_path, caplog):
    store = EmbeddingStore(tmp_path, chunk_size=1000)
    with pytest.raises(KeyboardInterrupt):
        store.get("facts", TEXTS, "enc", "w", _Encoder(fail_after=2))
    (partial,) = tmp_path.glob("*.partial")
    raw = bytearray((partial / "part-00002.npy").read_bytes())
    raw[-3] ^= 0xFF
    (partial / "part-00002.npy").write_bytes(bytes(raw))
    resumed = _Encoder()
    with caplog.at_level(logging.WARNING):
        emb, _ = store.get("facts", TEXTS, "enc", "w", resumed)
    assert resumed.calls == [1000, 500], "the damaged part and everything after it"
    assert "part-00002 of the partial build is unusable" in caplog.text
    assert np.array_equal(emb, _unit_rows(TEXTS))


def test_a_partial_build_of_other_content_is_not_resumed(tmp_path):
    store = EmbeddingStore(tmp_path, chunk_size=1000)
    with pytest.raises(KeyboardInterrupt):
        store.get("facts", TEXTS, "enc", "w", _Encoder(fail_after=2))
    other = _Encoder()
    store.get("facts", TEXTS, "enc", "w2", other)  # other weights: another entry, another partial
    assert other.calls == [1000, 1000, 500]
    (partial,) = tmp_path.glob("*.partial")  # the first one stays for its own resumption
    (partial / "meta.json").write_text("{}")
    fresh = _Encoder()
    store.get("facts", TEXTS, "enc", "w", fresh)
    assert fresh.calls == [1000, 1000, 500], "a partial whose meta.json differs is started over"


def test_small_collections_are_encoded_in_one_call(tmp_path):
    store = EmbeddingStore(tmp_path, chunk_size=1000)
    once = _Encoder()
    store.get("facts", TEXTS[:1000], "enc", "w", once)
    assert once.calls == [1000] and not list(tmp_path.glob("*.partial"))


@pytest.mark.slow  # a dozen train.py / evaluate.py processes: minutes on two cores
def test_full_size_benchmark_runs_every_stage_at_a_tiny_scale(tmp_path):
    """``benchmarks/full_size.py``: the path of the full-size measurement, at a scale CI affords."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "full-size"
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "full_size.py"), "--scale", "0.002", "--out",
                           str(out), "--train-steps", "1", "--shards", "2", "--sample", "20"],
                          capture_output=True, text=True, timeout=3000, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = {r["stage"]: r for r in json.loads((out / "results.json").read_text())}
    for stage in ("generate", "check answers (kopl, sample)", "train start-up", "evaluate cold", "evaluate warm",
                  "report", "browser", "2 shards (sum)", "merge 2 shards", "sweep tasks (2 settings)", "finalize"):
        assert rows[stage]["seconds"] > 0 and rows[stage]["peak_rss_gb"] > 0, stage
    assert rows["train start-up"]["startup_s"] > 0  # parsed from train.py's log
    cold = json.loads((out / "runs" / "cold" / "metrics.json").read_text())
    merged = json.loads((out / "runs" / "sharded" / "metrics.json").read_text())
    assert cold["n"] == merged["n"] == rows["generate"]["val"] and cold["hits@1"] == merged["hits@1"]
    assert (out / "sweeps" / "table5" / "report" / "ablation.md").is_file()
    assert "Largest peak:" in (out / "report.md").read_text() and "| evaluate cold |" in done.stdout

    # --resume keeps the leading rows that ended well and runs only the stages after them; here the
    # last one (the first run above already ran every stage, so a later cut would only repeat them).
    before = json.loads((out / "results.json").read_text())
    assert [r["stage"] for r in before][-2:] == ["sweep tasks (2 settings)", "finalize"]
    (out / "results.json").write_text(json.dumps(before[:-1]))
    table = out / "sweeps" / "table5" / "report" / "ablation.md"
    table.unlink()
    kept = [r["stage"] for r in before[:-1] if r["stage"] != "2 shards (sum)"]  # a sum of rows, never run
    again = subprocess.run([sys.executable, str(root / "benchmarks" / "full_size.py"), "--scale", "0.002", "--out",
                            str(out), "--train-steps", "1", "--shards", "2", "--sample", "20", "--resume"],
                           capture_output=True, text=True, timeout=3000, check=False)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert [s for s in kept if f"{s}: " in again.stdout and "(kept from" in again.stdout.split(f"{s}: ")[1].split("\n")[0]] == kept
    assert "finalize: " in again.stdout and "(kept from" not in again.stdout.split("finalize: ")[1].split("\n")[0]
    rows = {r["stage"]: r for r in json.loads((out / "results.json").read_text())}
    assert len(rows) == 13 and table.is_file()
