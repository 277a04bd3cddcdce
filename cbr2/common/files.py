"""Small file and memory helpers shared by the on-disk caches (embeddings, the KB store), the loaders and
the run files."""

from __future__ import annotations

import gc
import hashlib
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_BLOCK = 1 << 24


def file_sha256(path: str | Path) -> str:
    """SHA-256 of a file, read in 16 MB blocks (never mapped, so it adds nothing to RSS)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(_BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through a file beside it, renamed over it when complete.

    A reader (another task, a browser) never sees half a file, and an interrupted writer never
    leaves one that looks whole.
    """
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def remove_path(path: Path) -> None:
    """Delete a cache entry, whether a folder, a file or a link."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for a bulk build of objects without cycles.

    Parsing, validating, unpickling or indexing a KQA Pro-size KB makes millions of small objects;
    left on, the collector rescans the whole heap again and again (3-4x the time). Not for what is
    built and kept anyway at no benefit: pausing only defers that collection.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
