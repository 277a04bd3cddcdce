"""How well retrieval did: sketch-hit of the case views, recall of the knowledge, precision and recall
of entity linking, and the merge of these blocks over shards.

The structural retriever validates on ``sketch_hit_at_k`` while it trains (``cbr2.structural``);
a run reports ``retrieval_metrics`` and ``linking_metrics`` in ``metrics.json``'s ``retrieval``
block (``cbr2.run.runner``), and a sharded run's blocks merge with ``merge_retrieval``
(``cbr2.cluster.merge``). The metrics of the answers are ``cbr2.evaluation.metrics``'.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def sketch_hit_at_k(gold: Sequence[Sequence[str]], retrieved: Sequence[Sequence[Sequence[str]]], k: int) -> float:
    """Share of questions whose first ``k`` retrieved cases include one with the gold sketch.

    Args:
        gold: Per question, the function sketch of its gold program.
        retrieved: Per question, the sketches of its retrieved cases, best first.
        k: How many retrieved cases count.
    """
    if not gold:
        return 0.0
    hits = sum(tuple(g) in {tuple(s) for s in cases[:k]} for g, cases in zip(gold, retrieved, strict=True))
    return hits / len(gold)


def knowledge_recall(gold_items: Sequence[set[tuple[str, str]]], found: Sequence[set[tuple[str, str]]]) -> float:
    """Share of the gold programs' schema items that the retrieved triples mention.

    Micro-averaged: every item of every question counts once. Items are ``(kind, name)``
    pairs (concepts, attribute keys, relations, qualifier keys), so a relation named like an
    attribute key does not count as found.
    """
    total = sum(len(items) for items in gold_items)
    if total == 0:
        return 0.0
    return sum(len(items & got) for items, got in zip(gold_items, found, strict=True)) / total


def retrieval_metrics(gold_sketches: Sequence[Sequence[str]], view_sketches: dict[str, Sequence[Sequence[Sequence[str]]]],
                      gold_items: Sequence[set[tuple[str, str]]] | None = None,
                      ontology_terms: Sequence[set[tuple[str, str]]] | None = None,
                      fact_terms: Sequence[set[tuple[str, str]]] | None = None,
                      ks: Sequence[int] = (1, 5)) -> dict[str, Any]:
    """``metrics.json``'s ``retrieval`` block.

    Args:
        gold_sketches: Per evaluated question, its gold sketch (used after retrieval only).
        view_sketches: Per view (``semantic``, ``structural``, ``random``), per question, the
            sketches of its ranked cases, best first.
        gold_items: Per question, the schema items of its gold program.
        ontology_terms: Per question, the items its retrieved ontology triples mention.
        fact_terms: Per question, the items its retrieved fact triples mention.
        ks: Depths of sketch-hit.

    Returns:
        ``{"n", "cases": {view: {"sketch_hit@k"}}, "knowledge": {"recall", "recall_ontology",
        "recall_facts", "items"}}``. ``merged`` at depth k is the union of the semantic and
        structural top-k, the case set a prompt with k_s = k_r = k gets.
    """
    cases = {view: {f"sketch_hit@{k}": sketch_hit_at_k(gold_sketches, lists, k) for k in ks}
             for view, lists in view_sketches.items()}
    if "semantic" in view_sketches and "structural" in view_sketches:
        pairs = list(zip(view_sketches["semantic"], view_sketches["structural"], strict=True))
        cases["merged"] = {f"sketch_hit@{k}": sketch_hit_at_k(gold_sketches, [[*s[:k], *r[:k]] for s, r in pairs], 2 * k)
                           for k in ks}
    out: dict[str, Any] = {"n": len(gold_sketches), "cases": cases}
    if gold_items is not None and ontology_terms is not None and fact_terms is not None:
        out["knowledge"] = {
            "recall": knowledge_recall(gold_items, [o | f for o, f in zip(ontology_terms, fact_terms, strict=True)]),
            "recall_ontology": knowledge_recall(gold_items, ontology_terms),
            "recall_facts": knowledge_recall(gold_items, fact_terms),
            "items": sum(len(items) for items in gold_items),
        }
    return out


LINKED_KINDS = {"entities": ("entity",), "values": ("quantity", "year", "date", "string", "any")}
"""The argument kinds whose gold values linking is scored against: ``Find``'s entities, and the
literal values."""


def linking_metrics(gold_programs: Sequence[Any], linked: Sequence[dict[str, Sequence[str]]]) -> dict[str, Any]:
    """Linking precision and recall against the gold programs' arguments, micro-averaged.

    Args:
        gold_programs: Per question, its gold ``Program`` (read after linking, to score it).
        linked: Per question, ``{"entities": [...], "values": [...]}`` as linking found them.

    Returns:
        Per group (``entities``, ``values``): ``{"precision", "recall", "true", "linked", "gold"}``
        (counts, so shards merge exactly).
    """
    from cbr2.kopl.functions import get_spec

    out = {}
    for group, kinds in LINKED_KINDS.items():
        true = n_linked = n_gold = 0
        for program, found in zip(gold_programs, linked, strict=True):
            gold = {value for step in program.steps if (spec := get_spec(step.function))
                    for arg, value in zip(spec.args, step.inputs, strict=False) if arg.kind in kinds}
            mine = set(found.get(group, ()))
            true, n_linked, n_gold = true + len(mine & gold), n_linked + len(mine), n_gold + len(gold)
        out[group] = _link_rates(true, n_linked, n_gold)
    return out


def _link_rates(true: int, linked: int, gold: int) -> dict[str, Any]:
    return {"precision": true / linked if linked else 0.0, "recall": true / gold if gold else 0.0,
            "true": true, "linked": linked, "gold": gold}


def merge_retrieval(blocks: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The ``retrieval`` block of a whole run from those of its shards.

    Every rate in the block is a count divided by a count (hits over questions, found schema
    items over items), so each shard's count is recovered exactly as ``round(rate * n)`` and
    the merged rate is the same division an unsharded run does: equal to the last bit.

    Args:
        blocks: ``retrieval_metrics`` blocks of the shards (with ``seconds_per_question`` and
            ``encoders``, as the runner writes them).

    Returns:
        The block an unsharded run would have written (its timing a weighted mean).

    Raises:
        ValueError: When the shards retrieved with different encoders.
    """
    n = sum(b["n"] for b in blocks)
    merged: dict[str, Any] = {"n": n, "cases": {}}
    for view, ranks in blocks[0]["cases"].items():
        merged["cases"][view] = {
            key: (sum(round(b["cases"][view][key] * b["n"]) for b in blocks) / n if n else 0.0) for key in ranks}
    if "knowledge" in blocks[0]:
        items = sum(b["knowledge"]["items"] for b in blocks)
        merged["knowledge"] = {
            key: (sum(round(b["knowledge"][key] * b["knowledge"]["items"]) for b in blocks) / items if items else 0.0)
            for key in ("recall", "recall_ontology", "recall_facts")}
        merged["knowledge"]["items"] = items
    if "linking" in blocks[0]:
        merged["linking"] = {group: _link_rates(*(sum(b["linking"][group][key] for b in blocks)
                                                  for key in ("true", "linked", "gold")))
                             for group in blocks[0]["linking"]}
    seconds = [b.get("seconds_per_question") for b in blocks]
    if all(s is not None for s in seconds):
        merged["seconds_per_question"] = sum(s * b["n"] for s, b in zip(seconds, blocks, strict=True)) / max(1, n)
    encoders = [b.get("encoders") for b in blocks]
    if any(e != encoders[0] for e in encoders):
        raise ValueError(f"shards retrieved with different encoders: {encoders}")
    merged["encoders"] = encoders[0]
    return merged
