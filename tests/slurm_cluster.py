"""A real, private, single-node Slurm cluster for tests (munged + slurmctld + slurmd).

Its config, key, state and logs live in one work folder (munged's socket in a short temp
folder), and it uses free ports, so it never clashes with a Slurm the machine may already run. It needs root
(``SlurmdUser=root`` runs jobs as their owner) and the Debian packages; without them
:func:`start_cluster` raises :class:`SlurmUnavailable` with the reason, for a test skip.

No pytest here: the fixture in ``conftest.py`` is a thin wrapper around this module.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

#: Daemons and clients this module runs.
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scontrol", "scancel")
APT_INSTALL = "apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge"
#: Job states that are not final yet (wait() keeps polling while any job is in one).
ACTIVE_STATES = frozenset({"PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING",
                           "SUSPENDED", "RESIZING", "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT"})
#: Client variables an outer Slurm job or the user's shell may set; they must not steer our cluster.
_CLIENT_ENV_PREFIXES = ("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "SQUEUE_", "SINFO_", "SCONTROL_")


class SlurmUnavailable(Exception):
    """The cluster cannot run here; ``str()`` is a one-line reason for a test skip."""


def _free_port() -> int:
    # The kernel picks a free port; the tiny race until the daemon binds it is acceptable in tests.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: Path, lines: int = 2) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:]) or "(empty log)"


#: What the test node declares, whatever the machine has (``SlurmdParameters=config_overrides``):
#: two tasks of the job scripts' defaults (8 CPUs, 64 GB, one GPU each, an A100 task) at once, so
#: the scripts are submitted as users submit them. The GPUs are generic resources whose device
#: files are /dev/null and /dev/zero: Slurm schedules them and sets CUDA_VISIBLE_DEVICES; no job
#: here uses CUDA.
NODE_CPUS = 16
NODE_MEMORY_MB = 2 * 64 * 1024
FAKE_GPUS = ("/dev/null", "/dev/zero")


def _node_line() -> str:
    """This machine's node line from ``slurmd -C``, declaring ``NODE_CPUS``, ``NODE_MEMORY_MB`` and
    the ``FAKE_GPUS`` (the jobs run on the machine's own cores; only scheduling sees the node's size)."""
    out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, timeout=30, check=True).stdout
    line = next((x for x in out.splitlines() if x.startswith("NodeName=")), None)
    if line is None:
        raise SlurmUnavailable(f"`slurmd -C` printed no node line: {out.strip()!r}")
    line = re.sub(r"CPUs=\d+ .*?ThreadsPerCore=\d+", f"CPUs={NODE_CPUS} Boards=1 SocketsPerBoard=1 "
                  f"CoresPerSocket={NODE_CPUS} ThreadsPerCore=1", line)
    line = re.sub(r"RealMemory=\d+", f"RealMemory={NODE_MEMORY_MB} Gres=gpu:{len(FAKE_GPUS)}", line)
    # Clients and slurmctld reach slurmd on loopback whatever the host name resolves to.
    return f"{line} NodeAddr=127.0.0.1 State=UNKNOWN"


class SlurmCluster:
    """A running private cluster; build it with :func:`start_cluster`, end it with :meth:`stop`.

    Attributes:
        workdir: Folder holding the config, state, spool and logs.
        conf: Path of the ``slurm.conf``.
        env: Environment for client commands and jobs: ``os.environ`` without Slurm client
            variables (``SLURM_*``, ``SBATCH_*``...), plus ``SLURM_CONF``.
    """

    def __init__(self, workdir: Path, conf: Path, env: dict[str, str], socket_dir: Path | None = None) -> None:
        self.workdir = workdir
        self.conf = conf
        self.env = env
        self._socket_dir = socket_dir  # munged's socket folder, outside workdir; removed by stop()
        self._procs: list[tuple[str, subprocess.Popen[bytes], Path]] = []  # (name, process, log), start order

    @property
    def pids(self) -> dict[str, int]:
        """PID of each daemon started, by name."""
        return {name: proc.pid for name, proc, _ in self._procs}

    def _spawn(self, name: str, args: list[str], log: Path) -> None:
        with open(log, "ab") as out:  # the child keeps its own descriptor
            proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=self.env, start_new_session=True)  # no terminal signals from pytest
        self._procs.append((name, proc, log))

    def _check_alive(self) -> None:
        for name, proc, log in self._procs:
            if proc.poll() is not None:
                raise SlurmUnavailable(f"{name} exited early (rc={proc.returncode}): {_tail(log)}")

    def run(self, args: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command (``["squeue", ...]``) against this cluster.

        Args:
            args: Command line.
            **kw: More ``subprocess.run`` arguments (``cwd``, ``timeout``...).

        Returns:
            The finished process, with text stdout/stderr.

        Raises:
            RuntimeError: When the command fails; the message holds its stderr.
        """
        kw.setdefault("timeout", 60)
        # check=False and our own error: CalledProcessError's message hides stderr.
        proc = subprocess.run(args, env=self.env, capture_output=True, text=True, check=False, **kw)
        if proc.returncode != 0:
            why = proc.stderr.strip() or proc.stdout.strip()
            raise RuntimeError(f"{' '.join(args)} failed (rc={proc.returncode}): {why}")
        return proc

    def sbatch(self, args: list[str], cwd: str | os.PathLike[str]) -> str:
        """Submit a batch job (``--parsable`` added) from ``cwd``; returns its job id, e.g. ``"12"``.

        With ``--wait`` in ``args`` this returns once the job ended (and raises if it failed).
        """
        out = self.run(["sbatch", "--parsable", *args], cwd=cwd, timeout=None).stdout.strip()
        return out.splitlines()[-1].split(";")[0]  # "12" or "12;cluster"

    def job_states(self, job_id: str) -> dict[str, str]:
        """``{job or array task id: state}`` of a job, from ``scontrol`` (there is no accounting)."""
        states: dict[str, str] = {}
        for line in self.run(["scontrol", "show", "job", "-o", job_id]).stdout.splitlines():
            # The first matches are the leading fields; a later "Command=" cannot shadow them.
            fields = {k: m.group(1) if (m := re.search(rf"(?:^|\s){k}=(\S+)", line)) else ""
                      for k in ("JobId", "ArrayJobId", "ArrayTaskId", "JobState")}
            if not fields["JobId"]:
                continue
            # Array tasks print as ArrayJobId_ArrayTaskId, like squeue; pending ones as one "_1-2" line.
            key = f"{fields['ArrayJobId']}_{fields['ArrayTaskId']}" if fields["ArrayTaskId"] else fields["JobId"]
            states[key] = fields["JobState"]
        return states

    def wait(self, job_id: str, timeout_s: float) -> dict[str, str]:
        """Poll until every job of ``job_id`` (all array tasks too) reached a final state.

        Returns:
            ``{job or array task id: final state}``, e.g. ``{"3_0": "COMPLETED", ...}``.

        Raises:
            TimeoutError: After ``timeout_s``; the message holds ``squeue``'s view.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            states = self.job_states(job_id)
            if states and not ACTIVE_STATES & set(states.values()):
                return states
            if time.monotonic() > deadline:
                queue = self.run(["squeue", "--state=all", "-j", job_id]).stdout
                raise TimeoutError(f"Slurm job {job_id} not done after {timeout_s:.0f}s: {states}\n{queue}")
            time.sleep(0.5)

    def stop(self) -> None:
        """Cancel leftover jobs, then stop slurmd, slurmctld and munged by PID (idempotent)."""
        names = [name for name, _, _ in self._procs]
        if "slurmctld" in names and "slurmd" in names:
            # Job steps run in slurmstepd processes that outlive slurmd; cancel them while it can.
            try:
                if self.run(["squeue", "-h", "-o", "%i"], timeout=10).stdout.strip():
                    self.run(["scancel", f"--user={os.geteuid()}"], timeout=10)
                    deadline = time.monotonic() + 15
                    while self.run(["squeue", "-h", "-o", "%i"], timeout=10).stdout.strip():
                        if time.monotonic() > deadline:
                            break
                        time.sleep(0.5)
            except (RuntimeError, subprocess.TimeoutExpired):
                pass  # best effort: stopping the daemons matters more
        for _, proc, _ in reversed(self._procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=5)  # slurmctld saves its state on SIGTERM: a second or so
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
        self._procs.clear()
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None


def _check_prerequisites() -> None:
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        raise SlurmUnavailable(f"missing {', '.join(missing)}; install with `{APT_INSTALL}`")
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        raise SlurmUnavailable("needs root (slurmd runs jobs as their user)")


def _write_conf(cluster_dir: Path, munge_socket: Path) -> Path:
    host = socket.gethostname().split(".")[0]  # `hostname -s`: slurmctld only starts on SlurmctldHost
    state, spool = cluster_dir / "state", cluster_dir / "spool"
    state.mkdir(exist_ok=True)
    spool.mkdir(exist_ok=True)
    conf = cluster_dir / "slurm.conf"
    (cluster_dir / "gres.conf").write_text("".join(f"Name=gpu File={f}\n" for f in FAKE_GPUS))
    node = _node_line()
    node_name = node.split()[0].removeprefix("NodeName=")
    conf.write_text(f"""\
# Private single-node test cluster written by tests/slurm_cluster.py.
ClusterName=cbr2test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
# No systemd or cgroups here: track processes by parent PID and bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# The node's declared size (NODE_CPUS, NODE_MEMORY_MB, FAKE_GPUS), not what slurmd detects.
SlurmdParameters=config_overrides
GresTypes=gpu
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
KillWait=5
JobRequeue=1
StateSaveLocation={state}
SlurmdSpoolDir={spool}
SlurmctldPidFile={cluster_dir / "slurmctld.pid"}
SlurmdPidFile={cluster_dir / "slurmd.pid"}
# No SlurmctldLogFile/SlurmdLogFile: in the foreground (-D) the daemons log to stderr,
# which start_cluster keeps in slurmctld.log/slurmd.log along with any fatal start-up error.
{node}
PartitionName=test Nodes={node_name} Default=YES MaxTime=INFINITE State=UP
""")
    return conf


def _start_munged(cluster: SlurmCluster, munge_dir: Path, socket_path: Path) -> None:
    # munged refuses keys readable by others and key folders writable by others.
    munge_dir.mkdir(mode=0o700, exist_ok=True)
    key = munge_dir / "munge.key"
    if not key.exists():
        key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    socket_path.parent.chmod(0o755)  # clients (jobs' users) must reach the socket
    log = munge_dir / "munged.log"
    cluster._spawn("munged", ["munged", "-F", "-S", str(socket_path), f"--key-file={key}",
                              f"--pid-file={munge_dir / 'munged.pid'}", f"--log-file={log}",
                              f"--seed-file={munge_dir / 'munged.seed'}"], log)
    deadline = time.monotonic() + 10
    while not socket_path.exists():
        cluster._check_alive()
        if time.monotonic() > deadline:
            raise SlurmUnavailable(f"munged made no socket within 10s: {_tail(log)}")
        time.sleep(0.1)


def start_cluster(workdir: Path, timeout_s: float = 60) -> SlurmCluster:
    """Start munged, slurmctld and slurmd in ``workdir`` and wait until the node is idle.

    Args:
        workdir: Empty (or previously used) folder for config, state and logs.
        timeout_s: How long the node may take to become idle.

    Returns:
        The running cluster; call :meth:`SlurmCluster.stop` when done.

    Raises:
        SlurmUnavailable: When it cannot run here (missing packages, not root, a daemon
            exited, or the node never became idle); the cluster is stopped first.
    """
    _check_prerequisites()
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    # munged wants every folder above its socket executable by all, which pytest's 0700 tmp
    # folders are not; a short folder in the system temp dir also fits a Unix socket address.
    socket_dir = Path(tempfile.mkdtemp(prefix="cbr2-munge-"))
    socket_path = socket_dir / "munge.socket"
    try:
        conf = _write_conf(workdir, socket_path)
    except (OSError, subprocess.SubprocessError) as e:
        shutil.rmtree(socket_dir, ignore_errors=True)
        raise SlurmUnavailable(f"cannot write slurm.conf: {e}") from e
    env = {k: v for k, v in os.environ.items() if not k.startswith(_CLIENT_ENV_PREFIXES)}
    env["SLURM_CONF"] = str(conf)
    cluster = SlurmCluster(workdir, conf, env, socket_dir)
    try:
        _start_munged(cluster, workdir / "munge", socket_path)
        # -D: stay in the foreground so the PID we hold is the daemon's.
        cluster._spawn("slurmctld", ["slurmctld", "-D", "-f", str(conf)], workdir / "slurmctld.log")
        cluster._spawn("slurmd", ["slurmd", "-D", "-f", str(conf)], workdir / "slurmd.log")
        deadline = time.monotonic() + timeout_s
        state = ""
        while state != "idle":
            cluster._check_alive()
            if time.monotonic() > deadline:
                raise SlurmUnavailable(f"node not idle after {timeout_s:.0f}s (state {state or 'unknown'!r}): "
                                       f"{_tail(workdir / 'slurmd.log')} | {_tail(workdir / 'slurmctld.log')}")
            time.sleep(0.2)
            proc = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True,
                                  timeout=30, check=False)
            state = proc.stdout.strip()  # stays empty until slurmctld answers
    except BaseException:
        cluster.stop()
        raise
    return cluster
