"""JSONL record files (``predictions.jsonl``, ``retrieval.jsonl``): one writer, one reader.

A record is a JSON object with a string ``id``, one per line. Files are appended record by
record, so a killed process can leave any damage on the last line only (half a JSON text,
half a UTF-8 character, a partly flushed block of bytes). The reader drops such a last line
with a warning (and, when asked to repair, cuts the file back to its last good line, so
appending continues a valid file); damage on an earlier line is never skipped: it is an
error naming the file and the line.

``load_predictions`` reads a run's ``predictions.jsonl`` as every reader needs it, each record
judged by the current answer comparison (``metrics.judged``): the run resuming from it, the shard
merge and the comparison of runs. It lives here, below both the run and the reports, so that a
report reads a run's predictions without importing the run loop.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO, cast

from cbr2.common.errors import UserError
from cbr2.common.files import write_atomic
from cbr2.common.records import Prediction, Record
from cbr2.evaluation.metrics import judged

log = logging.getLogger(__name__)


def utf8_json(value: Any, **options: Any) -> str:
    """``json.dumps(value, **options)`` that UTF-8 can always encode.

    Non-ASCII text is written as is (readable files), except in a value that cannot be encoded
    as UTF-8 (a lone surrogate such as ``'\\ud800'`` in generated text): that value is written
    with ASCII escapes, which ``json.loads`` reads back to the identical string.
    """
    text = json.dumps(value, ensure_ascii=False, **options)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(value, ensure_ascii=True, **options)
    return text


def record_line(record: Record) -> str:
    """The JSONL line of ``record``, without its newline (``utf8_json``)."""
    return utf8_json(record)


def append_record(handle: TextIO, record: Record) -> None:
    """Append ``record`` as one line to ``handle`` (opened for text) and flush it to the file."""
    handle.write(record_line(record) + "\n")
    handle.flush()


def _parse(raw: bytes) -> tuple[Record | None, str]:
    """The record on one line, or None and what is wrong with it."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        return None, f"not UTF-8 ({err.reason} at byte {err.start})"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        return None, f"not JSON ({err.msg} at column {err.colno})"
    if not isinstance(value, dict):
        return None, f"a JSON {type(value).__name__}, not a record (an object with an id)"
    if not isinstance(value.get("id"), str):
        return None, "a JSON object without a string 'id'"
    return value, ""


def read_records(path: str | Path, repair: bool = False,
                 damaged: list[tuple[int, str]] | None = None) -> list[tuple[int, Record]]:
    """The records of a JSONL file with their (1-based) line numbers; none when it does not exist.

    A damaged last line (of any kind: cut JSON, cut UTF-8, garbage, a JSON value that is not a
    record) is dropped with a warning. With ``repair`` the file itself is cut back to its last
    good line, and a last record that lacks only its newline gets one, so that appending to it
    continues a valid file.

    Args:
        path: The file.
        repair: Fix the file in place (only its writer should: a reader of a file another
            process is appending to must not cut it).
        damaged: When given, a damaged line anywhere is noted here as ``(line, what is wrong)``
            and skipped instead of raising (the folder repair, which keeps the file whole).

    Raises:
        ValueError: Naming the file, the line and what is wrong, for damage before the last line.
    """
    path = Path(path)
    if not path.exists():
        return []
    data = path.read_bytes()
    # Split on b"\n" only: JSON text may hold U+2028 and friends, which str.splitlines() breaks on.
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()  # the newline that ends the last record
    records: list[tuple[int, Record]] = []
    offset = 0  # byte offset of the current line's start
    for lineno, raw in enumerate(lines, 1):
        record, problem = _parse(raw)
        if record is None and damaged is not None:
            damaged.append((lineno, problem))
        elif record is None:
            if lineno < len(lines):
                raise UserError(f"{path}:{lineno}: corrupt record ({problem}); remove the line or the file "
                                 "(a run folder: `python -m cbr2.run.repair FOLDER`)")
            log.warning("%s:%d: dropping the damaged last line (%s)%s", path, lineno, problem,
                        "; it is written again" if repair else "")
            if repair:
                with path.open("r+b") as handle:
                    handle.truncate(offset)
            return records
        else:
            records.append((lineno, record))
        offset += len(raw) + 1
    if repair and data and not data.endswith(b"\n"):  # a complete record, killed before its newline
        with path.open("ab") as handle:
            handle.write(b"\n")
    return records


TIMING_KEYS = frozenset({"latency_s"})
"""Keys that time a record rather than say what it is; also read inside its nested blocks
(``fallback``, ``single_pass``). Two records of a question that differ only there are the same
answer measured twice (two runs of a deterministic generator), not a conflict."""


def untimed(record: Record) -> Record:
    """``record`` without its ``TIMING_KEYS``, at the top and one level down."""
    return {k: ({kk: vv for kk, vv in v.items() if kk not in TIMING_KEYS} if isinstance(v, dict) else v)
            for k, v in record.items() if k not in TIMING_KEYS}


def records_by_id(path: str | Path, entries: Sequence[tuple[int, Record]],
                  supersedes: Callable[[Record, Record], bool] | None = None,
                  conflicts: list[tuple[int, int, str]] | None = None) -> dict[str, Record]:
    """The records of ``read_records`` by id, checking that a repeated id is legitimate.

    A later record of an id replaces the earlier one when the two are the same but for timing
    (``untimed``) or when ``supersedes(new, old)`` says the new one is a newer version of the
    old (e.g. a stale prediction generated again); any other repetition means two writers mixed
    their records.

    Args:
        path: The file, for messages.
        entries: ``read_records``' ``(line, record)`` pairs.
        supersedes: Whether a later record may replace an earlier one of its id.
        conflicts: When given, a conflicting repetition is noted here as ``(first line, later
            line, id)`` and the first record is kept, instead of raising (the folder repair).

    Raises:
        UserError: Naming the file, the id and both line numbers of a conflicting repetition.
    """
    found: dict[str, tuple[int, Record]] = {}
    for lineno, record in entries:
        qid = record["id"]
        if qid in found:
            first_line, old = found[qid]
            if untimed(record) != untimed(old) and not (supersedes and supersedes(record, old)):
                if conflicts is None:
                    raise UserError(
                        f"{path}: lines {first_line} and {lineno} both hold id {qid!r} with different content (two "
                        "runs wrote into this file?); `python -m cbr2.run.repair FOLDER` keeps one record "
                        "per question")
                conflicts.append((first_line, lineno, qid))
                continue
        found[qid] = (lineno, record)
    return {qid: record for qid, (_, record) in found.items()}


def is_pending(record: Record) -> bool:
    """Whether a prediction is a fallback's first pass still waiting for its correction."""
    return bool((record.get("fallback") or {}).get("pending"))


def supersedes(new: Record, old: Record) -> bool:
    """Whether ``new`` may replace the earlier record ``old`` of the same question: ``old`` was
    generated for another prompt or generation key (stale), or is a pending first pass."""
    stale = (new.get("prompt_hash"), new.get("generation_key")) != (old.get("prompt_hash"), old.get("generation_key"))
    return stale or is_pending(old)


def load_records(path: str | Path, repair: bool = False,
                 conflicts: list[tuple[int, int, str]] | None = None) -> dict[str, Record]:
    """The records of a JSONL file by id: the one reader of ``predictions.jsonl`` and
    ``retrieval.jsonl``, with the one policy for a repeated id (``records_by_id`` with
    ``supersedes``).

    A damaged last line (the process died mid-write) is dropped with a warning; with ``repair``
    (the run about to append to the file) the file is also cut back to its last good record.
    A question may appear again further down when its record was superseded: a fallback's
    pending first pass by its final record, or a record whose prompt or generation key is no
    longer the run's by one generated again. The newest record wins then; a repetition that is
    the same but for timing keeps the later one; any other is a conflict.

    Args:
        path: The file (missing: no records).
        repair: Fix a damaged last line in the file itself (only its writer should).
        conflicts: When given, a conflicting repetition is noted here and the first record kept
            (readers that show what they can: the run browser), instead of raising.

    Raises:
        UserError: Naming the file and line of a corrupt record before the last line, or both
            lines of a question recorded twice with different content that supersedes nothing.
    """
    return records_by_id(path, read_records(path, repair=repair), supersedes=supersedes, conflicts=conflicts)


def load_predictions(path: Path, repair: bool = False) -> dict[str, Prediction]:
    """The prediction records of a run folder's ``predictions.jsonl`` by question id
    (``load_records``: what a resumed run, a merge and a comparison read), each judged
    by the current answer comparison (``metrics.judged``).

    Args:
        path: The file.
        repair: The writer's read before it appends: a damaged last line is cut, and when a
            record's verdict was taken by an earlier comparison, the file is rewritten with the
            records as judged now, so that its ``correct`` fields agree with ``metrics.json``.

    Raises:
        UserError: As ``load_records``.
    """
    # The reader checks only that a line is an object with an id; the runner wrote it as a Prediction.
    found = cast(dict[str, Prediction], load_records(path, repair=repair))
    records = {qid: judged(record) for qid, record in found.items()}
    changed = sum(records[qid] != found[qid] for qid in found)
    if repair and changed:
        log.info("%s: %d cached predictions judged again by the current answer comparison; file rewritten",
                 path, changed)
        write_atomic(path, "".join(record_line(r) + "\n" for r in records.values()))
    return records
