"""What the command line shows: one logging setup, and progress that reads well in a log file.

Every entry point calls ``setup_logging`` first. It gives the project, Lightning and the
libraries one handler on stderr (stdout stays for results and ``--show-prompt``), and silences
third-party messages that tell a user nothing (tips, deprecation notices of library internals,
download bars of files that are already local); warnings that can matter (a monitored metric
that is missing, an unreachable W&B server) are kept.

``Progress`` is the progress display of long loops (generation, encoding, training): a tqdm bar
on a terminal, and on a file or pipe a line every ``LINE_EVERY_S`` seconds with the rate and the
time left, so a log shows where a job is while it runs, not only when it ends.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
import sys
import time
import warnings
from collections.abc import Iterable
from types import TracebackType
from typing import Any

FORMAT = "%(levelname)s %(name)s: %(message)s"

LINE_EVERY_S = 30.0
"""Seconds between two progress lines when stderr is not a terminal."""

# Messages that say nothing to a user of this project, by logger, as regular expressions.
_QUIET_MESSAGES = {
    "lightning.pytorch.utilities.rank_zero": (
        r"^(TPU|HPU|IPU) available", r"^GPU available: False", r"^💡 Tip", r"Loading `train_dataloader` to estimate",
    ),
    "lightning.fabric.utilities.seed": (r"^Seed set to",),
}
# Libraries whose INFO messages repeat what the project logs itself (model paths, devices).
_WARNING_ONLY = ("sentence_transformers", "httpx", "urllib3", "filelock", "faiss.loader")
# Warnings about library internals, not about anything the user configured.
_QUIET_WARNINGS = (
    r".*isinstance\(treespec, LeafSpec\)",
    r"Your `IterableDataset` has `__len__` defined",  # the pair dataset's length is exact: one process
    r"The `srun` command is available on your system but is not used",  # a local run on a Slurm login node
    r"The anonymous setting has no effect",
)


class _DropMessages(logging.Filter):
    def __init__(self, patterns: tuple[str, ...]):
        super().__init__()
        self.patterns = [re.compile(p) for p in patterns]

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(p.search(message) for p in self.patterns)


def setup_logging(level: int = logging.INFO) -> None:
    """Route every logger to one stderr handler and silence messages that say nothing to a user.

    Safe to call more than once. Environment variables it sets (only where unset):
    ``WANDB_SILENT`` (W&B's own console lines; the project logs where the run is and how to sync
    it) and ``HF_HUB_DISABLE_PROGRESS_BARS`` (bars of local files loading in well under a second).
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    route_library_loggers()
    for name, patterns in _QUIET_MESSAGES.items():
        logger = logging.getLogger(name)
        logger.filters = [f for f in logger.filters if not isinstance(f, _DropMessages)]
        logger.addFilter(_DropMessages(patterns))
    for name in _WARNING_ONLY:
        logging.getLogger(name).setLevel(logging.WARNING)
    for pattern in _QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    os.environ.setdefault("WANDB_SILENT", "true")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    # The libraries read that variable when imported; an entry point may have imported them already.
    if os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1":
        if "huggingface_hub" in sys.modules:
            sys.modules["huggingface_hub"].utils.disable_progress_bars()
        if "transformers" in sys.modules:
            sys.modules["transformers"].utils.logging.disable_progress_bar()


def route_library_loggers() -> None:
    """Send Lightning's loggers through the root handler only.

    Importing ``lightning`` gives its logger a handler of its own (and, before logging is set up,
    its subpackages too), so each of its messages was printed twice: by it and by the root
    handler. ``setup_logging`` calls this, and so does every module that imports Lightning, for
    the case where that import comes after the setup (training on demand inside an evaluation).
    """
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning", "lightning_fabric"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True


def did_you_mean(value: object, choices: Iterable[object], n: int = 2, cutoff: float = 0.6) -> str:
    """`` (did you mean A or B?)`` for the choices closest to ``value``, or ``""`` when none is close.

    Every "unknown X" message of the project (config keys and values, ablations, backends,
    packaged models) appends this, so a misspelling gets the same suggestion everywhere.
    """
    close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=n, cutoff=cutoff)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


def duration(seconds: float) -> str:
    """``42 s``, ``3 min 05 s``, ``1 h 12 min``."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def progress_line(desc: str, done: int, total: int | None, elapsed_s: float, unit: str = "it",
                  postfix: str = "") -> str:
    """``generate 12/27 (44%) · 6.4 s/q · 1 min 17 s elapsed · about 1 min 36 s left``."""
    parts = [f"{desc} {done}/{total} ({100 * done / total:.0f}%)" if total else f"{desc} {done}"]
    if done:
        per = elapsed_s / done
        parts.append(f"{per:.1f} s/{unit}" if per >= 1 else f"{1 / per:.1f} {unit}/s")
    parts.append(f"{duration(elapsed_s)} elapsed")
    if done and total and done < total:
        parts.append(f"about {duration(elapsed_s / done * (total - done))} left")
    if postfix:
        parts.append(postfix)
    return " · ".join(parts)


class Progress:
    """A progress display: tqdm on a terminal, a logged line every ``every_s`` seconds otherwise.

    Used as a context manager, like tqdm::

        with Progress(total=len(todo), desc="generate", unit="q") as bar:
            bar.update()

    Args:
        total: Number of items, or None when unknown.
        desc: What is being done (the line's first word).
        unit: Name of one item.
        initial: Items already done (a resumed job).
        every_s: Seconds between lines when stderr is not a terminal.
        logger: Where lines go (default: this module's logger).
        disable: Show nothing.
    """

    def __init__(self, total: int | None, desc: str, unit: str = "it", initial: int = 0,
                 every_s: float = LINE_EVERY_S, logger: logging.Logger | None = None, disable: bool = False):
        self.total, self.desc, self.unit, self.done = total, desc, unit, initial
        self.every_s, self.log = every_s, logger or logging.getLogger("cbr2.progress")
        self.disable, self.postfix = disable, ""
        self._initial = initial
        self._start = self._last = time.perf_counter()
        self._bar: Any = None
        if not disable and sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True)

    def update(self, n: int = 1) -> None:
        """Count ``n`` more items done."""
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
            return
        now = time.perf_counter()
        if not self.disable and now - self._last >= self.every_s and (self.total is None or self.done < self.total):
            self._last = now
            self.log.info("%s", self.line())

    def set_postfix(self, text: str) -> None:
        """Extra text at the end of the line (e.g. the current loss)."""
        self.postfix = text
        if self._bar is not None:
            self._bar.set_postfix_str(text)

    def line(self) -> str:
        """The current progress line; rates count only the items done in this process."""
        elapsed = time.perf_counter() - self._start
        done_here = self.done - self._initial
        total_here = None if self.total is None else self.total - self._initial
        text = progress_line(self.desc, done_here, total_here, elapsed, self.unit, self.postfix)
        if self._initial:
            text += f" · {self._initial} done before"
        return text

    def close(self) -> None:
        """End the display; off a terminal, a final line says how long it took."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif not self.disable and self.done > self._initial:
            self.log.info("%s", self.line())
        self.disable = True

    def __enter__(self) -> Progress:  # noqa: PYI034 - a final class; Self needs Python 3.11
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
