"""The Slurm tier: real jobs on a private single-node Slurm (skipped with the reason when it cannot run)."""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path

import pytest
from slurm_cluster import SlurmCluster, SlurmUnavailable, start_cluster

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[1]


def test_batch_job_writes_its_output(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    out = tmp_path / "job.out"
    job = slurm_cluster.sbatch(["--wait", f"--output={out}", "--wrap", "echo hello from $SLURM_JOB_ID"],
                               cwd=tmp_path)
    assert slurm_cluster.wait(job, timeout_s=30) == {job: "COMPLETED"}
    assert out.read_text().strip() == f"hello from {job}"


def test_array_tasks_see_their_shard(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    # cbr2.common.slurm.array_task() inside real array tasks: each must find its own (position, count).
    code = "from cbr2.common.slurm import array_task; print(array_task())"
    job = slurm_cluster.sbatch(["--array=0-2", f"--output={tmp_path}/task-%a.out",
                                "--wrap", f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}"],
                               cwd=REPO)  # the job starts in the submit folder, where cbr2 imports
    states = slurm_cluster.wait(job, timeout_s=60)
    assert states == {f"{job}_{i}": "COMPLETED" for i in range(3)}, states
    outputs = [(tmp_path / f"task-{i}.out").read_text().strip() for i in range(3)]
    assert outputs == ["(0, 3)", "(1, 3)", "(2, 3)"]


def test_failed_job_is_reported(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    job = slurm_cluster.sbatch([f"--output={tmp_path}/fail.out", "--wrap", "exit 3"], cwd=tmp_path)
    assert slurm_cluster.wait(job, timeout_s=30) == {job: "FAILED"}


def _processes_mentioning(text: str) -> list[int]:
    """PIDs whose command line (arguments joined by spaces) mentions ``text`` (Linux /proc)."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text in cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                pids.append(int(cmdline.parent.name))
        except OSError:
            continue  # the process ended meanwhile
    return pids


def test_stop_ends_every_daemon(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    # Its own cluster (about a second to start): stopping the session one would end the tier.
    # slurm_cluster is requested only so this test skips with the same reason when Slurm cannot run.
    try:
        cluster = start_cluster(tmp_path / "own")
    except SlurmUnavailable as e:
        pytest.fail(f"the session cluster started but a second one did not: {e}")
    try:
        pids = cluster.pids
        assert set(pids) == {"munged", "slurmctld", "slurmd"}
        # A job still running at stop() must not leave its slurmstepd (and the job) behind.
        job = cluster.sbatch([f"--output={tmp_path}/sleep.out", "--wrap", "sleep 297"], cwd=tmp_path)
        deadline = time.monotonic() + 30
        while cluster.job_states(job) != {job: "RUNNING"}:
            assert time.monotonic() < deadline, cluster.job_states(job)
            time.sleep(0.2)
    finally:
        cluster.stop()
    for name, pid in pids.items():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
            pytest.fail(f"{name} (PID {pid}) still runs after stop()")
    assert _processes_mentioning(str(tmp_path / "own")) == []
    assert _processes_mentioning("sleep 297") == []
    cluster.stop()  # idempotent
