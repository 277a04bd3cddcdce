"""Sweeps: the grid, the submission, and a whole sweep run here without SLURM (--local)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from cbr2.cluster.grid import expand_grid, expand_vary, split_values
from cbr2.cluster.sweep import Sweep, main
from cbr2.config import ConfigError

REPO = Path(__file__).resolve().parents[1]
BASE = ["llm.backend=gold", "generation.constrained=false", "eval.per_category=null", "eval.limit=6", "wandb.mode=disabled",
        "structural.checkpoint=sentence-transformers/all-MiniLM-L6-v2"]


def test_grid_values_and_run_names():
    assert split_values("0,1,2") == ["0", "1", "2"]
    assert split_values('["a","b"],[c,d],x') == ['["a","b"]', "[c,d]", "x"]
    runs = expand_grid(["full", "w/o_act"], ["llm.seed=0,1", "llm.model=Qwen/Qwen3-8B"])
    assert [r.name for r in runs] == ["full__llm.seed=0__llm.model=Qwen-Qwen3-8B",
                                      "full__llm.seed=1__llm.model=Qwen-Qwen3-8B",
                                      "wo_act__llm.seed=0__llm.model=Qwen-Qwen3-8B",
                                      "wo_act__llm.seed=1__llm.model=Qwen-Qwen3-8B"]
    assert runs[3].ablation == "w/o_act" and runs[3].overrides == ["llm.seed=1", "llm.model=Qwen/Qwen3-8B"]
    with pytest.raises(ConfigError, match="KEY=V1"):
        expand_grid([None], ["llm.seed"])
    with pytest.raises(ConfigError, match="given twice"):
        expand_grid([None], ["llm.seed=0", "llm.seed=1"])


def test_vary_changes_one_factor_at_a_time_around_the_base():
    from cbr2.config import CONFIG_DIR, Config, load_config

    base = load_config(["prompt.case_triples=2"], files=[CONFIG_DIR / "evaluate.yaml"], schema=Config)
    runs = expand_vary([None], ["prompt.case_triples=0,2,null", "retrieval.k_semantic,retrieval.k_structural=2,5"],
                       base)
    assert [r.name for r in runs] == ["run", "run__prompt.case_triples=0", "run__prompt.case_triples=null",
                                      "run__retrieval.k_semantic-retrieval.k_structural=2",
                                      "run__retrieval.k_semantic-retrieval.k_structural=5"]
    assert runs[0].overrides == [] and runs[2].overrides == ["prompt.case_triples=null"]
    assert runs[4].overrides == ["retrieval.k_semantic=5", "retrieval.k_structural=5"]
    with pytest.raises(ConfigError, match="unknown key 'prompt.case_tripels'"):
        expand_vary([None], ["prompt.case_tripels=1"], base)
    assert main(["submit", "--dry-run", "--vary", "llm.seed=1", "--grid", "llm.seed=2", *BASE]) == 2


def test_dry_run_writes_the_sweep_and_prints_one_array(tmp_path, capsys):
    code = main(["submit", "--dry-run", "--dir", str(tmp_path), "--name", "s", "--ablations", "all",
                 "--grid", "llm.seed=0,1", "--shards", "2", "--parallel", "4", "--sbatch", "--gpus=1 -p gpu", *BASE])
    assert code == 0
    array, final = capsys.readouterr().out.strip().splitlines()
    assert array.startswith("sbatch --array=0-31%4 --job-name=cbr2-sweep-s") and "--gpus=1 -p gpu" in array
    assert array.endswith(f"slurm/sweep.sbatch task {tmp_path / 's'}")
    assert "--dependency=afterany:" in final and final.endswith(f"slurm/finalize.sbatch {tmp_path / 's'}")
    sweep = Sweep.load(tmp_path / "s")
    assert sweep.tasks == 32 and len(sweep.runs) == 16
    run, shard = sweep.task(3)  # task t: run t // shards, shard t % shards
    assert (run.name, shard) == ("full__llm.seed=1", 1)
    cfg = sweep.config(run, shard)
    assert (cfg.eval.num_shards, cfg.eval.shard, cfg.llm.seed, cfg.wandb.group) == (2, 1, 1, "s")
    assert cfg.output_dir == str(tmp_path / "s" / "runs" / "full__llm.seed=1")


def test_resources_are_sbatch_options_of_the_tasks_and_the_finalize_job(tmp_path, capsys):
    code = main(["submit", "--dry-run", "--dir", str(tmp_path), "--name", "a100", "--ablations", "full,chain",
                 "--partition", "a100", "--account", "kbqa", "--gpus", "2", "--cpus", "16", "--mem", "128G",
                 "--time", "08:00:00", "--sbatch", "--gpus=1", *BASE])
    assert code == 0
    array, final = (shlex.split(line) for line in capsys.readouterr().out.strip().splitlines())
    asked = ["--gpus=2", "--cpus-per-task=16", "--mem=128G", "--time=08:00:00", "--partition=a100", "--account=kbqa"]
    assert all(flag in array for flag in asked)
    # --sbatch comes after the resources, so sbatch takes its value (the last of an option wins).
    assert array.index("--gpus=1") > array.index("--gpus=2")
    # The finalize job merges files: it asks for no GPU at all (some sites reject --gpus=0 on a GPU
    # partition), on the same account and the site's default partition.
    assert "--account=kbqa" in final and not [a for a in final if a.startswith(("--gpus", "--partition"))]


def test_the_finalize_job_goes_to_the_partition_named_for_it(tmp_path, capsys):
    code = main(["submit", "--dry-run", "--dir", str(tmp_path), "--name", "f", "--ablations", "full,chain",
                 "--partition", "a100", "--finalize-partition", "cpu", *BASE])
    assert code == 0
    array, final = (shlex.split(line) for line in capsys.readouterr().out.strip().splitlines())
    assert "--partition=a100" in array and "--partition=cpu" in final and "--partition=a100" not in final


def test_unset_resources_leave_the_scripts_defaults(tmp_path, capsys):
    assert main(["submit", "--dry-run", "--dir", str(tmp_path), "--name", "d", *BASE]) == 0
    array, final = (shlex.split(line) for line in capsys.readouterr().out.strip().splitlines())
    assert not [a for a in array if a.startswith(("--gpus", "--mem", "--cpus", "--time", "--partition", "--account"))]
    assert not [a for a in final if a.startswith(("--gpus", "--partition"))]


def test_the_job_scripts_default_to_one_a100_task_and_requeue_at_the_time_limit():
    finalize = [line.split()[1] for line in (REPO / "slurm" / "finalize.sbatch").read_text().splitlines()
                if line.startswith("#SBATCH")]
    assert not [flag for flag in finalize if "gpu" in flag or "gres" in flag]  # it asks for no GPU at all
    for name, gpus in (("evaluate", "--gpus=1"), ("sweep", "--gpus=1"), ("train", "--gpus-per-node=1")):
        script = (REPO / "slurm" / f"{name}.sbatch").read_text()
        lines = [line.split()[1] for line in script.splitlines() if line.startswith("#SBATCH")]
        assert {gpus, "--cpus-per-task=8", "--mem=64G", "--time=04:00:00", "--requeue"} <= set(lines), name
        assert '"${CBR2_PYTHON:-.venv-gpu/bin/python}"' in script, name
        # Evaluation requeues itself on the signal to its batch shell; training's steps get it (Lightning).
        assert ("--signal=SIGUSR1@120" if name == "train" else "--signal=B:USR1@120") in lines, name


def test_a_bad_key_fails_before_anything_is_submitted(tmp_path, capsys):
    assert main(["submit", "--dry-run", "--dir", str(tmp_path), "--name", "s", "--grid", "eval.limt=1,2"]) == 2
    assert "unknown key 'eval.limt'" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()
    assert main(["submit", "--dry-run", "--dir", str(tmp_path), "--ablations", "w/o_cases"]) == 2
    assert "unknown ablation 'w/o_cases'" in capsys.readouterr().err


@pytest.mark.slow
def test_a_local_sweep_merges_shards_and_tabulates(tmp_path, capsys):
    code = main(["submit", "--local", "--dir", str(tmp_path), "--name", "s", "--ablations", "full,w/o_knowledge",
                 "--shards", "2", *BASE])
    assert code == 0
    summary = json.loads((tmp_path / "s" / "summary.json").read_text())
    assert summary["states"]["done"] == 4 and summary["finished_runs"] == ["full", "wo_knowledge"]
    for run in ("full", "wo_knowledge"):
        metrics = json.loads((tmp_path / "s" / "runs" / run / "metrics.json").read_text())
        assert metrics["n"] == 6 and metrics["hits@1"] == 1.0
    table = (tmp_path / "s" / "report" / "ablation.md").read_text()
    assert "| Full CBR² |" in table and "-w/o knowledge" in table
    assert "2 of 2 runs" in capsys.readouterr().out


@pytest.mark.slow
def test_a_failed_task_is_recorded_and_the_others_finish(tmp_path, capsys):
    # A valid config that fails when run: mini-kqapro's test split has no gold programs for the gold
    # writer (a split that does not exist is refused when the config is built, before anything is submitted).
    code = main(["submit", "--local", "--dir", str(tmp_path), "--name", "s", "--grid", "data.split=val,test",
                 *BASE])
    assert code == 1
    summary = json.loads((tmp_path / "s" / "summary.json").read_text())
    assert summary["finished_runs"] == ["run__data.split=val"]
    assert summary["incomplete_runs"] == ["run__data.split=test"]
    assert summary["failed"][0]["task"] == 1 and "gold programs" in summary["failed"][0]["error"]
    assert main(["status", str(tmp_path / "s")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any("failed" in line and "data.split=test" in line for line in lines)


def test_a_bad_option_value_is_refused_before_anything_is_submitted(tmp_path, capsys):
    code = main(["submit", "--local", "--dir", str(tmp_path), "--name", "s", "--grid", "data.split=val,nosuchsplit",
                 *BASE])
    assert code == 2 and "data.split='nosuchsplit' is not a kqapro split" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


@pytest.mark.slow
def test_a_local_vary_sweep_writes_each_setting_against_its_base(tmp_path):
    code = main(["submit", "--local", "--dir", str(tmp_path), "--name", "v", "--vary", "prompt.format=dag,chain",
                 "--vary", "eval.limit=4", *BASE])
    assert code == 0
    sweep = Sweep.load(tmp_path / "v")
    assert [r.name for r in sweep.runs] == ["run", "run__prompt.format=chain", "run__eval.limit=4"]
    table = (tmp_path / "v" / "report" / "vary.md").read_text()
    # The first table is the settings against the base; the reasoning-type table follows it.
    first = table[table.index("| setting"):].split("\n\n")[0]
    rows = [line for line in first.splitlines() if line.startswith("| ")][1:]
    assert [r.split(" | ")[0] for r in rows] == ["| base", "| prompt.format=chain", "| eval.limit=4"]
    # The gold writer is right on every question: no difference, no flips; the paired interval
    # is over the 4 questions both runs share.
    assert "| +0.00 | [+0.00, +0.00] | +0 / −0 |" in rows[1] and rows[2].endswith("| 4 |")
    assert json.loads((tmp_path / "v" / "summary.json").read_text())["vary"].endswith("vary.md")
