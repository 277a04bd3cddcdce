"""Retrieval and structural-training speed, measured in one run on one machine.

    python benchmarks/retrieval.py                       # mini-kqapro, embedded default
    python benchmarks/retrieval.py --data kqapro --root /data/KQAPro --encoder BAAI/bge-m3

Prints:
* triple and pool encoding time (what the cache saves on a second run) and FAISS index build
  time for each index kind over the fact triples;
* retrieval time per question, excluding question encoding (FAISS searches of the ontology,
  facts, semantic and structural indexes only) and including it, in batches of 64 and one
  question at a time (the paper reports under 0.1 s per question);
* structural-retriever training throughput in question pairs per second (forward, backward
  and optimiser step of the Lightning module on batches from the pair DataModule).
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time

from cbr2.config import CONFIG_DIR, Config, TrainConfig, load_config
from cbr2.data.benchmarks import Benchmark
from cbr2.kb.triples import fact_triples
from cbr2.retrieval.cases import Query
from cbr2.retrieval.encoders import encode, load_encoder
from cbr2.retrieval.index import INDEX_KINDS, build_index, search
from cbr2.retrieval.retriever import Retriever
from cbr2.structural.on_demand import resolve_structural


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def retrieval_speed(args) -> None:
    overrides = [f"data.name={args.data}", f"retrieval.encoder={args.encoder}", f"retrieval.device={args.device}"]
    if args.root:
        overrides.append(f"data.root={args.root}")
    if args.structural:
        overrides.append(f"structural.checkpoint={args.structural}")
    cfg = load_config(overrides, files=[CONFIG_DIR / "evaluate.yaml"], schema=Config)
    bench = Benchmark.from_config(cfg.data)
    structural = resolve_structural(cfg.structural, cfg.data, bench)
    questions = bench.questions()[: args.questions]
    queries = [Query(q.qid, q.question) for q in questions]
    model = load_encoder(cfg.retrieval.encoder, cfg.retrieval.device)

    facts = [t.text for t in fact_triples(bench.kb)]
    emb, enc_s = _timed(lambda: encode(model, facts, cfg.retrieval.batch_size))
    print(f"{bench.name}: {len(facts)} fact triples encoded in {enc_s:.1f} s "
          f"({len(facts) / enc_s:.0f}/s, {cfg.retrieval.encoder})")
    for kind in INDEX_KINDS:
        _, build_s = _timed(lambda kind=kind: build_index(emb, kind))
        print(f"  index build {kind:5s} {1000 * build_s:8.1f} ms")

    with tempfile.TemporaryDirectory() as cache:
        retriever, cold_s = _timed(lambda: Retriever(bench, cfg.retrieval, structural, cache_dir=cache))
        _, warm_s = _timed(lambda: Retriever(bench, cfg.retrieval, structural, cache_dir=cache))
    print(f"  retriever setup (encode + index KB and pool): cold cache {cold_s:.1f} s, warm cache {warm_s:.2f} s")

    q_emb = {view: encode(m, [q.text for q in queries], cfg.retrieval.batch_size) for view, (_, m) in
             retriever.encoders.items()}

    def search_only():
        retriever.knowledge.retrieve(q_emb["semantic"])
        for view in ("semantic", "structural"):
            search(retriever.cases._indexes[view], q_emb[view], retriever._depth(view) + 1)

    best = {}
    for name, fn in (
        ("search only (no encoding)", search_only),
        ("with encoding, batches of 64", lambda: [retriever.retrieve(queries[i:i + 64])
                                                  for i in range(0, len(queries), 64)]),
        ("with encoding, one at a time", lambda: [retriever.retrieve([q]) for q in queries]),
    ):
        best[name] = min(_timed(fn)[1] for _ in range(args.repeat)) / len(queries)
    print(f"  retrieval per question over {len(queries)} questions "
          f"(K_o={cfg.retrieval.k_ontology}, K_f={cfg.retrieval.k_facts}, k_s={cfg.retrieval.k_semantic}, "
          f"k_r={cfg.retrieval.k_structural}; best of {args.repeat}):")
    for name, sec in best.items():
        print(f"    {name:30s} {1000 * sec:8.2f} ms")


def training_speed(args) -> None:
    import torch

    from cbr2.structural.data import PairDataModule
    from cbr2.structural.module import StructuralRetriever

    overrides = [f"data.name={args.data}"] + ([f"data.root={args.root}"] if args.root else [])
    cfg = load_config(overrides, files=[CONFIG_DIR / "train.yaml"], schema=TrainConfig)
    s = cfg.structural
    data = PairDataModule(cfg.data.name, cfg.data.root, label=s.label, label_bins=s.label_bins,
                          pairs_per_epoch=s.pairs_per_epoch, val_pairs=s.val_pairs, holdout=s.holdout,
                          batch_size=s.batch_size, seed=cfg.seed)
    data.setup("fit")
    module = StructuralRetriever(s.backbone, max_seq_length=s.max_seq_length, lr=s.lr, warmup_ratio=s.warmup_ratio)
    optimiser = torch.optim.AdamW(module.parameters(), lr=cfg.structural.lr)
    module.train()
    batches = iter(data.train_dataloader())

    def step() -> int:
        batch = next(batches)
        module.training_step(batch, 0).backward()  # training's own step, outside a Trainer (no logging)
        optimiser.step()
        optimiser.zero_grad()
        return len(batch[2])

    step()  # warm-up, not timed
    start = time.perf_counter()
    pairs = sum(step() for _ in range(args.train_steps))
    seconds = time.perf_counter() - start
    print(f"  structural training: {pairs / seconds:.1f} pairs/s ({args.train_steps} steps of "
          f"{cfg.structural.batch_size} pairs, max_seq_length {cfg.structural.max_seq_length}, "
          f"{torch.get_num_threads()} CPU threads, backbone {cfg.structural.backbone})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="mini-kqapro")
    parser.add_argument("--root", default=None)
    parser.add_argument("--encoder", default="sentence-transformers/all-MiniLM-L6-v2")
    parser.add_argument("--structural", default=None, help="structural retriever (default: as evaluate.py picks)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--questions", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--train-steps", type=int, default=10)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    retrieval_speed(args)
    training_speed(args)


if __name__ == "__main__":
    main()
