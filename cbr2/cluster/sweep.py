"""Sweeps: one SLURM job array over a grid of evaluations, then one job that joins them.

    python -m cbr2.cluster.sweep submit --ablations all --grid llm.seed=0,1 --partition a100 --account ACCT \\
        --gpus 1 --cpus 8 --mem 64G --time 04:00:00 --config configs/paper.yaml data.name=kqapro data.root=/data/KQAPro
    python -m cbr2.cluster.sweep submit --ablations all --shards 4 ...     # each run split over 4 tasks
    python -m cbr2.cluster.sweep submit --ablations all --local            # no SLURM: the tasks one after another here
    python -m cbr2.cluster.sweep status outputs/sweeps/NAME

``submit`` expands the grid (ablations x every ``--grid`` key's values), checks every run's
config (a misspelt key fails here, not in 16 queued jobs), writes ``SWEEP/sweep.json`` and
submits a job array of ``slurm/sweep.sbatch`` with one task per run and shard, and a ``finalize``
job (``slurm/finalize.sbatch``) that starts when the array has ended (``afterany``). Task ``t`` evaluates run
``t // shards``, shard ``t % shards``, into ``SWEEP/runs/{run}/``, with ``wandb.group`` set to
the sweep's name. Each task asks for ``--gpus``, ``--cpus``, ``--mem``, ``--time``, ``--partition``
and ``--account`` (unset: ``slurm/sweep.sbatch``'s defaults, one A100 task: 1 GPU, 8 CPUs, 64 GB,
4 h); the finalize job asks for no GPU, on the site's default partition unless
``--finalize-partition`` names one. ``finalize`` merges sharded runs (``python -m cbr2.cluster.merge``), writes the
Table 5 layout of the finished runs to ``SWEEP/report/`` (``python -m cbr2.report.compare``) and
``SWEEP/summary.json`` (task states, seconds, the sweep's wall time). A task that was killed
resumes from its predictions when run again: ``python -m cbr2.cluster.sweep task SWEEP T`` or
``sbatch --array=T slurm/sweep.sbatch task SWEEP``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from cbr2.cluster.grid import Run, expand_grid, expand_vary
from cbr2.common.console import setup_logging
from cbr2.common.errors import SetupError, UserError
from cbr2.common.files import write_atomic
from cbr2.common.provenance import git_hash
from cbr2.config import (
    ABLATIONS,
    REPO_ROOT,
    Config,
    ConfigError,
    ablation,
    compose,
)
from cbr2.report import compare

log = logging.getLogger(__name__)

SBATCH_SCRIPT = REPO_ROOT / "slurm" / "sweep.sbatch"
"""The job script of every sweep task."""
FINALIZE_SCRIPT = REPO_ROOT / "slurm" / "finalize.sbatch"
"""The job script of the finalize job: its resources (2 CPUs, no GPU) are its own ``#SBATCH`` lines."""


@dataclass
class Sweep:
    """What ``sweep.json`` holds: everything a task needs to rebuild its config."""

    name: str
    dir: str
    runs: list[Run]
    shards: int = 1
    config_files: list[str] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)
    """Overrides shared by every run (before the grid's)."""
    created: str = ""
    git: str | None = None
    command: str = ""
    jobs: dict[str, str] = field(default_factory=dict)

    @property
    def tasks(self) -> int:
        """Job-array tasks: one per run and shard."""
        return len(self.runs) * self.shards

    def task(self, t: int) -> tuple[Run, int]:
        """The run and shard of task ``t``."""
        if not 0 <= t < self.tasks:
            raise UserError(f"task {t} is not one of the sweep's {self.tasks} tasks (0..{self.tasks - 1})")
        return self.runs[t // self.shards], t % self.shards

    def run_dir(self, run: Run) -> Path:
        """Where a run's results go (its shards in ``shard-I-of-N/`` inside)."""
        return Path(self.dir) / "runs" / run.name

    def run_overrides(self, run: Run, shard: int) -> list[str]:
        """A task's full override list: shared, then the grid's, then what the sweep decides."""
        return [*self.overrides, *run.overrides, f"output_dir={self.run_dir(run)}", f"wandb.group={self.name}",
                f"wandb.name={self.name}-{run.name}", f"eval.num_shards={self.shards}", f"eval.shard={shard}"]

    def config(self, run: Run, shard: int) -> Any:
        """The evaluation config of one task.

        Raises:
            ConfigError: Naming the key, file or ablation that does not fit.
        """
        return compose(Config, ablation=run.ablation, files=self.config_files, overrides=self.run_overrides(run, shard))

    def save(self) -> None:
        """Write ``sweep.json`` (atomically: tasks read it while the submitter may rewrite it)."""
        write_atomic(Path(self.dir) / "sweep.json", json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, folder: str | Path) -> Sweep:
        """Read ``FOLDER/sweep.json``.

        Raises:
            UserError: When the folder holds no sweep.
        """
        path = Path(folder) / "sweep.json"
        if not path.is_file():
            raise UserError(f"{folder} is not a sweep folder (no sweep.json)")
        raw = json.loads(path.read_text(encoding="utf-8"))
        raw["runs"] = [Run(**r) for r in raw["runs"]]
        return cls(**raw)


def _status_path(sweep: Sweep, t: int) -> Path:
    return Path(sweep.dir) / "status" / f"task-{t}.json"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def run_task(sweep: Sweep, t: int) -> dict[str, Any]:
    """Evaluate task ``t`` of the sweep and record its state in ``SWEEP/status/task-{t}.json``.

    Raises:
        Exception: Whatever the evaluation raised (after recording the task as failed).
    """
    from cbr2.common.devices import check_devices
    from cbr2.run.runner import device_settings, run_evaluation

    run, shard = sweep.task(t)
    status = {"task": t, "run": run.name, "shard": shard, "state": "running", "started": _now(),
              "start_s": time.time(), "host": socket.gethostname(),
              "job": os.environ.get("SLURM_JOB_ID"), "restarts": int(os.environ.get("SLURM_RESTART_COUNT", "0"))}
    path = _status_path(sweep, t)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(status, indent=2) + "\n", encoding="utf-8")
    log.info("sweep %s task %d: run %s, shard %d of %d", sweep.name, t, run.name, shard, sweep.shards)
    try:
        cfg = sweep.config(run, shard)
        check_devices(**device_settings(cfg))
        metrics = run_evaluation(cfg, ablation=run.ablation, config_files=sweep.config_files)
    except BaseException as err:
        status.update(state="failed", error=f"{type(err).__name__}: {err}")
        raise
    else:
        status.update(state="done", **{k: metrics[k] for k in ("hits@1", "ser", "n") if k in metrics})
    finally:
        status.update(ended=_now(), seconds=time.time() - status["start_s"])
        path.write_text(json.dumps(status, indent=2) + "\n", encoding="utf-8")
    return status


def task_states(sweep: Sweep) -> list[dict[str, Any]]:
    """Each task's last recorded status (``state`` ``pending`` when it never started)."""
    states = []
    for t in range(sweep.tasks):
        path = _status_path(sweep, t)
        run, shard = sweep.task(t)
        states.append(json.loads(path.read_text(encoding="utf-8")) if path.is_file()
                      else {"task": t, "run": run.name, "shard": shard, "state": "pending"})
    return states


def finalize(sweep: Sweep) -> dict[str, Any]:
    """Merge sharded runs, tabulate the finished runs, write ``SWEEP/summary.json``.

    Runs with a failed or unfinished task are left out of the table and listed in the summary.
    """
    from cbr2.cluster.merge import merge

    states = task_states(sweep)
    finished, incomplete = [], []
    for i, run in enumerate(sweep.runs):
        mine = states[i * sweep.shards: (i + 1) * sweep.shards]
        if any(s["state"] != "done" for s in mine):
            incomplete.append(run.name)
            continue
        folder = sweep.run_dir(run)
        if sweep.shards > 1:
            try:
                merge([folder / f"shard-{j}-of-{sweep.shards}" for j in range(sweep.shards)], folder)
            except (UserError, OSError) as err:  # one bad run must not cost the others their table
                log.error("sweep %s: cannot merge %s: %s", sweep.name, run.name, err)
                incomplete.append(run.name)
                continue
        finished.append(folder)
    table = None
    if finished:
        out = Path(sweep.dir) / "report"
        code = compare.main([*map(str, finished), "--out", str(out), "--title", sweep.name])
        table = str(out / "ablation.md") if code == 0 else None
    vary = _vary_tables(sweep, finished)
    starts = [s["start_s"] for s in states if "start_s" in s]
    ends = [s["start_s"] + s["seconds"] for s in states if "seconds" in s]
    summary = {
        "name": sweep.name, "runs": len(sweep.runs), "tasks": sweep.tasks,
        "states": {k: sum(s["state"] == k for s in states) for k in ("done", "failed", "running", "pending")},
        "finished_runs": [p.name for p in finished], "incomplete_runs": incomplete, "table": table, "vary": vary,
        "wall_s": (max(ends) - min(starts)) if starts and ends else None,
        "task_seconds": sum(s.get("seconds", 0.0) for s in states),
        "failed": [{"task": s["task"], "run": s["run"], "error": s.get("error")} for s in states if s["state"] == "failed"],
    }
    (Path(sweep.dir) / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    log.info("sweep %s: %d of %d runs finished; tasks %s; wall %.0f s", sweep.name, len(finished), len(sweep.runs),
             summary["states"], summary["wall_s"] or 0)
    return summary


def _vary_tables(sweep: Sweep, finished: list[Path]) -> str | None:
    """``SWEEP/report/vary.md`` of a one-factor-at-a-time sweep (``--vary``): each setting against
    its ablation's base run; None for grids or when no base run finished."""

    done = {p.name for p in finished}
    bases = {r.ablation: r for r in sweep.runs if not r.overrides and r.name in done}
    if not bases or all(not r.overrides for r in sweep.runs):
        return None
    parts = []
    for setting, base in bases.items():
        others = [(" ".join(r.overrides), compare.load_run(sweep.run_dir(r))) for r in sweep.runs
                  if r.ablation == setting and r.overrides and r.name in done]
        title = f"{sweep.name} · {base.name}: one factor at a time"
        parts.append(compare.versus_table(compare.load_run(sweep.run_dir(base)), others, title))
    path = Path(sweep.dir) / "report" / "vary.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(parts), encoding="utf-8")
    print(path.read_text(encoding="utf-8"))
    return str(path)


def _sbatch(args: list[str], env: dict[str, str]) -> str:
    try:
        done = subprocess.run(["sbatch", "--parsable", *args], env=env, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise SetupError("sbatch not found: submit from a SLURM login node, or run the sweep here with --local") from None
    job = done.stdout.strip().split("\n")[0].split(";")[0]  # "id" or "id;cluster"
    if done.returncode and not ("--wait" in args and job):  # with --wait, the job's own exit code
        raise SetupError(f"sbatch {' '.join(args)} failed: {done.stderr.strip()}")
    if done.returncode:
        log.warning("job %s ended with exit code %d", job, done.returncode)
    return job


@dataclass
class Resources:
    """What each task of a sweep asks Slurm for; None leaves ``slurm/sweep.sbatch``'s default."""

    gpus: int | None = None
    cpus: int | None = None
    mem: str | None = None
    time: str | None = None
    partition: str | None = None
    account: str | None = None
    finalize_partition: str | None = None
    """The finalize job's partition; unset: the site's default partition (not the tasks' GPU one)."""

    def task_args(self) -> list[str]:
        """``sbatch`` options of the array's tasks."""
        flags = {"gpus": self.gpus, "cpus-per-task": self.cpus, "mem": self.mem, "time": self.time,
                 "partition": self.partition, "account": self.account}
        return [f"--{k}={v}" for k, v in flags.items() if v is not None]

    def finalize_args(self) -> list[str]:
        """``sbatch`` options of the finalize job: the account, and ``finalize_partition`` if set.

        The job reads and writes files: on a GPU partition it would be a GPU-less job there, which
        some sites reject; the site's default partition takes it.
        """
        flags = {"partition": self.finalize_partition, "account": self.account}
        return [f"--{k}={v}" for k, v in flags.items() if v is not None]


def submit(sweep: Sweep, sbatch: list[str], finalize_sbatch: list[str], parallel: int | None,
           dry_run: bool = False, wait: bool = False, resources: Resources | None = None) -> list[list[str]]:
    """Submit the job array and the finalize job; returns the two ``sbatch`` argument lists.

    The tasks use this interpreter (``$CBR2_PYTHON``) and start in this working directory. The
    options in ``sbatch`` and ``finalize_sbatch`` come after those of ``resources``, so they win.
    """
    resources = resources or Resources()
    logs = Path(sweep.dir) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    array = f"0-{sweep.tasks - 1}" + (f"%{parallel}" if parallel else "")
    task_args = [f"--array={array}", f"--job-name=cbr2-sweep-{sweep.name}", f"--output={logs}/task-%a.out",
                 *resources.task_args(), *sbatch, str(SBATCH_SCRIPT), "task", sweep.dir]
    final_args = [f"--job-name=cbr2-sweep-{sweep.name}-finalize", f"--output={logs}/finalize.out",
                  *resources.finalize_args(), *finalize_sbatch, *(["--wait"] if wait else []), str(FINALIZE_SCRIPT),
                  sweep.dir]
    if dry_run:
        return [task_args, ["--dependency=afterany:ARRAY_JOB", *final_args]]
    env = {**os.environ, "CBR2_PYTHON": sys.executable}
    array_id = _sbatch(task_args, env)
    sweep.jobs = {"array": array_id}
    sweep.save()
    final_args.insert(0, f"--dependency=afterany:{array_id}")
    print(f"submitted job array {array_id} ({sweep.tasks} tasks) for sweep {sweep.name} in {sweep.dir}", flush=True)
    if wait:
        print("waiting for the sweep to finish (the finalize job) ...", flush=True)
    sweep.jobs["finalize"] = _sbatch(final_args, env)
    sweep.save()
    return [task_args, final_args]


def _new_sweep(args: argparse.Namespace) -> Sweep:
    ablations: list[str | None]
    if args.ablations in (None, ""):
        ablations = [None]
    elif args.ablations == "all":
        ablations = list(ABLATIONS)
    else:
        ablations = [a.strip() for a in args.ablations.split(",")]
        for a in ablations:
            ablation(a)  # unknown names fail here, listing the valid ones
    if args.shards < 1:
        raise ConfigError(f"--shards {args.shards}: must be at least 1")
    name = args.name or datetime.now().strftime("sweep-%Y%m%d-%H%M%S")
    folder = (Path(args.dir) / name).resolve()
    if (folder / "sweep.json").exists():
        raise ConfigError(f"{folder} already holds a sweep; choose another --name (tasks of a sweep resume with "
                          f"`python -m cbr2.cluster.sweep task {folder} T`)")
    if args.vary and args.grid:
        raise ConfigError("--vary (one factor at a time) and --grid (every combination) do not combine; use one")
    if args.vary:
        base = compose(Config, files=args.config, overrides=args.overrides)
        runs = expand_vary(ablations, args.vary, base)
    else:
        runs = expand_grid(ablations, args.grid)
    sweep = Sweep(name=name, dir=str(folder), runs=runs, shards=args.shards,
                  config_files=[str(Path(f).resolve()) for f in args.config], overrides=list(args.overrides),
                  created=_now(), git=git_hash(), command=" ".join(sys.argv))
    seen: dict[str, str] = {}
    for run in sweep.runs:  # every run's config is checked before anything is submitted
        cfg = sweep.config(run, 0)
        if cfg.eval.limit is not None and cfg.eval.limit < sweep.shards:
            raise ConfigError(f"eval.limit={cfg.eval.limit} leaves some of the {sweep.shards} shards empty")
        same = seen.setdefault(_identity(cfg), run.name)
        if same != run.name:
            raise ConfigError(f"runs {same} and {run.name} of the sweep compose to the same configuration, so one "
                              "would only repeat the other: drop one, or make their settings differ")
    folder.mkdir(parents=True, exist_ok=True)
    sweep.save()
    return sweep


def _identity(cfg: Any) -> str:
    """What a run computes: its configuration without where it writes and how it is named and sharded."""
    tree = OmegaConf.to_container(cfg)
    tree.pop("output_dir", None)
    for section, keys in (("wandb", ("name", "group")), ("eval", ("shard", "num_shards"))):
        for key in keys:
            tree[section].pop(key, None)
    return json.dumps(tree, sort_keys=True)


def _submit_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("overrides", nargs="*", help="config overrides shared by every run (key=value)")
    p.add_argument("--ablations", metavar="LIST", help=f"'all' or comma-separated names from: {', '.join(ABLATIONS)}")
    p.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                   help="one grid axis (repeatable); runs are every combination with the ablations")
    p.add_argument("--vary", action="append", default=[], metavar="KEY=V1,V2",
                   help="one factor at a time (repeatable): the base run, then one run per value of each axis; "
                        "K1,K2=V1,V2 sets several keys together")
    p.add_argument("--shards", type=int, default=1, help="tasks per run, each evaluating 1/N of its questions")
    p.add_argument("--config", action="append", default=[], metavar="FILE", help="YAML merged over configs/evaluate.yaml")
    p.add_argument("--name", help="the sweep's name (folder and W&B group); default sweep-DATE-TIME")
    p.add_argument("--dir", default="outputs/sweeps", help="where sweep folders go (default: %(default)s)")
    res = p.add_argument_group("resources of each task (unset: slurm/sweep.sbatch's defaults, one A100 task: "
                               "1 GPU, 8 CPUs, 64 GB, 4 h; the finalize job is slurm/finalize.sbatch's: no GPU)")
    res.add_argument("--gpus", type=int, metavar="N", help="GPUs per task (sbatch --gpus; 0: none)")
    res.add_argument("--cpus", type=int, metavar="N", help="CPUs per task (sbatch --cpus-per-task)")
    res.add_argument("--mem", metavar="SIZE", help="memory per task, e.g. 64G (sbatch --mem)")
    res.add_argument("--time", metavar="LIMIT", help="time limit per task, e.g. 04:00:00 (sbatch --time); a task "
                                                     "requeues itself 2 minutes before it and resumes")
    res.add_argument("--partition", metavar="NAME", help="partition of the tasks (sbatch -p)")
    res.add_argument("--account", metavar="NAME", help="account charged (sbatch -A)")
    res.add_argument("--finalize-partition", metavar="NAME",
                     help="partition of the finalize job (2 CPUs, no GPU); default: the site's default partition")
    p.add_argument("--sbatch", default="", metavar="ARGS",
                   help='more sbatch options of the tasks, after the resources above (they win), e.g. "--qos=high"')
    p.add_argument("--finalize-sbatch", default="", metavar="ARGS", help="sbatch options of the finalize job")
    p.add_argument("--parallel", type=int, metavar="P", help="run at most P tasks at once (--array=...%%P)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="write sweep.json and print the sbatch commands only")
    mode.add_argument("--local", action="store_true", help="no SLURM: run every task here, one after another")
    p.add_argument("--wait", action="store_true", help="return when the finalize job has finished")


def _joined_sbatch(argv: list[str]) -> list[str]:
    """``--sbatch "--gpus=1 -p gpu"`` as ``--sbatch=--gpus=1 -p gpu``: argparse would take a value that
    starts with one of submit's own options (``--gpus``, ``--time``...) for that option."""
    out: list[str] = []
    it = iter(argv)
    for arg in it:
        if arg in ("--sbatch", "--finalize-sbatch"):
            value = next(it, None)
            out.append(arg if value is None else f"{arg}={value}")
        else:
            out.append(arg)
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m cbr2.cluster.sweep {submit,task,finalize,status} ...``."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="python -m cbr2.cluster.sweep", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    _submit_arguments(sub.add_parser("submit", help="expand a grid and submit it as one job array (+ a finalize job)"))
    for name, text in (("task", "evaluate one task (default: this job-array task)"),
                       ("finalize", "merge shards, tabulate, summarise"), ("status", "print each task's state")):
        q = sub.add_parser(name, help=text)
        q.add_argument("sweep_dir")
        if name == "task":
            q.add_argument("index", nargs="?", type=int, help="task number; default $SLURM_ARRAY_TASK_ID's position")
    if argv[:1] == ["submit"]:
        # Options may come between overrides, which argparse only allows without subparsers.
        submit_parser = argparse.ArgumentParser(prog="python -m cbr2.cluster.sweep submit")
        _submit_arguments(submit_parser)
        args = submit_parser.parse_intermixed_args(_joined_sbatch(argv[1:]))
        args.command = "submit"
    else:
        args = parser.parse_args(argv)
    setup_logging()
    try:
        if args.command == "submit":
            sweep = _new_sweep(args)
            if args.local:
                for t in range(sweep.tasks):
                    try:
                        run_task(sweep, t)
                    except Exception:  # recorded in its status; the other tasks still run, as in an array
                        log.exception("sweep %s task %d failed", sweep.name, t)
                summary = finalize(sweep)
                print(f"sweep {sweep.name}: {len(summary['finished_runs'])} of {len(sweep.runs)} runs in "
                      f"{summary['wall_s'] or 0:.0f} s -> {sweep.dir}")
                return 0 if not summary["incomplete_runs"] else 1
            resources = Resources(gpus=args.gpus, cpus=args.cpus, mem=args.mem, time=args.time,
                                  partition=args.partition, account=args.account,
                                  finalize_partition=args.finalize_partition)
            commands = submit(sweep, shlex.split(args.sbatch), shlex.split(args.finalize_sbatch), args.parallel,
                              dry_run=args.dry_run, wait=args.wait, resources=resources)
            if args.dry_run:
                for cmd in commands:
                    print(shlex.join(["sbatch", *cmd]))
            return 0
        sweep = Sweep.load(args.sweep_dir)
        if args.command == "task":
            index = args.index
            if index is None:
                from cbr2.common.slurm import array_task

                position = array_task()
                if position is None:
                    raise UserError("not in a SLURM job array: give the task number")
                index = position[0]
            run_task(sweep, index)
        elif args.command == "finalize":
            summary = finalize(sweep)
            print(json.dumps({k: summary[k] for k in ("states", "wall_s", "table", "incomplete_runs")}))
            return 0 if not summary["incomplete_runs"] else 1
        else:
            for s in task_states(sweep):
                extra = f"  hits@1 {s['hits@1']:.4f}" if s.get("hits@1") is not None else (f"  {s['error']}" if s.get("error") else "")
                print(f"{s['task']:>4}  {s['state']:<8} {s['run']} shard {s['shard']}{extra}")
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
