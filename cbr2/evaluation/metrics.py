"""Every metric of a run's answers, in one place: Hits@1 and SER overall and per category, generation
cost, the fallback's effect, and the paired comparison of two runs (retrieval quality, which
training measures as well, is ``cbr2.retrieval.metrics``').

Honesty rules that live here:
* a prediction is right only if it has an executed answer that matches the gold one; a
  program that failed to parse, type-check or execute is wrong, whatever the question;
* SER is the share of generated programs that do not parse or type-check after the
  deterministic repair; the share before repair is reported beside it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import date
from typing import Any, cast

from cbr2.common.records import PROMPT_TOO_LONG, Prediction
from cbr2.data.questions import KQAPRO_REASONING_TYPES
from cbr2.evaluation.errors import analyze
from cbr2.generation.fallback import FIRES_ON, single_pass_view

ERROR_KINDS = ("syntax", "type", "execution", "empty", "wrong", PROMPT_TOO_LONG)
"""Why a prediction is wrong, in pipeline order; ``None`` means right."""

def _kqapro_number(text: str) -> str:
    """KQA Pro's number normalisation: a leading number whose fractional part is below 1e-5 is
    written as an integer, the unit kept (``100.0 metre`` → ``100 metre``).

    As in KQA Pro's own evaluation, "fractional part" is ``v - int(v)``, which is negative for
    a negative non-integer, so ``-2.5`` is written ``-2``: kept as it is, since a number scored
    otherwise is not comparable with the published ones (the reference engine prints negative
    decimals the same way).
    """
    number, *unit = text.split()
    value: float | int = float(number)
    if value - int(value) < 1e-5:  # int() of inf or nan raises: such a text stays as it is
        value = int(value)
    return " ".join([str(value), *unit])


def _kqapro_date(text: str) -> date | int:
    """A date (``yyyy-mm-dd``, three parts split on ``-``) or a year (an integer); raises otherwise."""
    parts = text.split("-")
    if len(parts) == 3:
        return date(int(parts[0]), int(parts[1]), int(parts[2]))
    return int(text)


def answers_match(pred: str, gold: str) -> bool:
    """Whether a predicted KQA Pro answer equals the gold one, by KQA Pro's official comparison.

    1. Both strings are normalised as numbers (``_kqapro_number``): ``100.0 metre`` = ``100 metre``.
    2. When both then read as a date or a year (``_kqapro_date``), two full dates must be equal,
       and otherwise their years (``1882-12-11`` = ``1882``; a year is any integer).
    3. Anything else must be equal as text (``yyyy/mm/dd`` is text: ``1882/12/11`` ≠ ``1882-12-11``).

    The official baselines score with these rules, so Hits@1 computed here is comparable with
    theirs. Both sides are stripped first, as the official script strips each prediction line.
    """
    normalised = []
    for text in (pred.strip(), gold.strip()):
        try:
            text = _kqapro_number(text)
        except (ValueError, OverflowError):  # not a number (or no text at all): compared as it is
            pass
        normalised.append(text)
    pred, gold = normalised
    try:
        p, g = _kqapro_date(pred), _kqapro_date(gold)
    except (ValueError, OverflowError):
        return pred == gold
    if isinstance(p, date) and isinstance(g, date):
        return p == g
    return (p.year if isinstance(p, date) else p) == (g.year if isinstance(g, date) else g)


def is_correct(pred: str | Sequence[str] | None, gold: str | Sequence[str] | None) -> bool:
    """Hits@1 of one prediction.

    Args:
        pred: One string (KQA Pro) or a list of names whose first is the top answer (MetaQA).
        gold: One string (KQA Pro: compared by ``answers_match``, the official comparison) or
            the set of gold names (MetaQA: the top answer must be one of them as text, as in
            MetaQA's own Hits@1).
    """
    if pred is None or gold is None:
        return False
    if isinstance(gold, str):
        return isinstance(pred, str) and answers_match(pred, gold)
    top = pred if isinstance(pred, str) else (pred[0] if pred else None)
    return top is not None and top.strip() in {g.strip() for g in gold}


JUDGED_KINDS = (None, "wrong")
"""``error_kind`` of a prediction whose verdict comes from comparing its answer with the gold one
(every other kind is wrong before any comparison)."""


def judged(record: Prediction) -> Prediction:
    """The record with its verdict taken again by ``is_correct``, the one comparison.

    A record keeps the verdict of the comparison it was scored with; records cached or written
    before a change of the comparison are brought to the current one wherever records are read
    (``records.load_predictions``, the browser), so every Hits@1 the project prints, from a
    run, a merge, a sweep or a comparison, uses the same rule. The single pass of a fallback
    record (``single_pass``) is judged again too. A record of a question without a gold answer
    (a test split) is returned as it is.
    """
    gold = record.get("gold_answer")
    if gold is None:
        return record
    out = dict(record)
    if out.get("error_kind") in JUDGED_KINDS and out.get("answer"):
        out["correct"] = is_correct(out["answer"], gold)
        out["error_kind"] = None if out["correct"] else "wrong"
    single = out.get("single_pass")
    if isinstance(single, dict) and single.get("error_kind") in JUDGED_KINDS and single.get("answer"):
        right = is_correct(single["answer"], gold)
        out["single_pass"] = {**single, "correct": right, "error_kind": None if right else "wrong"}
    return cast(Prediction, out)


ANSWER_COMPARISON = "kqapro-official/metaqa-exact"
"""Which answer comparison ``is_correct`` applies, recorded in ``metrics.json``: KQA Pro's official
one (``answers_match``) and MetaQA's exact names. A comparison of runs notes a run scored otherwise."""


def _rates(records: Sequence[Prediction]) -> dict[str, Any]:
    n = len(records)
    if n == 0:
        return {"hits@1": 0.0, "ser": 0.0, "ser_before_repair": 0.0, "n": 0}
    # A split without gold answers (KQA Pro's test) has no Hits@1 to report, only what was generated.
    answered = any(r.get("gold_answer") is not None for r in records)
    return {
        "hits@1": sum(bool(r["correct"]) for r in records) / n if answered else None,
        "ser": sum(r["syntax_error"] for r in records) / n,
        "ser_before_repair": sum(r["syntax_error_before_repair"] for r in records) / n,
        "n": n,
    }


def compute_metrics(records: Iterable[Prediction], categories: Sequence[str] = (),
                    reasoning_types: Mapping[str, Sequence[str]] | None = None) -> dict[str, Any]:
    """Aggregate prediction records into ``metrics.json``'s structure.

    Args:
        records: Prediction records with ``correct``, ``category``, ``error_kind``,
            ``syntax_error`` and ``syntax_error_before_repair``.
        categories: Categories to list first, in this order (others follow sorted).
        reasoning_types: Question id → its KQA Pro reasoning types (``Question.reasoning_types``);
            None for a benchmark without them.

    Returns:
        ``{"hits@1", "ser", "ser_before_repair", "n", "per_category": {cat: {...}},
        "errors": {kind: count}, "emptied_at": {function: count}, "prompt_too_long": [question ids],
        "error_analysis": {...}}`` with
        fractions in [0, 1], and ``per_reasoning_type`` (each type that some question has, in
        ``KQAPRO_REASONING_TYPES`` order) when ``reasoning_types`` is given; ``hits@1`` is None
        when no record has a gold answer (``gold_answers`` is then False).
        ``emptied_at`` counts the empty answers by the function of the step whose result was
        empty first (most first). ``error_analysis`` is ``errors.analyze``'s grounding / logical classification of the
        wrong predictions.
    """
    records = list(records)
    by_cat: dict[str, list[Prediction]] = {}
    for r in records:
        by_cat.setdefault(r["category"] or "unknown", []).append(r)
    order = [c for c in categories if c in by_cat] + sorted(c for c in by_cat if c not in categories)
    kinds = Counter(r["error_kind"] for r in records if r["error_kind"])
    metrics = {
        **_rates(records),
        "answer_comparison": ANSWER_COMPARISON,
        "per_category": {c: _rates(by_cat[c]) for c in order},
    }
    if reasoning_types is not None:
        by_type = {t: [r for r in records if t in reasoning_types.get(r["id"], ())] for t in KQAPRO_REASONING_TYPES}
        metrics["per_reasoning_type"] = {t: _rates(rs) for t, rs in by_type.items() if rs}
    if records and metrics["hits@1"] is None:
        metrics["gold_answers"] = False
    return {
        **metrics,
        "errors": {k: kinds.get(k, 0) for k in ERROR_KINDS},
        "emptied_at": dict(Counter(r["emptied_at"]["function"] for r in records
                                   if r["error_kind"] == "empty" and r.get("emptied_at")).most_common()),
        # Named one by one: each was never put to the model, whatever the other numbers say.
        PROMPT_TOO_LONG: [r["id"] for r in records if r["error_kind"] == PROMPT_TOO_LONG],
        "error_analysis": analyze(records, categories),
    }


def finish_metrics(records: Sequence[Prediction], categories: Sequence[str], fallback: bool = False,
                   reasoning_types: Mapping[str, Sequence[str]] | None = None) -> dict[str, Any]:
    """The metrics of a run's records (an evaluation and the shard merge both get theirs here).

    Args:
        records: The final prediction records.
        categories: Categories to list first.
        fallback: Whether ``generation.fallback`` was on: adds ``single_pass`` (the metrics of
            the first pass alone) and ``fallback`` (``fallback_metrics``).
        reasoning_types: As for ``compute_metrics``.

    Returns:
        ``compute_metrics`` of the records, with ``generation`` (``generation_stats``: a
        question's seconds and tokens include its correction) and the two fallback blocks.
    """
    metrics = compute_metrics(records, categories, reasoning_types)
    metrics["generation"] = generation_stats(records)
    if fallback:
        metrics["single_pass"] = compute_metrics([single_pass_view(r) for r in records], categories, reasoning_types)
        metrics["fallback"] = fallback_metrics(records)
    return metrics


def generation_stats(records: Sequence[Prediction]) -> dict[str, Any]:
    """Seconds and tokens per question (over records that report them), and canonicalisation counts.

    With the fallback on, a record's ``latency_s`` and token counts add up both of its
    generations, so these are the cost of a question.

    Returns:
        ``{"seconds_per_question", "prompt_tokens", "completion_tokens"}`` (None when no record
        reports them) and ``"canonicalized": {"considered", "snapped", "questions"}``.
    """
    def mean(key: str) -> float | None:
        values = [r[key] for r in records if r.get(key) is not None]
        return sum(values) / len(values) if values else None

    snaps = [c for r in records for c in (r.get("canonicalized") or [])]
    return {"seconds_per_question": mean("latency_s"), "prompt_tokens": mean("prompt_tokens"),
            "completion_tokens": mean("completion_tokens"),
            # generation.canonicalize: arguments outside the KB vocabulary, and how many were snapped.
            "canonicalized": {"considered": len(snaps), "snapped": sum(bool(c.get("snapped")) for c in snaps),
                              "questions": sum(any(c.get("snapped") for c in r.get("canonicalized") or [])
                                               for r in records)}}


def fallback_metrics(records: Sequence[Prediction]) -> dict[str, Any]:
    """``metrics.json``'s ``fallback`` block (``cbr2.generation.fallback`` describes the records).

    Returns:
        ``fired`` (questions that got a correction) and ``fired_rate`` (of all), ``fixed``
        (right after and not before) and ``fixed_rate_of_fired``, ``still_failing`` (fired,
        still not right), ``kept_correction`` (corrections that replaced their first pass),
        ``corrections`` (the corrections' own error kinds, ``right`` when right), ``after``
        (final error kinds of the fired questions, ``right`` for the fixed ones),
        ``by_error_kind`` (``{"fired", "fixed"}`` per single-pass error kind),
        ``extra_seconds_per_question`` (the corrections' time over all questions) and
        ``extra_seconds_per_fired``. Rates of nothing are None.
    """
    n = len(records)
    fired = [r for r in records if (r.get("fallback") or {}).get("fired")]
    fixed = sum(bool(r["fallback"]["fixed"]) for r in fired)
    extra = sum(r["fallback"].get("latency_s") or 0.0 for r in fired)
    by_kind = {kind: {"fired": 0, "fixed": 0} for kind in FIRES_ON}
    for r in fired:
        counts = by_kind.setdefault(r["single_pass"]["error_kind"], {"fired": 0, "fixed": 0})
        counts["fired"] += 1
        counts["fixed"] += bool(r["fallback"]["fixed"])
    return {
        "fired": len(fired),
        "fired_rate": len(fired) / n if n else 0.0,
        "fixed": fixed,
        "fixed_rate_of_fired": fixed / len(fired) if fired else None,
        "still_failing": len(fired) - fixed,
        "kept_correction": sum(r["fallback"].get("kept") == "correction" for r in fired),
        "corrections": dict(Counter(r["fallback"].get("error_kind") or "right" for r in fired)),
        "after": dict(Counter(r["error_kind"] or "right" for r in fired)),
        "by_error_kind": by_kind,
        "extra_seconds_per_question": extra / n if n else None,
        "extra_seconds_per_fired": extra / len(fired) if fired else None,
    }


def paired_difference(a: Sequence[bool], b: Sequence[bool], resamples: int = 10_000, seed: int = 0,
                      level: float = 0.95) -> dict[str, Any]:
    """Hits@1 of ``a`` minus that of ``b`` on the same questions, with a paired bootstrap interval.

    ``scipy.stats.bootstrap(paired=True)``, percentile method: both runs are resampled with the
    same question indices, so the interval reflects how much the difference depends on which
    questions were drawn, not the variance of each run alone. Resamples are drawn a batch at a
    time (about 4 million question draws each), which bounds the memory (10,000 resamples of
    KQA Pro's 11,797 validation questions: ~0.2 GB instead of ~3.7 GB) and gives the same
    interval as one batch, to the last digit: the batches read the generator's stream in order.

    Args:
        a: Per-question correctness of one run.
        b: Of the other run, on the same questions in the same order.
        resamples: Bootstrap resamples.
        seed: Seed of the resampling.
        level: Coverage of the percentile interval.

    Returns:
        ``{"delta", "low", "high", "a_only", "b_only", "n"}``: fractions in [-1, 1]; ``a_only``
        and ``b_only`` count the questions only that run got right (the flips).
    """
    import numpy as np
    from scipy.stats import bootstrap

    if len(a) != len(b):
        raise ValueError(f"paired runs need the same questions ({len(a)} vs {len(b)})")
    a_arr, b_arr = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    diff = a_arr - b_arr
    n = len(diff)
    if n == 0:
        return {"delta": 0.0, "low": 0.0, "high": 0.0, "a_only": 0, "b_only": 0, "n": 0}
    delta = float(diff.mean())
    low = high = delta  # one question: every resample is that question (scipy wants two or more)
    if n > 1:
        # random_state, not rng: the keyword every scipy the project allows (>=1.10) takes.
        result = bootstrap((a_arr, b_arr), lambda x, y, axis: np.mean(x - y, axis=axis), paired=True,
                           vectorized=True, n_resamples=resamples, batch=max(1, 4_000_000 // n),
                           confidence_level=level, method="percentile", random_state=np.random.default_rng(seed))
        low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
    return {"delta": delta, "low": low, "high": high,
            "a_only": int((diff > 0).sum()), "b_only": int((diff < 0).sum()), "n": n}
