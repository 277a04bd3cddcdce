"""On-disk cache of embeddings and FAISS indexes, keyed by encoder, weights and content.

An entry is a folder ``{label}-{key}`` holding ``embeddings.npy``, the index when it is not
``flat`` (a flat index is rebuilt from the embeddings in milliseconds) and ``meta.json``. The
key hashes the encoder name, a fingerprint of its weights, the exact texts embedded and the
cache format, so a fine-tuned encoder or a changed KB never reuses an entry. Entries are
written to a temporary folder and renamed, under a build lock, so concurrent SLURM tasks
build an entry once and never see a half-written one. On load, the metadata, sizes, dtype
and checksums are verified; an entry that does not match, whatever is wrong with it, is
removed with a warning and rebuilt, never used.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import faiss
import numpy as np

from cbr2.locks import build_lock
from cbr2.retrieval.index import build_index

log = logging.getLogger(__name__)

FORMAT = 1
"""Bump when the entry layout or the meaning of a key changes."""


def cache_root(configured: str | None = None) -> Path:
    """``retrieval.cache_dir``, else ``$CBR2_CACHE_DIR``, else ``~/.cache/cbr2``."""
    return Path(configured or os.environ.get("CBR2_CACHE_DIR") or Path.home() / ".cache" / "cbr2").expanduser()


def content_hash(texts: Sequence[str]) -> str:
    """SHA-256 of the texts in order (length-prefixed, so no separator can collide)."""
    digest = hashlib.sha256()
    for text in texts:
        data = text.encode("utf-8")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def _remove(path: Path) -> None:
    """Delete a cache entry, whether a folder, a file or a link."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


class EmbeddingStore:
    """Embeddings and indexes of text collections, built once and reused across runs.

    Args:
        root: Cache folder (created on first write).
    """

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def get(self, label: str, texts: Sequence[str], encoder: str, fingerprint: str,
            embed: Callable[[Sequence[str]], np.ndarray], index_kind: str = "flat") -> tuple[np.ndarray, faiss.Index]:
        """The embeddings of ``texts`` and a CPU index over them, from the cache or built now.

        Args:
            label: Readable prefix of the entry's folder (``facts``, ``ontology``, ``cases``...).
            texts: What is embedded; part of the key.
            encoder: Encoder name; part of the key.
            fingerprint: ``encoders.weights_fingerprint`` of the encoder; part of the key.
            embed: Computes the embeddings when the entry is missing or invalid.
            index_kind: ``flat``, ``hnsw`` or ``ivf``.
        """
        meta = {"format": FORMAT, "encoder": encoder, "weights": fingerprint, "content": content_hash(texts),
                "n": len(texts), "index": index_kind}
        key = hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()[:20]
        entry = self.root / f"{label}-{key}"
        loaded = self._load(entry, meta)
        if loaded is None:
            with build_lock(entry, f"the {label} embeddings"):
                loaded = self._load(entry, meta)  # built by another task while this one waited?
                if loaded is None:
                    return self._build(entry, meta, texts, label, encoder, embed, index_kind)
        log.info("cache hit: %s (%d %s)", entry, len(texts), label)
        return loaded

    def _build(self, entry: Path, meta: dict, texts: Sequence[str], label: str, encoder: str,
               embed: Callable[[Sequence[str]], np.ndarray], index_kind: str) -> tuple[np.ndarray, faiss.Index]:
        log.info("encoding %d %s with %s (cache: %s)", len(texts), label, encoder, entry)
        embeddings = np.ascontiguousarray(embed(texts), dtype=np.float32)
        if embeddings.shape[0] != len(texts):
            raise ValueError(f"encoder returned {embeddings.shape[0]} embeddings for {len(texts)} texts")
        index = build_index(embeddings, index_kind)
        self._save(entry, meta, embeddings, index, index_kind)
        return embeddings, index

    def _load(self, entry: Path, meta: dict) -> tuple[np.ndarray, faiss.Index] | None:
        """The entry's embeddings and index, or None when it is missing or unusable.

        An unusable entry (of any kind: missing or truncated files, a ``meta.json`` that is
        not the expected object, a checksum mismatch, vectors of another dtype or shape, a
        file where the folder should be) is removed with one warning naming it and what is
        wrong, so that it is rebuilt once and the rebuilt entry is reused by later runs.
        """
        if not entry.exists() and not entry.is_symlink():
            return None
        try:
            if not entry.is_dir():
                raise ValueError("it is a file, not a folder")
            return self._read(entry, meta)
        except MemoryError:  # the entry may be fine; this process cannot hold it
            raise
        # Anything that stops an entry from loading makes it unusable, whatever the exception;
        # it costs a rebuild, never a crash of this run and of every later one.
        except Exception as err:  # noqa: BLE001
            log.warning("cache entry %s is unusable (%s: %s); rebuilding it", entry, type(err).__name__, err)
            _remove(entry)
            return None

    @staticmethod
    def _read(entry: Path, meta: dict) -> tuple[np.ndarray, faiss.Index]:
        stored = json.loads((entry / "meta.json").read_text(encoding="utf-8"))
        if not isinstance(stored, dict):
            raise TypeError(f"meta.json holds a JSON {type(stored).__name__}, not an object")
        if {k: stored.get(k) for k in meta} != meta:
            raise ValueError("stale entry: its meta.json describes other content")
        dim = stored.get("dim")
        if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1:
            raise ValueError(f"meta.json has dim={dim!r}, not a positive integer")
        emb_path = entry / "embeddings.npy"
        if _file_sha256(emb_path) != stored.get("embeddings_sha256"):
            raise ValueError("embeddings.npy does not match its checksum")
        embeddings = np.load(emb_path, allow_pickle=False)
        expected = (meta["n"], dim)
        if embeddings.shape != expected or embeddings.dtype != np.float32:
            raise ValueError(f"embeddings are {embeddings.dtype} of shape {embeddings.shape}, "
                             f"expected float32 of shape {expected}")
        if stored.get("index_sha256"):
            idx_path = entry / "index.faiss"
            if _file_sha256(idx_path) != stored["index_sha256"]:
                raise ValueError("index.faiss does not match its checksum")
            index = faiss.read_index(str(idx_path))
        else:
            index = build_index(embeddings, "flat")
        if index.ntotal != meta["n"] or index.d != dim:
            raise ValueError(f"index holds {index.ntotal} vectors of {index.d} dimensions, expected {meta['n']} of {dim}")
        return embeddings, index

    def _save(self, entry: Path, meta: dict, embeddings: np.ndarray, index: faiss.Index, kind: str) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=self.root))
        try:
            np.save(tmp / "embeddings.npy", embeddings, allow_pickle=False)
            record = {**meta, "dim": int(embeddings.shape[1]), "embeddings_sha256": _file_sha256(tmp / "embeddings.npy")}
            if kind != "flat" and not isinstance(index, faiss.IndexFlat):
                faiss.write_index(index, str(tmp / "index.faiss"))
                record["index_sha256"] = _file_sha256(tmp / "index.faiss")
            (tmp / "meta.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
            try:
                os.rename(tmp, entry)
            except OSError as err:
                shutil.rmtree(tmp, ignore_errors=True)
                if not entry.is_dir():  # not another process's finished entry: this one is lost
                    log.warning("could not store cache entry %s (%s); it is encoded again next time", entry, err)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
