"""What the command line shows: one logging setup, and progress that reads well in a log file.

Every entry point calls ``setup_logging`` first. It gives the project, Lightning and the
libraries one handler on stderr (stdout stays for results and ``--show-prompt``), and silences
third-party messages that tell a user nothing (tips, deprecation notices of library internals,
download bars of files that are already local); warnings that can matter (a monitored metric
that is missing, an unreachable W&B server) are kept.

``progress`` is the display of long loops (generation, encoding, training): a tqdm bar on a
terminal, and on a file or pipe a line every ``LINE_EVERY_S`` seconds with the rate and the time
left (tqdm's ``mininterval``), so a log shows where a job is while it runs, not only when it ends.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
import sys
import warnings
from collections.abc import Iterable
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


class StderrHandler(logging.StreamHandler):
    """A handler that writes to ``sys.stderr`` as it is when a message is logged, not as it was when
    logging was set up: a process that replaces ``sys.stderr`` later (a server's, a notebook's, a
    caller that captures it) keeps its messages, and a closed stream is never written to."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self) -> Any:  # the attribute StreamHandler reads and writes
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:  # StreamHandler's own assignment, ignored
        pass


def setup_logging(level: int = logging.INFO) -> None:
    """Route every logger to one stderr handler and silence messages that say nothing to a user.

    Safe to call more than once. Environment variables it sets (only where unset):
    ``WANDB_SILENT`` (W&B's own console lines; the project logs where the run is and how to sync
    it) and ``HF_HUB_DISABLE_PROGRESS_BARS`` (bars of local files loading in well under a second).
    """
    handler = StderrHandler()
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


_CURSOR_MOVES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class _LogLines:
    """A file for tqdm that logs each status it writes as one line (tqdm writes ``\\r`` + status)."""

    def __init__(self, logger: logging.Logger):
        self.log = logger

    def write(self, text: str) -> None:
        # A display opened inside another (encoding inside "retrieve") sits one row lower, and
        # tqdm moves the cursor back up with an escape sequence: meaningless in a log line.
        text = _CURSOR_MOVES.sub("", text).strip()
        if text:
            self.log.info("%s", text)

    def flush(self) -> None:
        pass


# Off a terminal: one line per status, the numbers a log reader wants and no bar.
_LINE = ("{desc} {n_fmt}/{total_fmt} ({percentage:.0f}%) · {rate_fmt} · {elapsed} elapsed · about {remaining} left"
         "{postfix}")
_LINE_NO_TOTAL = "{desc} {n_fmt} · {rate_fmt} · {elapsed} elapsed{postfix}"


def progress(total: int | None, desc: str, unit: str = "it", initial: int = 0, logger: logging.Logger | None = None,
             disable: bool = False, unit_scale: bool = False) -> Any:
    """A tqdm progress display: a bar on a terminal, a logged line every ``LINE_EVERY_S`` seconds otherwise.

    Off a terminal the lines go through ``logger``: one when the loop starts, then at an update
    at least ``LINE_EVERY_S`` seconds after the last line, and one when it closes. Rates and the
    time left count only the items done in this process (``initial`` were done before). Used as
    a context manager, like any tqdm::

        with progress(total=len(todo), desc="generate", unit="q") as bar:
            bar.update()

    Args:
        total: Number of items, or None when unknown.
        desc: What is being done (the line's first word).
        unit: Name of one item.
        initial: Items already done (a resumed job).
        logger: Where lines go off a terminal (default: ``cbr2.progress``).
        disable: Show nothing.
        unit_scale: Write counts with SI prefixes (``12.3MB``), for bytes.

    Returns:
        The ``tqdm`` object (``update``, ``set_postfix_str``, ``n``, ``close``).
    """
    from tqdm import tqdm

    if sys.stderr.isatty():
        return tqdm(total=total, initial=initial, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True,
                    disable=disable, unit_scale=unit_scale)
    # miniters=1: at most one line per LINE_EVERY_S, decided at each update; tqdm's adaptive
    # miniters would let its monitor thread print between updates. smoothing=0: average rates.
    return tqdm(total=total, initial=initial, desc=desc, unit=unit, disable=disable, unit_scale=unit_scale,
                file=_LogLines(logger or logging.getLogger("cbr2.progress")), mininterval=LINE_EVERY_S,
                miniters=1, smoothing=0, bar_format=_LINE if total is not None else _LINE_NO_TOTAL)
