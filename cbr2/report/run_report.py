"""``report.md``: the overall line, a per-category table in the layout of the paper's Table 3,
error counts, the fallback's effect, the error analysis (grounding / direction / logical), generation cost,
retrieval metrics and provenance."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from cbr2.common.records import PROMPT_TOO_LONG
from cbr2.data.questions import KQAPRO_ABBREVIATIONS
from cbr2.evaluation.errors import CLASSES
from cbr2.evaluation.metrics import ERROR_KINDS

CLASS_LEGEND = ("Grounding: the program names a wrong or non-existent schema item, entity or value (an entity "
                "or value the gold program lacks counts whatever the program's shape). Direction: the right "
                "relation followed the wrong way. Logical: a condition dropped or added, a comparison reversed "
                "or another multi-hop structure. Other: the program cannot be compared with the gold one, "
                "because it does not parse (syntax) or breaks KoPL's typing rules (type), or the question "
                "has no gold program, or it is the gold program and only the executed answer differs "
                "(same_program).")
"""What the four classes of the error analysis mean (the paper's Section 6.5)."""

EXAMPLE_CHARS = 1500
"""Longest program or generated text an error example shows; raw generations can be long."""


def summary_line(metrics: dict[str, Any], where: str | Path) -> str:
    """The one line a run prints when it ends: Hits@1 (or that the split has no gold answers), SER, n."""
    hits = "no gold answers" if metrics["hits@1"] is None else f"Hits@1 {metrics['hits@1']:.4f}"
    return f"{hits}  SER {metrics['ser']:.4f}  n={metrics['n']}  -> {where}"


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
        hits = (f"**Hits@1 {pct(metrics['hits@1'])}%** (higher is better)" if metrics["hits@1"] is not None
                else "**No gold answers** (a test split: no Hits@1; the answers are in `predict.txt`)")
        lines += [
            (f"{hits} · **SER {pct(metrics['ser'])}%** "
             f"(lower is better; {pct(metrics['ser_before_repair'])}% before repair) · n = {metrics['n']}"),
            "",
            "## Per category",
            "",
            *per_category_table(metrics),
        ]
        if metrics.get("per_reasoning_type"):
            lines += ["", "## Per reasoning type", "", *reasoning_type_table(metrics)]
        gen = metrics.get("generation") or {}
        if gen.get("seconds_per_question") is not None:
            tokens = "".join(f" · {gen[k]:.0f} {k.replace('_', ' ')} per question" for k in
                             ("prompt_tokens", "completion_tokens") if gen.get(k) is not None)
            lines += ["", f"Generation: {gen['seconds_per_question']:.2f} s per question{tokens}."]
            snaps = gen.get("canonicalized") or {}
            if snaps.get("considered"):
                lines += ["", (f"Canonicalisation: {snaps['snapped']} of {snaps['considered']} arguments outside "
                               f"the KB vocabulary snapped to a KB item, in {snaps['questions']} questions.")]
        lines += ["", "## Errors", "", "| kind | count |", "|---|---:|"]
        lines += [f"| {k} | {metrics['errors'].get(k, 0)} |" for k in ERROR_KINDS]
        if metrics.get("emptied_at"):
            lines += ["", "Empty answers by the step whose result was empty first: "
                      + ", ".join(f"{f} {n}" for f, n in metrics["emptied_at"].items()) + "."]
        if metrics.get(PROMPT_TOO_LONG):
            ids = metrics[PROMPT_TOO_LONG]
            lines += ["", f"Not generated, counted wrong: {len(ids)} questions whose prompt is longer than the model's "
                      f"context (`{PROMPT_TOO_LONG}`; raise `llm.max_model_len` or shorten the prompt): "
                      + ", ".join(f"`{i}`" for i in ids) + "."]
        lines += render_fallback(metrics)
    if "error_analysis" in metrics:
        lines += render_error_analysis(metrics["error_analysis"], metrics.get("n"))
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


def _pct_or_dash(x: float | None) -> str:
    return "—" if x is None else pct(x)


def reasoning_type_table(metrics: dict[str, Any]) -> list[str]:
    """KQA Pro's reasoning types as columns, Overall first (the layout of the paper's Figure 5).

    The types are multi-label (a question counts in each of its types), so their n do not sum
    to the run's n.
    """
    types = metrics["per_reasoning_type"]
    rows = [("Hits@1 (%) ↑", "hits@1", _pct_or_dash), ("SER (%) ↓", "ser", pct), ("n", "n", str)]
    lines = ["| | Overall | " + " | ".join(types) + " |", "|---|" + "---:|" * (len(types) + 1)]
    for label, key, fmt in rows:
        lines.append(f"| {label} | {fmt(metrics[key])} | " + " | ".join(fmt(types[t][key]) for t in types) + " |")
    return lines + ["", ("Multi-label, read off the gold program: Multi-hop (Relate or Filter*), Qualifier (QFilter*, "
                         "QueryAttrUnderCondition, QueryAttrQualifier, QueryRelationQualifier), Comparison "
                         "(SelectBetween, SelectAmong), Logical (And, Or), Count, Verify (Verify*); Zero-shot: the "
                         "gold answer is not among the training split's answers.")]


def per_category_table(metrics: dict[str, Any]) -> list[str]:
    """Categories as columns, in the layout of the paper's Table 3 (KQA Pro abbreviations), then Overall."""
    cats = list(metrics["per_category"])
    heads = [KQAPRO_ABBREVIATIONS.get(c, c) for c in cats]
    rows = [("Hits@1 (%) ↑", "hits@1", _pct_or_dash), ("SER (%) ↓", "ser", pct), ("n", "n", str)]
    lines = ["| | " + " | ".join(heads) + " | Overall |", "|---|" + "---:|" * (len(cats) + 1)]
    for label, key, fmt in rows:
        cells = [fmt(metrics["per_category"][c][key]) for c in cats] + [fmt(metrics[key])]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if any(c in KQAPRO_ABBREVIATIONS for c in cats):
        lines += ["", "; ".join(f"{a}: {c}" for c, a in KQAPRO_ABBREVIATIONS.items()) + "."]
    return lines


def render_fallback(metrics: dict[str, Any]) -> list[str]:
    """``report.md`` lines comparing the single pass with the result after the fallback.

    Args:
        metrics: ``metrics.json``; without ``fallback`` and ``single_pass`` blocks there is
            nothing to render (an empty list).
    """
    fb, single = metrics.get("fallback"), metrics.get("single_pass")
    if not fb or not single:
        return []
    lines = ["", "## Fallback", "", "| | single pass | after fallback |", "|---|---:|---:|"]
    for label, key in (("Hits@1 (%) ↑", "hits@1"), ("SER (%) ↓", "ser"), ("SER before repair (%) ↓", "ser_before_repair")):
        lines.append(f"| {label} | {pct(single[key])} | {pct(metrics[key])} |")
    of_fired = f" ({pct(fb['fixed_rate_of_fired'])}% of those)" if fb["fixed_rate_of_fired"] is not None else ""
    lines += ["", (f"Fired on {fb['fired']} of {metrics['n']} questions ({pct(fb['fired_rate'])}%); "
                   f"fixed {fb['fixed']}{of_fired}; {fb['still_failing']} still not right.")]
    if fb["extra_seconds_per_question"] is not None:
        per_fired = (f", {fb['extra_seconds_per_fired']:.2f} s per correction"
                     if fb["extra_seconds_per_fired"] is not None else "")
        lines.append(f"Extra generation: {fb['extra_seconds_per_question']:.2f} s per question{per_fired}.")
    if fb["fired"]:
        lines += ["", "| single-pass error | fired | fixed |", "|---|---:|---:|"]
        lines += [f"| {kind} | {c['fired']} | {c['fixed']} |" for kind, c in fb["by_error_kind"].items()]
        after = ", ".join(f"{kind} {count}" for kind, count in sorted(fb["after"].items()))
        own = ", ".join(f"{kind} {count}" for kind, count in sorted((fb.get("corrections") or {}).items()))
        lines += ["", (f"The corrections themselves: {own}; {fb.get('kept_correction', 0)} of {fb['fired']} failed "
                       f"less visibly than their first pass and replaced it. Final results of these questions: {after}.")]
    return lines


def render_error_analysis(block: dict[str, Any], n: int | None) -> list[str]:
    """Lines of the error-analysis section: class counts, per category, reasons and examples.

    Args:
        block: ``metrics.json``'s ``error_analysis`` (see ``cbr2.evaluation.errors.analyze``).
        n: Number of evaluated questions, for the summary line.
    """
    wrong = block["n_wrong"]
    lines = ["", "## Error analysis", ""]
    if not wrong:
        return [*lines, "No wrong predictions."]
    shares = " · ".join(f"**{c}** {block['classes'][c]} ({pct(block['classes'][c] / wrong)}%)" for c in CLASSES)
    of_n = f" of {n}" if n is not None else ""
    lines += [f"{wrong} wrong predictions{of_n}: {shares} of the wrong ones.",
              "",
              CLASS_LEGEND,
              "", "| category | " + " | ".join(CLASSES) + " | wrong |", "|---|" + "---:|" * (len(CLASSES) + 1)]
    for cat, counts in block["per_category"].items():
        lines.append(f"| {cat} | " + " | ".join(str(counts[c]) for c in CLASSES) + f" | {sum(counts.values())} |")
    lines += ["", "Reasons: " + " · ".join(f"`{r}` {k}" for r, k in block["reasons"].items()) + "."]
    for cls in CLASSES:
        examples = block["examples"].get(cls) or []
        if examples:
            lines += ["", f"### Examples: {cls}"]
            for ex in examples:
                lines += _example_lines(ex)
    return lines


def _example_lines(ex: dict[str, Any]) -> list[str]:
    """One error example: id, category, reason and detail, question, gold and predicted programs."""
    lines = ["", f"**{ex['id']}** ({ex.get('category') or 'unknown'}) · `{ex['reason']}`: {ex['detail']}",
             "", f"Question: {ex['question']}"]
    if ex.get("gold_program"):
        lines += ["", "Gold program:", "", *_fenced(ex["gold_program"])]
    if "program" in ex:
        lines += ["", "Predicted program:", "", *_fenced(ex["program"])]
    else:
        lines += ["", _GENERATED_HEADING.get(ex.get("error_kind"), "Generated text:"), "",
                  *_fenced(ex.get("generated") or "")]
    return lines


_GENERATED_HEADING = {
    "syntax": "Generated text (it does not parse, even after repair):",
    "type": "Generated text (it parses, but breaks KoPL's typing rules):",
}


def _fenced(text: str) -> list[str]:
    """A fenced code block that survives backticks in ``text`` (an LLM may write its own fences)."""
    if len(text) > EXAMPLE_CHARS:
        text = text[:EXAMPLE_CHARS] + " …"
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", text)), default=0))
    return [fence, text, fence]


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
    for i, (group, m) in enumerate(block.get("linking", {}).items()):
        lines += [""] if i == 0 else []
        lines.append(f"Linking, {group} (against the gold programs' {m['gold']} arguments): precision "
                     f"{pct(m['precision'])}%, recall {pct(m['recall'])}% ({m['linked']} linked).")
    return lines


def run_title(metrics: dict[str, Any], run_dir: Path) -> str:
    """``benchmark · backend · ablation`` (``retrieval`` for a retrieval-only run) from the
    provenance, else the folder's name: the first heading of ``report.md`` and the title of ``browser.html``."""
    prov = metrics.get("provenance") or {}
    cfg = prov.get("config") or {}
    bench = (cfg.get("data") or {}).get("name")
    if not bench:
        return run_dir.name
    kind = "retrieval" if "hits@1" not in metrics else (cfg.get("llm") or {}).get("backend")
    return " · ".join(str(x) for x in (bench, kind, prov.get("ablation")) if x)


def write_report(path: Path, metrics: dict[str, Any]) -> None:
    """Write ``report.md`` (titled ``run_title``)."""
    # Generated text may hold a lone surrogate (predictions.jsonl escapes it); the report shows it escaped.
    title = run_title(metrics, path.parent)
    path.write_text(render_report(metrics, title), encoding="utf-8", errors="backslashreplace")


def _run_lines(prov: dict[str, Any]) -> list[str]:
    """Provenance lines of a generation run: ablation, LLM, prompt version, seeds."""
    llm = (prov.get("config") or {}).get("llm")
    if not llm or "prompt_version" not in prov:
        return []
    model = f" {llm['model']}" if llm.get("model") else ""
    return [f"- ablation: {prov.get('ablation') or 'none (the configuration as given)'}",
            f"- llm: {llm['backend']}{model} (temperature {llm['temperature']}); prompt {prov['prompt_version']}",
            f"- seeds: {prov.get('seed')}"]
