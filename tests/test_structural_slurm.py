"""Training under SLURM and DDP: sizing from the allocation, two DDP processes on CPU (gloo) as
Lightning and as ``srun`` start them, resuming from the requeue checkpoint, and
``slurm/train.sbatch`` signalled, requeued and resumed, and run over two tasks, on a real
(private) Slurm."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import socket
import subprocess
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


# ------------------------------------------------------------------------------ DDP on CPU

DDP_PAIRS, DDP_MAX_STEPS = 32, 3
"""32 pairs per epoch are 16 per rank with two ranks, 2 batches of 8: the one epoch
(``trainer.max_epochs=1``) ends at step 2, before ``max_steps``; one process would take 3 steps."""
_DISTRIBUTED_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                          "NODE_RANK", "GROUP_RANK")


def _ddp_overrides(tiny_root: Path, tmp_path: Path, *extra: str) -> list[str]:
    return [*_overrides(tiny_root, tmp_path, DDP_PAIRS, DDP_MAX_STEPS), "trainer.max_epochs=1", *extra]


def _process_env(**values: str) -> dict[str, str]:
    """This environment without SLURM's and torch.distributed's variables (the tests may run inside
    a job, and a second rank must not inherit the first's), plus ``values``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k not in _DISTRIBUTED_VARIABLES}
    return {**env, "HF_HUB_OFFLINE": "1", **values}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _train_processes(envs: list[dict[str, str]], overrides: list[str], cwd: Path,
                     timeout_s: float = 300) -> list[tuple[int, str]]:
    """``train.py overrides`` started once per environment, all at once; each one's exit code and output.

    Each runs in a session of its own, so that on a timeout it is killed with any rank Lightning
    started from it (a rank left waiting for its peers would wait for gloo's 30 minutes).
    """
    procs = []
    for i, env in enumerate(envs):
        with (cwd / f"process-{i}.log").open("wb") as out:  # the child keeps its own descriptor
            procs.append(subprocess.Popen([sys.executable, str(ROOT / "train.py"), *overrides], cwd=cwd, env=env,
                                          stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
    deadline = time.monotonic() + timeout_s
    try:
        for proc in procs:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return [(proc.returncode, (cwd / f"process-{i}.log").read_text(errors="replace")) for i, proc in enumerate(procs)]


def _check_two_rank_run(output: str, tmp_path: Path) -> None:
    """What training over two DDP ranks leaves: both joined, each trained on its half of the
    epoch's pairs, global rank zero alone exported, and the export loads and encodes."""
    from sentence_transformers import SentenceTransformer

    for rank in (0, 1):  # Lightning's line as each rank joins the process group
        assert f"GLOBAL_RANK: {rank}, MEMBER: {rank + 1}/2" in output, output[-4000:]
    assert "distributed_backend=gloo" in output
    assert output.count("exported the structural retriever") == 1, output[-4000:]
    exports = list((tmp_path / "ckpt").iterdir())
    assert len(exports) == 1
    meta = json.loads((exports[0] / META_FILE).read_text())
    assert meta["steps"] == 2 and _train_steps(tmp_path / "run" / "logs" / "version_0" / "metrics.csv") == [0, 1]
    assert meta["config"]["trainer"]["precision"] == "32-true"  # trainer.precision=auto on CPUs
    assert {"val/spearman", "val/sketch_hit@5"} <= set(meta["metrics"])
    assert SentenceTransformer(str(exports[0]), device="cpu").encode(["Which is taller?"]).shape == (1, 384)


@pytest.mark.slow
def test_two_ddp_processes_on_cpu(tiny_root, tmp_path):
    """``trainer.devices=2 trainer.strategy=ddp`` on CPUs: Lightning starts the second rank; gloo joins them."""
    [(code, output)] = _train_processes([_process_env()], _ddp_overrides(
        tiny_root, tmp_path, "trainer.devices=2", "trainer.strategy=ddp"), tmp_path)
    assert code == 0, output[-4000:]
    _check_two_rank_run(output, tmp_path)


@pytest.mark.slow
def test_two_ddp_processes_as_srun_starts_them(tiny_root, tmp_path):
    """Two processes with the variables srun gives the tasks of a one-node, two-task job: each is
    sized by the allocation (``trainer.devices`` stays auto) and Lightning's SLURMEnvironment joins them."""
    task = {**JOB, "NTASKS": "2", "NTASKS_PER_NODE": "2", "JOB_NUM_NODES": "1", "NNODES": "1", "NODELIST": "127.0.0.1"}
    port = str(_free_port())  # else Lightning derives one from the job id, which a machine's other tests may share
    envs = [_process_env(**{f"SLURM_{k}": v for k, v in {**task, "PROCID": str(rank), "LOCALID": str(rank)}.items()},
                         MASTER_ADDR="127.0.0.1", MASTER_PORT=port) for rank in (0, 1)]
    (code0, output0), (code1, output1) = _train_processes(envs, _ddp_overrides(tiny_root, tmp_path), tmp_path)
    assert code0 == code1 == 0, (output0[-3000:], output1[-3000:])
    for output in (output0, output1):
        assert "trainer.num_nodes=1, trainer.devices=2" in output, output[-3000:]
    assert "best val/sketch_hit@5" in output0 and "best val/sketch_hit@5" not in output1  # rank 0 reports
    _check_two_rank_run(output0 + output1, tmp_path)


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


@pytest.mark.slurm
@pytest.mark.slow
def test_sbatch_training_over_two_tasks(slurm_cluster, tiny_root, tmp_path, request):
    """slurm/train.sbatch with ``--ntasks-per-node=2`` and no GPU: srun starts two tasks, which
    train as two DDP ranks (gloo), sized by the allocation."""
    job = slurm_cluster.sbatch([f"--output={tmp_path}/slurm-%x-%j.out", f"--export=ALL,CBR2_PYTHON={sys.executable}",
                                "--ntasks-per-node=2", "--gpus-per-node=0", "slurm/train.sbatch",
                                *_ddp_overrides(tiny_root, tmp_path)], cwd=ROOT)
    request.addfinalizer(lambda: _cancel(slurm_cluster, job))
    states = slurm_cluster.wait(job, timeout_s=300)
    log = tmp_path / f"slurm-cbr2-train-{job}.out"
    output = log.read_text(errors="replace") if log.exists() else "(no output)"
    assert states == {job: "COMPLETED"}, output[-4000:]
    assert output.count("trainer.num_nodes=1, trainer.devices=2") == 2, output[-4000:]  # each task sized by the job
    _check_two_rank_run(output, tmp_path)
