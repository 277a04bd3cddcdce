"""The results pages' tables that run folders determine, printed as Markdown and checked against a page.

    python benchmarks/results_tables.py ladder RUN_DIR...                      # Table 5 per model
    python benchmarks/results_tables.py categories RUN_DIR...                  # Table 5 per category
    python benchmarks/results_tables.py versus BASE RUN_DIR... --label TEXT... # each run against BASE
    python benchmarks/results_tables.py runs RUN_DIR... --label TEXT...        # Hits@1, SER, s / question, n
    ... --check docs/results/cpu-default.md [--section HEADING]

Every figure comes from the project's own code: runs are read by ``cbr2.report.compare.load_run``,
Table 5's rows (Δ against the full run of the same LLM and seed, its 95% paired bootstrap interval
and the flips) by ``compare.table_data``, a pair's Δ by ``cbr2.evaluation.metrics.paired_difference``
over the questions both runs answered, each answer judged by the current comparison
(``records.load_predictions``). So a user who reruns a page's commands gets its rows back, and
``--check`` says which cells of the page's table agree with them.

``--check PAGE`` finds the page's table with the printed table's columns (under ``--section`` when
given; else the one where most cells agree), then each printed row by its first cell, and compares
the numbers of each cell. A page cell may state fewer numbers than the printed one (a row that omits
its flips); ``;`` in a page cell separates figures of different runs (another commit or host, marked
on the page), and the printed cell must agree with one of them; ``·`` separates the parts of one
figure (full · w/o knowledge). Cells the runs do not give (no run of that setting) are not compared.
Exit status 0 when every compared cell agrees, 1 when one differs or a row is not on the page, 2 on
unreadable runs.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

MINUS = "−"
"""The pages' minus sign (U+2212)."""
TOLERANCE = 0.006
"""Two numbers agree when they differ by less than this: the pages print two decimals at most."""
NUMBER = re.compile(r"[+\-−]?\d+(?:,\d{3})*(?:\.\d+)?")
"""A figure as the pages write it: a sign, thousands with commas, decimals (superscript footnote marks are not digits)."""


@dataclass
class Table:
    """A table as printed: its header and its rows of cells, the first cell of a row its key."""

    header: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        aligned = "|---|" + "---:|" * (len(self.header) - 1)
        lines = ["| " + " | ".join(self.header) + " |", aligned]
        lines += ["| " + " | ".join(_escape(c) for c in row) + " |" for row in self.rows]
        return "\n".join(lines) + "\n"


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def signed(value: float) -> str:
    """A difference in points as the pages print it: a sign always, the minus sign U+2212."""
    return f"{value:+.2f}".replace("-", MINUS)


def interval(low: float, high: float) -> str:
    return f"[{signed(low)}, {signed(high)}]"


def flips(gained: int, lost: int) -> str:
    return f"+{gained} / {MINUS}{lost}"


def _seconds(metrics: dict[str, Any]) -> float | None:
    return (metrics.get("generation") or {}).get("seconds_per_question")


def _tokens(metrics: dict[str, Any]) -> float | None:
    return (metrics.get("generation") or {}).get("prompt_tokens")


def _number(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def _labels(labels: Sequence[str], run_dirs: Sequence[str]) -> list[str]:
    """The rows' first cells: the labels given, else the run folders."""
    from cbr2.common.errors import UserError

    if labels and len(labels) != len(run_dirs):
        raise UserError(f"{len(run_dirs)} runs but {len(labels)} --label values")
    return list(labels) or [str(d) for d in run_dirs]


def _load(run_dirs: Sequence[str]) -> list[dict[str, Any]]:
    from cbr2.report.compare import load_run

    return [load_run(d) for d in run_dirs]


# --- the tables ---------------------------------------------------------------------------------


def ladder(run_dirs: Sequence[str]) -> Table:
    """Table 5 per model: a row per setting, a column per model (by size), each cell Hits@1 (%) and,
    against the full run of that model, Δ [95% CI], flips; a last row of seconds per question of the
    full and the w/o knowledge run.

    Raises:
        ReportError: As ``compare.table_data`` (runs of different benchmarks or splits), or two runs
            of one setting and model (give the runs of one commit and host at a time).
    """
    from cbr2.llm.packaged import parameters_b
    from cbr2.report.compare import ReportError, table_data

    runs = _load(run_dirs)
    data = table_data(runs)
    seconds = {str(r["dir"]): _seconds(r["metrics"]) for r in runs}
    models = list(dict.fromkeys(row["llm"]["model"] for row in data["rows"]))
    models.sort(key=lambda m: (parameters_b(m) is None, parameters_b(m) or 0.0, str(m)))
    cells: dict[str, dict[Any, dict[str, Any]]] = {}
    for row in data["rows"]:
        by_model = cells.setdefault(row["base"], {})
        model = row["llm"]["model"]
        if model in by_model:
            raise ReportError(f"two runs of {row['base']} with {model} ({by_model[model]['run_dir']}, "
                              f"{row['run_dir']}): give the runs of one commit and host at a time")
        by_model[model] = row
    rows = [[setting, *(_ladder_cell(by_model.get(m)) for m in models)] for setting, by_model in cells.items()]

    def spq(model: Any, base: str) -> str:
        row = next((r for r in data["rows"] if r["llm"]["model"] == model and r["ablation"] == base), None)
        return _number(None if row is None else seconds[row["run_dir"]])

    rows.append(["s / question, full · w/o knowledge",
                 *(f"{spq(m, 'full')} · {spq(m, 'w/o_knowledge')}" for m in models)])
    return Table(["setting", *(str(m) for m in models)], rows, data["notes"])


def _ladder_cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return "—"
    text = f"{row['overall']:.2f}"
    if row["delta_vs_full"] is not None:
        parts = [signed(row["delta_vs_full"])]
        if row["delta_ci"]:
            parts[0] += " " + interval(*row["delta_ci"])
        if row["flips"]:
            parts.append(flips(row["flips"]["gained"], row["flips"]["lost"]))
        text += f" ({', '.join(parts)})"
    return text


def categories(run_dirs: Sequence[str]) -> Table:
    """Table 5 in the paper's layout: a row per run, Hits@1 (%) per category and overall, Δ against the
    full run of the same LLM and seed with its 95% paired interval and flips, seconds per question."""
    from cbr2.report.compare import table_data

    runs = _load(run_dirs)
    data = table_data(runs)
    seconds = {str(r["dir"]): _seconds(r["metrics"]) for r in runs}
    header = ["setting", *(c["header"] for c in data["columns"]), "Overall", "Δ vs full", "95% CI", "flips",
              "s / question"]
    rows = []
    for row in data["rows"]:
        per = [_number(v) for v in row["per_category"].values()]
        delta = "—" if row["delta_vs_full"] is None else signed(row["delta_vs_full"])
        ci = "—" if not row["delta_ci"] else interval(*row["delta_ci"])
        flipped = "—" if not row["flips"] else flips(row["flips"]["gained"], row["flips"]["lost"])
        rows.append([row["setting"], *per, f"{row['overall']:.2f}", delta, ci, flipped,
                     _number(seconds[row["run_dir"]])])
    return Table(header, rows, data["notes"])


def versus(base_dir: str, run_dirs: Sequence[str], labels: Sequence[str]) -> Table:
    """Each run against one base run (without → with a switch): both Hits@1 (%), Δ with its 95% paired
    bootstrap interval and the flips over the questions both answered, the programs that differ, and
    both runs' seconds per question and prompt tokens."""
    from cbr2.evaluation.metrics import paired_difference
    from cbr2.evaluation.records import load_predictions

    base, *others = _load([base_dir, *run_dirs])
    labels = _labels(labels, run_dirs)

    def records(run: dict[str, Any]) -> dict[str, Any]:
        path = Path(run["dir"]) / "predictions.jsonl"
        return load_predictions(path) if path.is_file() else {}

    ref = records(base)
    header = ["pair", "without", "with", "Δ", "95% CI", "flips", "programs changed",
              "s / question, without · with", "prompt tokens, without · with"]
    rows, notes = [], []
    for label, run in zip(labels, others, strict=True):
        mine = records(run)
        common = sorted(mine.keys() & ref.keys())
        if len(common) < max(len(mine), len(ref)):
            notes.append(f"{label}: {len(common)} questions in common ({len(ref)} in the base, {len(mine)} here)")
        d = paired_difference([bool(mine[q].get("correct")) for q in common],
                              [bool(ref[q].get("correct")) for q in common])
        changed = sum(_program(mine[q]) != _program(ref[q]) for q in common)
        rows.append([label, f"{100 * base['metrics']['hits@1']:.2f}", f"{100 * run['metrics']['hits@1']:.2f}",
                     signed(100 * d["delta"]), interval(100 * d["low"], 100 * d["high"]),
                     flips(d["a_only"], d["b_only"]), str(changed),
                     f"{_number(_seconds(base['metrics']))} · {_number(_seconds(run['metrics']))}",
                     f"{_number(_tokens(base['metrics']), 0)} · {_number(_tokens(run['metrics']), 0)}"])
    return Table(header, rows, notes)


def _program(record: dict[str, Any]) -> str | None:
    """The program a prediction ran (its text as generated when it had none)."""
    return record.get("program") or record.get("generated")


def runs_table(run_dirs: Sequence[str], labels: Sequence[str]) -> Table:
    """One row per run: Hits@1 (%), SER (%), seconds per question and the number of questions."""
    loaded = _load(run_dirs)
    labels = _labels(labels, run_dirs)
    rows = [[label, f"{100 * r['metrics']['hits@1']:.2f}", f"{100 * r['metrics']['ser']:.2f}",
             _number(_seconds(r["metrics"])), str(r["metrics"]["n"])] for label, r in zip(labels, loaded, strict=True)]
    return Table(["run", "Hits@1 (%)", "SER (%)", "s / question", "n"], rows)


# --- checking a page -----------------------------------------------------------------------------


@dataclass
class PageTable:
    heading: str
    header: list[str]
    rows: list[list[str]]


def _cells(line: str) -> list[str]:
    inner = line.strip()
    inner = inner.removeprefix("|")
    inner = inner[:-1] if inner.endswith("|") and not inner.endswith("\\|") else inner
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", inner)]


def page_tables(text: str) -> list[PageTable]:
    """The Markdown tables of a page (outside fenced code), each with the heading it stands under."""
    tables, heading, block, fenced = [], "", [], False
    for line in [*text.splitlines(), ""]:
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and line.lstrip().startswith("|"):
            block.append(line)
            continue
        if len(block) >= 2 and re.fullmatch(r"\|?[\s:|-]+\|?", block[1].strip()):
            tables.append(PageTable(heading, _cells(block[0]), [_cells(b) for b in block[2:]]))
        block = []
        if not fenced and line.startswith("#"):
            heading = line.lstrip("#").strip()
    return tables


def _plain(text: str) -> str:
    """A header or row key without emphasis, code marks or footnote marks, in lower case."""
    text = re.sub(r"[*`¹²³⁴⁵⁶⁷⁸⁹⁰†‡]", "", text)
    return re.sub(r"\s+", " ", text).strip().lower()


def _same_key(page: str, printed: str) -> bool:
    """A page's row key names a printed one: equal, or the printed key followed by a parenthesis
    (``-w/o knowledge (the default)``)."""
    page, printed = _plain(page), _plain(printed)
    return page == printed or (page.startswith(printed + " (") and page.endswith(")"))


def _numbers(text: str) -> list[float]:
    return [float(n.replace(",", "").replace(MINUS, "-")) for n in NUMBER.findall(text)]


def _part_agrees(page: str, printed: str) -> bool:
    """The page's numbers are the printed ones, or their beginning (a cell that leaves out its flips)."""
    mine, theirs = _numbers(page), _numbers(printed)
    if not theirs:
        return True  # the runs do not give this part (no run of that setting)
    return len(mine) <= len(theirs) and all(abs(a - b) < TOLERANCE for a, b in zip(mine, theirs, strict=False))


def cell_agrees(page: str, printed: str) -> bool:
    """Whether a page cell states what the runs give (``;`` alternatives, ``·`` parts: see the module)."""
    printed_parts = [p.strip() for p in printed.split("·")]
    for alternative in page.split(";"):
        parts = [p.strip() for p in alternative.split("·")]
        if len(parts) == len(printed_parts):
            if all(_part_agrees(a, b) for a, b in zip(parts, printed_parts, strict=True)):
                return True
        elif all(any(_part_agrees(a, b) for b in printed_parts) for a in parts):
            return True
    return False


def _has_value(cell: str) -> bool:
    return bool(_numbers(cell))


@dataclass
class CheckResult:
    table: PageTable | None
    agree: int = 0
    differ: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.table is not None and self.agree > 0 and not self.differ and not self.missing


def _compare(table: Table, page: PageTable) -> CheckResult:
    result = CheckResult(page)
    columns = {_plain(h): i for i, h in enumerate(page.header)}
    for row in table.rows:
        found = next((r for r in page.rows if r and _same_key(r[0], row[0])), None)
        if found is None:
            result.missing.append(row[0])
            continue
        for head, value in zip(table.header[1:], row[1:], strict=True):
            i = columns.get(_plain(head))
            if i is None or i >= len(found) or not _has_value(value):
                continue  # a column the page does not have, or a cell the runs do not give
            if cell_agrees(found[i], value):
                result.agree += 1
            else:
                result.differ.append(f"{row[0]} / {head}: page {found[i]!r}, runs {value!r}")
    return result


def check(table: Table, text: str, section: str | None = None) -> CheckResult:
    """Compare a printed table with the page's table of the same columns (the best-agreeing one)."""
    wanted = {_plain(h) for h in table.header[1:]}
    candidates = [t for t in page_tables(text)
                  if wanted & {_plain(h) for h in t.header[1:]}
                  and (section is None or _plain(section) in _plain(t.heading))]
    results = [_compare(table, t) for t in candidates]
    if not results:
        return CheckResult(None)
    return max(results, key=lambda r: (r.agree - len(r.differ) - len(r.missing), r.agree))


def report(result: CheckResult, page: str) -> list[str]:
    if result.table is None:
        return [f"check: {page} has no table with these columns"]
    where = f"{page}, table under \"{result.table.heading}\""
    lines = [(f"check: {where}: {result.agree} cells agree, {len(result.differ)} differ, "
              f"{len(result.missing)} rows not on the page")]
    lines += [f"  differs: {d}" for d in result.differ]
    lines += [f"  not on the page: {m}" for m in result.missing]
    return lines


# --- command line --------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/results_tables.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="table", required=True)
    for name, helptext in (("ladder", "Table 5 per model: a row per setting, a column per model"),
                           ("categories", "Table 5 per category, a row per run"),
                           ("versus", "each run against the first (BASE)"),
                           ("runs", "Hits@1, SER, seconds per question and n of each run")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="evaluation run folders (with metrics.json)")
        if name in ("versus", "runs"):
            p.add_argument("--label", nargs="+", default=[], help="the row's first cell, one per run (BASE excluded)")
        p.add_argument("--check", metavar="PAGE", help="compare with the table of these columns on PAGE")
        p.add_argument("--section", metavar="HEADING", help="only tables under a heading that contains this")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))  # run as a script from anywhere: the package is the checkout's
    from cbr2.common.errors import UserError

    try:
        if args.table == "ladder":
            table = ladder(args.run_dirs)
        elif args.table == "categories":
            table = categories(args.run_dirs)
        elif args.table == "versus":
            if len(args.run_dirs) < 2:
                parser.error("versus needs BASE and at least one RUN_DIR")
            table = versus(args.run_dirs[0], args.run_dirs[1:], args.label)
        else:
            table = runs_table(args.run_dirs, args.label)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for note in table.notes:
        print(f"note: {note}", file=sys.stderr)
    print(table.markdown(), end="")
    if not args.check:
        return 0
    result = check(table, Path(args.check).read_text(encoding="utf-8"), args.section)
    print("\n".join(report(result, args.check)))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
