"""Sharded evaluation: shards are a deterministic partition, and their merge is the unsharded run."""

from __future__ import annotations

import json
import shutil

import pytest
from run_equivalence import differences

from cbr2.cluster.merge import main as merge_main
from cbr2.cluster.merge import merge
from cbr2.common.slurm import array_task, num_nodes, tasks_per_node, visible_gpus
from cbr2.config import load_config
from cbr2.evaluation.selection import resolve_shard, shard_of
from cbr2.run.runner import run_evaluation

RUN = ["llm.backend=gold", "generation.constrained=false", "eval.per_category=null", "eval.limit=20", "wandb.mode=disabled",
       "structural.checkpoint=sentence-transformers/all-MiniLM-L6-v2", "retrieval.k_semantic=2",
       "retrieval.k_structural=2"]
"""Gold programs with the whole retrieval on: every file of a run (retrieval.jsonl too) is compared."""


def _evaluate(folder, *overrides):
    return run_evaluation(load_config([*RUN, f"output_dir={folder}", *overrides]))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same evaluation run whole and as 3 shards (not yet merged)."""
    root = tmp_path_factory.mktemp("sharding")
    _evaluate(root / "whole")
    for i in range(3):
        _evaluate(root / "run", "eval.num_shards=3", f"eval.shard={i}")
    return root


@pytest.mark.slow
def test_three_shards_merge_into_the_unsharded_run(runs, tmp_path):
    shards = [runs / "run" / f"shard-{i}-of-3" for i in (2, 0, 1)]  # any order
    assert [json.loads((s / "metrics.json").read_text())["n"] for s in shards] == [6, 7, 7]
    merged = merge(shards, tmp_path / "merged")
    assert differences(runs / "whole", tmp_path / "merged") == []
    whole = json.loads((runs / "whole" / "metrics.json").read_text())
    assert merged["n"] == whole["n"] == 20 and merged["per_category"] == whole["per_category"]
    assert merged["retrieval"]["cases"] == whole["retrieval"]["cases"]  # rates rebuilt exactly, not averaged
    assert merged["provenance"]["question_ids_sha256"] == whole["provenance"]["question_ids_sha256"]
    assert merged["provenance"]["merged_from"] == [str(runs / "run" / f"shard-{i}-of-3") for i in range(3)]
    ids = [json.loads(line)["id"] for line in (tmp_path / "merged" / "predictions.jsonl").read_text().splitlines()]
    assert ids == [json.loads(line)["id"] for line in (runs / "whole" / "predictions.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_the_command_line_merges_into_the_shards_parent(runs, tmp_path, capsys):
    copy = tmp_path / "run"
    shutil.copytree(runs / "run", copy)
    assert merge_main([str(copy / f"shard-{i}-of-3") for i in range(3)]) == 0
    assert "n=20" in capsys.readouterr().out
    assert differences(runs / "whole", copy) == []


@pytest.mark.slow
def test_retrieval_only_shards_merge_too(tmp_path):
    whole = run_evaluation(load_config([*RUN, f"output_dir={tmp_path / 'whole'}"]), retrieval_only=True)
    for i in range(2):
        run_evaluation(load_config([*RUN, f"output_dir={tmp_path / 'run'}", "eval.num_shards=2", f"eval.shard={i}"]),
                       retrieval_only=True)
    merged = merge([tmp_path / "run" / f"shard-{i}-of-2" for i in range(2)], tmp_path / "run")
    assert differences(tmp_path / "whole", tmp_path / "run") == []
    assert merged["retrieval"]["cases"] == whole["retrieval"]["cases"] and "hits@1" not in merged


def _refusal(shards, out, capsys) -> str:
    assert merge_main([*map(str, shards), "--out", str(out)]) == 2
    return capsys.readouterr().err


@pytest.mark.slow
def test_missing_duplicated_or_unfinished_shards_are_refused(runs, tmp_path, capsys):
    s = [runs / "run" / f"shard-{i}-of-3" for i in range(3)]
    assert "missing shard(s) [2] of 3" in _refusal(s[:2], tmp_path / "m", capsys)
    assert "given more than once" in _refusal([s[0], s[0], s[1], s[2]], tmp_path / "m", capsys)
    unfinished = tmp_path / "unfinished"
    shutil.copytree(s[1], unfinished)
    (unfinished / "metrics.json").unlink()
    assert "has not finished" in _refusal([s[0], unfinished, s[2]], tmp_path / "m", capsys)
    assert "not a shard" in _refusal([runs / "whole"], tmp_path / "m", capsys)
    assert not (tmp_path / "m" / "metrics.json").exists()


@pytest.mark.slow
def test_a_question_answered_in_two_shards_is_refused(runs, tmp_path, capsys):
    s = [runs / "run" / f"shard-{i}-of-3" for i in range(3)]
    doubled = tmp_path / "shard-0"
    shutil.copytree(s[0], doubled)
    stray = (s[1] / "predictions.jsonl").read_text().splitlines()[0]
    with (doubled / "predictions.jsonl").open("a") as handle:
        handle.write(stray + "\n")
    assert "other shards" in _refusal([doubled, s[1], s[2]], tmp_path / "m", capsys)


@pytest.mark.slow
def test_shards_of_different_configs_are_refused(runs, tmp_path, capsys):
    other = tmp_path / "other"
    _evaluate(other, "eval.num_shards=3", "eval.shard=2", "retrieval.k_facts=3")
    s = [runs / "run" / f"shard-{i}-of-3" for i in range(2)]
    err = _refusal([*s, other / "shard-2-of-3"], tmp_path / "m", capsys)
    assert "different configurations (retrieval.k_facts differ)" in err


def test_shards_partition_the_selection():
    questions = list(range(23))
    parts = [shard_of(questions, i, 4) for i in range(4)]
    assert sorted(q for p in parts for q in p) == questions
    assert [len(p) for p in parts] == [6, 6, 6, 5]


def test_shard_defaults_come_from_the_job_array(monkeypatch):
    for var in ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_STEP"):
        monkeypatch.delenv(var, raising=False)
    cfg = load_config([])
    assert resolve_shard(cfg.eval) == (0, 1)
    assert (cfg.eval.shard, cfg.eval.num_shards) == (None, None)  # the configuration is left as it is
    with pytest.raises(ValueError, match="needs eval.shard"):
        resolve_shard(load_config(["eval.num_shards=3"]).eval)
    with pytest.raises(ValueError, match="is not one of"):
        resolve_shard(load_config(["eval.num_shards=3", "eval.shard=3"]).eval)
    # sbatch --array=1-3: task id 3 is the third task, shard 2 of 3.
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "3")
    monkeypatch.setenv("SLURM_ARRAY_TASK_MIN", "1")
    assert resolve_shard(load_config([]).eval) == (2, 3)
    # an explicit single shard ignores the array
    assert resolve_shard(load_config(["eval.num_shards=1"]).eval) == (0, 1)


def test_allocation_is_read_from_slurm_variables():
    assert array_task({}) is None
    assert array_task({"SLURM_ARRAY_TASK_ID": "10", "SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_MIN": "0",
                       "SLURM_ARRAY_TASK_STEP": "5"}) == (2, 3)
    with pytest.raises(ValueError, match="not one of 3 tasks"):
        array_task({"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_COUNT": "3"})
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "0,1,3"}) == 3
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == 0
    assert visible_gpus({"SLURM_GPUS_ON_NODE": "4"}) == 4 and visible_gpus({}) is None
    assert tasks_per_node({"SLURM_NTASKS_PER_NODE": "4(x2)"}) == 4
    assert num_nodes({"SLURM_JOB_NUM_NODES": "2"}) == 2 and num_nodes({}) is None
