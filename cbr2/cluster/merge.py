"""Join the shards of one evaluation into the result an unsharded run would have written.

    python -m cbr2.cluster.merge outputs/kqapro/val/vllm/shard-*-of-8 --out outputs/kqapro/val/vllm

``python evaluate.py eval.num_shards=N eval.shard=I`` (or a SLURM job array, which sets both)
evaluates question i of the selection in shard ``i mod N``. The merge rebuilds the selection
from the shards' shared config, checks that every question was answered by exactly one
finished shard, and writes ``predictions.jsonl`` (in selection order), ``retrieval.jsonl``,
``metrics.json``, ``report.md`` and ``config.yaml`` as the unsharded run would: the metrics
are computed from the joined records by the same code, so they are equal, not averaged.
Only timings and provenance (where and how it ran) differ. It refuses shards of different
configs, missing or duplicated shards, and shards whose questions do not match the selection.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from cbr2.common.console import setup_logging
from cbr2.common.errors import UserError
from cbr2.common.files import write_atomic
from cbr2.common.records import Prediction
from cbr2.data.benchmarks import Benchmark
from cbr2.evaluation.records import load_predictions, load_records, record_line
from cbr2.evaluation.selection import check_shard, select_questions, selection_sha256
from cbr2.report.run_report import summary_line
from cbr2.retrieval.metrics import merge_retrieval
from cbr2.run.run_folder import check_same_config, finish_run, write_config

log = logging.getLogger(__name__)


class Shard:
    """One finished shard folder: its config, metrics and shard position.

    Raises:
        UserError: When the folder is not a finished shard (naming the file that is missing).
    """

    def __init__(self, folder: str | Path):
        self.dir = Path(folder)
        for name in ("config.yaml", "metrics.json"):
            if not (self.dir / name).is_file():
                hint = " (the shard has not finished: rerun it, it resumes)" if name == "metrics.json" else ""
                raise UserError(f"{self.dir}: no {name}{hint}")
        self.cfg: DictConfig = OmegaConf.load(self.dir / "config.yaml")
        self.metrics: dict[str, Any] = json.loads((self.dir / "metrics.json").read_text(encoding="utf-8"))
        self.info: dict[str, Any] | None = self.metrics.get("provenance", {}).get("shard")
        if self.info is None:
            raise UserError(f"{self.dir}: not a shard (its metrics.json has no provenance.shard); "
                             "it is a whole run already")
        self.index: int = self.info["index"]
        self.count: int = self.info["count"]
        self.retrieval_only = "hits@1" not in self.metrics


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for k, v in node.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): node}


def unsharded_config(cfg: DictConfig) -> DictConfig:
    """The config of the same evaluation run as one shard (what ``config.yaml`` of an unsharded run holds)."""
    whole = OmegaConf.create(OmegaConf.to_container(cfg))
    whole.eval.num_shards, whole.eval.shard = 1, 0
    return whole


WHERE_KEYS = ("output_dir", "wandb.")
"""Config keys that say where a shard wrote and logged, not what it computed: may differ."""


def check_shards(shards: list[Shard]) -> list[Shard]:
    """The shards in index order, after checking they form exactly one evaluation.

    Raises:
        UserError: On shards of different configs (naming the keys that differ), a shard
            given twice, or missing shards.
    """
    if not shards:
        raise UserError("no shard folders given")
    first = shards[0]
    reference = _flat(OmegaConf.to_container(unsharded_config(first.cfg)))
    for s in shards[1:]:
        other = _flat(OmegaConf.to_container(unsharded_config(s.cfg)))
        diff = sorted(k for k in reference.keys() | other.keys()
                      if reference.get(k) != other.get(k) and not k.startswith(WHERE_KEYS))
        ablations = {first.metrics["provenance"].get("ablation"), s.metrics["provenance"].get("ablation")}
        if diff or len(ablations) > 1 or s.retrieval_only != first.retrieval_only:
            what = ", ".join(diff) or "the ablation or run kind"
            raise UserError(f"{s.dir} and {first.dir} are shards of different configurations ({what} differ)")
    counts = Counter(s.index for s in shards)
    twice = sorted(i for i, c in counts.items() if c > 1)
    if twice:
        dirs = [str(s.dir) for s in shards if s.index in twice]
        raise UserError(f"shard(s) {twice} given more than once: {', '.join(dirs)}")
    missing = sorted(set(range(first.count)) - set(counts))
    if missing:
        raise UserError(f"missing shard(s) {missing} of {first.count}; run them (eval.shard=I) before merging")
    return sorted(shards, key=lambda s: s.index)


def merge(shard_dirs: list[str | Path], out: str | Path) -> dict[str, Any]:
    """Join shard folders into one run folder ``out``.

    Args:
        shard_dirs: Every shard folder of one evaluation (any order).
        out: The run folder to write (created; may be the shards' parent).

    Returns:
        The merged metrics (also written to ``out/metrics.json``).

    Raises:
        UserError: As ``check_shards``, or when a shard's questions are not its share of the
            selection (the data changed, or questions are missing or duplicated).
    """
    shards = check_shards([Shard(d) for d in shard_dirs])
    first = shards[0]
    cfg = unsharded_config(first.cfg)
    bench = Benchmark.from_config(cfg.data, cfg.get("cache_dir"))  # a folder written before the key has none
    selection = select_questions(bench, cfg.data.split, cfg.eval)
    by_id: dict[str, Prediction] = {}
    retrieval_lines: dict[str, str] = {}
    for s in shards:
        expected = check_shard(selection, s.metrics["provenance"], str(s.dir), cfg.data.name)
        if not s.retrieval_only:
            found = load_predictions(s.dir / "predictions.jsonl")
            wanted = {q.qid for q in expected}
            missing = [q.qid for q in expected if q.qid not in found]
            foreign = sorted(set(found) - wanted)
            if missing:
                raise UserError(f"{s.dir}: {len(missing)} question(s) have no prediction, e.g. {missing[:3]}")
            if foreign:
                raise UserError(f"{s.dir}/predictions.jsonl holds {len(foreign)} question(s) of other shards or "
                                 f"selections, e.g. {foreign[:3]}: they would be counted twice")
            by_id.update({qid: found[qid] for qid in wanted})
        path = s.dir / "retrieval.jsonl"
        retrieval_lines.update({qid: record_line(rec) for qid, rec in load_records(path).items()})

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if not first.retrieval_only:
        check_same_config(out, cfg)
    prov = {k: v for k, v in first.metrics["provenance"].items() if k != "shard"}
    prov.update(config=OmegaConf.to_container(cfg), output_dir=str(out), question_ids_sha256=selection_sha256(selection),
                command=" ".join(sys.argv), merged_from=[str(s.dir) for s in shards])
    blocks = [s.metrics["retrieval"] for s in shards if s.metrics.get("retrieval")]
    retrieval = merge_retrieval(blocks) if len(blocks) == len(shards) else None

    records: list[Prediction] | None = None  # None: shards of a retrieval-only run
    if not first.retrieval_only:
        records = [by_id[q.qid] for q in selection]
        write_atomic(out / "predictions.jsonl", "".join(record_line(r) + "\n" for r in records))
    if len(retrieval_lines) == len(selection):
        write_atomic(out / "retrieval.jsonl", "".join(retrieval_lines[q.qid] + "\n" for q in selection))
    write_config(out, cfg)
    metrics = finish_run(out, cfg, bench, prov, selection, len(selection), records, retrieval)
    log.info("merged %d shards (%d questions) into %s", len(shards), len(selection), out)
    return metrics


def main(argv: list[str] | None = None) -> int:
    """``python -m cbr2.cluster.merge SHARD_DIR... --out DIR``."""
    parser = argparse.ArgumentParser(prog="python -m cbr2.cluster.merge", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shards", nargs="+", metavar="SHARD_DIR", help="every shard folder of one evaluation")
    parser.add_argument("--out", metavar="DIR",
                        help="the run folder to write; default: the shards' common parent folder")
    args = parser.parse_args(argv)
    setup_logging()
    out = args.out
    if out is None:
        parents = {Path(d).resolve().parent for d in args.shards}
        if len(parents) != 1:
            print("error: the shards are in different folders; give --out DIR", file=sys.stderr)
            return 2
        out = parents.pop()
    try:
        metrics = merge(args.shards, out)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if "hits@1" in metrics:
        print(summary_line(metrics, out))
    else:
        print(f"retrieval of n={metrics['n']} questions -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
