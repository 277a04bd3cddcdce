"""``report.md``: the overall line, a per-category table in the layout of the paper's Table 3,
error counts, generation cost, retrieval metrics and provenance."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cbr2.data.questions import KQAPRO_ABBREVIATIONS
from cbr2.evaluation.metrics import ERROR_KINDS


def pct(x: float) -> str:
    """A fraction as a percentage with two decimals, as the paper prints them."""
    return f"{100 * x:.2f}"


def render_report(metrics: dict[str, Any], title: str) -> str:
    """Markdown for one run (a retrieval-only run has only the retrieval section).

    Args:
        metrics: The ``metrics.json`` structure.
        title: First heading (benchmark and generator).
    """
    lines = [f"# {title}", ""]
    if "hits@1" in metrics:
        lines += [
            (f"**Hits@1 {pct(metrics['hits@1'])}%** (higher is better) · **SER {pct(metrics['ser'])}%** "
             f"(lower is better; {pct(metrics['ser_before_repair'])}% before repair) · n = {metrics['n']}"),
            "",
            "## Per category",
            "",
            *per_category_table(metrics),
        ]
        gen = metrics.get("generation") or {}
        if gen.get("seconds_per_question") is not None:
            tokens = "".join(f" · {gen[k]:.0f} {k.replace('_', ' ')} per question" for k in
                             ("prompt_tokens", "completion_tokens") if gen.get(k) is not None)
            lines += ["", f"Generation: {gen['seconds_per_question']:.2f} s per question{tokens}."]
        lines += ["", "## Errors", "", "| kind | count |", "|---|---:|"]
        lines += [f"| {k} | {metrics['errors'].get(k, 0)} |" for k in ERROR_KINDS]
    if metrics.get("retrieval"):
        lines += render_retrieval(metrics["retrieval"])
    prov = metrics.get("provenance", {})
    if prov:
        lines += ["", "## Provenance", "",
                  f"- split: {prov.get('split')} ({prov.get('data_root')}), n = {metrics.get('n')}",
                  *_run_lines(prov),
                  f"- git: {prov.get('git')}",
                  f"- python {prov.get('python')}; " + ", ".join(f"{k} {v}" for k, v in prov.get("packages", {}).items()),
                  f"- command: `{prov.get('command')}`"]
    return "\n".join(lines) + "\n"


def per_category_table(metrics: dict[str, Any]) -> list[str]:
    """Categories as columns, in the layout of the paper's Table 3 (KQA Pro abbreviations), then Overall."""
    cats = list(metrics["per_category"])
    heads = [KQAPRO_ABBREVIATIONS.get(c, c) for c in cats]
    rows = [("Hits@1 (%) ↑", "hits@1", pct), ("SER (%) ↓", "ser", pct), ("n", "n", str)]
    lines = ["| | " + " | ".join(heads) + " | Overall |", "|---|" + "---:|" * (len(cats) + 1)]
    for label, key, fmt in rows:
        cells = [fmt(metrics["per_category"][c][key]) for c in cats] + [fmt(metrics[key])]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if any(c in KQAPRO_ABBREVIATIONS for c in cats):
        lines += ["", "; ".join(f"{a}: {c}" for c, a in KQAPRO_ABBREVIATIONS.items()) + "."]
    return lines


def render_retrieval(block: dict[str, Any]) -> list[str]:
    """Lines of the retrieval section: sketch-hit per case view and knowledge recall."""
    lines = ["", "## Retrieval", "", f"n = {block['n']} · {1000 * block.get('seconds_per_question', 0):.1f} ms per "
             "question (encoding included) · encoders: " + ", ".join(f"{v} {n}" for v, n in block.get("encoders", {}).items())]
    if block.get("cases"):
        ks = list(next(iter(block["cases"].values())))
        lines += ["", "| case view | " + " | ".join(f"{k} (%) ↑" for k in ks) + " |",
                  "|---|" + "---:|" * len(ks)]
        for view, m in block["cases"].items():
            lines.append(f"| {view} | " + " | ".join(pct(m[k]) for k in ks) + " |")
        if "merged" in block["cases"]:
            lines += ["", "`merged` at k is the union of the semantic and structural top-k."]
    if block.get("knowledge"):
        kn = block["knowledge"]
        recall = (f"Knowledge recall (share of the gold programs' {kn['items']} schema items named by the "
                  f"retrieved triples): {pct(kn['recall'])}% (ontology {pct(kn['recall_ontology'])}%, "
                  f"facts {pct(kn['recall_facts'])}%).")
        lines += ["", recall]
    return lines


def write_report(path: Path, metrics: dict[str, Any], title: str) -> None:
    """Write ``report.md``."""
    path.write_text(render_report(metrics, title), encoding="utf-8")


def _run_lines(prov: dict[str, Any]) -> list[str]:
    """Provenance lines of a generation run: ablation, LLM, prompt version, seeds."""
    llm = (prov.get("config") or {}).get("llm")
    if not llm or "prompt_version" not in prov:
        return []
    model = f" {llm['model']}" if llm.get("model") else ""
    return [f"- ablation: {prov.get('ablation') or 'none (the configuration as given)'}",
            f"- llm: {llm['backend']}{model} (temperature {llm['temperature']}); prompt {prov['prompt_version']}",
            f"- seeds: {prov.get('seed')}"]
