"""A run's output folder: where it is, what configuration owns it, and the files a run leaves there.

* ``output_dir`` names the folder; ``check_same_config`` refuses to mix two configurations'
  predictions in one; ``config.yaml`` records the resolved configuration.
* ``predictions.jsonl`` doubles as the predictions cache: ``records.load_predictions`` reads it back, and
  a record is reused when its ``prompt_hash`` and ``generation_key`` equal the current run's.
* ``finish_run`` writes the results (``metrics.json``, then ``report.md``, ``browser.html`` and the
  W&B run by the writers of ``cbr2.report``); an evaluation and the shard merge both end there, so
  a merged run's files are written by the same code as an unsharded one's.
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from cbr2.common.errors import UserError
from cbr2.common.files import write_atomic
from cbr2.common.provenance import git_hash
from cbr2.common.records import Prediction
from cbr2.config import WandbConfig, ablation_slug, setting_of
from cbr2.data.benchmarks import KQAPRO, Benchmark
from cbr2.data.questions import Question
from cbr2.evaluation.metrics import finish_metrics
from cbr2.evaluation.selection import categories_of, selection_provenance, whole_split
from cbr2.generation.prompt import FALLBACK_VERSION, PROMPT_VERSION
from cbr2.report.browser import write_browser
from cbr2.report.run_report import write_report
from cbr2.report.tracking import log_evaluation

log = logging.getLogger(__name__)

IDENTITY_KEYS = ("data", "llm", "prompt", "generation", "retrieval", "structural")
"""Config sections that decide what a prediction is; a resumed run must agree on them."""

PACKAGES = ("cbr2", "kopl", "omegaconf", "torch", "transformers", "sentence-transformers", "faiss-cpu",
            "faiss-gpu", "faiss-gpu-cu13-cuvs", "faiss-gpu-cu12", "vllm", "openai")
"""Packages whose versions a run's provenance records."""


def output_dir(cfg: DictConfig, bench: Benchmark, retrieval_only: bool = False, ablation: str | None = None) -> Path:
    """The run's folder: ``output_dir``, else ``outputs/{data.name}/{split}/{leaf}``.

    The leaf is ``retrieval`` for ``--retrieval-only``, else ``llm.backend``, with
    ``-{ablation}`` appended (``w/o_act`` → ``hf-wo_act``) when an ablation is selected.
    A shard of a sharded run gets ``shard-{i}-of-{n}`` below that.

    Args:
        cfg: The resolved configuration (``eval.shard`` and ``eval.num_shards`` resolved).
        bench: The benchmark (its default evaluation split names the folder).
        retrieval_only: Whether the run scores retrieval only.
        ablation: The canonical ``--ablation`` name, if any.
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


def wandb_name(wandb: WandbConfig, backend: str, bench_name: str, ablation: str | None) -> str:
    """``wandb.name``, else ``{benchmark}-{backend}-{ablation or 'run'}``.

    Args:
        wandb: The ``wandb`` section.
        backend: ``llm.backend``.
        bench_name: The benchmark's name.
        ablation: The canonical ``--ablation`` name, if any.
    """
    return wandb.name or f"{bench_name}-{backend}-{ablation or 'run'}"


def write_config(out: Path, cfg: DictConfig) -> None:
    """Record the resolved configuration as ``out/config.yaml`` (what ``check_same_config`` reads)."""
    write_atomic(out / "config.yaml", OmegaConf.to_yaml(cfg))


def check_same_config(out: Path, cfg: DictConfig) -> None:
    """Refuse to mix predictions of different configurations in one folder.

    Args:
        out: The run folder about to receive predictions.
        cfg: The configuration that will write them.

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
        raise UserError(f"{old_path} is not a readable config ({problem}), so what wrote the predictions beside it "
                         "is unknown; choose another output_dir or delete the folder")

    def section(node: DictConfig, key: str) -> Any:
        value = node.get(key)
        return OmegaConf.to_container(value) if isinstance(value, DictConfig) else value

    diff = [k for k in IDENTITY_KEYS if section(old, k) != section(cfg, k)]
    if diff:
        raise UserError(f"{out} holds predictions of a different configuration (sections {', '.join(diff)} differ); "
                         "choose another output_dir or delete the folder")


def provenance(cfg: DictConfig, bench: Benchmark, out: Path, selection: Sequence[Question],
               ablation: str | None, config_files: Sequence[str | Path] = ()) -> dict[str, Any]:
    """What a result needs to be trusted and reproduced: ``metrics.json``'s ``provenance`` block.

    Args:
        cfg: The resolved configuration (recorded whole).
        bench: The benchmark (its data root and split).
        out: The run folder.
        selection: The whole selection; the run judged shard ``eval.shard`` of it.
        ablation: The canonical ``--ablation`` name, if any.
        config_files: The ``--config`` files of the run's base.

    Returns:
        Config, git hash, Python and package versions, data, prompt and fallback versions,
        seeds and command line; the base's ``--config`` files, the ablation and the Table 5
        setting (``config.setting_of``);
        and the selection hashes (``selection.selection_provenance``).
    """
    versions = {}
    for pkg in PACKAGES:
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
        "config_files": [str(Path(f).resolve()) for f in config_files],
        "ablation": ablation,
        "setting": setting_of(cfg),
        "output_dir": str(out),
        **selection_provenance(selection, cfg.eval.shard, cfg.eval.num_shards),
    }


def generation_key(section: DictConfig, backend: Any) -> str:
    """The predictions cache's second key: what besides the prompt decides a record.

    The backend's identity (backend, model, sampling parameters, grammar), the ``generation``
    section (constrained decoding and the fallback change what is generated, canonicalisation
    how it is scored) and, with the fallback on, the correction prompt's version.

    Args:
        section: The ``generation`` section.
        backend: The built backend (only its ``identity()`` is read; no weights load).
    """
    ident: dict[str, Any] = {"backend": backend.identity(), "generation": OmegaConf.to_container(section)}
    if section.fallback:
        ident["fallback_version"] = FALLBACK_VERSION
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


SUBMISSION = "predict.txt"
"""The file KQA Pro's leaderboard takes for its test split: one answer per line, in the order of
``test.json`` (the official baselines' ``predict.txt``)."""


def write_submission(out: Path, split: str | None, bench: Benchmark, selection: Sequence[Question],
                     records: Sequence[Prediction]) -> Path | None:
    """Write ``SUBMISSION`` for a run of a split without gold answers.

    A question without an answer (its program failed) gets an empty line: never a guess such as
    "no", which older baselines wrote. Written only when the run judged the whole split in the
    file's order, since a line's position is its question.

    Args:
        out: The run folder.
        split: ``data.split`` (the family's evaluation split when None).
        bench: The benchmark.
        selection: The whole selection.
        records: The final prediction records, in selection order.

    Returns:
        The file written, or None when the run covers less than the whole split.
    """
    if not whole_split(bench, split, selection) or len(records) != len(selection):
        log.warning("%s not written: it needs every question of the split in order (eval.per_category=null, no "
                    "eval.limit); this run judged %d of them", SUBMISSION, len(records))
        return None
    lines = []
    for record in records:
        answer = record.get("answer")
        if isinstance(answer, list):
            answer = answer[0] if answer else None
        lines.append(" ".join(str(answer).split()) if answer else "")
    path = out / SUBMISSION
    write_atomic(path, "\n".join(lines) + "\n")
    log.info("wrote %s: %d answers (%d empty: no answer) for submission", path, len(lines), lines.count(""))
    return path


def finish_run(out: Path, cfg: DictConfig, bench: Benchmark, prov: dict[str, Any], selection: Sequence[Question],
               n: int, records: Sequence[Prediction] | None = None, retrieval: dict[str, Any] | None = None
               ) -> dict[str, Any]:
    """Compute a run's metrics and write its results: ``metrics.json``, ``report.md``, ``browser.html``, W&B.

    A generation run gets ``metrics.finish_metrics`` of its records; a retrieval-only run
    (``records`` None) its retrieval block alone. One W&B run is logged per whole generation
    run: a shard (``prov`` has ``shard``) leaves it to the merge, and a retrieval-only run has
    no predictions to log.

    Args:
        out: The run folder (``retrieval.jsonl`` already written: the browser reads it).
        cfg: The run's configuration (for a merge: the unsharded one).
        bench: The benchmark (category order, the browser's cases).
        prov: The ``provenance`` block.
        selection: The whole selection (the browser's question texts and ``--show-prompt`` indexes).
        n: Number of questions judged.
        records: The final prediction records, in selection order; None for a retrieval-only run.
        retrieval: The ``retrieval`` block, None when nothing was retrieved.

    Returns:
        The metrics, as written to ``metrics.json``.
    """
    if records is None:
        metrics: dict[str, Any] = {"n": n, "retrieval": retrieval, "provenance": prov}
    else:
        # select with a default: configs of runs from before the fallback existed lack the key.
        fallback = bool(OmegaConf.select(cfg, "generation.fallback", default=False))
        types = {q.qid: q.reasoning_types for q in selection} if bench.family is KQAPRO else None
        metrics = finish_metrics(records, categories_of(bench), fallback, types)
        if retrieval is not None:
            metrics["retrieval"] = retrieval
        metrics["provenance"] = prov
    ablation = prov.get("ablation")
    if records is not None and metrics.get("gold_answers") is False and "shard" not in prov:
        write_submission(out, cfg.data.split, bench, selection, records)
    write_atomic(out / "metrics.json", json.dumps(metrics, indent=2) + "\n")
    write_report(out / "report.md", metrics)
    write_browser(out, bench, records, selection)
    if records is None:
        return metrics
    if "shard" in prov:
        log.info("shard %d of %d done; `python -m cbr2.cluster.merge` joins the shards and logs the run to W&B",
                 prov["shard"]["index"], prov["shard"]["count"])
    else:
        log_evaluation(cfg.wandb, metrics, list(records), out,
                       name=wandb_name(cfg.wandb, cfg.llm.backend, bench.name, ablation))
    return metrics
