"""FAISS inner-product indexes over unit-length embeddings (inner product = cosine).

``flat`` is exact and the default; ``hnsw`` and ``ivf`` are approximate and meant for
KQA Pro-sized fact sets. When faiss-gpu is installed and a GPU is visible, ``flat`` and
``ivf`` indexes are moved to the GPUs (HNSW has no GPU version in FAISS and stays on CPU), where
FAISS has shown it can search there (``cbr2.common.devices.faiss_gpu_problem``). Every index of
the process shares one set of GPU resources, whose scratch memory is bounded
(``FAISS_TEMP_MEMORY``).
"""

from __future__ import annotations

import functools
import logging
import math
from typing import TYPE_CHECKING

import numpy as np

from cbr2.common.devices import faiss_cpu_fallback, faiss_gpu_error, faiss_gpu_problem, wants_gpu

if TYPE_CHECKING:  # annotations only: FAISS loads when an index is built or searched, not with the runner
    import faiss

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
MIN_APPROXIMATE = 1000
"""Fewest vectors an ``hnsw`` or ``ivf`` index is built for; below, the index is ``flat``."""
FAISS_TEMP_MEMORY = 256 * 1024**2
"""Scratch memory of the process's FAISS GPU resources, per GPU. FAISS's default is 1.5 GiB per
``StandardGpuResources`` on a large GPU, and ``index_cpu_to_all_gpus`` makes one per call: 6 GiB
for a run's four indexes. A search of ``QUERY_CHUNK`` queries tiles its distances in about 32 MiB (16
queries x 262,144 vectors x 4 bytes, double-buffered); FAISS allocates beyond the bound if ever needed."""
IVF_ID_BYTES = 8
"""Bytes per vector an IVF index on the GPU keeps beside the vector: its id."""


def gpu_available() -> bool:
    """Whether this FAISS build has GPU support and sees at least one GPU."""
    import faiss

    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


@functools.cache
def gpu_resources() -> tuple[faiss.StandardGpuResources, ...]:
    """The process's FAISS GPU resources, one per GPU, shared by every index moved there.

    Made on first use and kept for the process (an index must not outlive its resources), each
    with ``FAISS_TEMP_MEMORY`` of scratch memory instead of FAISS's default of up to 1.5 GiB.
    """
    import faiss

    resources = []
    for _ in range(faiss.get_num_gpus()):
        res = faiss.StandardGpuResources()
        res.setTempMemory(FAISS_TEMP_MEMORY)
        resources.append(res)
    return tuple(resources)


def gpu_bytes(n: int, dim: int, kind: str) -> int:
    """Bytes one GPU holds for an index of ``n`` vectors of ``dim`` floats (``build_index``'s choice of
    index, replicated on each GPU): float32 vectors, with an id each in an IVF index; none for
    ``hnsw`` from ``MIN_APPROXIMATE`` vectors on, which stays on the CPU."""
    if kind == "flat" or n < MIN_APPROXIMATE:
        return n * dim * 4
    if kind == "hnsw":
        return 0
    return n * (dim * 4 + IVF_ID_BYTES)


def build_index(embeddings: np.ndarray, kind: str = "flat") -> faiss.Index:
    """A CPU index over the rows of ``embeddings`` (float32, unit length).

    Args:
        embeddings: ``(n, dim)`` array.
        kind: One of ``INDEX_KINDS``.

    Raises:
        ValueError: On an unknown kind.
    """
    import faiss

    if kind not in INDEX_KINDS:
        raise ValueError(f"unknown retrieval.index {kind!r}; expected one of {', '.join(INDEX_KINDS)}")
    n, dim = embeddings.shape
    if kind == "flat" or n < MIN_APPROXIMATE:
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
    """Move an index to all visible GPUs when ``device`` is not ``cpu`` and FAISS's GPU build can search there.

    The on-disk cache always holds the CPU form (``faiss.write_index`` cannot write GPU
    indexes), so this runs after loading or building.

    Raises:
        SetupError: When ``device`` names a GPU (``cuda``) and FAISS's test search on the GPUs
            fails (``faiss_gpu_problem``); ``auto`` keeps the index on the CPU and says so once.
    """
    import faiss

    if device == "cpu" or isinstance(index, faiss.IndexHNSWFlat):
        return index
    if not gpu_available():
        # An explicit GPU device without FAISS GPUs stops the run at start (cbr2.common.devices);
        # here the device came from ``auto``, and the start-up log says which FAISS build this is.
        log.debug("a %d-vector index stays on the CPU: this FAISS has no GPU", index.ntotal)
        return index
    problem = faiss_gpu_problem()  # run once per process; the run's start ran it already
    if problem:
        if wants_gpu(device):
            raise faiss_gpu_error(device, problem)
        faiss_cpu_fallback(problem)
        return index
    resources = gpu_resources()
    log.info("moving a %d-vector index to %d GPU(s)", index.ntotal, len(resources))
    return faiss.index_cpu_to_gpu_multiple_py(list(resources), index)


def search(index: faiss.Index, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` rows by inner product.

    Returns:
        ``(scores, ids)``, each ``(len(queries), min(k, index.ntotal))``; ids are row numbers
        of the indexed embeddings, best first (``-1`` never appears: k is capped).
    """
    import faiss

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
