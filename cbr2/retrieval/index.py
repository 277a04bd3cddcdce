"""FAISS inner-product indexes over unit-length embeddings (inner product = cosine).

``flat`` is exact and the default; ``hnsw`` and ``ivf`` are approximate and meant for
KQA Pro-sized fact sets. When faiss-gpu is installed and a GPU is visible, ``flat`` and
``ivf`` indexes are moved to the GPUs (HNSW has no GPU version in FAISS and stays on CPU).
"""

from __future__ import annotations

import logging
import math

import faiss
import numpy as np

log = logging.getLogger(__name__)

INDEX_KINDS = ("flat", "hnsw", "ivf")

HNSW_NEIGHBOURS = 32
HNSW_EF_SEARCH = 256
"""Candidates an HNSW search keeps. On the real MiniLM embeddings of a KQA Pro-shaped KB's fact
triples, recall@10 against flat is 0.98 at 80,000 vectors and 0.92 at 326,000 (128: 0.96 and
0.89), at under a millisecond per query on 2 cores (``benchmarks/scale.py``, ``docs/results/scale.md``)."""
IVF_NPROBE = 16
"""Fewest inverted lists an IVF search visits."""
IVF_PROBE_DIVISOR = 10
"""An IVF search visits at least a tenth of its sqrt(n) lists, so recall holds as n grows: 0.94 at
80,000 and 0.95 at 326,000 real fact-triple embeddings, where a fixed 16 lists gave 0.92 and 0.88
(``benchmarks/scale.py``, ``docs/results/scale.md``)."""
QUERY_CHUNK = 16
"""Queries per FAISS call (below FAISS's BLAS threshold, see ``search``)."""


def gpu_available() -> bool:
    """Whether this FAISS build has GPU support and sees at least one GPU."""
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def build_index(embeddings: np.ndarray, kind: str = "flat") -> faiss.Index:
    """A CPU index over the rows of ``embeddings`` (float32, unit length).

    Args:
        embeddings: ``(n, dim)`` array.
        kind: One of ``INDEX_KINDS``.

    Raises:
        ValueError: On an unknown kind.
    """
    if kind not in INDEX_KINDS:
        raise ValueError(f"unknown retrieval.index {kind!r}; expected one of {', '.join(INDEX_KINDS)}")
    n, dim = embeddings.shape
    if kind == "flat" or n < 1000:
        # Approximate indexes only pay off (and IVF can only be trained) with enough vectors.
        index = faiss.IndexFlatIP(dim)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, HNSW_NEIGHBOURS, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efSearch = HNSW_EF_SEARCH
    else:
        # sqrt(n) lists, with the ~39 training points per centroid k-means needs.
        nlist = max(1, min(int(math.sqrt(n)), n // 39))
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, faiss.METRIC_INNER_PRODUCT)
        index.train(embeddings)
        index.nprobe = min(nlist, max(IVF_NPROBE, nlist // IVF_PROBE_DIVISOR))
    index.add(embeddings)
    return index


def to_device(index: faiss.Index, device: str) -> faiss.Index:
    """Move an index to all visible GPUs when ``device`` is not ``cpu`` and FAISS's GPU build sees them.

    The on-disk cache always holds the CPU form (``faiss.write_index`` cannot write GPU
    indexes), so this runs after loading or building.
    """
    if device == "cpu" or isinstance(index, faiss.IndexHNSWFlat):
        return index
    if not gpu_available():
        # An explicit GPU device without FAISS GPUs stops the run at start (cbr2.common.devices);
        # here the device came from ``auto``, and the start-up log says which FAISS build this is.
        log.debug("a %d-vector index stays on the CPU: this FAISS has no GPU", index.ntotal)
        return index
    log.info("moving a %d-vector index to %d GPU(s)", index.ntotal, faiss.get_num_gpus())
    return faiss.index_cpu_to_all_gpus(index)


def search(index: faiss.Index, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` rows by inner product.

    Returns:
        ``(scores, ids)``, each ``(len(queries), min(k, index.ntotal))``; ids are row numbers
        of the indexed embeddings, best first (``-1`` never appears: k is capped).
    """
    k = min(k, index.ntotal)
    if k <= 0 or len(queries) == 0:
        return np.zeros((len(queries), 0), np.float32), np.zeros((len(queries), 0), np.int64)
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    # FAISS switches from a per-query kernel to one BLAS product at `distance_compute_blas_threshold`
    # queries, and the two round differently: chunks below it keep each query's scores (and so
    # near-tie order) independent of the other queries searched with it, still in parallel.
    step = max(1, min(QUERY_CHUNK, faiss.cvar.distance_compute_blas_threshold - 1))
    parts = [index.search(queries[i: i + step], k) for i in range(0, len(queries), step)]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
