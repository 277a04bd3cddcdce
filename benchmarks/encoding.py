"""Encoding speed of the encoder backends against today's torch path, and how alike their searches are.

    python benchmarks/encoding.py --n 100000                         # full-size synthetic KQA Pro
    python benchmarks/encoding.py --n 2000 --scale 0.05              # a quick check
    python benchmarks/encoding.py --n 20000 --backends onnx onnx-int8 --structural checkpoints/NAME

On the synthetic KQA Pro of ``cbr2.data.builders.synthetic_kqapro`` at ``--scale`` (1: ~650k fact
triples), draws ``--n`` fact texts and ``--n`` question texts (seeded) and, in this one process,
encodes both with each encoder:

* ``torch``: today's path, the sentence-transformers model's own ``encode`` (no deduplication);
* each of ``--backends`` through ``cbr2.retrieval.encoders.encode`` (identical texts once, then
  the backend's forward pass); the ONNX export is built before the clock starts.

Prints texts per second for each, the speed ratio to torch, and the mean top-10 overlap
(``|A ∩ B| / 10``) of exact FAISS searches by the same question embeddings: facts searched by
questions (knowledge retrieval) and questions by questions (case retrieval). With
``--structural``, the same for a trained structural retriever's questions. Also prints how many
of the KB's fact texts and the questions repeat (what deduplication saves), and the ceiling of
any float32 backend: the floating-point operations of torch's forward passes (from the padded
batches sentence-transformers builds) per second of its encoding, against what this machine's
float32 matrix products reach at the encoder's own shapes, timed in the same process. Timings are only
meaningful on otherwise idle cores; ``--threads`` sets torch's and ONNX Runtime's threads. Run it
from the checkout's root with ``PYTHONPATH=.`` when another checkout is installed editable.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Sequence

import numpy as np

from cbr2.retrieval.encoders import BACKENDS, encode, load_encoder, unique_texts
from cbr2.retrieval.index import build_index, search

ENCODER = "sentence-transformers/all-MiniLM-L6-v2"
K = 10


def texts_of_synthetic_kqapro(scale: float, n: int, seed: int) -> tuple[list[str], list[str], dict[str, int]]:
    """``n`` fact texts and ``n`` question texts of the synthetic KQA Pro, and repeat counts."""
    from cbr2.data.builders import synthetic_kqapro as syn
    from cbr2.data.kb_loaders import kqapro_kb_from_dict
    from cbr2.kb.triples import fact_triples

    kb_dict = syn.build_kb(scale, seed)
    facts = [t.text for t in fact_triples(kqapro_kb_from_dict(kb_dict, "synthetic"))]
    per_category = max(1, -(-n // 9))
    questions = [q["question"] for q in syn.build_questions(kb_dict, seed, per_category, engine="cbr2")]
    rng = random.Random(seed)
    stats = {"kb_facts": len(facts), "kb_distinct_facts": len(set(facts)),
             "questions": len(questions), "distinct_questions": len(set(questions))}
    facts = rng.sample(facts, min(n, len(facts)))
    questions = rng.sample(questions, min(n, len(questions)))
    return facts, questions, stats


def overlap_at_k(a: np.ndarray, b: np.ndarray, k: int = K) -> float:
    """Mean share of each row's top-``k`` ids that both result lists hold."""
    return float(np.mean([len(set(x) & set(y)) / k for x, y in zip(a, b, strict=True)]))


def top_ids(base: np.ndarray, queries: np.ndarray, k: int = K) -> np.ndarray:
    """Exact inner-product top-``k`` ids of ``queries`` among ``base``."""
    _, ids = search(build_index(base, "flat"), queries, k)
    return ids


def _timed_encode(fn, texts: Sequence[str]) -> tuple[np.ndarray, float]:
    start = time.perf_counter()
    out = fn(texts)
    return np.asarray(out, dtype=np.float32), time.perf_counter() - start


def compare(name: str, facts: list[str], questions: list[str], backends: Sequence[str], batch_size: int,
            cache_dir: str | None) -> list[dict]:
    """One row per encoder (torch first) for the encoder ``name``."""
    torch_model = load_encoder(name, "cpu", "torch")

    def today(texts):
        return torch_model.encode(list(texts), batch_size=batch_size, normalize_embeddings=True,
                                  convert_to_numpy=True, show_progress_bar=False)

    runs = {"torch": today}
    for backend in backends:
        model = load_encoder(name, "cpu", backend, cache_dir)  # exports now, before any clock
        runs[backend] = lambda texts, m=model: encode(m, texts, batch_size)
    rows, ref = [], {}
    work = forward_flops(torch_model, [*facts, *questions], batch_size)
    for backend, fn in runs.items():
        fn(facts[:batch_size])  # warm-up: first-call allocations are not encoding speed
        emb_f, t_f = _timed_encode(fn, facts) if facts else (np.zeros((0, 1), np.float32), 0.0)
        emb_q, t_q = _timed_encode(fn, questions)
        row = {"encoder": name, "backend": backend, "facts_per_s": len(facts) / t_f if t_f else None,
               "questions_per_s": len(questions) / t_q, "seconds": t_f + t_q}
        ids = {"facts": top_ids(emb_f, emb_q) if facts else None, "cases": top_ids(emb_q, emb_q)}
        if backend == "torch":
            ref = ids
            row["gflop_per_s"] = work / row["seconds"] / 1e9
            row["gemm_gflop_per_s"] = gemm_flops_per_s(torch_model) / 1e9
        else:
            row["speedup"] = rows[0]["seconds"] / row["seconds"]
            row["overlap_facts"] = overlap_at_k(ref["facts"], ids["facts"]) if facts else None
            row["overlap_cases"] = overlap_at_k(ref["cases"], ids["cases"])
        rows.append(row)
    return rows


def forward_flops(model, texts: Sequence[str], batch_size: int) -> float:
    """Floating-point operations of a BERT-style encoder's forward passes over ``texts`` as
    sentence-transformers batches them (sorted by length, each batch padded to its longest).

    Per layer and sequence of ``L`` tokens at width ``d``: ``24 L d^2`` in the projections and
    the feed-forward (with the usual 4d inner width) and ``4 L^2 d`` in attention.
    """
    config = model[0].auto_model.config
    d, layers, inner = config.hidden_size, config.num_hidden_layers, config.intermediate_size
    ordered = sorted(texts, key=len, reverse=True)
    tokenize = getattr(model, "preprocess", None) or model.tokenize  # renamed in sentence-transformers 6
    total = 0.0
    for i in range(0, len(ordered), batch_size):
        batch = ordered[i:i + batch_size]
        length = tokenize(batch)["attention_mask"].shape[1]
        per_layer = 2 * length * (4 * d * d + 2 * d * inner) + 4 * length * length * d
        total += len(batch) * layers * per_layer
    return total


def gemm_flops_per_s(model, seconds: float = 3.0) -> float:
    """float32 matrix-product throughput at the encoder's feed-forward shape (64 texts x 32 tokens
    by ``d`` by the inner width), the best of three timed stretches."""
    import torch

    config = model[0].auto_model.config
    a = torch.randn(64 * 32, config.hidden_size)
    b = torch.randn(config.hidden_size, config.intermediate_size)
    flops = 2 * a.shape[0] * a.shape[1] * b.shape[1]
    best = 0.0
    for _ in range(3):
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds / 3:
            torch.mm(a, b)
            n += 1
        best = max(best, n * flops / (time.perf_counter() - start))
    return best


def _fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=20000, help="fact texts and question texts encoded (each)")
    parser.add_argument("--scale", type=float, default=1.0, help="synthetic KQA Pro size (1: ~650k fact triples)")
    parser.add_argument("--backends", nargs="+", default=["onnx", "onnx-int8"],
                        choices=[b for b in BACKENDS if b not in ("auto", "torch")])
    parser.add_argument("--structural", help="a trained structural retriever folder: its question view too")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, help="torch and ONNX Runtime threads (default: torch's)")
    parser.add_argument("--cache-dir", help="where the ONNX exports go (default: the project's cache root)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    facts, questions, stats = texts_of_synthetic_kqapro(args.scale, args.n, args.seed)
    print(f"synthetic KQA Pro at scale {args.scale} (built in {time.perf_counter() - start:.0f} s): "
          f"{stats['kb_facts']:,} fact texts, {stats['kb_distinct_facts']:,} distinct "
          f"({1 - stats['kb_distinct_facts'] / max(1, stats['kb_facts']):.1%} repeats); "
          f"{stats['questions']:,} questions, {stats['distinct_questions']:,} distinct")
    print(f"sample: {len(facts):,} facts ({len(unique_texts(facts)[0]):,} distinct), {len(questions):,} questions "
          f"({len(unique_texts(questions)[0]):,} distinct); batch {args.batch_size}")
    rows = compare(ENCODER, facts, questions, args.backends, args.batch_size, args.cache_dir)
    if args.structural:
        rows += compare(args.structural, [], questions, args.backends, args.batch_size, args.cache_dir)
    print(f"\n{'encoder':42s} {'backend':10s} {'facts/s':>9s} {'questions/s':>12s} {'speedup':>8s} "
          f"{'top-10 overlap facts':>21s} {'cases':>6s}")
    for r in rows:
        print(f"{r['encoder'][-42:]:42s} {r['backend']:10s} {_fmt(r['facts_per_s'], '9.0f')} "
              f"{_fmt(r['questions_per_s'], '12.0f')} {_fmt(r.get('speedup'), '7.2f') + 'x':>8s} "
              f"{_fmt(r.get('overlap_facts'), '21.3f'):>21s} {_fmt(r.get('overlap_cases'), '6.3f'):>6s}")
    for r in rows:
        if "gflop_per_s" in r:
            print(f"\n{r['encoder']}: torch's forward passes ran at {r['gflop_per_s']:.1f} GFLOP/s; float32 matrix "
                  f"products at its shapes at {r['gemm_gflop_per_s']:.1f} GFLOP/s here: a float32 backend can be at "
                  f"most {r['gemm_gflop_per_s'] / r['gflop_per_s']:.2f}x faster than torch on this machine")


if __name__ == "__main__":
    main()
