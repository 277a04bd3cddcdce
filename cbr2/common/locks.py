"""Build-once locks for what concurrent jobs share on disk (embedding cache, converted LLM,
the embedded benchmark's structural retriever).

Every entry is already written atomically (temporary folder, then rename), so a reader never
sees half of one. The lock adds that N job-array tasks starting together on a cold cache build
an entry once: the first task builds, the others wait and then load what it wrote. The lock is
``fcntl.flock`` on a file beside the entry (through ``filelock``), which Linux also honours on
NFS; it is released when its process dies, so a killed build never blocks later jobs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

log = logging.getLogger(__name__)


@contextmanager
def build_lock(target: str | Path, what: str) -> Iterator[None]:
    """Hold the exclusive lock of ``target`` (``.{name}.lock`` beside it) while building it.

    Callers check again for a finished ``target`` once inside: another process may have built
    it while this one waited.

    Args:
        target: The file or folder about to be built.
        what: What is built, for the log line when another process holds the lock.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(target.parent / f".{target.name}.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log.info("another process is building %s; waiting for it (%s)", what, lock.lock_file)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()
