"""Error analysis: why a wrong prediction is wrong, in the classes of the paper's Section 6.5.

* **grounding**: the program names the wrong thing: an argument outside the KB's schema; with
  the gold program's shape, another schema item (concept, key, qualifier key, relation), entity
  or literal value; with another shape, an entity or literal value the gold program does not
  name anywhere (a program about another entity than the question's is a grounding error even
  when its steps differ too);
* **direction**: the right relation followed the wrong way (``forward`` for ``backward``), the
  paper's second named failure, counted on its own;
* **logical**: the reasoning is wrong with the right items: a condition dropped or added, a
  comparison reversed, or a different multi-hop structure;
* **other**: nothing to compare (no parsed program, no gold program) or a program equal to
  the gold one that still gave a wrong answer.

The predicted program is compared with the gold one recorded beside it (``gold_program``),
after scoring only; nothing here feeds back into retrieval or prompts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from cbr2.common.records import Prediction
from cbr2.kopl.functions import FUNCTIONS, get_spec
from cbr2.kopl.program import Program, ProgramError
from cbr2.kopl.sketch import SCHEMA_KINDS, sketch, sketch_text
from cbr2.kopl.text import parse_text

CLASSES = ("grounding", "direction", "logical", "other")
"""Error classes, in the order reports list them."""

REASONS = {
    "grounding": ("outside_schema", "schema_item", "entity", "value"),
    "direction": ("direction_flipped",),
    "logical": ("condition_missing", "condition_extra", "comparison", "structure"),
    "other": ("syntax", "type", "no_program", "no_gold", "unparsable", "same_program"),
}
"""The reasons of each class; ``analyze`` counts them in this order."""

CONDITION_FUNCTIONS = frozenset(name for name in FUNCTIONS if name.startswith(("Filter", "QFilter")))
"""Steps that only narrow a set (``FilterConcept``, ``Filter*``, ``QFilter*``): dropping one
keeps the program well-formed but loses a constraint of the question."""

COMPARISON_KINDS = ("op", "between_op", "among_op")
"""Closed argument kinds that choose a comparison; ``direction`` is handled on its own."""

LITERAL_KINDS = ("string", "quantity", "year", "date", "any")
"""Argument kinds of literal values."""


def _arguments(program: Program, kinds: Sequence[str]) -> list[str]:
    out = []
    for step in program.steps:
        spec = get_spec(step.function)
        out += [v for arg, v in zip(spec.args, step.inputs, strict=False) if arg.kind in kinds]
    return out


def _foreign(pred: Program, gold: Program, kinds: Sequence[str]) -> list[str]:
    """Arguments of ``kinds`` in ``pred`` that ``gold`` has nowhere."""
    known = set(_arguments(gold, kinds))
    return list(dict.fromkeys(v for v in _arguments(pred, kinds) if v not in known))


def classify(record: Prediction) -> dict[str, str] | None:
    """Classify one prediction record.

    Args:
        record: A ``predictions.jsonl`` record (``correct``, ``error_kind``, ``error``,
            ``program``, ``unknown_arguments`` and ``gold_program``; older records without the
            last two are tolerated).

    Returns:
        None for a correct prediction, else ``{"class", "reason", "detail"}`` with class in
        ``CLASSES`` and reason in ``REASONS[class]``.
    """
    if record.get("correct"):
        return None
    if record.get("program") is None:
        kind = record.get("error_kind")
        reason = kind if kind in ("syntax", "type") else "no_program"
        return _result("other", reason, (record.get("error") or {}).get("message", ""))
    if record.get("gold_program") is None:
        return _result("other", "no_gold", "the record has no gold program")
    if record.get("unknown_arguments"):
        # Checked before any comparison with gold: a name the KB does not have is a grounding
        # failure whatever else differs, and canonicalisation may have hidden it in `program`.
        details = [f"step {u['step'] + 1} ({u['function']}) {u['arg']}: {u['value']!r} is not in the KB"
                   for u in record["unknown_arguments"]]
        return _result("grounding", "outside_schema", "; ".join(details))
    try:
        pred = parse_text(record["program"], "dag")
        gold = parse_text(record["gold_program"], "dag")
    except ProgramError as err:
        return _result("other", "unparsable", str(err))
    return compare_programs(pred, gold)


def compare_programs(pred: Program, gold: Program) -> dict[str, str]:
    """Classify the difference between a predicted program and the gold one (rules d to h).

    Returns:
        ``{"class", "reason", "detail"}``; ``same_program`` (class other) when they are equal.
    """
    pred_sketch, gold_sketch = sketch(pred), sketch(gold)
    if pred_sketch != gold_sketch:
        shapes = f"{sketch_text(pred)} vs gold {sketch_text(gold)}"
        if drops_only_conditions(gold_sketch, pred_sketch):
            return _result("logical", "condition_missing", f"missing {_extra_steps(gold_sketch, pred_sketch)}: {shapes}")
        if drops_only_conditions(pred_sketch, gold_sketch):
            return _result("logical", "condition_extra", f"extra {_extra_steps(pred_sketch, gold_sketch)}: {shapes}")
        # An entity or value the gold program never names: the program is about something else
        # than the question (a schema item may differ with the shape itself: an extra hop).
        for reason, kinds in (("entity", ("entity",)), ("value", LITERAL_KINDS)):
            if foreign := _foreign(pred, gold, kinds):
                return _result("grounding", reason, f"{', '.join(map(repr, foreign))} not in the gold program: {shapes}")
        return _result("logical", "structure", shapes)
    pairs = list(zip(pred.steps, gold.steps, strict=True))
    rewired = [i for i, (p, g) in enumerate(pairs) if p.dependencies != g.dependencies]
    if rewired:
        # Same functions, different data flow: e.g. a join of the wrong branches.
        return _result("logical", "structure", f"step {rewired[0] + 1} ({pred_sketch[rewired[0]]}) takes other inputs")

    diffs = argument_differences(pred, gold)
    flipped = [d for d in diffs if d["kind"] == "direction"
               and pred.steps[d["step"]].inputs[0] == gold.steps[d["step"]].inputs[0]]  # same relation
    if flipped:
        return _result("direction", "direction_flipped", _describe(flipped))
    if comparisons := _of_kinds(diffs, COMPARISON_KINDS):
        return _result("logical", "comparison", _describe(comparisons))
    if schema := _of_kinds(diffs, SCHEMA_KINDS):
        return _result("grounding", "schema_item", _describe(schema))
    if entities := _of_kinds(diffs, ("entity",)):
        return _result("grounding", "entity", _describe(entities))
    # Only literal values (strings, quantities, years, dates) are left: a direction that
    # changed with its relation was counted under the relation, as a schema item.
    if diffs:
        return _result("grounding", "value", _describe(diffs))
    return _result("other", "same_program", "the program equals the gold one; the answer still differs")


def drops_only_conditions(longer: Sequence[str], shorter: Sequence[str]) -> bool:
    """Whether ``shorter`` is ``longer`` with one or more condition steps deleted.

    Walks ``longer`` once, matching ``shorter`` in order; a step of ``longer`` may be skipped only
    if it is in ``CONDITION_FUNCTIONS``. Matching as early as possible is safe: a condition
    matched early leaves its later twin to be skipped, which is allowed.
    """
    if len(shorter) >= len(longer):
        return False
    j = 0
    for name in longer:
        if j < len(shorter) and name == shorter[j]:
            j += 1
        elif name not in CONDITION_FUNCTIONS:
            return False
    return j == len(shorter)


def argument_differences(pred: Program, gold: Program) -> list[dict[str, Any]]:
    """The textual arguments that differ between two programs of the same sketch, step by step.

    Returns:
        ``{"step", "function", "arg", "kind", "value", "gold"}`` per differing argument
        (``step`` 0-based), in program order.
    """
    diffs = []
    for i, (p, g) in enumerate(zip(pred.steps, gold.steps, strict=True)):
        spec = get_spec(p.function)
        for arg, value, gold_value in zip(spec.args, p.inputs, g.inputs, strict=True):
            if value != gold_value:
                diffs.append({"step": i, "function": spec.name, "arg": arg.name, "kind": arg.kind,
                              "value": value, "gold": gold_value})
    return diffs


def analyze(records: Iterable[Prediction], categories: Sequence[str] = (), examples: int = 3) -> dict[str, Any]:
    """Classify every wrong prediction and aggregate: ``metrics.json``'s ``error_analysis`` block.

    Args:
        records: Prediction records (see ``classify``).
        categories: Categories to list first, in this order (others follow sorted), as in
            ``compute_metrics``.
        examples: How many examples to keep per class (the first ones, in record order).

    Returns:
        ``{"n_wrong", "classes": {class: count}, "reasons": {reason: count},
        "per_category": {category: {class: count}}, "examples": {class: [example, ...]}}``.
        Every category of ``records`` has a row, zeros included. An example is ``{"id",
        "question", "category", "reason", "detail", "gold_program", "error_kind"}`` plus ``program``
        (the checked prediction) or, when none passed the checks, ``generated`` (the raw text).
    """
    records = list(records)
    seen = {r.get("category") or "unknown" for r in records}
    order = [c for c in categories if c in seen] + sorted(c for c in seen if c not in categories)
    per_category = {c: dict.fromkeys(CLASSES, 0) for c in order}
    classes: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    kept: dict[str, list[dict[str, Any]]] = {c: [] for c in CLASSES}
    for r in records:
        verdict = classify(r)
        if verdict is None:
            continue
        cls = verdict["class"]
        classes[cls] += 1
        reasons[verdict["reason"]] += 1
        per_category[r.get("category") or "unknown"][cls] += 1
        if len(kept[cls]) < examples:
            kept[cls].append(_example(r, verdict))
    reason_order = [reason for cls in CLASSES for reason in REASONS[cls]]
    return {
        "n_wrong": sum(classes.values()),
        "classes": {c: classes[c] for c in CLASSES},
        "reasons": {reason: reasons[reason] for reason in reason_order if reasons[reason]},
        "per_category": per_category,
        "examples": kept,
    }


def _result(cls: str, reason: str, detail: str) -> dict[str, str]:
    return {"class": cls, "reason": reason, "detail": detail}


def _describe(diffs: list[dict[str, Any]]) -> str:
    """E.g. ``step 2 (QueryAttr) key: 'altitude above sea level' vs gold 'elevation above sea level'``."""
    return "; ".join(f"step {d['step'] + 1} ({d['function']}) {d['arg']}: {d['value']!r} vs gold {d['gold']!r}"
                     for d in diffs)


def _extra_steps(longer: Sequence[str], shorter: Sequence[str]) -> str:
    """The functions ``longer`` has beyond ``shorter``, e.g. ``FilterConcept, FilterStr``."""
    extra = Counter(longer) - Counter(shorter)
    names = []
    for name in longer:
        if extra[name] > 0:
            names.append(name)
            extra[name] -= 1
    return ", ".join(names)


def _of_kinds(diffs: list[dict[str, Any]], kinds: Sequence[str]) -> list[dict[str, Any]]:
    return [d for d in diffs if d["kind"] in kinds]


def _example(record: Prediction, verdict: dict[str, str]) -> dict[str, Any]:
    example = {"id": record.get("id"), "question": record.get("question"), "category": record.get("category"),
               "reason": verdict["reason"], "detail": verdict["detail"], "gold_program": record.get("gold_program"),
               "error_kind": record.get("error_kind")}
    if record.get("program") is not None:
        example["program"] = record["program"]
    else:
        example["generated"] = record.get("generated")
    return example
