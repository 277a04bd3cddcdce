"""Locks of what concurrent jobs share on disk: build-once locks of caches (embedding cache,
converted LLM, the embedded benchmark's structural retriever), and the one-writer lock of a run
folder (``hold_folder``).

Every entry is already written atomically (temporary folder, then rename:
``cbr2.common.files.publish_folder``), so a reader never sees half of one. The lock adds that N job-array tasks starting together on a cold cache build
an entry once: the first task builds, the others wait and then load what it wrote. The lock is
``fcntl.flock`` on a file beside the entry (through ``filelock``), which Linux also honours on
NFS; it is released when its process dies, so a killed build never blocks later jobs.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from cbr2.common.errors import UserError

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


FOLDER_LOCK = ".lock"
"""The file in a run folder whose lock says which process writes the folder (``hold_folder``)."""

_POLL_S = 0.5


class FolderBusy(UserError, OSError):
    """Another live process holds a run folder (``hold_folder``); the message names it."""


def _holder() -> dict[str, Any]:
    """Who takes a folder: host, pid, start time, the Slurm job when there is one, the command."""
    job = os.environ.get("SLURM_JOB_ID")
    if job and os.environ.get("SLURM_ARRAY_TASK_ID"):
        job = f"{os.environ.get('SLURM_ARRAY_JOB_ID', job)}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return {"host": socket.gethostname(), "pid": os.getpid(),
            "started": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "slurm_job": job,
            "command": " ".join(sys.argv)}


def describe_holder(path: Path) -> str:
    """The holder a folder's lock file names, in words (it may be empty for an instant after a take)."""
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
        where = f"pid {info['pid']} on host {info['host']} since {info['started']}"
    except (OSError, ValueError, TypeError, KeyError):
        return "a process that has just taken it"
    job = f", Slurm job {info['slurm_job']}" if info.get("slurm_job") else ""
    return f"{where}{job} ({info.get('command', '?')})"


@contextmanager
def hold_folder(folder: str | Path, wait_s: float) -> Iterator[None]:
    """Be the one writer of ``folder`` while inside: an exclusive ``flock`` on ``folder/.lock``.

    The lock file names its holder (``_holder``) for whoever finds the folder taken. The kernel
    releases the lock when the holder's process dies, however it dies (a killed job, a node
    whose processes are gone), so a dead run never blocks the next one; Linux emulates
    ``flock`` with byte-range locks on NFS, so two nodes of a cluster see each other's lock.

    Args:
        folder: The folder (it exists).
        wait_s: How long to wait for a live holder to finish before giving up (0: refuse at once).
            Polled, so the wait is bounded whatever the holder does.

    Raises:
        FolderBusy: Naming the holder, when it still holds the folder after ``wait_s``.
    """
    path = Path(folder) / FOLDER_LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # never O_TRUNC: the holder's name is in there
    try:
        deadline = time.monotonic() + wait_s
        waited = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise FolderBusy(f"{folder} is being written by {describe_holder(path)}; two runs in one "
                                     "folder would mix their records. Wait for it to end, stop it, or choose "
                                     "another output_dir" + (f" (waited {wait_s:.0f} s, eval.folder_wait_s)"
                                                             if wait_s > 0 else "")) from None
                if not waited:
                    log.warning("%s is being written by %s; waiting up to %.0f s for it to end (eval.folder_wait_s)",
                                folder, describe_holder(path), wait_s)
                    waited = True
                time.sleep(min(_POLL_S, left))
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(_holder()) + "\n").encode("utf-8"), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)  # a free folder names nobody; the lock itself goes with the close
    finally:
        os.close(fd)
