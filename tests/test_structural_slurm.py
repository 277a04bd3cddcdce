"""Training under SLURM: sizing from the allocation, resuming from the requeue checkpoint, and
``slurm/train.sbatch`` signalled, requeued and resumed on a real (private) Slurm."""

from __future__ import annotations

import csv
import json
import os
import re
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from slurm_cluster import ACTIVE_STATES, SlurmCluster

from cbr2.config import CONFIG_DIR, TrainConfig, load_config
from cbr2.data.benchmarks import EMBEDDED_ROOT
from cbr2.structural.checkpoints import META_FILE
from cbr2.structural.train import resume_checkpoint, slurm_sizing

ROOT = Path(__file__).resolve().parents[1]
JOB = {"JOB_ID": "4242", "JOB_NAME": "cbr2-train", "NTASKS": "8", "NTASKS_PER_NODE": "4", "JOB_NUM_NODES": "2",
       "NNODES": "2", "PROCID": "0", "LOCALID": "0", "NODEID": "0", "NODELIST": "node[1-2]"}
"""The variables srun gives the first task of a 2 nodes x 4 tasks job."""


def _slurm_env(monkeypatch: pytest.MonkeyPatch, **values: str) -> None:
    """Replace this process's SLURM variables by ``SLURM_{key}=value`` (none when empty)."""
    for name in [n for n in os.environ if n.startswith("SLURM_")]:
        monkeypatch.delenv(name)
    for name in ("MASTER_ADDR", "MASTER_PORT"):  # SLURMEnvironment sets these when asked: undone after the test
        monkeypatch.delenv(name, raising=False)
    for key, value in values.items():
        monkeypatch.setenv(f"SLURM_{key}", value)


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A KQA Pro folder whose training split is mini-kqapro's first 120 questions: validation stays cheap."""
    root = tmp_path_factory.mktemp("tiny-kqapro")
    items = json.loads((EMBEDDED_ROOT / "mini-kqapro" / "train.json").read_text(encoding="utf-8"))[:120]
    (root / "train.json").write_text(json.dumps(items), encoding="utf-8")
    (root / "kb.json").symlink_to(EMBEDDED_ROOT / "mini-kqapro" / "kb.json")
    return root


def _overrides(tiny_root: Path, tmp_path: Path, pairs_per_epoch: int, max_steps: int) -> list[str]:
    # trainer.devices stays auto, so that inside a job the allocation decides it.
    return ["data.name=kqapro", f"data.root={tiny_root}", "structural.holdout=0.25",
            f"structural.pairs_per_epoch={pairs_per_epoch}", "structural.val_pairs=16", "structural.batch_size=8",
            "trainer.max_epochs=1000", f"trainer.max_steps={max_steps}", "trainer.accelerator=cpu",
            "trainer.log_every_n_steps=1", "trainer.num_sanity_val_steps=0", "trainer.enable_progress_bar=false",
            "trainer.enable_model_summary=false", "wandb.mode=disabled", f"output_dir={tmp_path / 'run'}",
            f"structural.checkpoints_dir={tmp_path / 'ckpt'}"]


def _train_steps(metrics_csv: Path) -> list[int]:
    """The steps of the training rows a CSVLogger wrote (``trainer.log_every_n_steps=1``: one per step)."""
    with metrics_csv.open(newline="", encoding="utf-8") as f:
        return [int(row["step"]) for row in csv.DictReader(f) if row.get("train/loss")]


# ------------------------------------------------------------------------------ sizing

def test_sizing_follows_the_allocation(monkeypatch):
    _slurm_env(monkeypatch, **JOB)
    sized = slurm_sizing({"devices": "auto", "accelerator": "gpu", "max_epochs": 2})
    assert sized == {"devices": 4, "num_nodes": 2, "accelerator": "gpu", "max_epochs": 2}
    assert slurm_sizing({"max_epochs": 2}) == {"devices": 4, "num_nodes": 2, "max_epochs": 2}  # Lightning's default


def test_sizing_keeps_explicit_values(monkeypatch):
    _slurm_env(monkeypatch, **JOB)
    assert slurm_sizing({"devices": 2, "num_nodes": 1}) == {"devices": 2, "num_nodes": 1}  # Lightning names a mismatch
    assert slurm_sizing({"devices": "auto", "num_nodes": 3}) == {"devices": 4, "num_nodes": 3}


def test_sizing_changes_nothing_outside_a_managed_job(monkeypatch):
    kwargs = {"devices": "auto", "max_epochs": 2}
    _slurm_env(monkeypatch)
    assert slurm_sizing(kwargs) == {"devices": "auto", "max_epochs": 2}
    # Lightning leaves interactive jobs (salloc; srun --pty bash) alone, and so does the sizing.
    _slurm_env(monkeypatch, **{**JOB, "JOB_NAME": "interactive"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's hint that srun is not used, where srun exists
        assert slurm_sizing(kwargs) == {"devices": "auto", "max_epochs": 2}
    unsized = {k: v for k, v in JOB.items() if k not in ("NTASKS_PER_NODE", "JOB_NUM_NODES", "NNODES")}
    _slurm_env(monkeypatch, **{**unsized, "NTASKS": "1"})
    assert slurm_sizing(kwargs) == {"devices": "auto", "max_epochs": 2}  # nothing to size it by


# ------------------------------------------------------------------------------ resume choice

def _touch(path: Path, mtime: float, content: bytes = b"") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    os.utime(path, (mtime, mtime))
    return path


def test_resume_takes_the_newest_of_last_and_the_requeue_checkpoint(tmp_path):
    run, now = tmp_path / "run", time.time()
    assert resume_checkpoint(run) is None  # no folder yet
    last = _touch(run / "checkpoints" / "last.ckpt", now - 100)
    assert resume_checkpoint(run) == last
    hpc2 = _touch(run / "hpc_ckpt_2.ckpt", now - 50)  # saved on SLURM's signal after last.ckpt
    _touch(run / "hpc_ckpt_1.ckpt", now - 10)  # an older requeue (by number) with a newer mtime (copied, say)
    _touch(run / "hpc_ckpt_x.ckpt", now)  # not Lightning's name
    assert resume_checkpoint(run) == hpc2
    os.utime(last, (now - 20, now - 20))  # validation saved last.ckpt after the requeued start
    assert resume_checkpoint(run) == last
    os.utime(hpc2, (now - 20, now - 20))
    assert resume_checkpoint(run) == hpc2  # a tie goes to the requeue checkpoint
    last.unlink()
    assert resume_checkpoint(run) == hpc2


@pytest.mark.slow
def test_train_in_a_slurm_job_resumes_from_the_requeue_checkpoint(tiny_root, tmp_path, monkeypatch):
    """train() as the first task of a one-task srun step: sized by the job, resumed from hpc_ckpt_1.ckpt."""
    from cbr2.structural.train import train

    _slurm_env(monkeypatch, **{**JOB, "NTASKS": "1", "NTASKS_PER_NODE": "1", "JOB_NUM_NODES": "1", "NNODES": "1",
                               "NODELIST": "127.0.0.1"})
    files = [CONFIG_DIR / "train.yaml"]
    # 8 steps per epoch: both attempts stop before any validation in fitting, so the final
    # validate() runs with a requeue checkpoint in the run folder.
    first = train(load_config(_overrides(tiny_root, tmp_path, 64, 2), files, TrainConfig))
    assert first["steps"] == 2
    run = tmp_path / "run"
    # What Lightning leaves on SLURM's signal: hpc_ckpt_N.ckpt in the run folder, newer than
    # last.ckpt, which is garbage here so that resuming from it fails loudly.
    hpc = (run / "checkpoints" / "last.ckpt").rename(run / "hpc_ckpt_1.ckpt")
    _touch(run / "checkpoints" / "last.ckpt", time.time() - 3600, b"not a checkpoint")

    second = train(load_config(_overrides(tiny_root, tmp_path, 64, 4), files, TrainConfig))
    assert second["resumed_from"] == str(hpc) and second["steps"] == 4
    assert len(_train_steps(run / "logs" / "version_1" / "metrics.csv")) == 2  # steps 3 and 4 only
    # The export holds the weights fitting ended with (last.ckpt at step 4), not the requeue state.
    from safetensors.torch import load_file

    exported = load_file(Path(second["checkpoint"]) / "model.safetensors")
    final = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    stale = torch.load(hpc, map_location="cpu", weights_only=False)
    assert final["global_step"] == 4 and stale["global_step"] == 2
    key = "encoder.layer.0.attention.self.query.weight"  # the module's name is "encoder.0.{model or auto_model}.{key}"

    def weight(ckpt: dict) -> torch.Tensor:
        return next(v for k, v in ckpt["state_dict"].items() if k.endswith(f".{key}"))

    assert torch.equal(exported[key], weight(final)) and not torch.equal(exported[key], weight(stale))


# ------------------------------------------------------------------------------ real Slurm

def _wait_for(what: str, ready: Callable[[], bool], timeout_s: float, slurm_cluster: SlurmCluster, job: str,
              log: Path) -> None:
    """Poll ``ready()`` until true; fail with the job's state and output when the job ended or time ran out."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        state = slurm_cluster.job_states(job).get(job)
        if time.monotonic() > deadline or state not in ACTIVE_STATES:
            output = log.read_text(errors="replace")[-4000:] if log.exists() else "(no output)"
            pytest.fail(f"waiting for {what}: job {job} is {state}\n{output}")
        time.sleep(0.2)


def _cancel(slurm_cluster: SlurmCluster, job: str) -> None:
    """Cancel ``job`` unless it ended: a failed check must not leave it training beside later tests."""
    if slurm_cluster.job_states(job).get(job) in ACTIVE_STATES:
        slurm_cluster.run(["scancel", job])


@pytest.mark.slurm
@pytest.mark.slow
def test_sbatch_training_is_signalled_requeued_and_resumed(slurm_cluster, tiny_root, tmp_path, request):
    """slurm/train.sbatch as users submit it: SIGUSR1 mid-run saves hpc_ckpt_1.ckpt and requeues,
    and the job's second start resumes from it and finishes the configured steps."""
    total = 30  # 10 steps per epoch: the signal lands early in epoch 1 (~0.8 s a step on 2 idle cores)
    overrides = _overrides(tiny_root, tmp_path, 80, total)
    # The job starts in the repository (train.py, .venv) but writes only under tmp_path.
    job = slurm_cluster.sbatch([f"--output={tmp_path}/slurm-%x-%j.out", f"--export=ALL,CBR2_PYTHON={sys.executable}",
                                "slurm/train.sbatch", *overrides], cwd=ROOT)
    request.addfinalizer(lambda: _cancel(slurm_cluster, job))
    log = tmp_path / f"slurm-cbr2-train-{job}.out"
    run = tmp_path / "run"
    last = run / "checkpoints" / "last.ckpt"

    def written() -> bool:  # a second after its write ended: into epoch 1, away from checkpoint writes
        return last.is_file() and time.time() - last.stat().st_mtime > 1.0

    _wait_for("the first epoch's checkpoint", written, 150, slurm_cluster, job, log)
    slurm_cluster.run(["scancel", "--signal=USR1", job])  # to the srun step, as --signal=SIGUSR1@120 does

    def pending() -> bool:
        return slurm_cluster.job_states(job).get(job) == "PENDING"

    _wait_for("the requeue", pending, 60, slurm_cluster, job, log)
    # Slurm holds a requeued job for its credential lifetime (120 s by default, so PENDING cannot
    # be missed above) before it may start again; let it start at once instead.
    slurm_cluster.run(["scontrol", "update", f"JobId={job}", "StartTime=now"])
    states = slurm_cluster.wait(job, timeout_s=150)
    output = log.read_text(errors="replace")
    assert states == {job: "COMPLETED"}, output[-4000:]

    hpc = run / "hpc_ckpt_1.ckpt"
    assert "Handling auto-requeue signal" in output and f"Requeued SLURM job: {job}" in output, output[-4000:]
    assert "DUE TO JOB REQUEUE" in output
    assert f"resuming from the SLURM requeue checkpoint {hpc}" in output, output[-4000:]
    assert f"Restored all states from the checkpoint at {hpc}" in output
    assert output.count("trainer.num_nodes=1, trainer.devices=1") == 2  # sized from the job at both starts
    saved_at = torch.load(hpc, map_location="cpu", weights_only=False, mmap=True)["global_step"]
    assert 10 <= saved_at < total
    assert min(_train_steps(run / "logs" / "version_1" / "metrics.csv")) >= saved_at  # continued, not restarted
    exported = tmp_path / "ckpt" / f"structural-kqapro-{json.loads((run / 'baseline.json').read_text())['run_id']}"
    meta = json.loads((exported / META_FILE).read_text())
    assert meta["steps"] == total and meta["lightning_checkpoint"].startswith(str(run / "checkpoints" / "best-"))
    assert re.search(rf"best val/sketch_hit@5 \S+ \(untrained \S+\) -> {re.escape(str(exported))}", output)
