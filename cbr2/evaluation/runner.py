"""The evaluation loop: questions → generator → scored predictions → metrics and report.

``predictions.jsonl`` is appended (and flushed) as answers come, so a crashed or interrupted
run resumes where it stopped: questions already in the file are not generated again.
"""

from __future__ import annotations

import json
import logging
import platform
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from cbr2.config import git_hash
from cbr2.data.benchmarks import KQAPRO, Benchmark
from cbr2.data.questions import KQAPRO_CATEGORIES, Question
from cbr2.evaluation.metrics import compute_metrics, retrieval_metrics
from cbr2.evaluation.report import write_report
from cbr2.kopl.executor import Executor
from cbr2.kopl.sketch import schema_items, sketch
from cbr2.llm import backend_class, get_backend
from cbr2.pipeline import score_generation
from cbr2.retrieval.cases import VIEWS, Query
from cbr2.retrieval.retriever import CASE_MODES, Retrieved, Retriever, check_retrieval_config, resolve_structural

log = logging.getLogger(__name__)

IDENTITY_KEYS = ("data", "llm", "prompt", "retrieval", "structural")
"""Config sections that decide what a prediction is; a resumed run must agree on them."""

BATCH = 64


def output_dir(cfg: DictConfig, bench: Benchmark, retrieval_only: bool = False) -> Path:
    """The run's folder: ``output_dir`` or ``outputs/{data.name}/{split}/{llm.backend or "retrieval"}``."""
    if cfg.output_dir:
        return Path(cfg.output_dir)
    leaf = "retrieval" if retrieval_only else cfg.llm.backend
    return Path("outputs") / cfg.data.name / (cfg.data.split or bench.family.eval_split) / leaf


def select_questions(bench: Benchmark, cfg: DictConfig) -> list[Question]:
    """The questions of the configured split, cut to ``eval.limit``.

    Raises:
        ValueError: If the split has no gold answers to score against.
    """
    questions = bench.questions(cfg.data.split)
    if cfg.eval.limit is not None:
        questions = questions[: cfg.eval.limit]
    if any(q.answer is None for q in questions):
        raise ValueError(f"{bench.name} split {cfg.data.split or bench.family.eval_split!r} has no gold answers "
                         "(the official KQA Pro test set keeps them private); evaluate val instead")
    return questions


def run_evaluation(cfg: DictConfig, retrieval_only: bool = False) -> dict[str, Any]:
    """Evaluate a configuration end to end and write its output folder.

    Args:
        cfg: The resolved configuration (``cbr2.config.Config``).
        retrieval_only: Retrieve and score retrieval only (every view), no generation.

    Returns:
        The metrics (also written to ``metrics.json``).
    """
    bench = Benchmark(cfg.data.name, cfg.data.root)
    questions = select_questions(bench, cfg)
    if not retrieval_only:
        backend_class(cfg.llm.backend)  # a misspelt backend fails before minutes of retrieval
    out = output_dir(cfg, bench, retrieval_only)
    check_retrieval_config(cfg.retrieval)
    if retrieval_only or "structural" in CASE_MODES[cfg.retrieval.cases]:
        # Resolved once and saved in config.yaml, so the run records the exact retriever used.
        cfg.structural.checkpoint = resolve_structural(cfg, bench)
    out.mkdir(parents=True, exist_ok=True)
    if not retrieval_only:
        _check_resumable(out, cfg)
    (out / "config.yaml").write_text(OmegaConf.to_yaml(cfg), encoding="utf-8")
    title = f"{bench.name} · {'retrieval' if retrieval_only else cfg.llm.backend}"
    categories = KQAPRO_CATEGORIES if bench.family is KQAPRO else ("1-hop", "2-hop", "3-hop")

    retrieval, _retrieved = run_retrieval(cfg, bench, questions, out, extra_views=VIEWS if retrieval_only else ())
    if retrieval_only:
        metrics = {"n": len(questions), "retrieval": retrieval,
                   "provenance": {**provenance(cfg, bench), "output_dir": str(out)}}
        (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
        write_report(out / "report.md", metrics, title=title)
        return metrics

    pred_path = out / "predictions.jsonl"
    done = load_predictions(pred_path)
    todo = [q for q in questions if q.qid not in done]
    log.info("%s: %d questions, %d already predicted in %s", bench.name, len(questions), len(questions) - len(todo), out)
    if todo:
        executor = Executor(bench.kb, cfg.eval.timeout_s)
        backend = get_backend(cfg.llm.backend, fmt=cfg.prompt.format)
        with pred_path.open("a", encoding="utf-8") as sink, tqdm(total=len(todo), desc="evaluate", unit="q") as bar:
            for start in range(0, len(todo), BATCH):
                batch = todo[start: start + BATCH]
                for q, text in zip(batch, backend.generate(batch)):
                    record = score_generation(text, q, bench, executor, cfg.prompt.format)
                    sink.write(json.dumps(record, ensure_ascii=False) + "\n")
                    sink.flush()
                    done[q.qid] = record
                    bar.update()

    records = [done[q.qid] for q in questions]
    metrics = compute_metrics(records, categories)
    if retrieval is not None:
        metrics["retrieval"] = retrieval
    metrics["provenance"] = {**provenance(cfg, bench), "output_dir": str(out)}
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    write_report(out / "report.md", metrics, title=title)
    return metrics


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
    if not extra_views and r.cases == "none" and r.k_ontology <= 0 and r.k_facts <= 0:
        return None, {}
    retriever = Retriever(bench, r, cfg.structural.checkpoint, extra_views)
    start = time.perf_counter()
    retrieved: list[Retrieved] = []
    for i in tqdm(range(0, len(questions), BATCH), desc="retrieve", unit="batch", disable=len(questions) <= BATCH):
        retrieved += retriever.retrieve([Query(q.qid, q.question) for q in questions[i: i + BATCH]])
    seconds = time.perf_counter() - start
    with (out / "retrieval.jsonl").open("w", encoding="utf-8") as sink:
        for item in retrieved:
            sink.write(json.dumps(item.to_record(), ensure_ascii=False) + "\n")

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


def load_predictions(path: Path) -> dict[str, dict[str, Any]]:
    """Records of an earlier (possibly interrupted) run, by question id.

    A half-written last line (the process died mid-write) is dropped and the file is cut
    back to its last complete record; a broken line elsewhere is an error.

    Raises:
        ValueError: Naming the file and line of a corrupt record before the last line.
    """
    if not path.exists():
        return {}
    text = path.read_text(encoding="utf-8")
    # Split on "\n" only: JSON text may hold U+2028 and friends, which splitlines() breaks on.
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    records: dict[str, dict[str, Any]] = {}
    for lineno, line in enumerate(lines, 1):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if lineno == len(lines) and not text.endswith("\n"):
                log.warning("%s:%d: dropping a half-written record", path, lineno)
                path.write_text("".join(f"{ln}\n" for ln in lines[:-1]), encoding="utf-8")
                break
            raise ValueError(f"{path}:{lineno}: corrupt prediction record; remove the line or the file") from None
        records[rec["id"]] = rec
    else:
        if text and not text.endswith("\n"):  # complete record, killed before its newline
            with path.open("a", encoding="utf-8") as handle:
                handle.write("\n")
    return records


def _check_resumable(out: Path, cfg: DictConfig) -> None:
    """Refuse to mix predictions of different configurations in one folder."""
    old_path = out / "config.yaml"
    if not old_path.exists() or not (out / "predictions.jsonl").exists():
        return
    old = OmegaConf.load(old_path)
    diff = [k for k in IDENTITY_KEYS if OmegaConf.to_container(old.get(k, {})) != OmegaConf.to_container(cfg[k])]
    if diff:
        raise ValueError(f"{out} holds predictions of a different configuration (sections {', '.join(diff)} differ); "
                         "choose another output_dir or delete the folder")


def provenance(cfg: DictConfig, bench: Benchmark) -> dict[str, Any]:
    """What a result needs to be trusted and reproduced."""
    versions = {}
    for pkg in ("cbr2", "kopl", "omegaconf"):
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
        "command": " ".join(sys.argv),
    }
