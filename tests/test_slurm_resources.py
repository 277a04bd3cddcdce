"""What the job scripts and the sweep submitter ask a real (private) Slurm for, and that an evaluation
job near its time limit requeues itself. The test node declares two fake GPUs (tests/slurm_cluster.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm_cluster import ACTIVE_STATES, SlurmCluster

REPO = Path(__file__).resolve().parent.parent
BASE = ["llm.backend=gold", "generation.constrained=false", "eval.per_category=null", "eval.limit=2",
        "wandb.mode=disabled", "structural.checkpoint=sentence-transformers/all-MiniLM-L6-v2"]

pytestmark = pytest.mark.slurm


def _job(slurm_cluster: SlurmCluster, job: str) -> str:
    return slurm_cluster.run(["scontrol", "show", "job", "-o", job]).stdout


def _field(record: str, key: str) -> str:
    match = re.search(rf"(?:^|\s){key}=(\S+)", record)
    return match.group(1) if match else ""


def _asked(record: str) -> tuple[str, str, str]:
    """CPUs, memory and GPUs a job asked for, as ``scontrol show job`` prints them (Slurm 22.05)."""
    return _field(record, "MinCPUsNode"), _field(record, "MinMemoryNode"), _field(record, "TresPerJob")


def _until(what: str, ready, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.3)


def test_a_sweeps_resources_reach_slurm(slurm_cluster, tmp_path, request):
    env = {**slurm_cluster.env, "CBR2_PYTHON": sys.executable}
    subprocess.run([sys.executable, "-m", "cbr2.cluster.sweep", "submit", "--dir", str(tmp_path), "--name", "a100",
                    "--partition", "test", "--account", "kbqa", "--gpus", "1", "--cpus", "8", "--mem", "64G",
                    "--time", "00:30:00", "--sbatch", "--hold", *BASE], cwd=REPO, env=env, check=True, timeout=300)
    jobs = json.loads((tmp_path / "a100" / "sweep.json").read_text())["jobs"]
    request.addfinalizer(lambda: slurm_cluster.run(["scancel", jobs["array"], jobs["finalize"]]))
    task = _job(slurm_cluster, jobs["array"])
    assert _field(task, "Partition") == "test" and _field(task, "Account") == "kbqa"
    assert _field(task, "TimeLimit") == "00:30:00" and _field(task, "JobState") == "PENDING"
    assert _asked(task) == ("8", "64G", "gres:gpu:1"), task
    final = _job(slurm_cluster, jobs["finalize"])
    # The finalize job only reads and writes files: it asks for no GPU at all (no TRES), on the
    # site's default partition (the test cluster's only one).
    assert _asked(final) == ("2", "16G", "") and _field(final, "Partition") == "test"
    assert _field(final, "Dependency").startswith(f"afterany:{jobs['array']}")


def test_evaluate_sbatch_gets_its_gpu_and_requeues_itself_at_the_time_limit(slurm_cluster, tmp_path, request):
    # The job script as users submit it, with its own defaults (one GPU, 8 CPUs, 64 GB); the
    # interpreter is a stand-in that says what the job sees and, at its first start, runs until killed.
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\n"
                    'echo "fake python: CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset} '
                    'restart=${SLURM_RESTART_COUNT:-0} args=$*"\n'
                    '[ "${SLURM_RESTART_COUNT:-0}" -ge 1 ] && exit 0\n'
                    "exec sleep 300\n")
    fake.chmod(0o755)
    out = tmp_path / "eval.out"
    job = slurm_cluster.sbatch([f"--output={out}", f"--export=ALL,CBR2_PYTHON={fake}", "slurm/evaluate.sbatch",
                                "data.name=mini-metaqa"], cwd=REPO)
    request.addfinalizer(lambda: slurm_cluster.job_states(job).get(job) in ACTIVE_STATES
                         and slurm_cluster.run(["scancel", job]))
    record = _job(slurm_cluster, job)
    assert _asked(record) == ("8", "64G", "gres:gpu:1"), record
    assert _field(record, "TimeLimit") == "04:00:00" and _field(record, "Requeue") == "1"
    _until("the first start", lambda: out.is_file() and "fake python" in out.read_text(), 60)
    text = out.read_text()
    assert "fake python: CUDA_VISIBLE_DEVICES=0 restart=0 args=evaluate.py data.name=mini-metaqa" in text, text
    # What --signal=B:USR1@120 sends 120 s before the time limit: SIGUSR1 to the batch shell only.
    slurm_cluster.run(["scancel", "--batch", "--signal=USR1", job])
    _until("the requeue", lambda: slurm_cluster.job_states(job).get(job) == "PENDING", 60)
    # Slurm holds a requeued job for its credential lifetime (120 s) before it may start; start it now.
    slurm_cluster.run(["scontrol", "update", f"JobId={job}", "StartTime=now"])
    assert slurm_cluster.wait(job, timeout_s=120) == {job: "COMPLETED"}
    text = out.read_text()
    assert f"requeueing job {job}" in text, text
    assert "fake python: CUDA_VISIBLE_DEVICES=0 restart=1 args=evaluate.py data.name=mini-metaqa" in text, text


def test_a_job_can_decline_the_scripts_gpu(slurm_cluster, tmp_path):
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\necho "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}"\n')
    fake.chmod(0o755)
    out = tmp_path / "cpu.out"
    slurm_cluster.sbatch(["--wait", "--gpus=0", "--mem=4G", "--cpus-per-task=1", f"--output={out}",
                          f"--export=ALL,CBR2_PYTHON={fake}", "slurm/evaluate.sbatch"], cwd=REPO)
    assert "CUDA_VISIBLE_DEVICES=unset" in out.read_text()
