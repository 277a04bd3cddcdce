"""The layout of a KB store entry (``cbr2.data.kb_store``) and its writer.

``store.bin`` is ``MAGIC``, then pickle protocol 5 sections (``SECTIONS``): a header, the four
engine indexes, the entity offsets as int64 and the entities one pickle each; ``meta.json``
records the format, the source's hash and size, the sections' offsets, and the size and SHA-256
of ``store.bin``. ``cbr2.data.kb_store`` finds, verifies and opens entries; this module writes them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import pickle
import shutil
import tempfile
import time
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cbr2.common.files import publish_folder
from cbr2.kb.model import KB

FORMAT = 3
"""Bump when the layout of an entry changes (the engine's index layout is ``INDEX_FORMAT``)."""

MAGIC = b"CBR2KBS\n"
"""The first bytes of ``store.bin``."""

ENGINE_SECTIONS = ("attrs", "rels", "forward", "backward")
"""The sections that hold the engine's indexes (``Engine.indexes``), each keyed (``write_keyed``)."""
SECTIONS = ("header", *ENGINE_SECTIONS, "entity_offsets", "entities")
"""The sections of ``store.bin``, in order."""
HEADER_KEYS = ("concepts", "entity_ids", "vocabulary", "stats", "ids", "nodes", "names", "members", "key_type")
"""What the header section holds (an entry whose header lacks one is rebuilt)."""
BLOCK = 1 << 24
"""Bytes per copy of the entities into ``store.bin``."""


class _HashingWriter:
    """A binary file that hashes and counts what is written."""

    def __init__(self, handle: Any):
        self.handle, self.digest, self.offset = handle, hashlib.sha256(), 0

    def write(self, data: bytes | memoryview) -> int:
        self.handle.write(data)
        self.digest.update(data)
        self.offset += len(data)
        return len(data)


def write_keyed(out: Any, index: dict[Any, Any]) -> None:
    """One engine index as a keyed section: the length of its directory (8 bytes, little-endian),
    the directory (a pickle of key → ``(offset, length)``), then each key's value, one pickle each.

    An engine reads only the keys a program asks for (one attribute key, one relation, the facts
    of one entity), so a run loads the part of the index its questions touch.
    """
    blobs, directory = io.BytesIO(), {}
    for key, value in index.items():
        data = pickle.dumps(value, protocol=5)
        directory[key] = (blobs.tell(), len(data))
        blobs.write(data)
    head = pickle.dumps(directory, protocol=5)
    out.write(len(head).to_bytes(8, "little"))
    out.write(head)
    out.write(blobs.getbuffer())


def write_entry(entry: Path, expected: dict[str, Any], kb: KB, indexes: dict[str, Any], path: Path,
                started: float) -> None:
    """Write the entry of ``kb`` (parsed from ``path``) with the engine's ``indexes``: ``store.bin``
    and ``meta.json`` (``expected`` plus the sections, sizes and checksum) in a temporary folder
    beside ``entry``, renamed into place when complete (``publish_folder``).

    Raises:
        OSError: When it cannot be written (a read-only cache, a full disk).
    """
    voc = kb.vocabulary
    header = {"concepts": kb.concepts, "entity_ids": list(kb.entities), "stats": kb.stats(),
              "vocabulary": {f.name: getattr(voc, f.name) for f in dataclasses.fields(voc)},
              **{k: indexes[k] for k in ("ids", "nodes", "names", "members", "key_type")}}

    def write_files(tmp: Path) -> None:
        sections: dict[str, list[int]] = {}
        with (tmp / "store.bin").open("wb") as handle:
            out = _HashingWriter(handle)
            out.write(MAGIC)

            def section(name: str, write: Callable[[], None]) -> None:
                start = out.offset
                write()
                sections[name] = [start, out.offset - start]

            section("header", lambda: out.write(pickle.dumps(header, protocol=5)))
            for name in ENGINE_SECTIONS:
                section(name, lambda name=name: write_keyed(out, indexes[name]))
            offsets = [0]
            # Entities go to a temporary file first: their offsets come before them in store.bin.
            with tempfile.TemporaryFile(dir=tmp) as blobs:
                for ent in kb.entities.values():
                    data = pickle.dumps(ent, protocol=5)
                    blobs.write(data)
                    offsets.append(offsets[-1] + len(data))
                section("entity_offsets", lambda: out.write(array("q", offsets).tobytes()))  # native order (keyed)
                blobs.seek(0)
                section("entities", lambda: shutil.copyfileobj(blobs, out, BLOCK))
            handle.flush()
            os.fsync(handle.fileno())
        meta = {**expected, "source": str(path), "store_bytes": out.offset, "store_sha256": out.digest.hexdigest(),
                "sections": sections, "stats": header["stats"], "build_seconds": round(time.perf_counter() - started, 2)}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")

    publish_folder(entry, write_files)  # a concurrent winner's entry (same source, same format) is kept
