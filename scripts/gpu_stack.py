"""Which GPU stack ``make install-gpu`` installs: vLLM, the CUDA torch it pins and FAISS's GPU build,
all built for the CUDA major of the node's NVIDIA driver.

    python3 scripts/gpu_stack.py plan                      # reads nvidia-smi; prints the stack as shell assignments
    python3 scripts/gpu_stack.py --cuda 12 plan            # no detection (make install-gpu CUDA=12)
    python3 scripts/gpu_stack.py --cuda 13 dry-run --report /tmp/cu13.json   # resolve it against the index, no install

Only the standard library is used: it runs before any virtual environment exists. ``plan`` exits 2
with one line on stderr naming the driver, Python or glibc needed when this machine cannot build
the stack; ``dry-run`` exits 1 when the resolution breaks what a stack must hold (below).

The versions of both stacks are written here and nowhere else: a pip extra cannot choose by the
driver, nor hold the CUDA 13 stack, whose FAISS must be installed with ``--no-deps`` (STACKS).
pyproject.toml's ``vllm`` extra is the range the backend supports, which both pins lie in
(tests/test_gpu_stack.py checks it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Stack:
    """What one CUDA major installs.

    Attributes:
        cuda: The CUDA major of torch's and FAISS's libraries.
        requires: Requirements resolved together with the project (pip install -e .[dev] REQUIRES).
        nodeps: Requirements installed after them with ``--no-deps``.
        faiss: FAISS's distribution name.
        pythons: The Python versions every wheel of the stack has, preferred first.
        python_why: Why only those.
        glibc: The newest manylinux glibc among the stack's pinned wheels: the oldest a node may have.
        glibc_wheel: The wheel that needs it.
        driver: The driver branch that first supports this CUDA major, in words.
    """

    cuda: int
    requires: tuple[str, ...]
    nodeps: tuple[str, ...]
    faiss: str
    pythons: tuple[str, ...]
    python_why: str
    glibc: tuple[int, int]
    glibc_wheel: str
    driver: str


STACKS = {
    # vLLM 0.33 pins torch 2.14.0, whose PyPI wheels use CUDA 13.0 (cuda-toolkit 13.0.3), and
    # xgrammar 0.2.8. The only FAISS for CUDA 13 that runs on those libraries is the cuVS build
    # faiss-gpu-cu13-cuvs (built against CUDA 13.0, native sm_75-sm_90; cp312 and glibc 2.39 only),
    # but it pins cuda-toolkit==13.0.0 and torch pins 13.0.3, so pip cannot resolve the two
    # together: it goes in with --no-deps onto torch's CUDA 13 libraries (the same major and
    # minor or newer, which CUDA keeps backward compatible), and its other dependencies, the cuVS
    # libraries at its exact versions, are listed here. Meta's own faiss-gpu-cuvs 1.15.1 is not an
    # option: it needs CUDA 13.2 libraries (cuBLAS >= 13.2), older than torch 2.14.0's would be
    # below what it was built against. dry-run checks that the --no-deps install misses nothing.
    13: Stack(cuda=13,
              requires=("vllm==0.33.0", "libcuvs-cu13==26.6.0", "libraft-cu13==26.6.0", "librmm-cu13==26.6.0",
                        "rapids-logger==0.2.3", "numpy>=2,<3"),
              nodeps=("faiss-gpu-cu13-cuvs==1.15.0",),
              faiss="faiss-gpu-cu13-cuvs", pythons=("3.12",),
              python_why="faiss-gpu-cu13-cuvs has cp312 wheels only", glibc=(2, 39),
              glibc_wheel="faiss-gpu-cu13-cuvs", driver=">= 580"),
    # vLLM 0.19.1 is the newest vLLM on PyPI whose torch (2.10.0) is a CUDA 12 build (CUDA 12.8
    # libraries; torch 2.11 and later are CUDA 13); Meta's faiss-gpu 1.15.1 needs CUDA 12.6-12.x
    # runtime libraries, which torch's are (native sm_70-sm_90). Its vllm wheel is manylinux_2_31.
    # A 12.0-12.7 driver runs torch's 12.8 libraries through CUDA's minor version compatibility.
    12: Stack(cuda=12, requires=("vllm==0.19.1", "faiss-gpu==1.15.1"), nodeps=(),
              faiss="faiss-gpu", pythons=("3.12", "3.13", "3.11", "3.10"),
              python_why="vLLM 0.19.1's range", glibc=(2, 31), glibc_wheel="vllm",
              driver=">= 525"),
}
OLDEST_CUDA = min(STACKS)
DEFAULT_PYTHONS = ("python3.12", "python3")
"""Interpreters tried, in order, when PYTHON is not given: the first whose version the stack has."""


class Stop(Exception):
    """This machine cannot build the stack; the message says what to change, in one line."""


def read_driver() -> tuple[str, tuple[int, int]]:
    """The NVIDIA driver's version and the CUDA version it supports, from ``nvidia-smi``'s header.

    Raises:
        Stop: Without nvidia-smi, when it fails, or when it prints no CUDA version.
    """
    try:
        out = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=120, check=False)
    except FileNotFoundError:
        raise Stop("no nvidia-smi here, so no NVIDIA driver to read the CUDA version from: run make install-gpu on "
                   "the GPU node, or pass CUDA=12 or CUDA=13 (the CUDA major of that node's driver)") from None
    text = out.stdout + out.stderr
    cuda = re.search(r"CUDA (?:Driver )?Version\s*:\s*(\d+)\.(\d+)", text)
    if out.returncode != 0 or cuda is None:
        first = next((line.strip() for line in text.splitlines() if line.strip()), f"exit status {out.returncode}")
        raise Stop(f"nvidia-smi printed no CUDA version ({first}): fix the driver, or pass CUDA=12 or CUDA=13")
    driver = re.search(r"Driver Version\s*:\s*([\d.]+)", text)
    return (driver.group(1) if driver else "unknown"), (int(cuda.group(1)), int(cuda.group(2)))


def choose_cuda(given: str | None) -> tuple[int, str]:
    """The stack's CUDA major, and how it was chosen (for the log line).

    Args:
        given: ``CUDA=`` from the command line; None detects it from the driver.

    Raises:
        Stop: When ``given`` names no stack, or the driver is older than every stack.
    """
    if given:
        if not given.isdigit() or int(given) not in STACKS:
            raise Stop(f"CUDA={given}: the GPU stacks are for CUDA 12 and 13: pass CUDA=12 or CUDA=13")
        return int(given), f"CUDA={given} given"
    driver, (major, minor) = read_driver()
    if major < OLDEST_CUDA:
        raise Stop(f"the NVIDIA driver {driver} supports CUDA {major}.{minor}; vLLM's and torch's wheels need CUDA >= "
                   f"{OLDEST_CUDA} (driver {STACKS[OLDEST_CUDA].driver}): update the driver, or pass CUDA=12 or "
                   "CUDA=13 to build for another node")
    # A driver runs every older CUDA major, so one newer than the newest stack takes that stack.
    return min(major, max(STACKS)), f"NVIDIA driver {driver}, CUDA {major}.{minor}"


def python_of(command: str) -> tuple[str, str] | None:
    """(sys.executable, "3.12") of an interpreter, or None when it does not run."""
    try:
        out = subprocess.run([command, "-c", "import sys; print(sys.executable); print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=60, check=False)
    except OSError:
        return None
    lines = out.stdout.splitlines()
    return (lines[0], lines[1]) if out.returncode == 0 and len(lines) == 2 else None


def choose_python(stack: Stack, given: str | None) -> tuple[str, str]:
    """The interpreter of the venv: ``given`` (PYTHON=), else the first of DEFAULT_PYTHONS whose
    version the stack has; (its sys.executable, its version).

    Raises:
        Stop: When none of them runs one of ``stack.pythons``.
    """
    ordered = sorted(stack.pythons, key=lambda v: tuple(map(int, v.split("."))))
    wanted = ordered[0] if len(ordered) == 1 else f"{ordered[0]}-{ordered[-1]}"
    found = []
    for command in [given] if given else DEFAULT_PYTHONS:
        info = python_of(command)
        if info is not None and info[1] in stack.pythons:
            return info
        found.append(f"{command} is {'Python ' + info[1] if info else 'not runnable here'}")
    if given:
        raise Stop(f"PYTHON={found[0]}; the CUDA {stack.cuda} stack needs Python {wanted} "
                   f"({stack.python_why}): pass PYTHON=/path/to/python{stack.pythons[0]}")
    raise Stop(f"the CUDA {stack.cuda} stack needs Python {wanted} ({stack.python_why}) and {', '.join(found)}: "
               f"install Python {stack.pythons[0]} (pyenv install {stack.pythons[0]}, apt install "
               f"python{stack.pythons[0]}-venv or module load python/{stack.pythons[0]}) or pass PYTHON=/path/to/it")


def check_glibc(stack: Stack) -> None:
    """Stops when this machine's glibc is older than the stack's wheels need (pip would find no wheel)."""
    try:
        name, version = os.confstr("CS_GNU_LIBC_VERSION").split()  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return  # not glibc: pip says what it lacks
    have = tuple(int(p) for p in version.split(".")[:2])
    if name == "glibc" and have < stack.glibc:
        need = ".".join(map(str, stack.glibc))
        other = [c for c in STACKS if c < stack.cuda and STACKS[c].glibc <= have]
        hint = f"pass CUDA={other[0]} (its stack runs on a CUDA {stack.cuda} driver too)" if other else "use a newer OS"
        raise Stop(f"the CUDA {stack.cuda} stack needs glibc >= {need} ({stack.glibc_wheel}'s wheel is manylinux_"
                   f"{stack.glibc[0]}_{stack.glibc[1]}) and this machine has {version}: {hint}")


def plan(cuda: str | None, python: str | None) -> str:
    """The stack this machine builds, as shell assignments (the Makefile sources them).

    Raises:
        Stop: When this machine cannot build it (driver, Python, glibc).
    """
    major, how = choose_cuda(cuda)
    stack = STACKS[major]
    check_glibc(stack)
    executable, version = choose_python(stack, python)
    headline = [r for r in stack.requires + stack.nodeps if r.startswith(("vllm==", stack.faiss + "=="))]
    print(f"gpu_stack: {how} -> the CUDA {major} stack: {', '.join(headline)}, Python {version} ({executable})",
          file=sys.stderr)
    values = {"GPU_CUDA": str(major), "GPU_PYTHON": executable, "GPU_REQUIRES": " ".join(stack.requires),
              "GPU_NODEPS": " ".join(stack.nodeps), "GPU_FAISS": stack.faiss}
    return "".join(f"{key}={shlex.quote(value)}\n" for key, value in values.items())


# --- dry-run: resolve a stack against the index without installing it ---

KEY_PACKAGES = ("vllm", "torch", "xgrammar", "transformers", "triton")
CUDA_RUNTIME = re.compile(r"^(nvidia-cuda-runtime|cuda-toolkit)(-cu(\d+))?$")
"""Requirements that say which CUDA major a distribution is built for."""
REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*\(?([^;)]*)\)?\s*(;.*)?$")


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(dist: dict) -> list[tuple[str, str]]:
    """(name, version specifier) of each unconditional requirement in a ``--report`` install entry."""
    out = []
    for req in dist["metadata"].get("requires_dist") or []:
        m = REQUIREMENT.match(req)
        if m and "extra" not in (m.group(4) or ""):
            out.append((normalize(m.group(1)), m.group(3).replace(" ", "")))
    return out


def declared_cuda(dist: dict) -> set[int]:
    """The CUDA majors a distribution declares through its CUDA runtime requirements: the package's
    -cuNN suffix, else the major of its pin or lower bound (``cuda-toolkit==13.0.3``, ``>=13.2,<14``)."""
    majors = set()
    for name, spec in requirements(dist):
        m = CUDA_RUNTIME.match(name)
        if m:
            bound = re.search(r"(?:==|>=|~=)\s*(\d+)", spec)
            majors.add(int(m.group(3)) if m.group(3) else int(bound.group(1)) if bound else -1)
    return majors


def resolve(stack: Stack, python: str, report: Path, target: str) -> list[dict]:
    """What pip would install for the stack and the project's own dependencies, from the index, on a
    manylinux x86-64 node of ``stack.glibc`` with CPython ``python``: ``--dry-run`` over every
    requirement, then over the ``--no-deps`` ones; the install entries of both reports.

    ``--use-feature=fast-deps`` reads each wheel's metadata with HTTP range requests where the
    index serves no PEP 658 metadata files (else pip downloads every wheel whole, ~5 GB).
    """
    project = project_requirements()
    platforms = [f"manylinux_2_{minor}_x86_64" for minor in range(stack.glibc[1], 16, -1)] + ["manylinux2014_x86_64"]
    pip = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--only-binary=:all:",
           "--use-feature=fast-deps", "--python-version", python, "--implementation", "cp",
           "--abi", "cp" + python.replace(".", ""), *(a for p in platforms for a in ("--platform", p)), "--target", target]
    runs = [(report, [*project, *stack.requires])]
    if stack.nodeps:
        # pip 23 checks a --no-deps wheel's Requires-Python against the running interpreter, not
        # --python-version; the wheel's cpXY tag still holds it to the target.
        runs.append((report.with_name(report.stem + "-nodeps" + report.suffix),
                     ["--no-deps", "--ignore-requires-python", *stack.nodeps]))
    installs = []
    for path, args in runs:
        print("gpu_stack:", shlex.join(["pip", *pip[4:], "--report", str(path), *args]), file=sys.stderr)
        done = subprocess.run([*pip, "--report", str(path), *args], check=False)
        if done.returncode != 0:
            raise SystemExit(f"gpu_stack: pip could not resolve the CUDA {stack.cuda} stack (exit status "
                             f"{done.returncode}, above)")
        installs += json.loads(path.read_text())["install"]
    return installs


def project_requirements() -> list[str]:
    """The project's dependencies and its ``dev`` extra, as ``make install-gpu`` installs them."""
    try:
        import tomllib
    except ImportError:
        raise SystemExit("gpu_stack: dry-run reads pyproject.toml with tomllib: run it with Python >= 3.11") from None
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"], *project["optional-dependencies"]["dev"]]


def check_resolution(stack: Stack, installs: list[dict]) -> list[str]:
    """What the resolved stack breaks, one line each (none when it holds):

    torch's and FAISS's CUDA majors and the resolved CUDA runtime's are the stack's; no faiss-cpu
    (it installs the same module ``faiss``); every requirement of a ``--no-deps`` distribution is
    resolved, at its exact pin unless it is a CUDA library (those need the same major only).
    """
    by_name = {normalize(d["metadata"]["name"]): d for d in installs}
    version = {name: d["metadata"]["version"] for name, d in by_name.items()}
    problems = []
    for what in ("torch", stack.faiss):
        majors = declared_cuda(by_name[what]) if what in by_name else set()
        if majors != {stack.cuda}:
            problems.append(f"{what} declares CUDA {sorted(majors) or 'nothing'}, not {stack.cuda}")
    runtimes = {name: v for name, v in version.items() if CUDA_RUNTIME.match(name) and name != "cuda-toolkit"}
    runtime_majors = {int(m.group(3)) if (m := CUDA_RUNTIME.match(n)).group(3) else int(v.split(".")[0])
                      for n, v in runtimes.items()}
    if runtime_majors != {stack.cuda}:
        problems.append(f"the CUDA runtimes resolved are {runtimes}, not CUDA {stack.cuda} alone")
    if "faiss-cpu" in version:
        problems.append("faiss-cpu is resolved: it would shadow FAISS's GPU build")
    for spec in stack.nodeps:
        name = normalize(re.split(r"[=<>~! ]", spec, maxsplit=1)[0])
        for dep, pin in requirements(by_name[name]) if name in by_name else []:
            cuda_lib = dep.startswith(("nvidia-", "cuda-")) or re.search(r"-cu\d+$", dep)
            if dep not in version:
                problems.append(f"{name} requires {dep}{pin}, which nothing else brings")
            elif not cuda_lib and pin.startswith("==") and version[dep] != pin[2:]:
                problems.append(f"{name} requires {dep}{pin}, resolved {version[dep]}")
            elif cuda_lib and pin.startswith("==") and version[dep].split(".")[0] != pin[2:].split(".")[0]:
                problems.append(f"{name} requires {dep}{pin}, resolved {version[dep]} (another CUDA major)")
    return problems


def summary(stack: Stack, installs: list[dict]) -> str:
    """The resolved key versions, in a few lines."""
    version = {normalize(d["metadata"]["name"]): d["metadata"]["version"] for d in installs}
    keys = [*KEY_PACKAGES, stack.faiss]
    cuda = sorted(n for n in version if re.match(r"^nvidia-(cuda-runtime|cublas|cudnn|nccl)(-cu\d+)?$", n))
    lines = [f"{len(installs)} distributions; " + ", ".join(f"{n} {version.get(n, '-')}" for n in keys),
             "CUDA libraries: " + ", ".join(f"{n} {version[n]}" for n in cuda)]
    by_name = {normalize(d["metadata"]["name"]): d for d in installs}
    lines.append(f"CUDA majors: torch {sorted(declared_cuda(by_name['torch']))}, {stack.faiss} "
                 f"{sorted(declared_cuda(by_name[stack.faiss]))}, runtime "
                 + ", ".join(f"{n} {version[n]}" for n in version if CUDA_RUNTIME.match(n) and n != "cuda-toolkit"))
    return "\n".join(lines)


def dry_run(cuda: str | None, report: str | None) -> int:
    """``pip install --dry-run`` of the stack (CUDA= or the driver's) with the project's dependencies;
    prints the key versions; 1 when ``check_resolution`` finds a problem."""
    major, how = choose_cuda(cuda)
    stack = STACKS[major]
    python = stack.pythons[0]
    with tempfile.TemporaryDirectory(prefix="gpu-stack-") as tmp:
        path = Path(report) if report else Path(tmp) / "report.json"
        print(f"gpu_stack: {how} -> the CUDA {major} stack for CPython {python} on manylinux_{stack.glibc[0]}_"
              f"{stack.glibc[1]}_x86_64", file=sys.stderr)
        installs = resolve(stack, python, path, str(Path(tmp) / "target"))
    print(summary(stack, installs))
    problems = check_resolution(stack, installs)
    for problem in problems:
        print(f"gpu_stack: {problem}", file=sys.stderr)
    if not problems:
        print(f"ok: torch's and {stack.faiss}'s CUDA major is {major}, the runtime's too; no faiss-cpu"
              + (f"; {', '.join(stack.nodeps)} (--no-deps) has every requirement" if stack.nodeps else ""))
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    """Command line: ``plan`` or ``dry-run``; 2 with one line when the machine cannot build the stack."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cuda", help="12 or 13: the stack of that CUDA major (default: the driver's, from nvidia-smi)")
    parser.add_argument("--python", help="the venv's interpreter (default: the first of python3.12, python3 the stack fits)")
    sub = parser.add_subparsers(dest="mode", required=True)
    sub.add_parser("plan", help="print the stack as shell assignments (GPU_CUDA, GPU_PYTHON, GPU_REQUIRES, ...)")
    dry = sub.add_parser("dry-run", help="resolve the stack and the project's dependencies against the index")
    dry.add_argument("--report", help="pip's JSON report here (the --no-deps part beside it, *-nodeps.json)")
    args = parser.parse_args(argv)
    try:
        if args.mode == "plan":
            sys.stdout.write(plan(args.cuda, args.python))
            return 0
        return dry_run(args.cuda, args.report)
    except Stop as stop:
        print(f"gpu_stack: {stop}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
