"""Evaluation on a real Slurm: an 8-ablation sweep as one job array, and a sharded evaluation
whose merge equals the unsharded run, both through the scripts in ``slurm/``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from run_equivalence import differences

from cbr2.cluster.sweep import Sweep
from cbr2.config import ABLATIONS

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
BACKBONE = "structural.checkpoint=sentence-transformers/all-MiniLM-L6-v2"
"""The untrained backbone as structural encoder: these tests check the cluster path, not training."""


def test_an_ablation_sweep_is_one_job_array_and_one_table(slurm_cluster, tmp_path):
    env = {**slurm_cluster.env, "CBR2_PYTHON": sys.executable}
    subprocess.run([sys.executable, "-m", "cbr2.cluster.sweep", "submit", "--wait", "--dir", str(tmp_path), "--name", "abl",
                    "--ablations", "all", "llm.backend=gold", "eval.per_category=1", "wandb.mode=disabled", BACKBONE],
                   cwd=REPO, env=env, check=True, timeout=1200)
    sweep = Sweep.load(tmp_path / "abl")
    states = slurm_cluster.job_states(sweep.jobs["array"])
    assert sorted(states) == [f"{sweep.jobs['array']}_{t}" for t in range(8)]
    assert set(states.values()) == {"COMPLETED"}
    assert slurm_cluster.job_states(sweep.jobs["finalize"]) == {sweep.jobs["finalize"]: "COMPLETED"}
    summary = json.loads((tmp_path / "abl" / "summary.json").read_text())
    assert summary["states"]["done"] == 8 and not summary["incomplete_runs"]
    assert {p.name for p in (tmp_path / "abl" / "runs").iterdir()} == {a.replace("w/o_", "wo_") for a in ABLATIONS}
    table = json.loads((tmp_path / "abl" / "report" / "ablation.json").read_text())
    assert [row["ablation"] for row in table["rows"]] == list(ABLATIONS)  # the paper's Table 5 order
    for run in (tmp_path / "abl" / "runs").iterdir():
        metrics = json.loads((run / "metrics.json").read_text())
        assert metrics["n"] == 9 and metrics["provenance"]["config"]["wandb"]["group"] == "abl"


def _encodings(logs: list[Path]) -> Counter:
    """How often each cache entry was computed (not loaded) across the jobs' logs."""
    text = "\n".join(p.read_text(errors="replace") for p in logs)
    # Keyed by the entry's folder: one label ("cases") can name several entries (the case pool
    # as written, for its knowledge, and masked, for the case views).
    return Counter(re.findall(r"encoding \d+ \S+ with \S+ \(cache: (\S+)\)", text)
                   + re.findall(r"into (\S+) \(once\)", text))


def test_three_slurm_shards_merge_into_the_unsharded_run(slurm_cluster, tmp_path):
    # A cold cache shared by all four jobs: each embedding set and the LLM file is built
    # by one of them while the others wait for it.
    export = f"--export=ALL,CBR2_PYTHON={sys.executable},CBR2_CACHE_DIR={tmp_path / 'cache'}"
    common = ["llm.model=smollm2-135m", "generation.constrained=false", "llm.max_new_tokens=48", "eval.per_category=null", "eval.limit=6",
              "wandb.mode=disabled", BACKBONE]
    script = str(REPO / "slurm" / "evaluate.sbatch")
    # One CPU each, so two jobs run at once on a 2-core node and meet at the cache locks.
    array = slurm_cluster.sbatch(["--array=0-2", "--cpus-per-task=1", export, f"--output={tmp_path}/shard-%a.out",
                                  script, *common, f"output_dir={tmp_path}/run"], cwd=REPO)
    whole = slurm_cluster.sbatch(["--cpus-per-task=1", export, f"--output={tmp_path}/whole.out", script, *common,
                                  f"output_dir={tmp_path}/whole"], cwd=REPO)
    assert set(slurm_cluster.wait(array, timeout_s=900).values()) == {"COMPLETED"}
    assert set(slurm_cluster.wait(whole, timeout_s=900).values()) == {"COMPLETED"}

    shards = sorted((tmp_path / "run").glob("shard-*-of-3"))
    assert [s.name for s in shards] == ["shard-0-of-3", "shard-1-of-3", "shard-2-of-3"]
    subprocess.run([sys.executable, "-m", "cbr2.cluster.merge", *map(str, shards)], check=True, timeout=300)
    assert differences(tmp_path / "whole", tmp_path / "run") == []
    generated = [json.loads(line)["generated"] for line in (tmp_path / "run" / "predictions.jsonl").open()]
    assert len(generated) == 6 and all(generated)  # the LLM really wrote each answer

    built = _encodings(sorted(tmp_path.glob("*.out")))
    assert built and all(count == 1 for count in built.values()), built
