"""What retrieval holds on a GPU: the encoders' weights, the FAISS indexes and FAISS's scratch memory.

The vLLM engine shares the GPU with retrieval in one process, and vLLM takes a fixed share of the
GPU's memory at start (``llm.gpu_memory_utilization``). So the share it is given leaves what this
module estimates, from files alone, before anything loads (``cbr2.llm.vllm.memory_share``; the
smoke check makes the same sum, ``cbr2.cluster.smoke``):

- each encoder: its parameters x 4 bytes (counted in the ``model.safetensors`` header; the file's
  size for a ``pytorch_model.bin``), once however many views use it;
- each index on the GPU: its vectors x dimensions x 4 bytes (``index.gpu_bytes``: an IVF index
  also keeps an id per vector, an HNSW index stays on the CPU), a full copy on every GPU;
- FAISS's scratch memory, ``index.FAISS_TEMP_MEMORY`` per GPU;
- ``MARGIN``: this process's CUDA context, torch's allocator slack and the activations of encoding.

MiniLM (22.7M parameters, 384 dimensions) over KQA Pro's 650,187 fact triples: 87 MiB of weights
and 952 MiB of fact vectors.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cbr2.common.errors import SetupError
from cbr2.retrieval.index import FAISS_TEMP_MEMORY, gpu_bytes

GIB = 1024**3
MARGIN = GIB
"""Beside the weights and indexes: the CUDA context of the process (0.3-0.6 GiB), torch's caching
allocator's slack and the activations of one encoder batch (``retrieval.batch_size`` texts)."""
PARAMETER_BYTES = 4
"""Bytes a parameter of an encoder takes on the GPU: ``load_encoder`` asks for no dtype, so
transformers 4 loads float32 whatever the file stores, and 5 the stored dtype, which is float32 for
MiniLM and bge-m3 (a half-precision file counts double: an estimate that errs on the safe side)."""
SAFETENSORS_WIDTH = {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "F16": 2, "BF16": 2, "I16": 2, "I8": 1, "U8": 1,
                     "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
"""Bytes per element of the safetensors dtypes."""


@dataclass(frozen=True)
class RetrievalMemory:
    """What retrieval holds on one GPU, in bytes (the first GPU: the encoders run there).

    Attributes:
        encoders: Encoder name → its weights on the GPU (none when the encoders run on the CPU).
        indexes: Index label → ``(vectors, dimensions)`` of those that go to the GPU.
        index_kind: ``retrieval.index`` (``gpu_bytes`` of each index follows it).
        faiss_temp: FAISS's scratch memory (0 without an index on the GPU).
        margin: ``MARGIN`` where an encoder runs on the GPU, else 0.
    """

    encoders: dict[str, int] = field(default_factory=dict)
    indexes: dict[str, tuple[int, int]] = field(default_factory=dict)
    index_kind: str = "flat"
    faiss_temp: int = 0
    margin: int = 0

    @property
    def weights(self) -> int:
        return sum(self.encoders.values())

    @property
    def index_bytes(self) -> int:
        return sum(gpu_bytes(n, dim, self.index_kind) for n, dim in self.indexes.values())

    @property
    def total(self) -> int:
        return self.weights + self.index_bytes + self.faiss_temp + self.margin

    def describe(self) -> str:
        """One line in GiB, e.g. ``retrieval 2.6 GiB: encoder 0.08 (minilm), 850,535 index vectors 1.22 (flat),
        FAISS scratch 0.25, margin 1.0``."""
        if not self.total:
            return "retrieval: nothing on the GPU"
        parts = []
        if self.encoders:
            names = ", ".join(self.encoders)
            parts.append(f"encoder{'s' if len(self.encoders) > 1 else ''} {self.weights / GIB:.2f} ({names})")
        on_gpu = sum(n for n, dim in self.indexes.values() if gpu_bytes(n, dim, self.index_kind))
        if on_gpu:
            parts.append(f"{on_gpu:,} index vectors {self.index_bytes / GIB:.2f} ({self.index_kind})")
        elif self.indexes:
            parts.append(f"indexes on the CPU ({self.index_kind})")
        if self.faiss_temp:
            parts.append(f"FAISS scratch {self.faiss_temp / GIB:.2f}")
        parts.append(f"margin {self.margin / GIB:.1f}")
        return f"retrieval {self.total / GIB:.1f} GiB: " + ", ".join(parts)


def _model_file(name: str, filename: str) -> Path | None:
    """``filename`` of the encoder ``name``: in its folder (a local or packaged one), or in the Hugging Face cache."""
    from cbr2.retrieval.encoders import resolve_model

    try:
        where = Path(resolve_model(name))
    except SetupError:
        return None
    if where.is_dir():
        path = where / filename
        return path if path.is_file() else None
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(name, filename)
    return Path(found) if isinstance(found, str) else None


def safetensors_parameters(path: Path) -> int:
    """Elements of every tensor in a ``.safetensors`` file, from its header alone (the first bytes)."""
    with path.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    return sum(math.prod(t["shape"]) for key, t in header.items() if key != "__metadata__")


def encoder_size(name: str) -> tuple[int, int]:
    """``(bytes on the GPU, embedding dimensions)`` of a sentence encoder, from its files.

    The dimensions are the pooling layer's (``1_Pooling/config.json``), else the model's
    ``hidden_size``; a ``2_Dense`` layer's ``out_features`` win.

    Raises:
        SetupError: When the encoder's files are not here (the smoke check names how to stage them).
    """
    config = _model_file(name, "config.json")
    if config is None:
        raise SetupError(f"encoder {name}: no config.json here (a folder, a packaged copy or the Hugging Face cache) "
                         "to size it by; stage it first (docs/cluster.md, 'Staging weights')")
    weights = _model_file(name, "model.safetensors")
    if weights is not None:
        size = safetensors_parameters(weights) * PARAMETER_BYTES
    elif (index := _model_file(name, "model.safetensors.index.json")) is not None:
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        size = sum(safetensors_parameters(index.parent / shard) for shard in shards) * PARAMETER_BYTES
    elif (binary := _model_file(name, "pytorch_model.bin")) is not None:
        size = binary.stat().st_size
    else:
        raise SetupError(f"encoder {name}: no model.safetensors or pytorch_model.bin beside its config.json; "
                         "stage the whole model (docs/cluster.md, 'Staging weights')")
    dim = json.loads(config.read_text(encoding="utf-8")).get("hidden_size")
    for module in ("1_Pooling/config.json", "2_Dense/config.json"):
        path = _model_file(name, module)
        if path is not None:
            own = json.loads(path.read_text(encoding="utf-8"))
            dim = own.get("out_features") or own.get("word_embedding_dimension") or dim
    if not dim:
        raise SetupError(f"encoder {name}: its config.json names no hidden_size; cannot size its embeddings")
    return size, int(dim)


def retrieval_memory(retrieval: Any, counts: dict[str, int], structural: str | None, encoders_on_gpu: bool,
                     indexes_on_gpu: bool, semantic_encoder: bool = False) -> RetrievalMemory:
    """What retrieval holds on the first GPU for a ``retrieval`` section and the data it searches.

    Args:
        retrieval: The ``retrieval`` config section (``encoder``, ``index``, ``k_ontology``,
            ``k_facts``, ``cases``).
        counts: Vectors of each index the run builds: ``ontology`` and ``facts`` (KB triples),
            ``semantic`` and ``structural`` (the training pool), from ``benchmark_counts``.
        structural: The structural retriever's encoder (a checkpoint folder or name), when the
            ``structural`` index is built.
        encoders_on_gpu: Whether the encoders run on the GPU (``retrieval.device`` not ``cpu``, CUDA seen).
        indexes_on_gpu: Whether the indexes go there (FAISS's GPU build sees GPUs and passed its
            test search: ``cbr2.common.devices``).
        semantic_encoder: The semantic encoder is loaded though no index needs it (canonicalisation).

    Raises:
        SetupError: When an encoder's files are not here.
    """
    if not encoders_on_gpu:
        return RetrievalMemory(index_kind=str(retrieval.index))
    encoders: dict[str, int] = {}
    dims: dict[str, int] = {}
    uses = {"ontology": retrieval.encoder, "facts": retrieval.encoder, "semantic": retrieval.encoder,
            "structural": structural}
    names = [uses[label] for label in counts if uses.get(label)]
    if semantic_encoder:
        names.append(retrieval.encoder)
    for name in dict.fromkeys(str(n) for n in names):  # one model per name: load_encoder caches it
        encoders[name], dims[name] = encoder_size(name)
    indexes = {label: (n, dims[str(uses[label])]) for label, n in counts.items() if n and uses.get(label)} \
        if indexes_on_gpu else {}
    kind = str(retrieval.index)
    return RetrievalMemory(encoders=encoders, indexes=indexes, index_kind=kind,
                           faiss_temp=FAISS_TEMP_MEMORY if any(gpu_bytes(n, d, kind) for n, d in indexes.values()) else 0,
                           margin=MARGIN if encoders else 0)


def benchmark_counts(bench: Any, retrieval: Any, views: tuple[str, ...]) -> dict[str, int]:
    """Vectors of each index a run over ``bench`` builds: KB triples (``cbr2.kb.triples.triple_counts``,
    seconds at KQA Pro's size from the stored KB) and the training pool, once per case view.

    Args:
        bench: The ``cbr2.data.benchmarks.Benchmark`` of ``data.name``.
        retrieval: The ``retrieval`` config section.
        views: The case views the run ranks (``retriever.CASE_MODES[retrieval.cases]``).
    """
    from cbr2.kb.triples import triple_counts

    counts: dict[str, int] = {}
    if retrieval.k_ontology > 0 or retrieval.k_facts > 0:
        triples = triple_counts(bench.kb)
        if retrieval.k_ontology > 0:
            counts["ontology"] = triples["ontology"]
        if retrieval.k_facts > 0:
            counts["facts"] = triples["facts"]
    pool = [v for v in ("semantic", "structural") if v in views]
    if pool:
        size = len(bench.questions(bench.family.train_split))
        counts.update(dict.fromkeys(pool, size))
    return counts


def retrieval_beside(bench: Any, retrieval: Any, structural: str | None, canonicalize: bool,
                     indexes_resident: bool) -> RetrievalMemory:
    """What retrieval holds on the first GPU while an engine that takes a share of it runs.

    An evaluation retrieves for every question before generating, and frees its indexes then: the
    encoders (``load_encoder`` keeps them) and the margin stay. A process that answers questions as
    they come (``cbr2.service``) keeps its indexes beside the engine: ``indexes_resident``.

    Args:
        bench: The ``cbr2.data.benchmarks.Benchmark`` retrieval searches.
        retrieval: The ``retrieval`` config section.
        structural: The structural retriever's encoder (a folder or name), when the run ranks by it.
        canonicalize: ``generation.canonicalize``: the semantic encoder is loaded for it.
        indexes_resident: Whether the indexes stay on the GPU beside the engine.

    Returns:
        Nothing where retrieval runs on the CPU; without indexes where FAISS cannot search on the
        GPU (its CPU build, or a failed test search: ``cbr2.common.devices.faiss_gpu_problem``).

    Raises:
        SetupError: When an encoder's files are not here.
    """
    import torch

    from cbr2.common.devices import faiss_gpu_problem
    from cbr2.retrieval.index import gpu_available
    from cbr2.retrieval.retriever import CASE_MODES

    if str(retrieval.device) == "cpu" or not torch.cuda.is_available():
        return retrieval_memory(retrieval, {}, None, False, False)
    views = CASE_MODES[retrieval.cases]
    counts = benchmark_counts(bench, retrieval, views)
    on_gpu = indexes_resident and gpu_available() and faiss_gpu_problem() is None
    return retrieval_memory(retrieval, counts, structural if "structural" in views else None, True, on_gpu,
                            semantic_encoder=canonicalize)
