"""Retrieval: FAISS indexes, the embedding cache, knowledge and case retrievers, metrics, leakage."""

from __future__ import annotations

import json
import logging
import shutil

import faiss
import numpy as np
import pytest

from cbr2.config import load_config
from cbr2.data.benchmarks import EMBEDDED_ROOT, Benchmark
from cbr2.data.questions import Question
from cbr2.kb.triples import fact_triples, ontology_triples
from cbr2.kopl.sketch import schema_items
from cbr2.kopl.text import parse_dag_text
from cbr2.retrieval.cache import EmbeddingStore
from cbr2.retrieval.cases import CaseRetriever, Query
from cbr2.retrieval.index import build_index, search
from cbr2.retrieval.knowledge import KnowledgeRetriever
from cbr2.retrieval.metrics import knowledge_recall, retrieval_metrics, sketch_hit_at_k
from cbr2.run.runner import run_evaluation

BACKBONE = "structural.checkpoint=sentence-transformers/all-MiniLM-L6-v2"


class KeywordEncoder:
    """A fake sentence encoder: normalised bag of known words, so expected rankings are exact."""

    def __init__(self, vocabulary):
        self.vocab = {w: i for i, w in enumerate(vocabulary)}
        self.calls = 0

    def encode(self, texts, **_):
        self.calls += 1
        out = np.zeros((len(texts), len(self.vocab) + 1), np.float32)
        for row, text in enumerate(texts):
            for word in text.lower().replace("?", " ").split():
                out[row, self.vocab.get(word, len(self.vocab))] += 1
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)

    def get_embedding_dimension(self):
        return len(self.vocab) + 1

    def state_dict(self):
        # Its "weights" are its vocabulary: two fakes of different words never share an embedding
        # cache entry (the cache keys on ``weights_fingerprint``, one per test session).
        import hashlib

        import torch

        digest = hashlib.sha256("\x00".join(self.vocab).encode()).digest()
        return {"vocabulary": torch.tensor(list(digest), dtype=torch.float32)}

    def __getitem__(self, i):
        return self


# ---------------------------------------------------------------- indexes


def _unit(n, dim, seed=0, clusters=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, dim)).astype(np.float32)
    if clusters:  # sentence embeddings are clustered; approximate indexes rely on that
        x = 0.3 * x + 3 * rng.normal(size=(clusters, dim)).astype(np.float32)[rng.integers(clusters, size=n)]
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_flat_index_is_exact_inner_product():
    emb, queries = _unit(300, 16), _unit(7, 16, seed=1)
    scores, ids = search(build_index(emb, "flat"), queries, 5)
    expected = np.argsort(-(queries @ emb.T), axis=1)[:, :5]
    assert (ids == expected).all()
    assert np.allclose(scores, np.take_along_axis(queries @ emb.T, expected, axis=1), atol=1e-5)


@pytest.mark.parametrize("kind", ["hnsw", "ivf"])
def test_approximate_indexes_find_most_exact_neighbours(kind):
    emb = _unit(4050, 32, clusters=40)
    emb, queries = emb[:4000], emb[4000:]
    _, exact = search(build_index(emb, "flat"), queries, 10)
    _, approx = search(build_index(emb, kind), queries, 10)
    recall = np.mean([len(set(a) & set(e)) / 10 for a, e in zip(approx, exact)])
    assert recall >= 0.9


def test_search_caps_k_and_unknown_kind_fails():
    _, ids = search(build_index(_unit(3, 4), "flat"), _unit(2, 4), 10)
    assert ids.shape == (2, 3) and (ids >= 0).all()
    with pytest.raises(ValueError, match="unknown retrieval.index 'lsh'"):
        build_index(_unit(3, 4), "lsh")


# ---------------------------------------------------------------- cache


def _counting_embed(log):
    def embed(texts):
        log.append(len(texts))
        return _unit(len(texts), 8, seed=len(texts))
    return embed


def test_cache_reuses_an_entry_and_keys_on_encoder_weights_and_content(tmp_path):
    store, calls = EmbeddingStore(tmp_path), []
    texts = ["a", "b", "c"]
    first, _ = store.get("facts", texts, "enc", "w1", _counting_embed(calls))
    again, index = store.get("facts", texts, "enc", "w1", _counting_embed(calls))
    assert calls == [3] and np.array_equal(first, again) and index.ntotal == 3
    store.get("facts", ["a", "b", "d"], "enc", "w1", _counting_embed(calls))    # other content
    store.get("facts", texts, "enc2", "w1", _counting_embed(calls))              # other encoder
    store.get("facts", texts, "enc", "w2", _counting_embed(calls))               # fine-tuned weights
    store.get("facts", ["ab", "c"], "enc", "w1", _counting_embed(calls))         # no separator collision
    store.get("facts", ["a", "bc"], "enc", "w1", _counting_embed(calls))
    assert calls == [3, 3, 3, 3, 2, 2]


def _entry(tmp_path):
    (entry,) = [p for p in tmp_path.iterdir() if p.is_dir() and not p.name.startswith(".")]
    return entry


@pytest.mark.parametrize("damage", ["flip", "truncate", "stale_meta", "no_meta"])
def test_a_corrupt_or_stale_entry_is_rebuilt_never_used(tmp_path, caplog, damage):
    store, calls, kind = EmbeddingStore(tmp_path), [], "flat"
    texts = [f"t{i}" for i in range(1200)]
    good, _ = store.get("facts", texts, "enc", "w", _counting_embed(calls), kind)
    entry = _entry(tmp_path)
    if damage == "flip":
        raw = bytearray((entry / "embeddings.npy").read_bytes())
        raw[-5] ^= 0xFF
        (entry / "embeddings.npy").write_bytes(bytes(raw))
    elif damage == "truncate":
        (entry / "embeddings.npy").write_bytes((entry / "embeddings.npy").read_bytes()[:200])
    elif damage == "stale_meta":
        meta = json.loads((entry / "meta.json").read_text())
        (entry / "meta.json").write_text(json.dumps({**meta, "content": "0" * 64}))
    else:
        (entry / "meta.json").unlink()
    rebuilt, index = store.get("facts", texts, "enc", "w", _counting_embed(calls), kind)
    assert calls == [1200, 1200], "a damaged entry must be re-encoded"
    assert np.array_equal(rebuilt, good) and index.ntotal == 1200
    assert any(r.levelno == logging.WARNING for r in caplog.records)  # said, not silent
    store.get("facts", texts, "enc", "w", _counting_embed(calls), kind)
    assert calls == [1200, 1200], "the rebuilt entry is reused"


def test_another_index_kind_reuses_the_embeddings_and_is_stored_once(tmp_path, caplog):
    store, calls = EmbeddingStore(tmp_path), []
    texts = [f"t{i}" for i in range(1200)]
    good, _ = store.get("facts", texts, "enc", "w", _counting_embed(calls), "flat")
    entry = _entry(tmp_path)
    assert not list(entry.glob("index-*")), "a flat index is rebuilt, never stored"
    emb, hnsw = store.get("facts", texts, "enc", "w", _counting_embed(calls), "hnsw")
    assert calls == [1200], "switching the index kind must not encode again"
    assert isinstance(hnsw, faiss.IndexHNSWFlat) and hnsw.ntotal == 1200 and np.array_equal(emb, good)
    stored = (entry / "index-hnsw.faiss").read_bytes()
    again = store.get("facts", texts, "enc", "w", _counting_embed(calls), "hnsw")[1]
    assert isinstance(again, faiss.IndexHNSWFlat) and (entry / "index-hnsw.faiss").read_bytes() == stored
    assert search(again, good[:5], 1)[1][:, 0].tolist() == search(hnsw, good[:5], 1)[1][:, 0].tolist()
    # A damaged index costs only the index: rebuilt from the embeddings, with a warning.
    (entry / "index-hnsw.faiss").write_bytes(b"not an index")
    rebuilt = store.get("facts", texts, "enc", "w", _counting_embed(calls), "hnsw")[1]
    assert calls == [1200] and rebuilt.ntotal == 1200
    assert any(r.levelno == logging.WARNING and "index is unusable" in r.message for r in caplog.records)
    assert (entry / "index-hnsw.faiss").read_bytes() != b"not an index"


# ---------------------------------------------------------------- knowledge and cases


def test_knowledge_retriever_finds_the_matching_triples(tiny_kb, tmp_path):
    kb = tiny_kb
    words = ["marie", "curie", "date", "birth", "population", "warsaw", "city", "height"]
    retriever = KnowledgeRetriever(kb, KeywordEncoder(words), "kw", EmbeddingStore(tmp_path), k_ontology=2, k_facts=1)
    enc = KeywordEncoder(words)
    (got,) = retriever.retrieve(enc.encode(["date of birth of Marie Curie"]))
    assert [t.text for t in got.facts] == ["Marie Curie | date of birth | 1867-11-07"]
    assert len(got.ontology) == 2 and ("key", "date of birth") in got.terms()
    none = KnowledgeRetriever(kb, enc, "kw", EmbeddingStore(tmp_path), k_ontology=0, k_facts=0)
    assert none.retrieve(enc.encode(["x"]))[0].facts == ()


def test_the_linked_entities_facts_come_first_then_the_nearest(tiny_kb, tmp_path):
    enc = KeywordEncoder(["marie", "curie", "date", "birth", "population", "warsaw", "city", "height", "award"])
    retriever = KnowledgeRetriever(tiny_kb, enc, "kw", EmbeddingStore(tmp_path), k_ontology=0, k_facts=5)
    question = enc.encode(["Who is Marie Curie?"])
    (nearest,) = retriever.retrieve(question)
    assert nearest.facts[0].subject == "Marie Curie"
    (linked,) = retriever.retrieve(question, [("Paris",)])
    # Paris's four facts (as subject, or as a relation's object) by similarity, then the nearest one.
    assert [t.text for t in linked.facts] == [
        "Pierre Curie | place of birth | Paris", "Paris | elevation above sea level | 35 metre",
        "Paris | population | 2145906 (point in time: 2020)", "Paris | instance of | city",
        "Marie Curie | instance of | human"]
    assert list(linked.facts_scores[:4]) == sorted(linked.facts_scores[:4], reverse=True)


def test_triples_name_their_schema_items(tiny_kb):
    kb = tiny_kb
    facts = {t.text: t.terms for t in fact_triples(kb)}
    assert facts["Marie Curie | award received | Nobel Prize in Physics (point in time: 1903)"] == {
        ("relation", "award received"), ("qkey", "point in time")}
    onto = {t.text: t.terms for t in ontology_triples(kb)}
    assert onto["city | subclass of | geographic location"] == {("concept", "city"), ("concept", "geographic location")}
    assert ("key", "population") in onto["city | attribute qualifier | population → point in time"]


def _q(qid, text, program="r1: Find[x] → QueryName[]"):
    return Question(qid, text, parse_dag_text(program), "x", "QueryName", None)


POOL = [_q("t0", "who directed the matrix"), _q("t1", "who wrote the matrix"),
        _q("t2", "when was the matrix released"), _q("t3", "who directed alien")]
WORDS = ["who", "directed", "wrote", "matrix", "released", "alien", "when"]


def _cases(tmp_path, **kw):
    enc = KeywordEncoder(WORDS)
    return CaseRetriever(POOL, EmbeddingStore(tmp_path), {"semantic": ("kw", enc)}, **kw), enc


def test_case_ranking_excludes_the_question_itself(tmp_path):
    cases, enc = _cases(tmp_path)
    queries = [Query("t0", "who directed the matrix"), Query("v0", "who directed the matrix")]
    own, other = cases.rank("semantic", queries, 2, enc.encode([q.text for q in queries]))
    assert [i for i, _ in other] == [0, 1] or [i for i, _ in other] == [0, 3]
    assert 0 not in [i for i, _ in own] and len(own) == 2


def test_merge_removes_duplicates_and_keeps_every_view(tmp_path):
    cases, _ = _cases(tmp_path)
    merged = cases.merge({"semantic": [(0, 0.9), (1, 0.5)], "structural": [(1, 0.8), (3, 0.7)]})
    assert [c.question.qid for c in merged] == ["t0", "t1", "t3"]
    assert merged[1].views == ("semantic", "structural") and merged[1].scores == (0.5, 0.8)


def test_random_cases_are_seeded_per_question_and_never_the_question(tmp_path):
    cases, _ = _cases(tmp_path, seed=3)
    queries = [Query(f"t{i}", "q") for i in range(4)]
    a = cases.rank("random", queries, 3)
    b = cases.rank("random", queries[::-1], 3)[::-1]
    assert a == b, "a question's random cases do not depend on the order it is asked in"
    assert all(i != qi for qi, ranking in enumerate(a) for i, _ in ranking)
    other_seed, _ = _cases(tmp_path, seed=4)
    many = [Query(f"v{i}", "q") for i in range(20)]
    assert cases.rank("random", many, 2) != other_seed.rank("random", many, 2)
    with pytest.raises(ValueError, match="has no encoder"):
        cases.rank("structural", queries, 2, np.zeros((4, 8), np.float32))


def test_query_carries_only_id_and_text():
    assert list(Query.__dataclass_fields__) == ["qid", "text"]


# ---------------------------------------------------------------- metrics


def test_knowledge_recall_is_micro_averaged_over_typed_items():
    gold = [{("key", "height"), ("concept", "city")}, {("relation", "height")}]
    found = [{("key", "height")}, {("key", "height")}]   # the same name as another kind does not count
    assert knowledge_recall(gold, found) == pytest.approx(1 / 3)
    assert knowledge_recall([set()], [set()]) == 0.0


def test_retrieval_metrics_merge_the_views_top_k():
    a, b, c = ("Find", "QueryName"), ("FindAll", "Count"), ("Find", "Relate", "QueryName")
    gold = [a, b]
    views = {"semantic": [[c, a], [c, c]], "structural": [[a, c], [c, b]]}
    m = retrieval_metrics(gold, views)
    assert m["cases"]["semantic"] == {"sketch_hit@1": 0.0, "sketch_hit@5": 0.5}
    assert m["cases"]["structural"] == {"sketch_hit@1": 0.5, "sketch_hit@5": 1.0}
    assert m["cases"]["merged"] == {"sketch_hit@1": 0.5, "sketch_hit@5": 1.0}
    assert sketch_hit_at_k(gold, views["semantic"], 2) == 0.5


def test_schema_items_come_from_the_function_table():
    program = parse_dag_text("r1: FindAll[] → FilterConcept[city] → FilterNum[population | 1000 | >] → "
                             "QueryAttrQualifier[population | 1000 | point in time]")
    assert schema_items(program) == {("concept", "city"), ("key", "population"), ("qkey", "point in time")}


# ---------------------------------------------------------------- end to end, with the real encoder


def _retrieval_run(tmp_path, root, name, *overrides):
    # The whole split: a category-balanced sample would read the (tampered) gold programs'
    # categories to choose its questions, which is the evaluation's design, not retrieval's.
    cfg = load_config([f"data.name={name}", f"data.root={root}", f"output_dir={tmp_path / name}",
                       BACKBONE, "eval.per_category=null", *overrides])
    metrics = run_evaluation(cfg, retrieval_only=True)
    return metrics, (tmp_path / name / "retrieval.jsonl").read_text()


@pytest.mark.slow
def test_retrieval_never_sees_the_gold_programs_or_answers_of_the_evaluated_split(tmp_path):
    """Rotate the programs and answers of the evaluated questions: nothing retrieved may change."""
    honest = tmp_path / "honest"
    shutil.copytree(EMBEDDED_ROOT / "mini-kqapro", honest)
    tampered = tmp_path / "tampered"
    shutil.copytree(honest, tampered)
    val = json.loads((honest / "val.json").read_text())
    original = json.loads((honest / "val.json").read_text())
    for q, other in zip(val, original[7:] + original[:7]):
        q["program"], q["answer"] = other["program"], other["answer"] + " (tampered)"
    (tampered / "val.json").write_text(json.dumps(val))

    # With linking and masking on, so that they are proven blind to them too, and the full method's
    # knowledge (the CPU default recalls none).
    on = ("retrieval.link=true", "retrieval.mask_mentions=true", "retrieval.k_ontology=10", "retrieval.k_facts=10")
    m_honest, r_honest = _retrieval_run(tmp_path, honest, "kqapro", "eval.limit=40", *on)
    shutil.move(tmp_path / "kqapro", tmp_path / "kqapro-honest")
    m_tampered, r_tampered = _retrieval_run(tmp_path, tampered, "kqapro", "eval.limit=40", *on)
    assert r_honest == r_tampered, "retrieved cases or triples changed with the gold programs"
    records = [json.loads(line) for line in r_honest.splitlines()]
    assert len(records) == 40 and all(r["facts"] and r["ontology"] and r["cases"] for r in records)
    # Linking is part of what must not change (retrieval.jsonl holds each question's links).
    assert sum(bool(r["links"]["entities"] or r["links"].get("values")) for r in records) > 30
    # Non-vacuous: the scores do read the gold programs, after retrieval.
    assert m_honest["retrieval"]["cases"] != m_tampered["retrieval"]["cases"]
    assert m_honest["retrieval"]["linking"] != m_tampered["retrieval"]["linking"]


@pytest.mark.slow
def test_prompts_never_see_the_gold_programs_or_answers_of_the_evaluated_split(tmp_path, fake_backend):
    """The same tampering as above, end to end: every prompt the model reads stays byte-identical."""
    val = json.loads((EMBEDDED_ROOT / "mini-kqapro" / "val.json").read_text())
    prompts = {}
    for name, rotate in (("honest", 0), ("tampered", 7)):
        root = tmp_path / name
        shutil.copytree(EMBEDDED_ROOT / "mini-kqapro", root)
        items = json.loads(json.dumps(val))
        for q, other in zip(items, val[rotate:] + val[:rotate]):
            q["program"], q["answer"] = other["program"], other["answer"] + (" (tampered)" if rotate else "")
        (root / "val.json").write_text(json.dumps(items))
        fake_backend.prompts.clear()
        cfg = load_config(["data.name=kqapro", f"data.root={root}", f"output_dir={tmp_path / name / 'run'}",
                           BACKBONE, "llm.backend=fake", "generation.constrained=false", "eval.per_category=null", "eval.limit=18",
                           "retrieval.link=true", "retrieval.mask_mentions=true",  # nor linking nor masking
                           "retrieval.k_ontology=10", "retrieval.k_facts=10",  # the full method's knowledge
                           "wandb.mode=disabled"])
        metrics = run_evaluation(cfg)
        prompts[name] = [fake_backend.render(p) for p in fake_backend.prompts]
        assert len(prompts[name]) == metrics["n"] == 18
    assert prompts["honest"] == prompts["tampered"], "a prompt changed with the gold programs or answers"
    # Non-vacuous: every prompt holds the question, cases with programs, and knowledge.
    for text, q in zip(prompts["honest"], Benchmark("mini-kqapro").questions("val")[:18], strict=True):
        assert f"Question: {q.question}\n" in text and "Facts:" in text and "\nr1: " in text


@pytest.mark.slow
def test_cached_question_embeddings_give_the_same_retrieval_and_are_not_encoded_again(tmp_path, caplog, monkeypatch):
    """A rerun reads the questions' embeddings from the cache: the same retrieval, no encoding."""
    monkeypatch.setenv("CBR2_CACHE_DIR", str(tmp_path / "cache"))
    on = ("eval.limit=12", "retrieval.link=true", "retrieval.mask_mentions=true")
    _, first = _retrieval_run(tmp_path / "a", EMBEDDED_ROOT / "mini-kqapro", "mini-kqapro", *on)
    assert {p.name.split("-")[1] for p in (tmp_path / "cache").glob("queries-*")} == {"written", "masked"}
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="cbr2.retrieval.cache"):
        _, again = _retrieval_run(tmp_path / "b", EMBEDDED_ROOT / "mini-kqapro", "mini-kqapro", *on)
    assert again == first
    messages = [r.getMessage() for r in caplog.records]
    assert sum("cache hit" in m and "queries-" in m for m in messages) == 3  # written/semantic, masked/both views
    assert not [m for m in messages if m.startswith("encoding")], messages
    # Uncached (one batch, as a benchmark or the browser asks) is the same embeddings.
    from cbr2.retrieval.retriever import Retriever

    cfg = load_config(["data.name=mini-kqapro", BACKBONE, "retrieval.link=true", "retrieval.mask_mentions=true"])
    retriever = Retriever(Benchmark("mini-kqapro"), cfg.retrieval, cfg.structural.checkpoint)
    queries = [Query(q.qid, q.question) for q in Benchmark("mini-kqapro").questions("val")[:5]]
    cached, fresh = retriever.encode(queries, cache=True), retriever.encode(queries)
    assert cached.keys() == fresh.keys() == {"written/semantic", "masked/semantic", "masked/structural"}
    assert all(np.array_equal(cached[k], fresh[k]) for k in fresh)


@pytest.mark.slow
def test_a_training_question_is_never_its_own_case(tmp_path):
    _, lines = _retrieval_run(tmp_path, EMBEDDED_ROOT / "mini-metaqa", "mini-metaqa", "data.split=train",
                              "eval.limit=30", "retrieval.k_facts=0", "retrieval.k_ontology=0")
    pool = {q.qid: q.question for q in Benchmark("mini-metaqa").questions("train")}
    for record in map(json.loads, lines.splitlines()):
        ids = [c["id"] for c in record["cases"]]
        assert record["id"] not in ids and len(ids) == len(set(ids)) and ids
        assert all(pool[i] for i in ids)


def _program_shape(program) -> str:
    """A program with its topic left out (MetaQA: the relations and their directions)."""
    return str(program.steps[1:])


@pytest.mark.slow
def test_masked_mentions_bring_cases_of_the_questions_own_template(tmp_path):
    """With entities masked, the cases share the question's program shape, not its movie."""
    gold = {q.qid: _program_shape(q.program) for q in Benchmark("mini-metaqa").questions("dev")}
    pool = {q.qid: _program_shape(q.program) for q in Benchmark("mini-metaqa").questions("train")}
    same = {}
    for mask in ("false", "true"):
        _, lines = _retrieval_run(tmp_path / mask, EMBEDDED_ROOT / "mini-metaqa", "mini-metaqa", "data.split=dev",
                                  "eval.limit=40", "retrieval.k_facts=0", "retrieval.k_ontology=0",
                                  f"retrieval.mask_mentions={mask}")
        records = [json.loads(line) for line in lines.splitlines()]
        same[mask] = sum(pool[c["id"]] == gold[r["id"]] for r in records for c in r["cases"]) / sum(
            len(r["cases"]) for r in records)
    # Measured with the untrained MiniLM for both views: 0.13 of the cases written, 0.99 masked.
    assert same["true"] > 0.9 and same["false"] < 0.5, same


# ---------------------------------------------------------------- which structural retriever


def _export(root, name, data, created):
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "cbr2_structural.json").write_text(json.dumps({"data": {"name": data}, "created": created}))
    return folder


def _resolve(tmp_path, *overrides):
    from cbr2.structural.on_demand import resolve_structural

    cfg = load_config([f"structural.checkpoints_dir={tmp_path}", *overrides])
    return resolve_structural(cfg.structural, cfg.data, Benchmark(cfg.data.name, cfg.data.root))


def test_the_newest_retriever_of_the_same_dataset_is_used(tmp_path):
    _export(tmp_path, "old", "mini-kqapro", "2026-01-01T00:00:00+00:00")
    new = _export(tmp_path, "new", "mini-kqapro", "2026-02-01T00:00:00+00:00")
    _export(tmp_path, "newest-other", "mini-metaqa", "2026-03-01T00:00:00+00:00")
    assert _resolve(tmp_path) == str(new)
    assert _resolve(tmp_path, "structural.checkpoint=/some/where") == "/some/where"
    # MetaQA has its own here; without it, the KQA Pro one is reused, as in the paper.
    assert _resolve(tmp_path, "data.name=mini-metaqa").endswith("newest-other")
    shutil.rmtree(tmp_path / "newest-other")
    assert _resolve(tmp_path, "data.name=mini-metaqa") == str(new)


def test_an_official_dataset_without_a_retriever_stops_with_the_train_command(tmp_path):
    root = tmp_path / "KQAPro"
    shutil.copytree(EMBEDDED_ROOT / "mini-kqapro", root)
    with pytest.raises(ValueError, match=f"python train.py data.name=kqapro data.root={root}"):
        _resolve(tmp_path / "ckpt", "data.name=kqapro", f"data.root={root}")
    metaqa = tmp_path / "MetaQA"
    shutil.copytree(EMBEDDED_ROOT / "mini-metaqa", metaqa)
    with pytest.raises(ValueError, match=r"python train\.py data\.name=kqapro data\.root=DIR`"):
        _resolve(tmp_path / "ckpt", "data.name=metaqa", f"data.root={metaqa}")


def test_the_embedded_default_trains_one_on_first_use(tmp_path, monkeypatch):
    import cbr2.structural.train as training

    seen = []

    def fake_train(cfg):
        seen.append((cfg.data.name, cfg.structural.checkpoints_dir))
        return {"checkpoint": tmp_path / "trained"}

    monkeypatch.setattr(training, "train", fake_train)
    assert _resolve(tmp_path, "data.name=mini-metaqa") == str(tmp_path / "trained")
    assert seen == [("mini-kqapro", str(tmp_path))], "MetaQA reuses a retriever trained on KQA Pro"


def test_a_bad_retrieval_setting_fails_before_any_training(tmp_path, monkeypatch):
    import cbr2.structural.train as training

    monkeypatch.setattr(training, "train", lambda cfg: pytest.fail("trained before checking the encoder"))
    cfg = load_config([f"output_dir={tmp_path}", f"structural.checkpoints_dir={tmp_path / 'none'}",
                       f"retrieval.encoder={tmp_path / 'missing-encoder'}"])
    with pytest.raises(OSError, match="missing-encoder does not exist"):
        run_evaluation(cfg, retrieval_only=True)
    with pytest.raises(ValueError, match="unknown retrieval.cases"):
        run_evaluation(load_config([f"output_dir={tmp_path}", "retrieval.cases=both"]))
