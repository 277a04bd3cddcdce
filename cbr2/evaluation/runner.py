"""The evaluation loop: questions → retrieval → prompts → one generation each (and, with
``generation.fallback``, one correction for each visible failure) → scored predictions →
metrics, report and W&B.

``predictions.jsonl`` is appended (and flushed) as answers come, so a crashed or interrupted
run resumes where it stopped: questions already in the file are not generated again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from cbr2.common.console import Progress
from cbr2.config import ablation_slug, canonical_ablation, git_hash, setting_of
from cbr2.data.benchmarks import KQAPRO, Benchmark
from cbr2.data.questions import KQAPRO_CATEGORIES, METAQA_CATEGORIES, Question
from cbr2.evaluation.browser import write_browser
from cbr2.evaluation.metrics import compute_metrics, retrieval_metrics
from cbr2.evaluation.records import append_record, read_records, records_by_id
from cbr2.evaluation.run_report import write_report
from cbr2.evaluation.scoring import score_completion
from cbr2.evaluation.tracking import log_evaluation
from cbr2.generation.fallback import (
    build_correction,
    corrected,
    fallback_metrics,
    first_pass,
    is_pending,
    single_pass_view,
)
from cbr2.generation.prompt import FALLBACK_VERSION, PROMPT_VERSION, PromptBuilder, prompt_hash
from cbr2.kopl.executor import Executor
from cbr2.kopl.sketch import schema_items, sketch
from cbr2.kopl.text import FORMATS
from cbr2.llm import backend_class, make_backend
from cbr2.llm.base import Completion, Prompt
from cbr2.retrieval.cases import VIEWS, Query
from cbr2.retrieval.knowledge import Knowledge
from cbr2.retrieval.retriever import CASE_MODES, Retrieved, Retriever, check_retrieval_config, resolve_structural

log = logging.getLogger(__name__)

IDENTITY_KEYS = ("data", "llm", "prompt", "generation", "retrieval", "structural")
"""Config sections that decide what a prediction is; a resumed run must agree on them."""

BATCH = 64
"""Questions per retrieval batch."""


def output_dir(cfg: DictConfig, bench: Benchmark, retrieval_only: bool = False, ablation: str | None = None) -> Path:
    """The run's folder: ``output_dir``, else ``outputs/{data.name}/{split}/{leaf}``.

    The leaf is ``retrieval`` for ``--retrieval-only``, else ``llm.backend``, with
    ``-{ablation}`` appended (``w/o_act`` → ``hf-wo_act``) when an ablation is selected.
    """
    if cfg.output_dir:
        base = Path(cfg.output_dir)
    else:
        leaf = "retrieval" if retrieval_only else cfg.llm.backend
        if ablation and not retrieval_only:
            leaf += "-" + ablation_slug(ablation)
        base = Path("outputs") / cfg.data.name / (cfg.data.split or bench.family.eval_split) / leaf
    # Shards of one run sit side by side in its folder; `python -m cbr2.cluster.merge` fills the folder itself.
    count = cfg.eval.num_shards or 1
    return base / f"shard-{cfg.eval.shard}-of-{count}" if count > 1 else base


def resolve_shard(cfg: DictConfig) -> None:
    """Fill ``eval.num_shards`` and ``eval.shard``: as configured, else from the SLURM job array
    (task position of ``$SLURM_ARRAY_TASK_COUNT``), else one shard.

    Raises:
        ValueError: On a shard outside ``[0, num_shards)`` or only one of the two set outside an array.
    """
    from cbr2.cluster.slurm import array_task

    e = cfg.eval
    if e.num_shards is None and e.shard is None:
        e.shard, e.num_shards = array_task() or (0, 1)
    elif e.shard is None:
        task = array_task()
        if e.num_shards > 1 and task is None:
            raise ValueError(f"eval.num_shards={e.num_shards} needs eval.shard (0..{e.num_shards - 1}) outside a job array")
        e.shard = task[0] if task and e.num_shards > 1 else 0
    elif e.num_shards is None:
        raise ValueError(f"eval.shard={e.shard} needs eval.num_shards")
    if e.num_shards < 1 or not 0 <= e.shard < e.num_shards:
        raise ValueError(f"eval.shard={e.shard} is not one of eval.num_shards={e.num_shards} shards (0..{e.num_shards - 1})")


def shard_of(questions: Sequence[Question], shard: int, num_shards: int) -> list[Question]:
    """Question i of the selection goes to shard ``i mod num_shards``: deterministic, and every
    shard gets a near-equal share of each category of a balanced sample."""
    return list(questions[shard::num_shards])


def selection_sha256(questions: Sequence[Question]) -> str:
    """SHA-256 of the question ids in order: what the evaluated questions were."""
    return hashlib.sha256("\n".join(q.qid for q in questions).encode()).hexdigest()


def run_title(bench_name: str, cfg: DictConfig, retrieval_only: bool, ablation: str | None) -> str:
    """First heading of ``report.md``."""
    return f"{bench_name} · {'retrieval' if retrieval_only else cfg.llm.backend}" + (f" · {ablation}" if ablation else "")


def select_questions(bench: Benchmark, cfg: DictConfig) -> list[Question]:
    """The evaluated questions: the configured split, optionally category-balanced, cut to ``eval.limit``.

    With ``eval.per_category=N`` the split is shuffled with ``random.Random(eval.sample_seed)``
    and the first N questions of each category are kept, in shuffled order (the few-shot
    literature's KQA Pro 9 x 100 recipe with N = 100 and seed 123). ``eval.skip_per_category=S``
    keeps questions S+1 .. S+N of each category instead: a sample disjoint from the first S of
    each category (settings chosen on those are then measured on other questions).

    Raises:
        ValueError: If the split has no gold answers to score against.
    """
    questions = bench.questions(cfg.data.split)
    skip = cfg.eval.skip_per_category
    if skip < 0 or (skip and cfg.eval.per_category is None):
        raise ValueError(f"eval.skip_per_category={skip}: must be at least 0, and needs eval.per_category")
    if cfg.eval.per_category is not None:
        shuffled = list(questions)
        random.Random(cfg.eval.sample_seed).shuffle(shuffled)
        taken: Counter[str] = Counter()
        questions = []
        for q in shuffled:
            if taken[q.category] < skip + cfg.eval.per_category:
                taken[q.category] += 1
                if taken[q.category] > skip:  # the first `skip` of each category are another sample's
                    questions.append(q)
    if cfg.eval.limit is not None:
        questions = questions[: cfg.eval.limit]
    if any(q.answer is None for q in questions):
        raise ValueError(f"{bench.name} split {cfg.data.split or bench.family.eval_split!r} has no gold answers "
                         "(the official KQA Pro test set keeps them private); evaluate val instead")
    return questions


def _prepare(cfg: DictConfig, bench: Benchmark, retrieval_only: bool) -> None:
    """Checks that fail fast, and the structural retriever resolved into the config."""
    if not retrieval_only:
        backend_class(cfg.llm.backend)  # a misspelt backend fails before minutes of retrieval
        if cfg.prompt.format not in FORMATS:
            raise ValueError(f"unknown prompt.format {cfg.prompt.format!r}; expected one of {', '.join(FORMATS)}")
    check_retrieval_config(cfg.retrieval)
    if retrieval_only or "structural" in CASE_MODES[cfg.retrieval.cases]:
        # Resolved once and saved in config.yaml, so the run records the exact retriever used.
        cfg.structural.checkpoint = resolve_structural(cfg, bench)


def build_prompts(cfg: DictConfig, questions: Sequence[Question], retrieved: dict[str, Retrieved]) -> list[Prompt]:
    """One prompt per question, from its text and what retrieval returned for it.

    The builder is given ``Query(id, text)`` for the target question, never the question
    itself: its gold program and answer cannot reach the prompt.
    """
    builder = PromptBuilder(cfg.prompt.format, cfg.prompt.case_triples)
    empty = Retrieved(Query("", ""), Knowledge(), [])
    prompts = []
    for q in questions:
        item = retrieved.get(q.qid, empty)
        prompts.append(builder.build(Query(q.qid, q.question), item.knowledge, item.cases, item.case_knowledge))
    return prompts


def show_prompt(cfg: DictConfig, index: int) -> str:
    """Exactly what the model would read for question ``index`` (0-based) of the selected questions.

    Retrieves for that one question and renders its prompt the way the configured backend
    would (plain text, or the model's chat template), without loading an LLM.

    Raises:
        ValueError: If ``index`` is outside the selected questions.
    """
    bench = Benchmark(cfg.data.name, cfg.data.root)
    questions = select_questions(bench, cfg)
    if not 0 <= index < len(questions):
        raise ValueError(f"--show-prompt {index}: the selection has {len(questions)} questions (0..{len(questions) - 1})")
    _prepare(cfg, bench, retrieval_only=False)
    question = questions[index]
    # On stderr (stdout is the prompt alone), so the prompt can be matched to predictions.jsonl.
    log.info("--show-prompt %d: question id %s (%s), number %d of the %d selected: %s", index, question.qid,
             question.category, index + 1, len(questions), question.question)
    retrieved = {}
    if _retrieves(cfg.retrieval):
        retriever = Retriever(bench, cfg.retrieval, cfg.structural.checkpoint)
        retrieved = {question.qid: retriever.retrieve([Query(question.qid, question.question)])[0]}
    (prompt,) = build_prompts(cfg, [question], retrieved)
    return make_backend(cfg, [question]).render(prompt)


def run_evaluation(cfg: DictConfig, retrieval_only: bool = False, ablation: str | None = None) -> dict[str, Any]:
    """Evaluate a configuration end to end and write its output folder.

    Args:
        cfg: The resolved configuration (``cbr2.config.Config``).
        retrieval_only: Retrieve and score retrieval only (every view), no generation.
        ablation: The ``--ablation`` name the configuration came from (recorded; names the folder).
            The Table 5 setting the run is labelled with is read off the configuration itself
            (``config.setting_of``), so a run of the defaults is Full CBR² with or without
            ``--ablation full``.

    Returns:
        The metrics (also written to ``metrics.json``).
    """
    ablation = canonical_ablation(ablation)
    bench = Benchmark(cfg.data.name, cfg.data.root)
    resolve_shard(cfg)
    selection = select_questions(bench, cfg)
    questions = shard_of(selection, cfg.eval.shard, cfg.eval.num_shards)
    out = output_dir(cfg, bench, retrieval_only, ablation)
    _prepare(cfg, bench, retrieval_only)
    out.mkdir(parents=True, exist_ok=True)
    if not retrieval_only:
        check_same_config(out, cfg)
    (out / "config.yaml").write_text(OmegaConf.to_yaml(cfg), encoding="utf-8")
    title = run_title(bench.name, cfg, retrieval_only, ablation)
    categories = KQAPRO_CATEGORIES if bench.family is KQAPRO else METAQA_CATEGORIES
    prov = {**provenance(cfg, bench), "ablation": ablation, "setting": setting_of(cfg), "output_dir": str(out),
            "question_ids_sha256": selection_sha256(questions)}
    sharded = cfg.eval.num_shards > 1
    if sharded:
        prov["shard"] = {"index": cfg.eval.shard, "count": cfg.eval.num_shards, "selection_n": len(selection),
                         "selection_sha256": selection_sha256(selection)}

    retrieval, retrieved = run_retrieval(cfg, bench, questions, out, extra_views=VIEWS if retrieval_only else ())
    if retrieval_only:
        metrics = {"n": len(questions), "retrieval": retrieval, "provenance": prov}
        (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
        write_report(out / "report.md", metrics, title=title)
        write_browser(out, bench)
        return metrics

    records = generate_and_score(cfg, bench, questions, build_prompts(cfg, questions, retrieved), out)
    metrics = finish_metrics(records, categories, cfg.generation.fallback)
    if retrieval is not None:
        metrics["retrieval"] = retrieval
    metrics["provenance"] = prov
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    write_report(out / "report.md", metrics, title=title)
    write_browser(out, bench)
    if sharded:  # one W&B run per evaluation, not per shard: the merge logs it
        log.info("shard %d of %d done; `python -m cbr2.cluster.merge` joins the shards and logs the run to W&B",
                 cfg.eval.shard, cfg.eval.num_shards)
    else:
        log_evaluation(cfg.wandb, metrics, records, out, name=wandb_name(cfg, bench.name, ablation))
    return metrics


def wandb_name(cfg: DictConfig, bench_name: str, ablation: str | None) -> str:
    """``wandb.name``, else ``{benchmark}-{backend}-{ablation or 'run'}``."""
    return cfg.wandb.name or f"{bench_name}-{cfg.llm.backend}-{ablation or 'run'}"


def generation_key(cfg: DictConfig, backend: Any) -> str:
    """The predictions cache's second key: what besides the prompt decides a record.

    The backend's identity (backend, model, sampling parameters, grammar), the ``generation``
    section (constrained decoding and the fallback change what is generated, canonicalisation
    how it is scored) and, with the fallback on, the correction prompt's version.
    """
    ident: dict[str, Any] = {"backend": backend.identity(), "generation": OmegaConf.to_container(cfg.generation)}
    if cfg.generation.fallback:
        ident["fallback_version"] = FALLBACK_VERSION
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def generate_and_score(cfg: DictConfig, bench: Benchmark, questions: Sequence[Question], prompts: Sequence[Prompt],
                       out: Path) -> list[dict[str, Any]]:
    """Generate what is not cached, score it, append it to ``predictions.jsonl`` as it comes.

    ``predictions.jsonl`` doubles as the cache: a record is reused when its prompt hash and
    generation key (backend, model, sampling parameters, ``generation`` section) equal this
    run's, so an interrupted run resumes where it stopped and a changed prompt is generated again.

    With ``generation.fallback`` the single pass is followed by one correction round for the
    programs that failed (``cbr2.generation.fallback``): a failed first pass is written at once,
    marked pending, and its final record is appended after the correction, so a resumed run
    runs only the corrections still missing.

    Returns:
        The records of ``questions``, in order.
    """
    gen = cfg.generation
    pred_path = out / "predictions.jsonl"
    grammar = None
    if gen.constrained:
        from cbr2.generation.grammar import build_grammar

        grammar = build_grammar(cfg, bench)
    backend = make_backend(cfg, questions, grammar=grammar)
    gen_key = generation_key(cfg, backend)
    hashes = [prompt_hash(p) for p in prompts]
    done = load_predictions(pred_path, repair=True)  # cuts a half-written last record before appending
    cached = {q.qid for q, h in zip(questions, hashes, strict=True)
              if q.qid in done and done[q.qid].get("prompt_hash") == h and done[q.qid].get("generation_key") == gen_key}
    todo = [i for i, q in enumerate(questions) if q.qid not in cached]
    pending = [i for i, q in enumerate(questions) if q.qid in cached and is_pending(done[q.qid])]
    log.info("%s: %d questions, %d cached in %s (%d awaiting their correction), %d to generate with %s", bench.name,
             len(questions), len(cached), pred_path, len(pending), len(todo), cfg.llm.backend)
    if not todo and not pending:
        return [done[q.qid] for q in questions]

    executor = Executor(bench.kb, cfg.eval.timeout_s, engine=cfg.eval.executor)
    canonicalize = None
    if gen.canonicalize:
        from cbr2.generation.canonicalize import build_canonicalizer

        canonicalize = build_canonicalizer(cfg, bench)

    def score(text: str, i: int) -> dict[str, Any]:
        return score_completion(text, questions[i], bench, executor, cfg.prompt.format, canonicalize=canonicalize)

    with pred_path.open("a", encoding="utf-8") as sink:
        def write(record: dict[str, Any]) -> None:
            append_record(sink, record)
            done[record["id"]] = record

        if todo:
            with Progress(total=len(todo), desc="generate", unit="q") as bar:
                last = [time.perf_counter()]

                def on_result(j: int, completion: Completion) -> None:
                    i = todo[j]
                    now = time.perf_counter()
                    record = score(completion.text, i)
                    # Wall time since the previous answer: their sum is the run's generation time,
                    # also for backends that return a whole batch at once.
                    record.update(prompt_hash=hashes[i], generation_key=gen_key,
                                  prompt_tokens=completion.prompt_tokens,
                                  completion_tokens=completion.completion_tokens, latency_s=now - last[0])
                    last[0] = now
                    if gen.fallback:
                        record = first_pass(record)
                        if is_pending(record):
                            pending.append(i)
                    write(record)
                    bar.update()

                backend.generate([prompts[i] for i in todo], on_result=on_result)
        if pending:
            _correct(cfg, bench, canonicalize, backend, [(i, prompts[i], done[questions[i].qid]) for i in pending],
                     score, write)
    return [done[q.qid] for q in questions]


def _correct(cfg: DictConfig, bench: Benchmark, canonicalize: Any, backend: Any,
             failed: Sequence[tuple[int, Prompt, dict[str, Any]]], score: Callable[[str, int], dict[str, Any]],
             write: Callable[[dict[str, Any]], None]) -> None:
    """The fallback's correction round: one prompt per failed first pass, all in one ``generate`` call.

    The same backend object generates (under the same grammar when constrained). Suggestions
    come from the canonicaliser when ``generation.canonicalize`` built one; otherwise from a
    lexical-only ``Canonicalizer``, which needs no encoder: loading one and embedding a KB's
    whole vocabulary would cost more than the few corrections of a run, and the model reading
    the suggestions judges their meaning itself. Each correction's latency includes building
    its prompt.

    Args:
        failed: ``(question index, its prompt, its pending first-pass record)`` each.
        score: Scores a generated text for question index ``i``.
        write: Appends a final record to ``predictions.jsonl``.
    """
    start = time.perf_counter()
    if canonicalize is None:
        from cbr2.generation.canonicalize import Canonicalizer

        canonicalize = Canonicalizer(bench.kb.vocabulary)
    corrections = [build_correction(prompt, record, bench.kb.vocabulary, canonicalize.nearest)
                   for _, prompt, record in failed]
    log.info("fallback: correcting %d failed programs", len(corrections))
    with Progress(total=len(corrections), desc="correct", unit="q") as bar:
        last = [start]

        def on_result(j: int, completion: Completion) -> None:
            i, _, first = failed[j]
            now = time.perf_counter()
            write(corrected(first, score(completion.text, i), completion, now - last[0], prompt_hash(corrections[j])))
            last[0] = now
            bar.update()

        backend.generate(corrections, on_result=on_result)


def finish_metrics(records: Sequence[dict[str, Any]], categories: Sequence[str], fallback: bool = False
                   ) -> dict[str, Any]:
    """The metrics of a run's records (``run_evaluation`` and the shard merge both call this).

    Args:
        records: The final prediction records.
        categories: Categories to list first.
        fallback: Whether ``generation.fallback`` was on: adds ``single_pass`` (the metrics of
            the first pass alone) and ``fallback`` (``cbr2.generation.fallback.fallback_metrics``).

    Returns:
        ``compute_metrics`` of the records, with ``generation`` (``generation_stats``: a
        question's seconds and tokens include its correction) and the two fallback blocks.
    """
    metrics = compute_metrics(records, categories)
    metrics["generation"] = generation_stats(records)
    if fallback:
        metrics["single_pass"] = compute_metrics([single_pass_view(r) for r in records], categories)
        metrics["fallback"] = fallback_metrics(records)
    return metrics


def generation_stats(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Seconds and tokens per question (over records that report them).

    With the fallback on, a record's ``latency_s`` and token counts add up both of its
    generations, so these are the cost of a question.
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


def _retrieves(r: DictConfig, extra_views: Sequence[str] = ()) -> bool:
    return bool(extra_views) or r.cases != "none" or r.k_ontology > 0 or r.k_facts > 0


def run_retrieval(cfg: DictConfig, bench: Benchmark, questions: list[Question], out: Path,
                  extra_views: tuple[str, ...] = ()) -> tuple[dict[str, Any] | None, dict[str, Retrieved]]:
    """Retrieve for every question, write ``retrieval.jsonl`` and score retrieval.

    Retrieval sees ``Query(id, text)`` only; the gold programs are read afterwards, to score
    what was retrieved.

    Returns:
        The ``retrieval`` block of ``metrics.json`` (None when the configuration retrieves
        nothing) and the retrieved items by question id.
    """
    r = cfg.retrieval
    if not _retrieves(r, extra_views):
        return None, {}
    retriever = Retriever(bench, r, cfg.structural.checkpoint, extra_views)
    start = time.perf_counter()
    retrieved: list[Retrieved] = []
    with Progress(total=len(questions), desc="retrieve", unit="q", disable=len(questions) <= BATCH) as bar:
        for i in range(0, len(questions), BATCH):
            batch = questions[i: i + BATCH]
            retrieved += retriever.retrieve([Query(q.qid, q.question) for q in batch])
            bar.update(len(batch))
    seconds = time.perf_counter() - start
    with (out / "retrieval.jsonl").open("w", encoding="utf-8") as sink:
        for item in retrieved:
            append_record(sink, item.to_record())

    pool_sketches = [sketch(q.program) for q in retriever.pool]
    view_sketches = {view: [[pool_sketches[i] for i, _ in item.rankings[view]] for item in retrieved]
                     for view in retriever.views}
    knowledge = retriever.knowledge is not None
    block = retrieval_metrics(
        [sketch(q.program) for q in questions], view_sketches,
        gold_items=[schema_items(q.program) for q in questions] if knowledge else None,
        ontology_terms=[{t for tr in item.knowledge.ontology for t in tr.terms} for item in retrieved],
        fact_terms=[{t for tr in item.knowledge.facts for t in tr.terms} for item in retrieved],
    )
    block["seconds_per_question"] = seconds / max(1, len(questions))
    block["encoders"] = {view: name for view, (name, _) in retriever.encoders.items()}
    return block, {item.query.qid: item for item in retrieved}


def load_predictions(path: Path, repair: bool = False) -> dict[str, dict[str, Any]]:
    """Records of an earlier (possibly interrupted) run, by question id (``records.read_records``).

    A damaged last line (the process died mid-write) is dropped with a warning; with ``repair``
    (the run about to append to the file) the file is also cut back to its last good record.
    A question may appear again further down when its record was superseded: a fallback's
    pending first pass by its final record, or a record whose prompt or generation key is no
    longer this configuration's by one generated again. The newest record wins then.

    Raises:
        ValueError: Naming the file and line of a corrupt record before the last line, or both
            lines of a question recorded twice with different content that supersedes nothing.
    """
    return records_by_id(path, read_records(path, repair=repair), supersedes=_supersedes)


def _supersedes(new: dict[str, Any], old: dict[str, Any]) -> bool:
    """Whether ``new`` may replace the earlier record ``old`` of the same question."""
    stale = (new.get("prompt_hash"), new.get("generation_key")) != (old.get("prompt_hash"), old.get("generation_key"))
    return stale or is_pending(old)


def check_same_config(out: Path, cfg: DictConfig) -> None:
    """Refuse to mix predictions of different configurations in one folder.

    Raises:
        ValueError: When the folder's ``config.yaml`` differs in an ``IDENTITY_KEYS`` section
            (naming them), or cannot be read as a mapping (then nobody knows what wrote the
            predictions beside it).
    """
    old_path = out / "config.yaml"
    if not old_path.exists() or not (out / "predictions.jsonl").exists():
        return
    try:
        old = OmegaConf.load(old_path)
        problem = None if isinstance(old, DictConfig) else "not a mapping"
    except (OSError, yaml.YAMLError) as err:
        problem = " ".join(str(err).split())
    if problem:
        raise ValueError(f"{old_path} is not a readable config ({problem}), so what wrote the predictions beside it "
                         "is unknown; choose another output_dir or delete the folder")

    def section(node: DictConfig, key: str) -> Any:
        value = node.get(key)
        return OmegaConf.to_container(value) if isinstance(value, DictConfig) else value

    diff = [k for k in IDENTITY_KEYS if section(old, k) != section(cfg, k)]
    if diff:
        raise ValueError(f"{out} holds predictions of a different configuration (sections {', '.join(diff)} differ); "
                         "choose another output_dir or delete the folder")


def provenance(cfg: DictConfig, bench: Benchmark) -> dict[str, Any]:
    """What a result needs to be trusted and reproduced."""
    versions = {}
    for pkg in ("cbr2", "kopl", "omegaconf", "torch", "transformers", "sentence-transformers", "faiss-cpu",
                "faiss-gpu-cu12", "vllm", "openai"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    return {
        "config": OmegaConf.to_container(cfg),
        "git": git_hash(),
        "python": platform.python_version(),
        "packages": versions,
        "data_root": str(bench.root),
        "split": cfg.data.split or bench.family.eval_split,
        "prompt_version": PROMPT_VERSION,
        "fallback_version": FALLBACK_VERSION if cfg.generation.fallback else None,
        "seed": {"retrieval": cfg.retrieval.seed, "llm": cfg.llm.seed, "sample": cfg.eval.sample_seed},
        "command": " ".join(sys.argv),
    }
