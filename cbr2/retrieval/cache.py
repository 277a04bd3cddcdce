"""On-disk cache of embeddings and FAISS indexes, keyed by encoder, weights and content.

An entry is a folder ``{label}-{key}`` holding ``embeddings.npy`` and ``meta.json``. The key
hashes the encoder name, a fingerprint of its weights, the exact texts embedded and the cache
format, so a fine-tuned encoder or a changed KB never reuses an entry. The index kind is not
part of the key: the embeddings do not depend on it, and re-encoding a million facts to try
another index would cost an hour on a CPU. An approximate index is stored beside the
embeddings the first time it is asked for (``index-{kind}.faiss`` with ``index-{kind}.json``,
its checksum, written last); a flat index is rebuilt from the embeddings in milliseconds. A
damaged index file costs only the index, rebuilt from the embeddings with a warning. Entries are
written to a temporary folder and renamed (``common.files.publish_folder``), under a build lock, so concurrent SLURM tasks
build an entry once and never see a half-written one. On load, the metadata, sizes, dtype
and checksums are verified; an entry that does not match, whatever is wrong with it, is
removed with a warning and rebuilt, never used.

A collection larger than ``chunk_size`` texts is encoded in chunks, with one progress bar,
and each chunk is written as it is done to ``{label}-{key}.partial/`` (``part-00001.npy`` with
``part-00001.json``: its first row, row count, dimension and checksum, written last so it
marks the part complete). A build that is killed (a SLURM time limit, a pre-empted node)
resumes from the parts already written: the next call checks them and encodes only the rest.
A part that does not check out is removed with a warning and encoded again, with every part
after it. When all parts are in, the entry is assembled and renamed into place as above and
the partial folder is deleted. Smaller collections are encoded in one call, as before.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from cbr2.common.console import progress
from cbr2.common.files import file_sha256, open_entry, publish_folder, remove_path, write_atomic
from cbr2.common.locks import build_lock
from cbr2.retrieval.index import build_index

if TYPE_CHECKING:  # annotations only: FAISS loads when an index is read or built
    import faiss

log = logging.getLogger(__name__)

FORMAT = 2
"""Bump when the entry layout or the meaning of a key changes (2: the index kind left the key)."""

PARTIAL_FORMAT = 1
"""Bump when the layout of a partial (resumable) build changes; older partials are then discarded."""

CHUNK_TEXTS = 8192
"""Texts per resumable part (about half a minute of MiniLM on two CPU cores)."""


def content_hash(texts: Sequence[str]) -> str:
    """SHA-256 of the texts in order (length-prefixed, so no separator can collide)."""
    digest = hashlib.sha256()
    for text in texts:
        data = text.encode("utf-8")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


def _partial(entry: Path) -> Path:
    """The folder of an entry's resumable build."""
    return entry.parent / f"{entry.name}.partial"


def _checked(embeddings: np.ndarray, n: int) -> np.ndarray:
    """``embeddings`` as C-contiguous float32 rows, after checking there is one per text."""
    embeddings = np.ascontiguousarray(embeddings, dtype=np.float32)
    if embeddings.ndim != 2 or embeddings.shape[0] != n:
        raise ValueError(f"encoder returned embeddings of shape {embeddings.shape} for {n} texts")
    return embeddings


def _write_part(folder: Path, number: int, start: int, block: np.ndarray) -> None:
    """``part-NNNNN.npy``, then its ``.json`` record (the mark that the part is complete)."""
    part = folder / f"part-{number:05d}"
    tmp = folder / f".{part.name}.npy.tmp"
    with tmp.open("wb") as handle:
        np.save(handle, block, allow_pickle=False)
    os.replace(tmp, part.with_suffix(".npy"))
    record = {"start": start, "rows": int(block.shape[0]), "dim": int(block.shape[1]),
              "sha256": file_sha256(part.with_suffix(".npy"))}
    write_atomic(part.with_suffix(".json"), json.dumps(record) + "\n")


def _read_part(part: Path, start: int, rows: int, dim: int | None) -> np.ndarray:
    """One written part, checked against its record and its place in the build."""
    record = json.loads(part.with_suffix(".json").read_text(encoding="utf-8"))
    if not isinstance(record, dict) or record.get("start") != start or record.get("rows") != rows:
        raise ValueError(f"its record {record!r} does not describe rows {start}-{start + rows - 1}")
    if dim is not None and record.get("dim") != dim:
        raise ValueError(f"it has {record.get('dim')!r} dimensions, the parts before it {dim}")
    if file_sha256(part.with_suffix(".npy")) != record.get("sha256"):
        raise ValueError("it does not match its checksum")
    block = np.load(part.with_suffix(".npy"), allow_pickle=False)
    if block.dtype != np.float32 or block.shape != (rows, record["dim"]):
        raise ValueError(f"it holds {block.dtype} of shape {block.shape}, expected float32 of ({rows}, {record['dim']})")
    return block


class EmbeddingStore:
    """Embeddings and indexes of text collections, built once and reused across runs.

    Args:
        root: Cache folder (created on first write).
        chunk_size: Collections of more texts are encoded in resumable parts of this many.
    """

    def __init__(self, root: str | Path, chunk_size: int = CHUNK_TEXTS):
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be positive, got {chunk_size}")
        self.root = Path(root)
        self.chunk_size = chunk_size

    def get(self, label: str, texts: Sequence[str], encoder: str, fingerprint: str,
            embed: Callable[[Sequence[str]], np.ndarray],
            index_kind: str | None = "flat") -> tuple[np.ndarray, faiss.Index | None]:
        """The embeddings of ``texts`` and a CPU index over them, from the cache or built now.

        Args:
            label: Readable prefix of the entry's folder (``facts``, ``ontology``, ``cases``...).
            texts: What is embedded; part of the key.
            encoder: Encoder name; part of the key.
            fingerprint: ``encoders.weights_fingerprint`` of the encoder; part of the key.
            embed: Computes the embeddings when the entry is missing or invalid; called once, or
                once per part of ``chunk_size`` texts for a larger collection.
            index_kind: ``flat``, ``hnsw`` or ``ivf``; None: no index (the second value is None).
        """
        meta = {"format": FORMAT, "encoder": encoder, "weights": fingerprint, "content": content_hash(texts),
                "n": len(texts)}
        key = hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()[:20]
        entry = self.root / f"{label}-{key}"
        embeddings = self._load(entry, meta)
        if embeddings is None:
            with build_lock(entry, f"the {label} embeddings"):
                embeddings = self._load(entry, meta)  # built by another task while this one waited?
                if embeddings is None:
                    embeddings = self._build(entry, meta, texts, label, encoder, embed)
                    return embeddings, self._index(entry, embeddings, index_kind, label)
        log.info("cache hit: %s (%d %s)", entry, len(texts), label)
        return embeddings, self._index(entry, embeddings, index_kind, label)

    def _build(self, entry: Path, meta: dict, texts: Sequence[str], label: str, encoder: str,
               embed: Callable[[Sequence[str]], np.ndarray]) -> np.ndarray:
        log.info("encoding %d %s with %s (cache: %s)", len(texts), label, encoder, entry)
        if len(texts) > self.chunk_size:
            embeddings = self._encode_in_parts(entry, meta, texts, label, embed)
        else:
            embeddings = _checked(embed(texts), len(texts))
        self._save(entry, meta, embeddings)
        remove_path(_partial(entry))
        return embeddings

    def _index(self, entry: Path, embeddings: np.ndarray, kind: str | None, label: str) -> faiss.Index | None:
        """The ``kind`` index over an entry's embeddings: read from the entry, or built (and stored
        there when the entry exists, so the next run reads it)."""
        if kind is None:
            return None
        import faiss

        if kind == "flat" or not entry.is_dir():  # no entry: storing it failed, and was said
            return build_index(embeddings, kind)
        index = self._read_index(entry, embeddings, kind)
        if index is not None:
            return index
        with build_lock(entry / f"index-{kind}.faiss", f"the {label} {kind} index"):
            index = self._read_index(entry, embeddings, kind)  # built by another task meanwhile?
            if index is None:
                log.info("building the %s index over %d %s", kind, len(embeddings), label)
                index = build_index(embeddings, kind)
                if not isinstance(index, faiss.IndexFlat):  # small sets fall back to flat: nothing to store
                    self._save_index(entry, index, kind)
        return index

    @staticmethod
    def _read_index(entry: Path, embeddings: np.ndarray, kind: str) -> faiss.Index | None:
        """The stored ``kind`` index of ``entry``, or None when there is none or it is unusable
        (then removed with a warning: only the index is rebuilt, the embeddings are fine)."""
        path, record_path = entry / f"index-{kind}.faiss", entry / f"index-{kind}.json"
        if not record_path.is_file():
            return None
        import faiss

        try:
            record = json.loads(record_path.read_text(encoding="utf-8"))
            if not isinstance(record, dict) or file_sha256(path) != record.get("sha256"):
                raise ValueError(f"{path.name} does not match its checksum")
            index = faiss.read_index(str(path))
            if index.ntotal != len(embeddings) or index.d != embeddings.shape[1]:
                raise ValueError(f"{path.name} holds {index.ntotal} vectors of {index.d} dimensions, "
                                 f"expected {len(embeddings)} of {embeddings.shape[1]}")
            return index
        except MemoryError:
            raise
        except Exception as err:  # noqa: BLE001 - any unusable index is rebuilt from the embeddings
            log.warning("cache entry %s: its %s index is unusable (%s: %s); building it again from the embeddings",
                        entry, kind, type(err).__name__, err)
            record_path.unlink(missing_ok=True)
            path.unlink(missing_ok=True)
            return None

    @staticmethod
    def _save_index(entry: Path, index: faiss.Index, kind: str) -> None:
        """Store an index beside the embeddings: the file, then its record (the mark that it is whole)."""
        import faiss

        path = entry / f"index-{kind}.faiss"
        tmp = entry / f".{path.name}.tmp"
        try:
            faiss.write_index(index, str(tmp))
            os.replace(tmp, path)
            write_atomic(entry / f"index-{kind}.json", json.dumps({"sha256": file_sha256(path)}) + "\n")
        except (OSError, RuntimeError) as err:  # FAISS raises RuntimeError on a failed write
            tmp.unlink(missing_ok=True)
            log.warning("could not store the %s index in %s (%s); it is built again next time", kind, entry, err)

    def _encode_in_parts(self, entry: Path, meta: dict, texts: Sequence[str], label: str,
                         embed: Callable[[Sequence[str]], np.ndarray]) -> np.ndarray:
        """All embeddings of ``texts``, resuming from the parts a killed build left (see the module)."""
        folder, n, size = _partial(entry), len(texts), self.chunk_size
        manifest = {**meta, "partial_format": PARTIAL_FORMAT, "chunk": size}
        out, done = self._resume(folder, manifest, n)
        if done:
            log.info("resuming the %s embeddings after %d of %d texts (%s)", label, done, n, folder)
        else:
            remove_path(folder)
            folder.mkdir(parents=True)
            write_atomic(folder / "meta.json", json.dumps(manifest, indent=2) + "\n")
        with progress(total=n, initial=done, unit="text", desc=f"encoding {label}", logger=log) as bar:
            for start in range(done, n, size):
                block = _checked(embed(texts[start: start + size]), min(size, n - start))
                if out is None:
                    out = np.empty((n, block.shape[1]), dtype=np.float32)
                if block.shape[1] != out.shape[1]:
                    raise ValueError(f"encoder returned {block.shape[1]} dimensions after {out.shape[1]}")
                out[start: start + len(block)] = block
                _write_part(folder, start // size + 1, start, block)
                bar.update(len(block))
        return out

    def _resume(self, folder: Path, manifest: dict, n: int) -> tuple[np.ndarray | None, int]:
        """The leading parts of a partial build that check out, as ``(embeddings so far, rows done)``.

        A partial build of other content or layout is discarded; the first part that is
        missing or damaged ends the resumable prefix, and it and every later part are removed
        (with a warning when damaged), so they are encoded again.
        """
        if not folder.is_dir():
            return None, 0
        try:
            stored = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
            if stored != manifest:
                raise ValueError("it belongs to another build (its meta.json differs)")
        except Exception as err:  # noqa: BLE001 - any unreadable partial is only lost work
            log.warning("partial build %s is unusable (%s: %s); encoding from the start", folder,
                        type(err).__name__, err)
            return None, 0
        size, out, done, number = manifest["chunk"], None, 0, 1
        while done < n:
            part = folder / f"part-{number:05d}"
            if not part.with_suffix(".json").exists():
                break
            try:
                block = _read_part(part, done, min(size, n - done), None if out is None else out.shape[1])
            except MemoryError:
                raise
            except Exception as err:  # noqa: BLE001 - a damaged part costs its re-encoding, nothing else
                log.warning("part %s of the partial build is unusable (%s: %s); encoding it again",
                            part.name, type(err).__name__, err)
                break
            if out is None:
                out = np.empty((n, block.shape[1]), dtype=np.float32)
            out[done: done + len(block)] = block
            done += len(block)
            number += 1
        for stale in sorted(folder.glob("part-*")):
            if stale.name.split(".")[0] >= f"part-{number:05d}":
                stale.unlink(missing_ok=True)
        return out, done

    def _load(self, entry: Path, meta: dict) -> np.ndarray | None:
        """The entry's embeddings, or None when the entry is missing or unusable.

        An unusable entry (of any kind: missing or truncated files, a ``meta.json`` that is
        not the expected object, a checksum mismatch, vectors of another dtype or shape, a
        file where the folder should be) is removed with one warning naming it and what is
        wrong, so that it is rebuilt once and the rebuilt entry is reused by later runs.
        """
        return open_entry(entry, lambda folder: self._read(folder, meta), log, "cache entry")

    @staticmethod
    def _read(entry: Path, meta: dict) -> np.ndarray:
        stored = json.loads((entry / "meta.json").read_text(encoding="utf-8"))
        if not isinstance(stored, dict):
            raise TypeError(f"meta.json holds a JSON {type(stored).__name__}, not an object")
        if {k: stored.get(k) for k in meta} != meta:
            raise ValueError("stale entry: its meta.json describes other content")
        dim = stored.get("dim")
        if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1:
            raise ValueError(f"meta.json has dim={dim!r}, not a positive integer")
        emb_path = entry / "embeddings.npy"
        if file_sha256(emb_path) != stored.get("embeddings_sha256"):
            raise ValueError("embeddings.npy does not match its checksum")
        embeddings = np.load(emb_path, allow_pickle=False)
        expected = (meta["n"], dim)
        if embeddings.shape != expected or embeddings.dtype != np.float32:
            raise ValueError(f"embeddings are {embeddings.dtype} of shape {embeddings.shape}, "
                             f"expected float32 of shape {expected}")
        return embeddings

    def _save(self, entry: Path, meta: dict, embeddings: np.ndarray) -> None:
        written = False

        def write(tmp: Path) -> None:
            nonlocal written
            np.save(tmp / "embeddings.npy", embeddings, allow_pickle=False)
            record = {**meta, "dim": int(embeddings.shape[1]), "embeddings_sha256": file_sha256(tmp / "embeddings.npy")}
            (tmp / "meta.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
            written = True

        self.root.mkdir(parents=True, exist_ok=True)
        try:
            publish_folder(entry, write)  # a concurrent winner's entry is as good as this one
        except OSError as err:
            if not written:  # writing failed, not the rename: raised as before
                raise
            log.warning("could not store cache entry %s (%s); it is encoded again next time", entry, err)
