"""Every stage before and during answering, on a synthetic KB of KQA Pro's size and shape.

    python benchmarks/scale.py                                  # 1/8, 1/4, 1/2 and full scale
    python benchmarks/scale.py --scales 0.125 0.25 --out outputs/scale
    python benchmarks/scale.py --scales 1 --stages parse,facts,ontology,index

The KB and its questions come from ``cbr2.data.builders.synthetic_kqapro`` (at scale 1: 17,000
entities, 794 concepts, 846 keys, 363 relations, ~650,000 fact triples; kb.json ~80 MB; gold
answers from the official engine). Each scale is generated in one child process and profiled in
another, so every stage's peak RSS is that process's own: before a stage the kernel's high-water
mark is reset (``/proc/self/clear_refs``), after it ``VmHWM`` is read, so the peak column is the
highest resident memory during the stage (what earlier stages hold included) and the next
column what the process still holds after it.

Stages (``--stages``, comma-separated; default all, in this order):

``parse``          ``load_kqapro_kb`` of kb.json (JSON, schema validation, the KB model)
``store``          the KB store (``cbr2.data.kb_store``, in a fresh cache): first load (builds the
                   entry), later load, ``Executor`` init and triples on the stored KB
``facts``          fact triples; ``ontology`` ontology triples (and how many without the bound)
``linking``        the linker's build and every question's links and masked text; then
                   ``generation.narrow``'s reach of every question (H from 1 to 3)
``executor``       ``Executor`` init with the ``cbr2`` engine and with ``kopl`` (a deep copy of the
                   KB), then every question's gold program on each: ms per question and Hits@1
                   through the scoring path (``pipeline.score_generation``)
``encode``         the retrieval encoder (``retrieval.encoder``) on a sample of fact and ontology
                   triples; throughput, and the time to encode all of them projected from it
``index``          FAISS flat, hnsw and ivf over as many vectors as there are fact triples:
                   build seconds, memory, recall@10 against flat, ms per query; and retrieval
                   per question (encode the question, search ontology and facts)
``canonicalizer``  ``build_canonicalizer`` with a cold cache (embeds every vocabulary item)
``grammar``        the decoding grammar's EBNF, and its xgrammar compilation for the packaged
                   model's tokenizer (cold)

Encoding all ~650,000 fact triples on two CPU cores takes about half an hour, so the index
vectors are not the real embeddings: each is a real embedding of a sampled triple plus Gaussian
noise (cosine ~0.87 to it), renormalised, so the vectors are clustered as sentence embeddings
are (``--vectors random`` takes uniform random unit vectors instead, the worst case for the
approximate indexes; ``--vectors real`` encodes every triple, through the embedding cache in the
scale's folder, which a later run reuses); the queries are the real embeddings of the benchmark's
questions. The output says which. "Time to first answer" adds the stages a fresh process runs before it can
answer (parse, triples, executor, encoder, encoding with a cold cache, index, one retrieval and
one execution); it is derived from the rows above, not timed on its own.

Writes ``DIR/scale-S/{kb.json,val.json,generate.json,profile.json}``, ``DIR/results.json`` and
``DIR/report.md`` (the printed tables). A scale's KB and questions are reused when their
``generate.json`` matches (``--regenerate`` to force).
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

STAGES = ("parse", "store", "facts", "ontology", "executor", "linking", "encode", "index", "canonicalizer", "grammar")
DEFAULT_SCALES = (0.125, 0.25, 0.5, 1.0)
INDEX_KINDS = ("flat", "hnsw", "ivf")


# --------------------------------------------------------------------------- measuring

def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _reset_peak() -> bool:
    """Reset this process's VmHWM to its current RSS (Linux 4.0+); False where not possible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


class Stage:
    """Times a block and records its peak and final RSS (GB) into ``results``."""

    def __init__(self, results: list[dict], name: str, out_file: Path | None = None):
        self.results, self.name, self.out_file = results, name, out_file
        self.row: dict[str, Any] = {"stage": name}

    def __enter__(self) -> dict[str, Any]:
        self.exact = _reset_peak()
        self.start = time.perf_counter()
        return self.row

    def __exit__(self, exc_type, exc, tb) -> bool:
        seconds = time.perf_counter() - self.start
        self.row.setdefault("seconds", seconds)
        self.row["peak_rss_gb"] = _status_kb("VmHWM") / 2**20
        self.row["rss_after_gb"] = _status_kb("VmRSS") / 2**20
        self.row["load_1m"] = os.getloadavg()[0]  # other work on the machine slows the timings
        if not self.exact:
            self.row["peak_note"] = "process peak so far (the kernel's peak could not be reset)"
        if exc is not None:
            self.row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        self.results.append(self.row)
        print(f"  {self.name}: {seconds:.2f} s, peak {self.row['peak_rss_gb']:.2f} GB"
              + (f" [{self.row['error']}]" if exc is not None else ""), flush=True)
        if self.out_file is not None:
            self.out_file.write_text(json.dumps(self.results, indent=1, default=str))
        return exc is not None and not isinstance(exc, (KeyboardInterrupt, MemoryError))


# --------------------------------------------------------------------------- generate worker

def generate_worker(scale: float, seed: int, per_category: int, folder: Path) -> None:
    """Write the scale's kb.json, val.json and generate.json (stage rows)."""
    from cbr2.data.builders import synthetic_kqapro as syn
    from cbr2.data.builders.mini_kqapro_kb import kb_stats
    from cbr2.data.kb_loaders import kqapro_kb_from_dict

    folder.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    with Stage(rows, "generate KB") as row:
        kb = syn.build_kb(scale, seed)
        row["stats"] = kb_stats(kb)
    with Stage(rows, "write kb.json") as row:
        tmp = folder / ".kb.json.tmp"
        with tmp.open("w", encoding="utf-8") as handle:
            json.dump(kb, handle, ensure_ascii=False, separators=(",", ":"))
        tmp.replace(folder / "kb.json")
        row["mb"] = (folder / "kb.json").stat().st_size / 1e6
    with Stage(rows, "executor init (kopl), for the gold answers") as row:
        executor = syn.make_executor(kqapro_kb_from_dict(kb, str(folder / "kb.json")), "kopl")
        row["engine"] = getattr(executor, "engine_name", "kopl")
    with Stage(rows, "questions (gold answers from kopl)") as row:
        questions = syn.build_questions(kb, seed, per_category, executor=executor)
        row["n"] = len(questions)
        row["per_category"] = syn.question_stats(questions)
    (folder / "val.json").write_text(json.dumps(questions, ensure_ascii=False, indent=0), encoding="utf-8")
    meta = _generation_key(scale, seed, per_category)
    (folder / "generate.json").write_text(json.dumps({**meta, "stages": rows}, indent=1, default=str))


def _generation_key(scale: float, seed: int, per_category: int) -> dict[str, Any]:
    from cbr2.data.builders.synthetic_kqapro import VERSION

    return {"generator_version": VERSION, "scale": scale, "seed": seed, "per_category": per_category}


# --------------------------------------------------------------------------- profile worker

def profile_worker(folder: Path, stages: list[str], sample: int, vectors: str, seed: int) -> None:
    """Run the selected stages on the scale's files; write profile.json after each."""
    out_file = folder / "profile.json"
    rows: list[dict] = []
    state: dict[str, Any] = {}

    def stage(name: str) -> Stage:
        return Stage(rows, name, out_file)

    kb_path = folder / "kb.json"
    from cbr2.data.kb_loaders import load_kqapro_kb

    with stage("KB parse (load_kqapro_kb)") as row:
        kb = load_kqapro_kb(kb_path)
        row["stats"] = kb.stats()
        row["load_average"] = os.getloadavg()
    if "parse" not in stages:
        rows[-1]["note"] = "needed by the other stages"
    if "store" in stages:
        _store_stages(stage, kb_path, stages, state)
    if "facts" in stages or "encode" in stages or "index" in stages:
        from cbr2.kb.triples import fact_triples

        with stage("fact triples") as row:
            facts = [t.text for t in fact_triples(kb)]
            row["n"] = len(facts)
        state["facts"] = facts
    if "ontology" in stages or "encode" in stages or "index" in stages:
        from cbr2.kb.triples import ontology_triples

        with stage("ontology triples") as row:
            ontology = [t.text for t in ontology_triples(kb)]
            row["n"] = len(ontology)
        state["ontology"] = ontology
        if "ontology" in stages:
            start = time.perf_counter()
            row["n_unbounded"] = len(ontology_triples(kb, max_per_concept=10**9))
            row["unbounded_seconds"] = time.perf_counter() - start
    if "executor" in stages:
        _executor_stages(stage, kb, folder, state)
    if "linking" in stages:
        _linking_stages(stage, kb, folder)
    if {"encode", "index", "canonicalizer"} & set(stages):
        _encoder_stages(stage, state, folder, stages, sample, vectors, seed, kb)
    if "grammar" in stages:
        _grammar_stages(stage, kb)
    out_file.write_text(json.dumps(rows, indent=1, default=str))  # what was added after the last stage
    if "store_cache" in state:
        shutil.rmtree(state["store_cache"], ignore_errors=True)


def _store_stages(stage, kb_path: Path, stages: list[str], state: dict) -> None:
    """The KB store (``cbr2.data.kb_store``) in a fresh cache: its first load builds the entry, later ones read it."""
    try:
        import cbr2.data.kb_store as store_module
    except ImportError:
        with stage("kb store load") as row:
            row["seconds"] = None
            row["note"] = "n/a: no cbr2.data.kb_store yet"
        return
    loader = next((getattr(store_module, n) for n in ("load_store", "load_kb") if
                   callable(getattr(store_module, n, None))), None)
    if loader is None:
        with stage("kb store load") as row:
            row["seconds"] = None
            row["note"] = "n/a: cbr2.data.kb_store has no load_store / load_kb"
        return
    cache = state["store_cache"] = tempfile.mkdtemp(prefix="cbr2-scale-kb-store-")
    kwargs = {"cache_dir": cache} if "cache_dir" in inspect.signature(loader).parameters else {}
    with stage("kb store build (first load)") as row:
        loader(kb_path, **kwargs)
        row["note"] = f"cbr2.data.kb_store.{loader.__name__}, empty cache: parse and write the entry"
    with stage("kb store load (later loads)") as row:
        stored = loader(kb_path, **kwargs)
        row["note"] = f"returns a {type(stored).__name__}"
    if "executor" in stages:
        from cbr2.data.builders.synthetic_kqapro import make_executor

        with stage("executor init (cbr2, stored KB)") as row:
            executor = make_executor(stored, "cbr2", timeout_s=None)
            row["note"] = "the directories of the engine's indexes read from the entry"
        with stage("execution per question (cbr2, stored KB)") as row:
            row.update(_timed_programs(executor, stored, kb_path.parent))
            indexes = stored.engine_indexes() if hasattr(stored, "engine_indexes") else {}
            read = [(v.read, len(v)) for v in indexes.values() if hasattr(v, "read")]
            if read:  # the index keys the programs made the engine read
                row["note"] = f"index keys read: {sum(r for r, _ in read):,} of {sum(n for _, n in read):,}"
        del executor
    if {"facts", "ontology"} & set(stages):
        from cbr2.kb.triples import fact_triples, ontology_triples

        with stage("fact + ontology triples (stored KB)") as row:
            row["n"] = sum(1 for _ in fact_triples(stored)) + len(ontology_triples(stored))
            row["note"] = "entities unpickled one by one from the entry"
    del stored


def _timed_programs(executor, kb, folder: Path) -> dict:
    """Each validation question's gold program run once on ``executor``, then scored as a run
    scores it: the mean, p95, first and slowest in ms, and Hits@1."""
    import numpy as np

    from cbr2.data.benchmarks import Benchmark
    from cbr2.data.questions import load_kqapro_questions
    from cbr2.evaluation.scoring import score_generation
    from cbr2.kopl.text import to_text

    bench = Benchmark("kqapro", folder)
    bench.__dict__["kb"] = kb  # the KB measured (Benchmark.kb is a cached_property)
    times, correct = [], 0
    for q in load_kqapro_questions(folder / "val.json", "val"):
        start = time.perf_counter()
        with contextlib.suppress(Exception):  # a failure is counted as wrong by the scoring below
            executor.run(q.program)
        times.append(time.perf_counter() - start)
        correct += bool(score_generation(to_text(q.program, "dag"), q, bench, executor)["correct"])
    ms = np.array(times) * 1e3
    return {"n": len(times), "hits_at_1": correct / max(1, len(times)), "mean_ms": float(ms.mean()),
            "p95_ms": float(np.percentile(ms, 95)), "max_ms": float(ms.max()), "first_ms": float(ms[0]),
            "seconds": float(ms.sum() / 1e3)}


def _linking_stages(stage, kb, folder: Path) -> None:
    """Linking (``cbr2.retrieval.linking``): build, then every question, scored against the gold Find
    arguments and literal values."""
    from cbr2.data.questions import load_kqapro_questions
    from cbr2.retrieval.linking import Linker
    from cbr2.retrieval.metrics import linking_metrics

    questions = load_kqapro_questions(folder / "val.json", "val")
    with stage("linking build (n-gram table)") as row:
        linker = Linker(kb)
        row["n"] = len(linker.entities)
    with stage("linking, every question") as row:
        start = time.perf_counter()
        links = [linker.link(q.question) for q in questions]
        row["linking_ms"] = 1e3 * (time.perf_counter() - start) / max(1, len(questions))
        scores = linking_metrics([q.program for q in questions],
                                 [{"entities": lk.entities, "values": lk.all_values()} for lk in links])
        row["linking"] = {g: (round(m["precision"], 3), round(m["recall"], 3)) for g, m in scores.items()}
        row["questions"] = len(questions)
    with stage("masking, every question (retrieval.mask_mentions)") as row:
        start = time.perf_counter()
        for q in questions:
            linker.mask(q.question)
        row["masking_ms"] = 1e3 * (time.perf_counter() - start) / max(1, len(questions))
        row["questions"] = len(questions)
    _narrowing_stages(stage, kb, questions, links)


def _narrowing_stages(stage, kb, questions, links) -> None:
    """``generation.narrow`` (``cbr2.generation.grounded.Reach``): the index of entity names, then
    every question's candidates at the questions' own H (their programs stand in for a training
    pool: the synthetic questions come from one generator) and at each H up to 3, the worst case.
    Coverage is the share of gold ``Relate`` pairs and concepts that lie in the question's reach."""
    from cbr2.generation.grounded import RELATE, Reach, pool_hops

    with stage("narrowing build (Reach)") as row:
        reach = Reach(kb, 1)
        row["n"] = len(kb.entities)
        row["note"] = "entities indexed by name"
    own = pool_hops(q.program for q in questions)
    for hops in sorted({own, 1, 2, 3}):
        if hops < 1:
            continue
        reach.hops = hops
        with stage(f"narrowing, every question, H={hops}" + (" (the questions' own)" if hops == own else "")) as row:
            start, sizes, empty = time.perf_counter(), {RELATE: [], "concept": []}, 0
            times, covered, gold = [], {RELATE: 0, "concept": 0}, {RELATE: 0, "concept": 0}
            for q, lk in zip(questions, links):
                t0 = time.perf_counter()
                found = reach.candidates(lk)
                times.append(1e3 * (time.perf_counter() - t0))
                empty += not found
                for kind, counts in sizes.items():
                    counts.append(len(found.get(kind, ())))
                for step in q.program.steps:
                    if step.function == "Relate" and len(step.inputs) == 2:
                        item, kind = " | ".join(step.inputs), RELATE
                    elif step.function == "FilterConcept" and step.inputs:
                        item, kind = step.inputs[0], "concept"
                    else:
                        continue
                    gold[kind] += 1
                    # A kind left out (its reach is the whole KB) covers every gold item.
                    covered[kind] += kind not in found or item in found[kind]
            times.sort()
            row["reach_ms"] = 1e3 * (time.perf_counter() - start) / max(1, len(questions))
            row["reach_p95_ms"] = times[int(0.95 * (len(times) - 1))] if times else 0.0
            row["reach_max_ms"] = times[-1] if times else 0.0
            row["questions"] = len(questions)
            row["without_candidates"] = empty
            row["mean_size"] = {k: sum(v) / max(1, len(v)) for k, v in sizes.items()}
            row["coverage"] = {k: (covered[k], gold[k]) for k in gold}


def _executor_stages(stage, kb, folder: Path, state: dict) -> None:
    from cbr2.data.builders.synthetic_kqapro import make_executor

    for engine in ("cbr2", "kopl"):
        with stage(f"executor init ({engine})") as row:
            executor = make_executor(kb, engine, timeout_s=None)
            row["engine"] = getattr(executor, "engine_name", "default (no engine choice)")
        if "error" in row:
            continue
        with stage(f"execution per question ({engine})") as row:
            row.update(_timed_programs(executor, kb, folder))
        state[f"execute_{engine}"] = row
        del executor


def _perturbed(centres, n: int, rng, sigma: tuple[float, float] = (0.35, 0.85)):
    """``n`` unit vectors, each a random centre plus isotropic noise whose norm is drawn from ``sigma``.

    A centre is a real embedding; the noise norm varies per vector (cosine to the centre 0.76-0.94),
    so a cluster's members lie at different distances from a query, as real neighbours do.
    """
    import numpy as np

    dim = centres.shape[1]
    out = np.empty((n, dim), dtype=np.float32)
    step = 65536
    for start in range(0, n, step):
        rows = min(step, n - start)
        block = centres[rng.integers(len(centres), size=rows)]
        scale = rng.uniform(*sigma, size=(rows, 1)).astype(np.float32) / math.sqrt(dim)
        block = block + rng.standard_normal((rows, dim), dtype=np.float32) * scale
        out[start: start + rows] = block / np.linalg.norm(block, axis=1, keepdims=True)
    return out


def _random_unit(n: int, dim: int, rng):
    import numpy as np

    out = rng.standard_normal((n, dim), dtype=np.float32)
    out /= np.linalg.norm(out, axis=1, keepdims=True)
    return out


def _encoder_stages(stage, state: dict, folder: Path, stages: list[str], sample: int, vectors: str, seed: int,
                    kb) -> None:
    import numpy as np
    import torch

    from cbr2.config import load_config
    from cbr2.data.questions import load_kqapro_questions
    from cbr2.retrieval.encoders import encode, load_encoder

    cfg = load_config([])
    rc = cfg.retrieval
    rng = np.random.default_rng(seed)
    with stage("encoder load") as row:
        model = load_encoder(rc.encoder, "cpu")
        row.update(encoder=rc.encoder, torch_threads=torch.get_num_threads())
    facts, ontology = state["facts"], state["ontology"]
    fact_sample = [facts[i] for i in rng.choice(len(facts), size=min(sample, len(facts)), replace=False)]
    onto_sample = [ontology[i] for i in rng.choice(len(ontology), size=min(sample // 2, len(ontology)), replace=False)]
    throughput = {}
    if "encode" in stages or "index" in stages:
        for label, texts, total in (("fact", fact_sample, len(facts)), ("ontology", onto_sample, len(ontology))):
            with stage(f"encoding {label} triples (sample)") as row:
                # The first pass over new sequence lengths builds the CPU kernels for them (3-6x
                # slower than later passes), a cost a long encoding pays once: it is timed apart.
                start = time.perf_counter()
                encode(model, texts, rc.batch_size, progress=False)
                row["warmup_seconds"] = time.perf_counter() - start
                # Then in four slices: other jobs on the machine slow some of them; the fastest says
                # what the encoder does on the cores it has, and the projection uses it.
                parts, rates, start = [], [], time.perf_counter()
                for piece in np.array_split(np.arange(len(texts)), 4):
                    t0 = time.perf_counter()
                    parts.append(encode(model, [texts[i] for i in piece], rc.batch_size, progress=False))
                    rates.append(len(piece) / max(time.perf_counter() - t0, 1e-9))
                emb = np.concatenate(parts)
                row["seconds"] = time.perf_counter() - start
            rate = max(rates)
            row.update(sample=len(texts), per_second=rate, overall_per_second=len(texts) / row["seconds"],
                       total=total, projected_seconds=total / rate, batch_size=rc.batch_size)
            throughput[label] = row
            state[f"{label}_sample_emb"] = emb
    questions = load_kqapro_questions(folder / "val.json", "val")
    if "index" in stages:
        _index_stages(stage, state, questions, model, vectors, rng, len(fact_sample), folder, rc)
    if "canonicalizer" in stages:
        from cbr2.data.benchmarks import Benchmark
        from cbr2.generation.canonicalize import build_canonicalizer
        from cbr2.kopl.grounding import SLOT_KINDS, slot_items

        bench = Benchmark("kqapro", folder)
        bench.__dict__["kb"] = kb
        with tempfile.TemporaryDirectory() as cache, stage("canonicaliser build (cold cache)") as row:
            build_canonicalizer(cfg.retrieval, cfg.generation.canonicalize_threshold, bench, cache)
            row["items"] = sum(len(slot_items(kb.vocabulary, k)) for k in SLOT_KINDS)


def _median_ms(fn, n: int) -> float:
    import numpy as np

    times = []
    for i in range(n):
        start = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def _recall(ids, exact) -> float:
    import numpy as np

    return float(np.mean([len(set(a) & set(e)) / len(e) for a, e in zip(ids, exact, strict=True)]))


SWEEP = {"hnsw": ("efSearch", (32, 64, 128, 256, 512)), "ivf": ("nprobe", (8, 16, 32, 64, 128, 256))}


def _index_stages(stage, state: dict, questions, model, vectors: str, rng, n_sample: int, folder: Path, rc) -> None:
    """Index build and search over as many vectors as fact triples; cache write and hit; retrieval."""
    import faiss
    import numpy as np

    from cbr2.retrieval.cache import EmbeddingStore
    from cbr2.retrieval.encoders import encode, weights_fingerprint
    from cbr2.retrieval.index import build_index, search

    facts, ontology = state["facts"], state["ontology"]
    query_emb = []
    encode_ms = _median_ms(lambda i: query_emb.append(encode(model, [questions[i].question], 1, progress=False)[0]),
                           len(questions))
    queries = np.ascontiguousarray(np.stack(query_emb), dtype=np.float32)
    n, dim = len(facts), queries.shape[1]
    with stage("index vectors") as row:
        if vectors == "real":
            # Every triple really encoded, through the project's cache in the scale's folder
            # (resumable: a killed run continues where it stopped; a later run loads it).
            store = EmbeddingStore(folder / "embeddings")
            fingerprint = weights_fingerprint(model)
            got = {}
            for label in ("facts", "ontology"):
                got[label], _ = store.get(label, state[label], rc.encoder, fingerprint,
                                          lambda t: encode(model, t, rc.batch_size, progress=False), "flat")
            base, onto_vectors = got["facts"], got["ontology"]
            row["note"] = (f"{n:,} real embeddings of every fact triple ({rc.encoder}, cached in {folder / 'embeddings'}); "
                           f"queries: the {len(questions)} questions' real embeddings")
        elif vectors == "random":
            base = _random_unit(n, dim, rng)
            onto_vectors = _random_unit(len(ontology), dim, rng)
            row["note"] = f"{n:,} uniform random unit vectors of dimension {dim} (not embeddings)"
        else:
            base = _perturbed(state["fact_sample_emb"], n, rng)
            onto_vectors = _perturbed(state["ontology_sample_emb"], len(ontology), rng)
            row["note"] = (f"{n:,} vectors of dimension {dim}: real embeddings of {n_sample:,} sampled fact triples "
                           f"plus Gaussian noise (cosine 0.76-0.94), renormalised; queries: the {len(questions)} "
                           "questions' real embeddings")
        row["n"], row["dim"] = n, dim
    # The embedding cache's cost: writing an entry in resumable parts, and a later run's hit.
    with tempfile.TemporaryDirectory() as cache:
        store = EmbeddingStore(cache)
        for label, texts, vecs in (("facts", facts, base), ("ontology", ontology, onto_vectors)):
            position = [0]

            def embed(chunk, vecs=vecs, position=position):
                start = position[0]
                position[0] += len(chunk)
                return vecs[start: start + len(chunk)]

            with stage(f"embedding cache write ({label}, flat)") as row:
                store.get(label, texts, "synthetic", "vectors", embed, "flat")
                row["note"] = f"{len(texts):,} vectors in parts of {store.chunk_size:,} (no encoding)"
            with stage(f"embedding cache hit ({label}, flat)") as row:
                store.get(label, texts, "synthetic", "vectors", embed, "flat")
                row["note"] = "content hash, checksum, load, flat index"
    onto_index = build_index(onto_vectors, "flat")
    onto_ms = _median_ms(lambda i: search(onto_index, queries[i: i + 1], 10), len(queries))
    exact = None
    for kind in INDEX_KINDS:
        with stage(f"index build ({kind})") as row:
            index = build_index(base, kind)
        row["kind"] = kind
        row["memory_mb"] = faiss.serialize_index(index).nbytes / 2**20
        start = time.perf_counter()
        _, ids = search(index, queries, 10)  # the retriever searches a batch of questions at once
        row["batch_ms_per_query"] = 1e3 * (time.perf_counter() - start) / len(queries)
        row["ms_per_query"] = _median_ms(lambda i, index=index: search(index, queries[i: i + 1], 10), len(queries))
        exact = ids if exact is None else exact
        row["recall_at_10"] = _recall(ids, exact)
        row["retrieval_ms_per_question"] = encode_ms + onto_ms + row["ms_per_query"]
        row["retrieval_parts_ms"] = {"encode question": encode_ms, "ontology search (flat)": onto_ms,
                                     f"facts search ({kind})": row["ms_per_query"]}
        if kind in SWEEP:
            param, values = SWEEP[kind]
            holder = index.hnsw if kind == "hnsw" else index
            default = getattr(holder, param)
            row["sweep"] = []
            for value in sorted({*values, default}):
                setattr(holder, param, value)
                _, got = search(index, queries, 10)
                row["sweep"].append({param: value, "recall_at_10": _recall(got, exact),
                                     "ms_per_query": _median_ms(lambda i, index=index: search(index, queries[i: i + 1], 10),
                                                                len(queries))})
            setattr(holder, param, default)
            row["sweep_param"], row["sweep_default"] = param, default
        del index


def _grammar_stages(stage, kb) -> None:
    from cbr2.generation.grammar import Bounds, ProgramGrammar
    from cbr2.llm.xgrammar_masks import compiled

    with stage("grammar build (EBNF)") as row:
        grammar = ProgramGrammar(kb.vocabulary, "dag", Bounds())
        grammar._xgr_grammar()
        row.update(ebnf_mb=len(grammar.ebnf) / 1e6, rules=len(grammar._r.rules))
    try:
        from cbr2.config import load_config
        from cbr2.llm.hf import HFBackend

        tokenizer = HFBackend(load_config([]).llm).tokenizer()
    except Exception as err:  # noqa: BLE001 - no packaged model here: the slot says so
        with stage("grammar compile (xgrammar, cold)") as row:
            row["seconds"] = None
            row["note"] = f"n/a: no tokenizer ({type(err).__name__}: {err})"[:200]
        return
    with tempfile.TemporaryDirectory() as cache, stage("grammar compile (xgrammar, cold)") as row:
        compiled(grammar.ebnf, tokenizer, cache_dir=cache)
        row["tokenizer_tokens"] = len(tokenizer)


# --------------------------------------------------------------------------- driver and tables

def _fmt_s(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x:.3f}" if x < 1 else f"{x:.1f}" if x < 100 else f"{x:.0f}"


def _note(row: dict) -> str:
    parts = []
    if "error" in row:
        parts.append(f"**failed**: {row['error']}")
    if "n" in row and "hits_at_1" not in row:
        parts.append(f"{row['n']:,}" + (f" ({row['n_unbounded']:,} without the per-concept bound)"
                                          if "n_unbounded" in row else ""))
    if "mb" in row:
        parts.append(f"{row['mb']:.1f} MB")
    if "hits_at_1" in row:
        parts.append(f"{row['n']} questions, mean {row['mean_ms']:.1f} ms, p95 {row['p95_ms']:.1f} ms, "
                     f"max {row['max_ms']:.0f} ms; gold Hits@1 {row['hits_at_1']:.3f}")
    if "per_second" in row:
        parts.append(f"{row['per_second']:.0f}/s (fastest quarter; {row['overall_per_second']:.0f}/s overall; first "
                     f"pass {row['warmup_seconds']:.0f} s) on {row['sample']:,}; all {row['total']:,}: "
                     f"~{row['projected_seconds'] / 60:.1f} min projected")
    if "recall_at_10" in row:
        parts.append(f"{row['memory_mb']:.0f} MB, recall@10 {row['recall_at_10']:.3f}, "
                     f"{row['ms_per_query']:.2f} ms/query")
    if "items" in row:
        parts.append(f"{row['items']:,} vocabulary items embedded")
    if "ebnf_mb" in row:
        parts.append(f"{row['ebnf_mb']:.2f} MB of EBNF, {row['rules']} rules")
    if "torch_threads" in row:
        parts.append(f"{row['encoder']}, {row['torch_threads']} torch threads")
    if "linking_ms" in row:
        parts.append(f"{row['questions']} questions, {row['linking_ms']:.2f} ms per question; precision / recall: "
                     + ", ".join(f"{g} {p:.3f} / {r:.3f}" for g, (p, r) in row["linking"].items()))
    if "reach_ms" in row:
        parts.append(f"{row['questions']} questions, mean {row['reach_ms']:.1f} ms, p95 {row['reach_p95_ms']:.1f} ms, "
                     f"max {row['reach_max_ms']:.0f} ms; mean in reach: "
                     + ", ".join(f"{k} {v:.1f}" for k, v in row["mean_size"].items())
                     + "; gold in reach: " + ", ".join(f"{k} {c}/{n}" for k, (c, n) in row["coverage"].items())
                     + f"; {row['without_candidates']} without candidates")
    if "masking_ms" in row:
        parts.append(f"{row['questions']} questions, {row['masking_ms']:.2f} ms per question")
    if "tokenizer_tokens" in row:
        parts.append(f"tokenizer of {row['tokenizer_tokens']:,} tokens")
    if "per_category" in row:
        parts.append(", ".join(f"{k} {v}" for k, v in row["per_category"].items()))
    if "note" in row and "error" not in row:
        parts.append(row["note"])
    if "engine" in row and row["engine"] not in ("cbr2", "kopl"):
        parts.append(f"engine: {row['engine']}")
    return "; ".join(parts)


def first_answer(rows: list[dict]) -> dict[str, float] | None:
    """Seconds a fresh process spends before its first answer, from the measured rows (flat index).

    Warm: the embedding cache holds the triples' entries (a hit each). Cold: every triple is
    encoded (the projected time) and written to the cache.
    """
    by = {r["stage"]: r for r in rows}
    common = ["KB parse (load_kqapro_kb)", "fact triples", "ontology triples", "executor init (cbr2)", "encoder load"]
    warm = ["embedding cache hit (facts, flat)", "embedding cache hit (ontology, flat)"]
    cold = ["embedding cache write (facts, flat)", "embedding cache write (ontology, flat)"]
    need = [*common, *warm, *cold, "encoding fact triples (sample)", "encoding ontology triples (sample)",
            "index build (flat)", "execution per question (cbr2)"]
    if not all(n in by and by[n].get("seconds") is not None and "error" not in by[n] for n in need):
        return None
    base = sum(by[n]["seconds"] for n in common)
    one = by["index build (flat)"]["retrieval_ms_per_question"] / 1e3 + by["execution per question (cbr2)"]["first_ms"] / 1e3
    encoding = sum(by[f"encoding {k} triples (sample)"]["projected_seconds"] for k in ("fact", "ontology")) + \
        by["encoding fact triples (sample)"].get("warmup_seconds", 0.0)  # the kernels' first build, once
    out = {"warm_cache_s": base + sum(by[n]["seconds"] for n in warm) + one,
           "cold_cache_s": base + encoding + sum(by[n]["seconds"] for n in cold) + one}
    stored = ["kb store load (later loads)", "executor init (cbr2, stored KB)", "fact + ontology triples (stored KB)",
              "encoder load"]
    if all(n in by and by[n].get("seconds") is not None and "error" not in by[n] for n in stored):
        out["warm_store_s"] = sum(by[n]["seconds"] for n in stored) + sum(by[n]["seconds"] for n in warm) + one
    return out


def scale_table(scale: float, gen: dict, prof: list[dict]) -> str:
    lines = [f"### scale {scale:g}", "", "| stage | seconds | peak RSS GB | RSS after GB | notes |", "|---|---:|---:|---:|---|"]
    for row in [*gen.get("stages", []), *prof]:
        lines.append(f"| {row['stage']} | {_fmt_s(row.get('seconds'))} | {row.get('peak_rss_gb', 0):.2f} | "
                     f"{row.get('rss_after_gb', 0):.2f} | {_note(row)} |")
    fa = first_answer(prof)
    if fa:
        store = (f"; warm caches and the KB store: {_fmt_s(fa['warm_store_s'])} s" if "warm_store_s" in fa else "")
        lines.append(f"| time to first answer (derived) | {_fmt_s(fa['warm_cache_s'])} | | | warm embedding cache; "
                     f"cold cache (encode and store every triple): {_fmt_s(fa['cold_cache_s'])} s{store} |")
    loads = [r["load_1m"] for r in [*gen.get("stages", []), *prof] if "load_1m" in r]
    if loads:
        lines += ["", (f"1-minute load average at the end of the stages: {min(loads):.1f}-{max(loads):.1f} "
                       f"on {len(os.sched_getaffinity(0))} CPUs.")]
    index_rows = [r for r in prof if "recall_at_10" in r]
    if index_rows:
        lines += ["", ("| index | build s | memory MB | recall@10 vs flat | ms / query | ms / query (batch) | "
                       "retrieval ms / question |"), "|---|---:|---:|---:|---:|---:|---:|"]
        for r in index_rows:
            lines.append(f"| {r['kind']} | {_fmt_s(r['seconds'])} | {r['memory_mb']:.0f} | {r['recall_at_10']:.3f} | "
                         f"{r['ms_per_query']:.2f} | {r['batch_ms_per_query']:.2f} | {r['retrieval_ms_per_question']:.1f} |")
        for r in index_rows:
            if "sweep" in r:
                param = r["sweep_param"]
                lines += ["", f"{r['kind']} `{param}` (default {r['sweep_default']}): " + ", ".join(
                    f"{x[param]}: recall {x['recall_at_10']:.3f} at {x['ms_per_query']:.2f} ms" for x in r["sweep"])]
        vec = next((r for r in prof if r["stage"] == "index vectors"), None)
        if vec:
            lines += ["", (f"Index vectors: {vec['note']}. ms / query: median of single-question searches; "
                           "batch: all questions in one call. Retrieval per question: encode it (median), search "
                           "the ontology (flat) and the facts.")]
    return "\n".join(lines)


def growth_table(results: dict[float, dict]) -> str:
    scales = sorted(results)
    order: list[str] = []
    for s in scales:
        for r in [*results[s]["generate"].get("stages", []), *results[s]["profile"]]:
            if r["stage"] not in order:
                order.append(r["stage"])
    head = " | ".join(f"{s:g}" for s in scales)
    lines = [f"| stage (seconds / peak RSS GB) | {head} | growth {scales[-1] / scales[0]:g}x data |",
             "|---|" + "---:|" * len(scales) + "---:|"]
    for name in order:
        cells, values = [], []
        for s in scales:
            row = next((r for r in [*results[s]["generate"].get("stages", []), *results[s]["profile"]]
                        if r["stage"] == name), None)
            if row is None or row.get("seconds") is None:
                cells.append("-")
                values.append(None)
                continue
            seconds = row["projected_seconds"] if "projected_seconds" in row else row["seconds"]
            cells.append(f"{_fmt_s(seconds)} / {row.get('peak_rss_gb', 0):.2f}")
            values.append(seconds)
        growth = f"{values[-1] / values[0]:.1f}x" if values[0] and values[-1] else "-"
        label = name.replace("(sample)", "(all, projected)")
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {growth} |")
    fas = [first_answer(results[s]["profile"]) for s in scales]
    if all(fas):
        lines.append("| time to first answer, warm / cold cache (derived) | "
                     + " | ".join(f"{_fmt_s(f['warm_cache_s'])} / {_fmt_s(f['cold_cache_s'])}" for f in fas)
                     + f" | {fas[-1]['cold_cache_s'] / fas[0]['cold_cache_s']:.1f}x |")
        if all("warm_store_s" in f for f in fas):
            lines.append("| time to first answer, warm caches and the KB store (derived) | "
                         + " | ".join(_fmt_s(f["warm_store_s"]) for f in fas)
                         + f" | {fas[-1]['warm_store_s'] / fas[0]['warm_store_s']:.1f}x |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scales", type=float, nargs="+", default=list(DEFAULT_SCALES))
    parser.add_argument("--out", type=Path, default=Path("outputs/scale"))
    parser.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated, of {', '.join(STAGES)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--per-category", type=int, default=None, help="questions per category (default 40)")
    parser.add_argument("--sample", type=int, default=2000, help="fact triples encoded to measure throughput")
    parser.add_argument("--vectors", choices=("perturbed", "random", "real"), default="perturbed",
                        help="index vectors: perturbed real embeddings, random unit vectors, or every triple encoded")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch and FAISS threads in the profile (default: all CPUs)")
    parser.add_argument("--regenerate", action="store_true", help="generate KB and questions even when reusable")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per child process")
    parser.add_argument("--worker", choices=("generate", "profile"), help=argparse.SUPPRESS)
    parser.add_argument("--scale", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    from cbr2.data.builders.synthetic_kqapro import QUESTIONS_PER_CATEGORY

    per_category = args.per_category or QUESTIONS_PER_CATEGORY
    stages = [s for s in args.stages.split(",") if s]
    unknown = sorted(set(stages) - set(STAGES))
    if unknown:
        parser.error(f"unknown stage(s) {', '.join(unknown)}; choose from {', '.join(STAGES)}")
    if args.worker == "generate":
        generate_worker(args.scale, args.seed, per_category, args.out)
        return
    if args.worker == "profile":
        if args.threads:
            import faiss
            import torch

            torch.set_num_threads(args.threads)
            faiss.omp_set_num_threads(args.threads)
        profile_worker(args.out, stages, args.sample, args.vectors, args.seed)
        return

    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[float, dict] = {}
    results_file = args.out / "results.json"
    previous = json.loads(results_file.read_text()) if results_file.exists() else {}
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    print(f"{len(os.sched_getaffinity(0))} CPUs; scales {', '.join(f'{s:g}' for s in args.scales)}; "
          f"stages {', '.join(stages)}", flush=True)
    for scale in args.scales:
        folder = args.out / f"scale-{scale:g}"
        key = _generation_key(scale, args.seed, per_category)
        gen_file = folder / "generate.json"
        reuse = (not args.regenerate and gen_file.exists() and (folder / "kb.json").exists()
                 and (folder / "val.json").exists()
                 and {k: v for k, v in json.loads(gen_file.read_text()).items() if k in key} == key)
        common = [sys.executable, __file__, "--out", str(folder), "--seed", str(args.seed)]
        if not reuse:
            print(f"scale {scale:g}: generating", flush=True)
            subprocess.run([*common, "--worker", "generate", "--scale", str(scale), "--per-category",
                            str(per_category)], check=True, timeout=args.timeout, env=env)
        else:
            print(f"scale {scale:g}: reusing {folder}", flush=True)
        print(f"scale {scale:g}: profiling", flush=True)
        (folder / "profile.json").unlink(missing_ok=True)
        threads = ["--threads", str(args.threads)] if args.threads else []
        code = subprocess.run([*common, "--worker", "profile", "--stages", ",".join(stages), "--sample",
                               str(args.sample), "--vectors", args.vectors, *threads], check=False,
                              timeout=args.timeout, env=env).returncode
        prof = json.loads((folder / "profile.json").read_text()) if (folder / "profile.json").exists() else []
        if code != 0:
            prof.append({"stage": "(profile process)", "seconds": None, "error": f"exited with {code}"})
        results[scale] = {"generate": json.loads(gen_file.read_text()), "profile": prof}
        print("\n" + scale_table(scale, results[scale]["generate"], prof) + "\n", flush=True)
        previous[f"{scale:g}"] = results[scale]
        results_file.write_text(json.dumps(previous, indent=1, default=str))
    command = " ".join(["python benchmarks/scale.py", *sys.argv[1:]])
    report = [f"`{command}` · {len(os.sched_getaffinity(0))} CPUs · stages {', '.join(stages)}", ""]
    report += [scale_table(s, results[s]["generate"], results[s]["profile"]) + "\n" for s in sorted(results)]
    if len(results) > 1:
        growth = growth_table(results)
        print(growth)
        report += ["### growth", "", growth]
    (args.out / "report.md").write_text("\n".join(report) + "\n")
    print(f"\nwrote {args.out / 'report.md'} and {results_file}")


if __name__ == "__main__":
    main()
