"""What a comparison of runs looks like: the ablation table as Markdown and a bar chart.

``render_table`` writes the numbers ``cbr2.report.compare.table_data`` computes in the layout
of the paper's Table 5 (``ablation.md``); ``percent_bars`` draws a grouped bar chart of
percentages (matplotlib, imported when a chart is drawn), as ``compare.plot_per_category`` draws
Hits@1 per category (``per_category.png``, like the paper's Figure 5); ``size_lines`` draws values
against a model size (``compare.plot_ladder``, ``ladder.png``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def cell(text: str) -> str:
    """Text safe in a Markdown table cell."""
    return text.replace("|", "\\|")


def render_table(data: dict[str, Any], title: str | None = None) -> str:
    """Markdown of ``compare.table_data``'s structure (``ablation.md``)."""
    cols = data["columns"]
    bench = " ".join(str(x) for x in (data["benchmark"], data["split"]) if x)
    lines = [f"# {title or 'Ablation study' + (f' · {bench}' if bench else '')}", ""]
    if any(c["header"] != c["category"] for c in cols):
        lines += ["Hits@1 (%) per category; " + "; ".join(f"{c['header']}: {c['category']}" for c in cols
                                                           if c["header"] != c["category"]) + ".", ""]
    lines += [("Δ vs full: Overall minus that of the full run with the same LLM and seed (— where there is none), "
               "with its 95% paired bootstrap interval over the questions; flips: questions only this setting / only "
               "the full run got right; SER after repair."), ""]
    header = ["Category group", "Setting", *(c["header"] for c in cols), "Overall", "Δ vs full (points)",
              "95% CI", "flips", "SER (%)", "n"]
    lines += ["| " + " | ".join(header) + " |", "|---|---|" + "---:|" * (len(header) - 2)]
    previous_group = None
    for row in data["rows"]:
        # Like the paper, a group's name stands on its first row only.
        group = row["group"] if row["group"] != previous_group else ""
        previous_group = row["group"]
        cells = [f"{v:.2f}" if v is not None else "—" for v in row["per_category"].values()]
        delta = "—" if row["delta_vs_full"] is None else f"{row['delta_vs_full']:+.2f}"
        ci = "—" if not row.get("delta_ci") else f"[{row['delta_ci'][0]:+.2f}, {row['delta_ci'][1]:+.2f}]"
        flips = "—" if not row.get("flips") else f"+{row['flips']['gained']} / −{row['flips']['lost']}"
        lines.append("| " + " | ".join([cell(group), cell(row["setting"]), *cells, f"{row['overall']:.2f}", delta,
                                        ci, flips, f"{row['ser']:.2f}", str(row["n"])]) + " |")
    types = data.get("reasoning_types") or []
    if types:
        lines += ["", "## Per reasoning type", "",
                  ("Hits@1 (%) overall and per KQA Pro reasoning type (the layout of the paper's Figure 5); "
                   "multi-label, so a question counts in each of its types."), "",
                  "| Setting | Overall | " + " | ".join(types) + " |", "|---|" + "---:|" * (len(types) + 1)]
        for row in data["rows"]:
            cells = [f"{v:.2f}" if v is not None else "—" for v in (row["per_reasoning_type"][t] for t in types)]
            lines.append("| " + " | ".join([cell(row["setting"]), f"{row['overall']:.2f}", *cells]) + " |")
        ns = data["rows"][0]["per_reasoning_type_n"] if data["rows"] else {}
        lines += ["", "n per type (first row): " + ", ".join(f"{t} {ns.get(t)}" for t in types) + "."]
    if data["notes"]:
        for note in data["notes"]:
            # A blank line between notes, or Markdown merges them into one paragraph.
            lines += ["", f"> **Note:** {note}"]
    return "\n".join(lines) + "\n"


def percent_bars(series: Sequence[tuple[str, Sequence[float]]], groups: Sequence[str], path: str | Path,
                 ylabel: str, title: str | None = None) -> None:
    """Write a grouped bar chart of values in [0, 100], each bar labelled with its value.

    Args:
        series: ``(legend label, one value per group)`` per series, in bar order; NaN: no bar.
        groups: The x-axis labels.
        path: The PNG to write.
        ylabel: The y-axis label.
        title: Chart title; none when unset.
    """
    # Imported here: the headless backend must be chosen before pyplot loads, and a table
    # alone should not pay for matplotlib.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_runs, n_cols = len(series), len(groups)
    width = 0.8 / max(n_runs, 1)
    fig_w = min(max(8.0, 0.17 * n_runs * n_cols + 3.0), 20.0)  # about 0.17 in a bar, labels stay legible
    fig, ax = plt.subplots(figsize=(fig_w, 6.0), dpi=120)
    cmap = plt.get_cmap("tab10" if n_runs <= 10 else "tab20")
    for i, (label, values) in enumerate(series):
        xs = [j + (i - (n_runs - 1) / 2) * width for j in range(n_cols)]
        bars = ax.bar(xs, values, width, label=label, color=cmap(i % cmap.N))
        # Vertical labels stay legible however many series share a group.
        ax.bar_label(bars, labels=["" if math.isnan(v) else f"{v:.1f}" for v in values], fontsize=7,
                     rotation=90 if n_runs > 2 else 0, padding=2)
    ax.set_xticks(range(n_cols), list(groups))
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, 115)  # headroom for the value labels above 100
    ax.set_yticks(range(0, 101, 20))
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    if title:
        ax.set_title(title)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=min(n_runs, 4), frameon=False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def size_lines(series: Sequence[tuple[str, Sequence[tuple[float, float, Sequence[float] | None]]]],
               path: str | Path, xlabel: str, ylabel: str, title: str | None = None) -> None:
    """Write a line chart of values in [0, 100] against a size on a log axis, with error bars.

    Args:
        series: ``(legend label, [(size, value, [low, high] or None), ...])`` per line.
        path: The PNG to write.
        xlabel, ylabel: Axis labels.
        title: Chart title; none when unset.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.0, 5.5), dpi=120)
    cmap = plt.get_cmap("tab10" if len(series) <= 10 else "tab20")
    sizes = sorted({x for _, points in series for x, _, _ in points})
    for i, (label, points) in enumerate(series):
        points = sorted(points)
        xs, ys = [x for x, _, _ in points], [y for _, y, _ in points]
        err = [[y - (ci[0] if ci else y) for _, y, ci in points], [(ci[1] if ci else y) - y for _, y, ci in points]]
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=label, color=cmap(i % cmap.N))
    ax.set_xscale("log")
    ax.set_xticks(sizes, [f"{x:g}" for x in sizes])
    ax.minorticks_off()
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=4, frameon=False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
