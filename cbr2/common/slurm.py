"""What the SLURM allocation gave this process, read from the job's environment.

The one place that knows SLURM's variables. Outside a job every function answers for a
single process on this machine, so the same config runs on a laptop and in a job array. In the
core layer because more than the cluster package reads the allocation: the evaluation's shard
(``array_task``), training's Lightning sizing and the vLLM backend's GPU count.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from cbr2.common.errors import UserError


def _env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def _int(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name, "").strip()
    if not value:
        return None
    # Per-node counts may look like "4(x2)" (4 on each of 2 nodes); the first number is ours.
    head = value.split("(")[0].split(",")[0]
    try:
        return int(head)
    except ValueError:
        raise UserError(f"${name}={value!r} is not a count") from None


def in_job(env: Mapping[str, str] | None = None) -> bool:
    """Whether this process runs inside a SLURM job (``sbatch``/``srun``/``salloc``)."""
    return bool(_env(env).get("SLURM_JOB_ID"))


def array_task(env: Mapping[str, str] | None = None) -> tuple[int, int] | None:
    """``(position, count)`` of this job-array task, or None outside a job array.

    The position is 0-based within the array whatever its ids (``--array=1-3`` or
    ``--array=0-10:5`` give positions 0, 1, 2), so it can serve as a shard index.

    Raises:
        UserError: When the array variables are inconsistent.
    """
    e = _env(env)
    task, count = _int(e, "SLURM_ARRAY_TASK_ID"), _int(e, "SLURM_ARRAY_TASK_COUNT")
    if task is None or count is None:
        return None
    first = _int(e, "SLURM_ARRAY_TASK_MIN") or 0
    step = _int(e, "SLURM_ARRAY_TASK_STEP") or 1
    position = (task - first) // step
    if not 0 <= position < count:
        raise UserError(f"SLURM array task {task} is not one of {count} tasks from {first} in steps of {step}")
    return position, count


def visible_gpus(env: Mapping[str, str] | None = None) -> int | None:
    """GPUs this process may use: ``$CUDA_VISIBLE_DEVICES`` (SLURM sets it for ``--gpus``),
    else ``$SLURM_GPUS_ON_NODE``; None when neither says (ask CUDA then)."""
    e = _env(env)
    visible = e.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [x for x in visible.split(",") if x.strip() and x.strip() != "-1"]
        return len(ids)
    return _int(e, "SLURM_GPUS_ON_NODE")


def tasks_per_node(env: Mapping[str, str] | None = None) -> int | None:
    """``--ntasks-per-node`` of the job (Lightning starts one DDP process per task), or None."""
    return _int(_env(env), "SLURM_NTASKS_PER_NODE")


def num_nodes(env: Mapping[str, str] | None = None) -> int | None:
    """Nodes of the job, or None outside a job."""
    return _int(_env(env), "SLURM_JOB_NUM_NODES") or _int(_env(env), "SLURM_NNODES")
