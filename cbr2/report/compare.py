"""Compare evaluation runs: an ablation table in the layout of the paper's Table 5 and a per-category bar chart.

Usage::

    python -m cbr2.report.compare RUN_DIR... [--out DIR] [--title T]

Each ``RUN_DIR`` is an evaluation output folder holding ``metrics.json``. Writes
``DIR/ablation.md`` (also printed), ``DIR/ablation.json``, ``DIR/per_category.png``, for KQA Pro
runs ``DIR/reasoning_types.png`` (the paper's Figure 5 layout) and, for two
or more runs, ``DIR/compare.html``; for runs of two or more models, ``DIR/ladder.md``, ``ladder.json`` and
``ladder.png`` (each setting's Hits@1 against model size, ``ladder_data``) (the questions that flipped between the table's first run and
each other one, side by side; ``cbr2.report.browser``).

Honesty rules that live here:
* runs of different benchmarks or splits are refused: one table would mix incomparable numbers;
* runs evaluated on different question sets (or whose question set is not recorded), with
  different LLMs or from different git revisions are tabulated, with a note under the table
  and a warning on stderr;
* Δ is taken against the full run of the same LLM and seed, never against a guess.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cbr2.common.errors import UserError
from cbr2.config import ABLATION_TABLE, canonical_ablation
from cbr2.data.questions import KQAPRO_ABBREVIATIONS, KQAPRO_CATEGORIES, KQAPRO_REASONING_TYPES, METAQA_CATEGORIES
from cbr2.evaluation.metrics import ANSWER_COMPARISON
from cbr2.evaluation.records import load_predictions
from cbr2.llm.packaged import DEFAULT_MODEL
from cbr2.report.figures import cell, percent_bars, render_table, size_lines
from cbr2.report.run_report import pct

_RANK = {a.name: i for i, a in enumerate(ABLATION_TABLE)}
"""A run's ``ablation`` (its provenance's setting name) → its row in Table 5 (``config.ABLATION_TABLE``)."""
OTHER_GROUP = "Other"
"""Group of runs that are not one of the paper's settings (no or an unknown ablation name)."""

DISTINGUISHING = (
    # (short name, where in a loaded run): what tells apart runs of the same setting, in label order.
    ("backend", ("llm", "backend")),
    ("model", ("llm", "model")),
    ("seed", ("seed",)),
    ("retrieval.seed", ("config", "retrieval", "seed")),
    ("temperature", ("config", "llm", "temperature")),
    ("format", ("config", "prompt", "format")),
    ("cases", ("config", "retrieval", "cases")),
    ("encoder", ("config", "retrieval", "encoder")),
    ("constrained", ("config", "generation", "constrained")),
    ("canonicalize", ("config", "generation", "canonicalize")),
    ("fallback", ("config", "generation", "fallback")),
    ("prompt", ("prompt_version",)),
    ("git", ("git",)),
)


class ReportError(UserError):
    """Runs that cannot be tabulated; the message names the folder and the reason."""


def load_run(path: str | Path) -> dict[str, Any]:
    """Read one evaluation run folder.

    Args:
        path: The run folder (or its ``metrics.json``).

    Returns:
        ``{"dir", "metrics", "ablation", "benchmark", "split", "llm": {"backend", "model"}, "seed",
        "git", "prompt_version", "question_ids_sha256", "config"}``; provenance fields the run
        did not record are ``None``.

    Raises:
        ReportError: The folder or its ``metrics.json`` is missing or corrupt, or the run has no
            Hits@1 (a retrieval-only run).
    """
    path = Path(path)
    run_dir = path.parent if path.name == "metrics.json" else path
    if not run_dir.is_dir():
        raise ReportError(f"{run_dir}: no such run folder")
    file = run_dir / "metrics.json"
    if not file.is_file():
        raise ReportError(f"{run_dir}: no metrics.json (not an evaluation run folder, or the run has not finished)")
    try:
        metrics = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ReportError(f"{run_dir}: metrics.json is not valid JSON ({exc})") from exc
    if not isinstance(metrics, dict):
        raise ReportError(f"{run_dir}: metrics.json is not a JSON object")
    if "hits@1" not in metrics:
        kind = "a retrieval-only run" if "retrieval" in metrics else "not an evaluation's metrics"
        raise ReportError(f"{run_dir}: metrics.json has no hits@1 ({kind}); only generation runs can be tabulated")
    missing = [k for k in ("ser", "n", "per_category") if k not in metrics]
    if missing:
        raise ReportError(f"{run_dir}: metrics.json lacks {', '.join(missing)}")
    prov = metrics.get("provenance") or {}
    cfg = prov.get("config") or {}
    data, llm = cfg.get("data") or {}, cfg.get("llm") or {}
    return {
        "dir": run_dir,
        "metrics": metrics,
        # The setting read off the run's configuration; runs older than that field: the --ablation name.
        "ablation": prov["setting"] if "setting" in prov else canonical_ablation(prov.get("ablation")),
        "benchmark": data.get("name"),
        "split": prov.get("split") or data.get("split"),
        # llm.model unset is the packaged default that the in-process CPU backends load, so a
        # ladder places it by its size.
        "llm": {"backend": llm.get("backend"),
                "model": llm.get("model") or (DEFAULT_MODEL if llm.get("backend") in ("llamacpp", "hf") else None)},
        # The evaluation's own seed when recorded; older runs only have the sampling seed.
        "seed": prov.get("seed", llm.get("seed")),
        "git": prov.get("git"),
        "prompt_version": prov.get("prompt_version"),
        "question_ids_sha256": prov.get("question_ids_sha256"),
        "config": cfg,
    }


def _get(run: dict[str, Any], keys: Sequence[str]) -> Any:
    value: Any = run
    for k in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(k)
    return value


def _family(run: dict[str, Any]) -> str | None:
    """``kqapro`` or ``metaqa`` from the benchmark name, else from the category keys."""
    name = (run["benchmark"] or "").lower()
    for family in ("kqapro", "metaqa"):
        if family in name:
            return family
    cats = set(run["metrics"]["per_category"])
    if cats & set(KQAPRO_CATEGORIES):
        return "kqapro"
    if cats & set(METAQA_CATEGORIES):
        return "metaqa"
    return None


def _setting(run: dict[str, Any]) -> tuple[int, str, str]:
    """(rank in Table 5, group, base label) of a run; runs outside the paper's settings rank last."""
    name = run["ablation"]
    if name in _RANK:
        setting = ABLATION_TABLE[_RANK[name]]
        return _RANK[name], setting.group, setting.label
    # Unknown names keep their own name; unnamed runs are known by their folder.
    return len(ABLATION_TABLE), OTHER_GROUP, str(name) if name else run["dir"].name


def _show(value: Any) -> str:
    return "default" if value is None else str(value)


def labelled(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs in Table 5's order, each with ``group`` and a unique ``label``.

    Runs that share a setting get the config values that tell them apart (``model=...,
    seed=...``), then their folder if those do not; the result does not depend on the order
    of ``runs``.

    Raises:
        ReportError: The same folder is given twice.
    """
    seen: dict[Path, Path] = {}
    for run in runs:
        key = run["dir"].resolve()
        if key in seen:
            raise ReportError(f"{run['dir']}: run folder given twice")
        seen[key] = run["dir"]
    by_base: dict[str, list[dict[str, Any]]] = {}
    out = []
    for run in runs:
        rank, group, base = _setting(run)
        item = {**run, "rank": rank, "group": group, "base": base}
        by_base.setdefault(base, []).append(item)
        out.append(item)
    for items in by_base.values():
        if len(items) == 1:
            items[0]["label"] = items[0]["base"]
            continue
        differing = [(short, keys) for short, keys in DISTINGUISHING
                     if len({json.dumps(_get(r, keys), sort_keys=True, default=str) for r in items}) > 1]
        for r in items:
            parts = [f"{short}={_show(_get(r, keys))}" for short, keys in differing]
            r["label"] = f"{r['base']} ({', '.join(parts)})" if parts else r["base"]
        labels = [r["label"] for r in items]
        for r in items:
            if labels.count(r["label"]) > 1:
                # Same config twice (a rerun): only the folder tells them apart.
                r["label"] = f"{r['label']} [{r['dir']}]"
    out.sort(key=lambda r: (r["rank"], r["label"], str(r["dir"].resolve())))
    return out


def check_runs(runs: Sequence[dict[str, Any]]) -> list[str]:
    """Refuse runs that cannot share a table; return notes on what makes them less comparable.

    Raises:
        ReportError: The runs are of different benchmarks or splits.
    """
    runs = labelled(runs)

    def groups(field: Any) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for r in runs:
            out.setdefault(_show(field(r)) if field(r) is not None else "unrecorded", []).append(r["label"])
        return out

    def listing(g: dict[str, list[str]]) -> str:
        return "; ".join(f"{k}: {', '.join(v)}" for k, v in sorted(g.items()))

    families = groups(_family)
    names = {r["benchmark"] for r in runs if r["benchmark"] is not None}
    if len(families) > 1 or len(names) > 1:
        by_name = groups(lambda r: r["benchmark"] or _family(r))
        raise ReportError(f"runs of different benchmarks cannot share a table ({listing(by_name)})")
    splits = {r["split"] for r in runs if r["split"] is not None}
    if len(splits) > 1:
        raise ReportError(f"runs of different splits cannot share a table ({listing(groups(lambda r: r['split']))})")

    notes = []
    hashes = groups(lambda r: r["question_ids_sha256"])
    if "unrecorded" in hashes:
        notes.append(f"No question_ids_sha256 recorded for {', '.join(hashes['unrecorded'])}: that all runs saw the "
                     "same questions cannot be checked.")
    recorded = {k: v for k, v in hashes.items() if k != "unrecorded"}
    if len(recorded) > 1:
        short = {k[:12]: v for k, v in recorded.items()}
        notes.append(f"Runs were evaluated on different question sets (question_ids_sha256 {listing(short)}); "
                     "their numbers are not directly comparable.")
    llms = groups(lambda r: f"{_show(r['llm']['backend'])}/{_show(r['llm']['model'])}")
    if len(llms) > 1:
        notes.append(f"Runs used different LLMs ({listing(llms)}).")
    gits = groups(lambda r: r["git"])
    if len(gits) > 1:
        notes.append(f"Runs come from different git revisions ({listing(gits)}).")
    stale = [r["label"] for r in runs if r["metrics"].get("answer_comparison") != ANSWER_COMPARISON]
    if stale:
        notes.append(f"The metrics.json of {', '.join(stale)} were scored with an earlier answer comparison (not "
                     f"{ANSWER_COMPARISON}): their Hits@1 is not comparable; rerun their commands (every answer is "
                     "cached, nothing is generated again) to score them with the current one.")
    return notes


def _columns(runs: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    """(category, header) pairs: the family's categories in table order, then any others sorted."""
    family = _family(runs[0]) if runs else None
    if family == "kqapro":
        cols = [(c, KQAPRO_ABBREVIATIONS[c]) for c in KQAPRO_CATEGORIES]
    elif family == "metaqa":
        cols = [(c, c) for c in METAQA_CATEGORIES]
    else:
        cols = []
    known = {c for c, _ in cols}
    extra = sorted({c for r in runs for c in r["metrics"]["per_category"]} - known)
    return cols + [(c, c) for c in extra]


def _reasoning_types(runs: Sequence[dict[str, Any]]) -> list[str]:
    """KQA Pro's reasoning types that some run reports, in the order of the paper's Figure 5."""
    found = {t for r in runs for t in (r["metrics"].get("per_reasoning_type") or {})}
    return [t for t in KQAPRO_REASONING_TYPES if t in found]


def _variant(run: dict[str, Any]) -> tuple[str, str, str]:
    return _show(run["llm"]["backend"]), _show(run["llm"]["model"]), _show(run["seed"])


def _reference(run: dict[str, Any], fulls: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The full run a row is compared with: the one of the same LLM and seed, if exactly one."""
    # A difference to a full run of another LLM or seed would mix the ablation's effect with the model's.
    same = [f for f in fulls if _variant(f) == _variant(run)]
    return same[0] if len(same) == 1 else None


def _percent(x: float) -> float:
    """A fraction as a percentage rounded like the per-run report (``pct``); + 0.0 turns -0.0 into 0.0."""
    return float(pct(x)) + 0.0


def table_data(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The numbers of the table, in percent with 2 decimals (the content of ``ablation.json``).

    Raises:
        ReportError: As :func:`check_runs`.
    """
    from cbr2.evaluation.metrics import paired_difference

    notes = check_runs(runs)
    ordered = labelled(runs)
    cols = _columns(ordered)
    types = _reasoning_types(ordered)
    fulls = [r for r in ordered if r["ablation"] == "full"]
    rows = []
    for r in ordered:
        m = r["metrics"]
        ref = _reference(r, fulls)
        delta = None if ref is None or ref is r else _percent(m["hits@1"] - ref["metrics"]["hits@1"])
        paired = None
        if delta is not None:
            mine, theirs = _correctness(r), _correctness(ref)
            common = sorted(mine.keys() & theirs.keys())
            if common:
                paired = paired_difference([mine[q] for q in common], [theirs[q] for q in common])
        rows.append({
            "group": r["group"],
            "setting": r["label"],
            "base": r["base"],
            "ablation": r["ablation"],
            "run_dir": str(r["dir"]),
            "per_category": {c: (_percent(m["per_category"][c]["hits@1"]) if c in m["per_category"] else None)
                             for c, _ in cols},
            "per_category_n": {c: m["per_category"].get(c, {}).get("n") for c, _ in cols},
            "per_reasoning_type": {t: (_percent(m["per_reasoning_type"][t]["hits@1"])
                                       if t in (m.get("per_reasoning_type") or {}) else None) for t in types},
            "per_reasoning_type_n": {t: (m.get("per_reasoning_type") or {}).get(t, {}).get("n") for t in types},
            "overall": _percent(m["hits@1"]),
            "delta_vs_full": delta,
            # Paired bootstrap over the questions both runs answered (95%), and the flips.
            "delta_ci": None if paired is None else [_percent(paired["low"]), _percent(paired["high"])],
            "flips": None if paired is None else {"gained": paired["a_only"], "lost": paired["b_only"],
                                                  "n": paired["n"]},
            "reference": None if ref is None or ref is r else ref["label"],
            "ser": _percent(m["ser"]),
            "ser_before_repair": _percent(m["ser_before_repair"]) if "ser_before_repair" in m else None,
            "n": m["n"],
            "llm": r["llm"],
            "seed": r["seed"],
            "git": r["git"],
            "question_ids_sha256": r["question_ids_sha256"],
        })
    first = ordered[0] if ordered else None
    return {
        "benchmark": first["benchmark"] if first else None,
        "split": first["split"] if first else None,
        "unit": "percent",
        "columns": [{"category": c, "header": h} for c, h in cols],
        "reasoning_types": types,
        "rows": rows,
        "notes": notes,
    }


def _correctness(run: dict[str, Any]) -> dict[str, bool]:
    """Question id → correct, from the run's ``predictions.jsonl`` (read once per run)."""
    if "_correct" not in run:
        path = Path(run["dir"]) / "predictions.jsonl"
        records = load_predictions(path) if path.is_file() else {}
        run["_correct"] = {qid: bool(rec.get("correct")) for qid, rec in records.items()}
    return run["_correct"]


def versus_table(base: dict[str, Any], runs: Sequence[tuple[str, dict[str, Any]]], title: str) -> str:
    """Markdown of settings against one base run (a one-factor-at-a-time sweep), with paired intervals.

    Args:
        base: The loaded base run.
        runs: ``(label, loaded run)`` of each other setting, in display order.
        title: First heading.
    """
    from cbr2.evaluation.metrics import paired_difference

    header = ["setting", "Hits@1 (%)", "Δ vs base (points)", "95% CI", "flips", "SER (%)", "s / question",
              "prompt tokens", "n"]
    lines = [f"# {title}", "", ("Δ vs base: Hits@1 minus the base run's, with its 95% paired bootstrap interval over "
                                "the questions; flips: questions only this setting / only the base got right."), "",
             "| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    ref = _correctness(base)
    for label, run in [("base", base), *runs]:
        m = run["metrics"]
        gen = m.get("generation") or {}
        cells = [label, f"{_percent(m['hits@1']):.2f}", "—", "—", "—"]
        if run is not base:
            mine = _correctness(run)
            common = sorted(mine.keys() & ref.keys())
            d = paired_difference([mine[q] for q in common], [ref[q] for q in common])
            cells[2:5] = [f"{_percent(d['delta']):+.2f}", f"[{_percent(d['low']):+.2f}, {_percent(d['high']):+.2f}]",
                          f"+{d['a_only']} / −{d['b_only']}"]
        spq, tokens = gen.get("seconds_per_question"), gen.get("prompt_tokens")
        cells += [f"{_percent(m['ser']):.2f}", "—" if spq is None else f"{spq:.2f}",
                  "—" if tokens is None else f"{tokens:.0f}", str(m["n"])]
        lines.append("| " + " | ".join(cell(c) for c in cells) + " |")
    everyone = [("base", base), *runs]
    types = _reasoning_types([run for _, run in everyone])
    if types:
        lines += ["", "Hits@1 (%) per KQA Pro reasoning type (multi-label):", "",
                  "| setting | Overall | " + " | ".join(types) + " |", "|---|" + "---:|" * (len(types) + 1)]
        for label, run in everyone:
            per = run["metrics"].get("per_reasoning_type") or {}
            cells = [label, f"{_percent(run['metrics']['hits@1']):.2f}",
                     *(f"{_percent(per[t]['hits@1']):.2f}" if t in per else "—" for t in types)]
            lines.append("| " + " | ".join(cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def plot_per_category(runs: Sequence[dict[str, Any]], path: str | Path, title: str | None = None) -> None:
    """Write a PNG of Hits@1 per category and overall, one bar per run in the table's order and labels
    (like the paper's Figure 5).

    Args:
        runs: Results of :func:`load_run`, in any order.
        path: The PNG to write.
        title: Chart title; none when unset.
    """
    ordered, nan = labelled(runs), float("nan")
    cols = _columns(ordered)
    series = [(r["label"], [100 * r["metrics"]["per_category"][c]["hits@1"] if c in r["metrics"]["per_category"]
                            else nan for c, _ in cols] + [100 * r["metrics"]["hits@1"]]) for r in ordered]
    percent_bars(series, [h for _, h in cols] + ["Overall"], path, ylabel="Hits@1 (%)", title=title)


def ladder_data(data: dict[str, Any]) -> dict[str, Any] | None:
    """The model-size ladder of ``table_data``'s rows: each setting's Hits@1 and Δ vs full per model.

    Answers the question a user asks first of runs over several model sizes: do knowledge and the
    two case views help more as the model grows? Δ is each row's own (against the full run of the
    same LLM and seed, with its paired interval); Hits@1 gets its 95% Wilson interval.

    Returns:
        ``{"models": [{"model", "params_b"}] (by size), "settings": [base labels, Table 5 order],
        "cells": {setting: {model: {"hits@1", "ci", "n", "delta", "delta_ci"}}}}``; None when the rows
        hold fewer than two models.
    """
    from scipy.stats import binomtest

    from cbr2.llm.packaged import parameters_b

    models = list(dict.fromkeys(r["llm"]["model"] for r in data["rows"]))
    if len(models) < 2:
        return None
    sizes = {m: parameters_b(m) for m in models}
    models.sort(key=lambda m: (sizes[m] is None, sizes[m] or 0.0, str(m)))
    cells: dict[str, dict[str, Any]] = {}
    for row in data["rows"]:
        k = round(row["overall"] * row["n"] / 100)
        ci = binomtest(k, row["n"]).proportion_ci(method="wilson") if row["n"] else None
        cells.setdefault(row["base"], {})[row["llm"]["model"]] = {
            "hits@1": row["overall"], "n": row["n"],
            "ci": None if ci is None else [_percent(ci.low), _percent(ci.high)],
            "delta": row["delta_vs_full"], "delta_ci": row["delta_ci"]}
    return {"models": [{"model": m, "params_b": sizes[m]} for m in models], "settings": list(cells), "cells": cells}


def render_ladder(ladder: dict[str, Any], title: str | None = None) -> str:
    """Markdown of ``ladder_data``: one row per setting, per model its Hits@1 and Δ vs full [95% CI]."""
    models = [m["model"] for m in ladder["models"]]
    sizes = {m["model"]: m["params_b"] for m in ladder["models"]}
    heads = [f"{m} ({sizes[m]:g}B)" if sizes[m] is not None else str(m) for m in models]
    lines = [f"# {title or 'Model-size ladder'}", "",
             ("Hits@1 (%) of each setting per model, then Δ vs the full run of the same model (points) with its "
              "95% paired bootstrap interval."), "",
             "| Setting | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(models)]
    for setting in ladder["settings"]:
        parts = []
        for m in models:
            c = ladder["cells"][setting].get(m)
            if c is None:
                parts.append("—")
                continue
            text = f"{c['hits@1']:.2f}"
            if c["delta"] is not None:
                ci = f" [{c['delta_ci'][0]:+.2f}, {c['delta_ci'][1]:+.2f}]" if c["delta_ci"] else ""
                text += f" ({c['delta']:+.2f}{ci})"
            parts.append(text)
        lines.append("| " + " | ".join([cell(setting), *parts]) + " |")
    return "\n".join(lines) + "\n"


def plot_ladder(ladder: dict[str, Any], path: str | Path, title: str | None = None) -> None:
    """Write a PNG of Hits@1 against model size, one line per setting with its 95% Wilson interval."""
    series = []
    for setting in ladder["settings"]:
        points = [(m["params_b"], ladder["cells"][setting][m["model"]]) for m in ladder["models"]
                  if m["params_b"] is not None and m["model"] in ladder["cells"][setting]]
        series.append((setting, [(x, c["hits@1"], c["ci"]) for x, c in points]))
    size_lines(series, path, xlabel="parameters (billions, log scale)", ylabel="Hits@1 (%)", title=title)


def plot_reasoning_types(runs: Sequence[dict[str, Any]], path: str | Path, title: str | None = None) -> bool:
    """Write a PNG of Hits@1 overall and per KQA Pro reasoning type, one bar per run, in the layout
    of the paper's Figure 5 (which shows the whole validation split).

    Returns:
        False (and no file) when no run reports reasoning types.
    """
    ordered, nan = labelled(runs), float("nan")
    types = _reasoning_types(ordered)
    if not types:
        return False
    series = [(r["label"], [100 * r["metrics"]["hits@1"]]
               + [100 * r["metrics"]["per_reasoning_type"][t]["hits@1"]
                  if t in (r["metrics"].get("per_reasoning_type") or {}) else nan for t in types]) for r in ordered]
    percent_bars(series, ["Overall", *types], path, ylabel="Hits@1 (%)", title=title)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: tabulate and plot runs; 0 on success, 2 on refused input."""
    parser = argparse.ArgumentParser(prog="python -m cbr2.report.compare",
                                     description="Ablation table (paper's Table 5 layout) and per-category chart.")
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="evaluation output folders (with metrics.json)")
    parser.add_argument("--out", default="outputs/report", help="where to write the report (default: %(default)s)")
    parser.add_argument("--title", default=None, help="heading of the table and the chart")
    args = parser.parse_args(argv)
    try:
        runs = [load_run(p) for p in args.runs]
        data = table_data(runs)
    except ReportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for note in data["notes"]:
        print(f"warning: {note}", file=sys.stderr)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    markdown = render_table(data, args.title)
    (out / "ablation.md").write_text(markdown, encoding="utf-8")
    (out / "ablation.json").write_text(json.dumps({"title": args.title, **data}, indent=2, ensure_ascii=False) + "\n",
                                       encoding="utf-8")
    plot_per_category(runs, out / "per_category.png", title=args.title)
    wrote = [out / "ablation.md", out / "ablation.json", out / "per_category.png"]
    if plot_reasoning_types(runs, out / "reasoning_types.png", title=args.title):
        wrote.append(out / "reasoning_types.png")
    ladder = ladder_data(data)
    if ladder is not None:  # runs of two or more models: the model-size ladder
        (out / "ladder.md").write_text(render_ladder(ladder, args.title), encoding="utf-8")
        (out / "ladder.json").write_text(json.dumps(ladder, indent=2) + "\n", encoding="utf-8")
        plot_ladder(ladder, out / "ladder.png", title=args.title)
        wrote += [out / "ladder.md", out / "ladder.json", out / "ladder.png"]
    if len(runs) > 1:  # the first row of the table (the full run when there is one) against each other run
        from cbr2.report.browser import write_compare

        ordered = labelled(runs)
        wrote.append(write_compare([r["dir"] for r in ordered], out, [r["label"] for r in ordered], title=args.title))
    print(markdown, end="")
    print("wrote " + ", ".join(str(p) for p in wrote), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
