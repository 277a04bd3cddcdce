"""``python -m cbr2.run.repair FOLDER``: mend a run folder that two runs wrote at once.

Runs now take their folder (``common.locks.hold_folder``), so this is for folders written
before that, or by two processes that could not see each other's lock (two machines on a file
system without working locks). Such a ``predictions.jsonl`` holds questions twice, with lines
of both writers interleaved and, rarely, a line cut by the other's write; every later run of
the folder stops on it.

The rule, the same one a resumed run applies to an intact file (``records.load_records``):

* a line that is not a whole record is dropped;
* of the records of one question, a later one replaces an earlier one when the two differ only
  in timing (``records.untimed``), or when it supersedes it (a fallback's pending first pass by
  its final record, a record of an older prompt or generation key by one generated again);
* when two records of a question conflict (different answers under the same prompt and
  generation key, e.g. a sampling backend run twice), the first one written is kept.

The kept records are written back in the order of their questions' first lines, the original
file is kept whole beside it as ``predictions.jsonl.damaged``, and a ``retrieval.jsonl`` that
no longer reads is moved aside the same way (every run writes it anew). Nothing is generated:
running the folder's command again then reuses every kept record, generates the questions
whose only lines were damaged, and rewrites ``metrics.json`` and ``report.md``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from cbr2.common.files import write_atomic
from cbr2.common.locks import hold_folder
from cbr2.evaluation.records import read_records, record_line, records_by_id, supersedes

log = logging.getLogger(__name__)

BACKUP_SUFFIX = ".damaged"
"""Appended to the name of a file the repair replaced: the original, kept whole (``.damaged.1`` ...
when an earlier repair's copy is there)."""


def _set_aside(path: Path) -> None:
    """Rename ``path`` to its first free backup name: no earlier copy is overwritten."""
    backup, n = path.with_name(path.name + BACKUP_SUFFIX), 0
    while backup.exists():
        n += 1
        backup = path.with_name(f"{path.name}{BACKUP_SUFFIX}.{n}")
    os.replace(path, backup)


def repair_folder(folder: str | Path) -> dict[str, int]:
    """Keep one valid record per question in ``folder/predictions.jsonl`` (the module's rule).

    Takes the folder first (refusing at once when a run is writing it). A file that already
    reads cleanly is left untouched.

    Returns:
        ``{"questions", "lines", "damaged", "replaced", "conflicts"}``: questions kept, lines
        read, lines that were no record, records replaced by a later one of their question,
        conflicting records dropped (the first of each question kept).

    Raises:
        FileNotFoundError: If the folder has no ``predictions.jsonl``.
        FolderBusy: If a run holds the folder.
    """
    folder = Path(folder)
    path = folder / "predictions.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file; FOLDER is a run's output folder")
    with hold_folder(folder, wait_s=0):
        damaged: list[tuple[int, str]] = []
        conflicts: list[tuple[int, int, str]] = []
        entries = read_records(path, damaged=damaged)
        kept = records_by_id(path, entries, supersedes=supersedes, conflicts=conflicts)
        for lineno, problem in damaged:
            log.warning("%s:%d: dropped, not a record (%s)", path, lineno, problem)
        for first, later, qid in conflicts:
            log.warning("%s: question %r: kept line %d, dropped line %d (different answers; the first one written "
                        "is kept)", path, qid, first, later)
        summary = {"questions": len(kept), "lines": len(entries) + len(damaged), "damaged": len(damaged),
                   "replaced": len(entries) - len(kept) - len(conflicts), "conflicts": len(conflicts)}
        if summary["lines"] > summary["questions"]:
            _set_aside(path)
            write_atomic(path, "".join(record_line(r) + "\n" for r in kept.values()))
        retrieval = folder / "retrieval.jsonl"
        bad: list[tuple[int, str]] = []
        clashes: list[tuple[int, int, str]] = []
        records_by_id(retrieval, read_records(retrieval, damaged=bad), conflicts=clashes)
        if bad or clashes:
            log.warning("%s: %d damaged lines, %d questions twice; moved aside as %s%s (the next run writes it anew)",
                        retrieval, len(bad), len(clashes), retrieval.name, BACKUP_SUFFIX)
            _set_aside(retrieval)
    return summary


def main(argv: list[str] | None = None) -> int:
    """The command line: ``python -m cbr2.run.repair FOLDER [FOLDER ...]``."""
    from cbr2.common.console import setup_logging

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", metavar="FOLDER", help="run output folders (holding predictions.jsonl)")
    args = parser.parse_args(argv)
    setup_logging()
    status = 0
    for folder in args.folders:
        try:
            s = repair_folder(folder)
        except OSError as err:  # no predictions.jsonl, or a run holds the folder (FolderBusy)
            print(f"error: {err}", file=sys.stderr)
            status = 2
            continue
        if s["lines"] == s["questions"]:
            print(f"{folder}: predictions.jsonl is intact ({s['questions']} questions, one record each)")
            continue
        print(f"{folder}: kept {s['questions']} records of {s['lines']} lines ({s['replaced']} replaced by a later "
              f"record, {s['conflicts']} conflicting dropped, {s['damaged']} damaged lines dropped); the original is "
              f"predictions.jsonl{BACKUP_SUFFIX}. Run the same command again: it reuses these records and rewrites "
              "metrics.json.")
    return status


if __name__ == "__main__":
    sys.exit(main())
