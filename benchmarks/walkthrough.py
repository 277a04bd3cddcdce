"""The walk-through's figure: new questions over your own KB, asked through the API, scored by hand.

    .venv/bin/python benchmarks/walkthrough.py                          # the CPU default over examples/university
    .venv/bin/python benchmarks/walkthrough.py llm.model=qwen2.5-coder-1.5b --traces /tmp/traces.jsonl

Each question of the questions file (``examples/university/questions.yaml``: 11 questions over
``kb.tsv``, none of them among the cases) is asked with ``KBQA.ask`` over ``--kb`` and
``--cases``, exactly as ``python -m cbr2.service.ask`` asks it: the API has no gold side, so the
script compares the executed answer with the question's own answer, as sets of values (the form
of a ``custom`` question's answer, ``cbr2.data.cases``: their order is free). That file is read as
a cases file is, so each gold answer is what its gold program computes on the KB.

Questions are asked one at a time, not as one batch, so that each has its own seconds (llama.cpp
answers a batch in turn anyway). The report names the machine, the load average before and after
(the cores may be shared: other work stretches every second) and the seconds of the load, which
include training the structural retriever when none was trained on the cases file as it is now.
Exit status 0 whatever the score: it is a measurement, not a test (``tests/test_walkthrough.py``
runs it with a fake LLM that writes the gold programs, where every answer must be right).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "university"


@dataclass
class Row:
    """One question asked: what came back and whether it is the gold answer."""

    question: str
    gold: list[str]
    answer: str | list[str] | None
    right: bool
    seconds: float
    error: str | None
    trace: dict[str, Any] = field(repr=False)


@dataclass
class Result:
    """The whole run: its rows and what it ran on."""

    rows: list[Row]
    load_s: float
    info: dict[str, Any]
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]

    @property
    def right(self) -> int:
        return sum(row.right for row in self.rows)


def same_answer(answer: str | list[str] | None, gold: Sequence[str]) -> bool:
    """Whether an executed answer is the gold one, as sets of values (an answer of one value may
    come as a string)."""
    if answer is None:
        return False
    values = [answer] if isinstance(answer, str) else list(answer)
    return set(values) == set(gold)


def loadavg() -> tuple[float, float, float]:
    """The 1-, 5- and 15-minute load averages (zeros where the system does not say)."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return 0.0, 0.0, 0.0
    return round(one, 2), round(five, 2), round(fifteen, 2)


def machine() -> str:
    """The CPU's model, its cores and the memory, in one line (what the seconds were measured on)."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = ""
    try:
        kib = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                       if line.startswith("MemTotal:")))
        memory = f", {kib / 2**20:.0f} GiB"
    except (OSError, StopIteration, ValueError):
        pass
    return f"{model}, {os.cpu_count()} cores{memory}"


def run(kb: Path, cases: Path, questions: Path, config: Sequence[str] = (), overrides: Sequence[str] = ()) -> Result:
    """Load once, then ask each question of ``questions`` in turn and score it.

    Args:
        kb: The KB file (``--kb``).
        cases: Its solved cases (``--cases``).
        questions: New questions in the cases file's form, each with its program (and answer).
        config: ``--config`` files.
        overrides: ``key=value`` pairs, as ``ask`` takes them.
    """
    from cbr2.data.cases import load_cases
    from cbr2.data.kb_loaders import load_custom_kb
    from cbr2.service import KBQA

    # The gold answers as the gold programs compute them on the KB (the reader checks a given
    # answer against its program, so a wrong line in the file stops here, not in the score).
    gold = load_cases(questions, load_custom_kb(kb))
    load_before = loadavg()
    start = time.perf_counter()
    kbqa = KBQA.load(list(config), list(overrides), kb=kb, cases=cases)
    load_s = time.perf_counter() - start
    rows = []
    for q in gold:
        start = time.perf_counter()
        answer = kbqa.ask(q.question)
        seconds = time.perf_counter() - start
        error = answer.trace["error"]
        rows.append(Row(q.question, list(q.answer), answer.answer, same_answer(answer.answer, q.answer), seconds,
                        f"{error['kind']}: {error['message']}" if error else None, answer.trace))
    return Result(rows, load_s, kbqa.info(), load_before, loadavg())


def _shown(answer: str | list[str] | None) -> str:
    if not answer:  # None (no program ran) or [] (it ran to nothing)
        return "—"
    return "; ".join(answer) if isinstance(answer, list) else answer


def report(result: Result, questions: Path) -> str:
    """The table: the setting and machine, one line per question, the total."""
    info, rows = result.info, result.rows
    views = info["case_views"]
    out = [
        (f"walk-through: {len(rows)} questions of {_relative(questions)}, {info['cases']} cases, "
         f"KB {info['kb'].get('entities', '?')} entities"),
        f"model: {info['backend']} {info['model']}; case views {', '.join(views['used'])} ({views['why']})",
        f"structural retriever: {info['structural_retriever']}",
        f"machine: {machine()}; {time.strftime('%Y-%m-%d %H:%M %Z')}",
        f"load average before: {' '.join(map(str, result.load_before))}; loaded in {result.load_s:.1f} s",
        "",
        f" {'#':>2}  {'':5}  {'s':>5}  question → answer",
    ]
    for n, row in enumerate(rows, 1):
        line = f" {n:>2}  {'right' if row.right else 'wrong':5}  {row.seconds:5.1f}  {row.question} → " \
               f"{_shown(row.answer)}"
        if not row.right:
            line += f"  (gold: {_shown(row.gold)})"
            if row.error:
                line += f"  [{row.error}]"
        out.append(line)
    per_question = sum(row.seconds for row in rows) / len(rows) if rows else 0.0
    out += ["", (f"right {result.right}/{len(rows)}; {per_question:.1f} s per question (wall, one at a time); "
                 f"load average after: {' '.join(map(str, result.load_after))}")]
    return "\n".join(out) + "\n"


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def parser() -> argparse.ArgumentParser:
    """The command line (also what ``tests/test_walkthrough.py`` checks the doc's command against)."""
    from cbr2.config.cli import add_config_arguments

    p = argparse.ArgumentParser(prog="python benchmarks/walkthrough.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(p)  # key=value overrides and --config, as ask takes them
    p.add_argument("--kb", type=Path, default=EXAMPLE / "kb.tsv", metavar="FILE",
                   help="the KB file (default: the walk-through's)")
    p.add_argument("--cases", type=Path, default=EXAMPLE / "cases.yaml", metavar="FILE", help="its solved cases")
    p.add_argument("--questions", type=Path, default=EXAMPLE / "questions.yaml", metavar="FILE",
                   help="new questions with their programs, in the cases file's form")
    p.add_argument("--traces", type=Path, metavar="FILE", help="also write each question's trace, one JSON a line")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run and print the table; 2 on a user error (one line)."""
    args = parser().parse_intermixed_args(argv)
    from cbr2.common.console import setup_logging
    from cbr2.common.errors import UserError

    setup_logging()  # logs on stderr; the table alone on stdout
    try:
        result = run(args.kb, args.cases, args.questions, args.config, args.overrides)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.traces:
        with args.traces.open("w", encoding="utf-8") as out:
            for row in result.rows:
                out.write(json.dumps(row.trace, ensure_ascii=False) + "\n")
    sys.stdout.write(report(result, args.questions))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))  # run as a script from anywhere: the package is the checkout's
    sys.exit(main())
