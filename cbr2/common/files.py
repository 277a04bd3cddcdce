"""Small file and memory helpers shared by the on-disk caches (embeddings, the KB store, converted and
downloaded LLMs, grammars), the structural retriever's exports, the loaders and the run files: where
the cache is, how a folder is published whole, how a file is written whole."""

from __future__ import annotations

import gc
import hashlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

_BLOCK = 1 << 24
T = TypeVar("T")


def cache_root(configured: str | Path | None = None) -> Path:
    """The one cache folder of the project: ``configured`` (the configuration's ``cache_dir``, which
    the entry points and the run loop hand on as a value), else ``$CBR2_CACHE_DIR``, else
    ``~/.cache/cbr2``.

    Embeddings and indexes (``cbr2.retrieval.cache``), the KB store, compiled grammars, packaged
    and converted LLMs each keep a subfolder of it.
    """
    return Path(configured or os.environ.get("CBR2_CACHE_DIR") or Path.home() / ".cache" / "cbr2").expanduser()


def file_sha256(path: str | Path) -> str:
    """SHA-256 of a file, read in 16 MB blocks (never mapped, so it adds nothing to RSS)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(_BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


SETTLED_S = 2.0
"""How long before it is hashed a file must have last changed for ``known_sha256`` to remember its
hash: file times tick coarsely (a few ms), so a file rewritten within one tick at the same size
keeps its time, and a hash taken then is not trusted later (as git treats "racily clean" files)."""


def known_sha256(path: str | Path, cache_dir: str | Path | None = None) -> str:
    """``file_sha256`` of a file, remembered under ``cache_root(cache_dir)/sha256`` by its identity
    (device, inode, size, modification and change times), so an unchanged large file (a KB, a
    store entry) is hashed once, not by every process that opens it.

    A file written, replaced, truncated or touched gets another identity and is hashed anew; one
    that changed less than ``SETTLED_S`` before it was hashed is hashed every time. Where the
    memo cannot be written (a read-only cache) it is only not remembered.
    """
    path = Path(path)
    st = path.stat()
    key = f"{os.path.realpath(path)}\0{st.st_dev}\0{st.st_ino}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}"
    memo = cache_root(cache_dir) / "sha256" / hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()
    try:
        known = memo.read_text(encoding="ascii").strip()
        if len(known) == 64:
            return known
    except (OSError, UnicodeDecodeError):
        pass
    hashed_at_ns = time.time_ns()
    sha = file_sha256(path)
    if hashed_at_ns - max(st.st_mtime_ns, st.st_ctime_ns) > SETTLED_S * 1e9:
        try:
            memo.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(memo, sha + "\n")
        except OSError:
            pass
    return sha


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through a file beside it, renamed over it when complete.

    A reader (another task, a browser) never sees half a file, and an interrupted writer never
    leaves one that looks whole.
    """
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def publish_folder(dest: str | Path, build: Callable[[Path], None], replace: bool = False) -> bool:
    """Build a folder beside ``dest``, then rename it to ``dest``: a reader finds no folder or a whole one.

    ``build`` writes into a fresh, empty, hidden folder in ``dest``'s parent (``mkdtemp``: mode
    0o700, which a build that is meant to be shared changes), so the final rename is atomic and
    never copies. A build that raises leaves nothing behind; a process killed mid-build leaves
    only a hidden folder, which no reader takes for ``dest``.

    What is at ``dest`` when the build is done decides the rest, the same for every caller:

    * nothing: the build is renamed to ``dest``.
    * a folder, with ``replace`` (an incomplete or stale folder, an earlier export of the same
      name): it is renamed aside (atomic; deleting in place is not) and deleted, and the build
      takes its place.
    * a folder, without ``replace``, or one that another process renamed there after the step
      above: that concurrent winner is kept, as a complete folder of the same name, and this
      build is deleted. Callers that build under a ``build_lock`` see this only where the lock
      does not hold (a file system without ``flock``).

    Args:
        dest: The folder to publish (its parent is created when missing).
        build: Writes the folder's content into the empty folder it is given.
        replace: Put this build in the place of a folder already at ``dest``.

    Returns:
        True when this build is now ``dest``; False when a concurrent winner's folder is kept.

    Raises:
        OSError: When the rename fails and no folder is at ``dest`` (a read-only or full disk).
            Whatever ``build`` raises is raised as well, after the temporary folder is removed.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name[:32]}.tmp-", dir=dest.parent))
    try:
        build(tmp)
        if replace and (dest.exists() or dest.is_symlink()):
            aside = Path(tempfile.mkdtemp(prefix=f".{dest.name[:32]}.old-", dir=dest.parent))
            dest.rename(aside / dest.name)
            shutil.rmtree(aside, ignore_errors=True)
        try:
            os.rename(tmp, dest)
        except OSError:
            if not dest.is_dir():
                raise
            return False
        return True
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def open_entry(entry: Path, read: Callable[[Path], T], logger: logging.Logger, what: str) -> T | None:
    """Read a cache entry folder with ``read``, or None when it is missing or unusable.

    An unusable entry (a file where the folder should be, or anything ``read`` raises: a missing
    or damaged file, a stale ``meta.json``) is removed with one warning on ``logger`` naming it and
    what is wrong, so that it is rebuilt once and the rebuilt entry is reused by later runs. A
    ``MemoryError`` is raised instead: the entry may be fine, this process cannot hold it.

    Args:
        entry: The entry's folder.
        read: Loads the folder; raises whatever makes it unusable.
        logger: The caller's logger, so the warning names the cache it comes from.
        what: How the warning names the entry (``cache entry``, ``KB store entry``).
    """
    if not entry.exists() and not entry.is_symlink():
        return None
    try:
        if not entry.is_dir():
            raise ValueError("it is a file, not a folder")
        return read(entry)
    except MemoryError:
        raise
    # Anything that stops an entry from loading makes it unusable, whatever the exception;
    # it costs a rebuild, never a crash of this run and of every later one.
    except Exception as err:  # noqa: BLE001
        logger.warning("%s %s is unusable (%s: %s); rebuilding it", what, entry, type(err).__name__, err)
        remove_path(entry)
        return None


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
