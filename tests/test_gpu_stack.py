"""scripts/gpu_stack.py: which GPU stack ``make install-gpu`` builds for a node's driver, and the one-line
stops, with a fake ``nvidia-smi`` and a fake interpreter on a PATH that holds nothing else.

The fast tests start the script as ``make install-gpu`` does (a subprocess, no network), or call it
in-process where they set the machine's glibc; the slow one resolves both stacks against the package
index (``make install-gpu-dry-run``).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_stack.py"

spec = importlib.util.spec_from_file_location("gpu_stack", SCRIPT)
gpu_stack = importlib.util.module_from_spec(spec)
sys.modules["gpu_stack"] = gpu_stack  # dataclasses resolve the module's annotations through it
spec.loader.exec_module(gpu_stack)

HEADER = """+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI {driver}             Driver Version: {driver}     CUDA Version: {cuda}     |
|-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
|   0  NVIDIA H100 80GB HBM3          On  |   00000000:19:00.0 Off |                    0 |
+-----------------------------------------+------------------------+----------------------+"""


def _tool(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)


@pytest.fixture
def node(tmp_path):
    """A PATH of one folder: ``node(cuda=..., driver=..., python=...)`` puts a fake nvidia-smi (its
    header) and a fake ``python3.12`` reporting ``python`` there; None leaves either out."""
    folder = tmp_path / "bin"
    folder.mkdir()

    def make(cuda: str | None = None, driver: str = "550.54.15", python: str | None = "3.12") -> dict[str, str]:
        if cuda is not None:
            lines = HEADER.format(driver=driver, cuda=cuda).splitlines()
            _tool(folder, "nvidia-smi", "\n".join(f"echo '{line}'" for line in lines))
        if python is not None:
            _tool(folder, "python3.12", f'echo "$0"; echo {python}')
        return {"PATH": str(folder), "HOME": str(tmp_path)}

    return make


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60,
                          check=False)


def assignments(out: str) -> dict[str, str]:
    """The plan's shell assignments, read by a shell as the Makefile does."""
    shown = subprocess.run(["/bin/sh", "-c", out + 'printf "%s\\n" "$GPU_CUDA" "$GPU_PYTHON" "$GPU_REQUIRES" '
                            '"$GPU_NODEPS" "$GPU_FAISS"'], capture_output=True, text=True, check=True).stdout
    return dict(zip(("cuda", "python", "requires", "nodeps", "faiss"), shown.split("\n"), strict=False))


def test_a_cuda_12_driver_gets_the_cuda_12_stack(node):
    done = run(node(cuda="12.4"), "plan")
    assert done.returncode == 0, done.stderr
    plan = assignments(done.stdout)
    assert plan["cuda"] == "12" and plan["python"].endswith("/python3.12")
    assert plan["requires"].split() == ["vllm==0.19.1", "faiss-gpu==1.15.1"] and plan["nodeps"] == ""
    assert "NVIDIA driver 550.54.15, CUDA 12.4 -> the CUDA 12 stack" in done.stderr


@pytest.mark.parametrize("cuda", ["13.0", "14.1"])  # a driver runs older CUDA majors: 14 takes the newest stack
def test_a_cuda_13_driver_gets_the_cuda_13_stack(node, monkeypatch, capsys, cuda):
    monkeypatch.setenv("PATH", node(cuda=cuda, driver="580.65.06")["PATH"])
    monkeypatch.setattr(gpu_stack.os, "confstr", lambda name: "glibc 2.39")
    plan = assignments(gpu_stack.plan(None, None))
    assert plan["cuda"] == "13" and plan["nodeps"] == "faiss-gpu-cu13-cuvs==1.15.0" and plan["faiss"] == "faiss-gpu-cu13-cuvs"
    assert plan["requires"].split()[0] == "vllm==0.33.0" and "libcuvs-cu13==26.6.0" in plan["requires"].split()
    assert f"CUDA {cuda} -> the CUDA 13 stack: vllm==0.33.0, faiss-gpu-cu13-cuvs==1.15.0, Python 3.12" in capsys.readouterr().err


def test_the_cuda_13_stack_stops_on_a_glibc_older_than_its_faiss_wheel(node, monkeypatch):
    monkeypatch.setenv("PATH", node(cuda="13.0")["PATH"])
    monkeypatch.setattr(gpu_stack.os, "confstr", lambda name: "glibc 2.35")
    with pytest.raises(gpu_stack.Stop, match=r"the CUDA 13 stack needs glibc >= 2.39 \(faiss-gpu-cu13-cuvs's wheel is "
                       r"manylinux_2_39\) and this machine has 2.35: pass CUDA=12"):
        gpu_stack.plan(None, None)


def test_a_cuda_11_driver_stops_in_one_line_naming_the_driver_needed(node):
    done = run(node(cuda="11.8", driver="520.61.05"), "plan")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert "the NVIDIA driver 520.61.05 supports CUDA 11.8" in done.stderr
    assert "need CUDA >= 12 (driver >= 525)" in done.stderr and "CUDA=12 or CUDA=13" in done.stderr


def test_no_nvidia_smi_and_no_cuda_stops_at_once(node):
    done = run(node(), "plan")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "no nvidia-smi here" in done.stderr and "CUDA=12 or CUDA=13" in done.stderr


def test_an_nvidia_smi_that_fails_stops_with_its_first_line(node, tmp_path):
    env = node()
    _tool(Path(env["PATH"]), "nvidia-smi", "echo 'NVIDIA-SMI has failed because it could not communicate with the "
                                           "NVIDIA driver.'; exit 9")
    done = run(env, "plan")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "nvidia-smi printed no CUDA version (NVIDIA-SMI has failed because" in done.stderr


def test_cuda_12_given_needs_no_nvidia_smi(node):
    done = run(node(), "--cuda", "12", "plan")
    assert done.returncode == 0, done.stderr
    assert assignments(done.stdout)["cuda"] == "12" and "CUDA=12 given" in done.stderr


def test_a_cuda_that_names_no_stack_stops(node):
    done = run(node(), "--cuda", "11", "plan")
    assert done.returncode == 2 and "CUDA=11: the GPU stacks are for CUDA 12 and 13" in done.stderr


def test_a_python_the_stack_has_no_wheels_for_stops_naming_the_one_needed(node):
    env = node(cuda="12.4", python="3.9")
    done = run(env, "plan")  # python3.12 reports 3.9 and there is no python3
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "the CUDA 12 stack needs Python 3.10-3.13" in done.stderr and "python3.12 is Python 3.9" in done.stderr
    assert "python3 is not runnable here" in done.stderr and "PYTHON=" in done.stderr
    given = run(env, "--python", str(Path(env["PATH"]) / "python3.12"), "plan")
    assert given.returncode == 2 and "is Python 3.9; the CUDA 12 stack needs Python 3.10-3.13" in given.stderr


def test_the_cuda_13_stack_takes_python_3_12_only():
    assert gpu_stack.STACKS[13].pythons == ("3.12",)  # faiss-gpu-cu13-cuvs: cp312 wheels only


def test_make_install_gpu_stops_before_making_the_venv(node, tmp_path):
    make = shutil.which("make")
    if make is None:
        pytest.skip("no make here")
    env = node()  # no nvidia-smi, no CUDA=
    os.symlink(sys.executable, Path(env["PATH"]) / "python3")
    venv = tmp_path / "venv-gpu"
    done = subprocess.run([make, "-C", str(ROOT), "--no-print-directory", "install-gpu", f"GPU_VENV={venv}"],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0
    assert "gpu_stack: no nvidia-smi here" in done.stderr
    assert not venv.exists()


def test_each_stack_lies_in_the_supported_vllm_range_and_brings_no_faiss_cpu():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    supported = Requirement(project["optional-dependencies"]["vllm"][0]).specifier
    for stack in gpu_stack.STACKS.values():
        reqs = [Requirement(r) for r in stack.requires + stack.nodeps]
        vllm = next(r for r in reqs if r.name == "vllm")
        pinned = str(vllm.specifier).removeprefix("==")
        assert pinned in supported, (stack.cuda, pinned, supported)
        assert stack.faiss in {r.name for r in reqs} and "faiss-cpu" not in {r.name for r in reqs}
        assert not {r.name for r in reqs} & {"onnxruntime", "onnx"}  # the CPU encoder backend: a GPU node uses torch
    # No extra holds a GPU stack beside the script: the versions are written once.
    extras = project["optional-dependencies"]
    assert not [name for name, reqs in extras.items() for r in reqs if Requirement(r).name.startswith("faiss-gpu")]


def _dist(name: str, version: str, *requires: str) -> dict:
    """One install entry of pip's --report."""
    return {"metadata": {"name": name, "version": version, "requires_dist": list(requires)}}


CU13 = [
    _dist("torch", "2.14.0", 'cuda-toolkit[cublas,cudart]==13.0.3; platform_system == "Linux"', "triton~=3.8.0"),
    _dist("cuda-toolkit", "13.0.3.0"),
    _dist("nvidia-cuda-runtime", "13.0.96"),
    _dist("nvidia-cublas", "13.1.1.3"),
    _dist("libcuvs-cu13", "26.6.0"),
    _dist("faiss-gpu-cu13-cuvs", "1.15.0", "cuda-toolkit==13.0.0", "nvidia-cuda-runtime==13.0.48",
          "nvidia-cublas==13.0.0.19", "libcuvs-cu13==26.6.0", 'pytest; extra == "test"'),
]


def test_a_resolution_with_equal_cuda_majors_holds():
    assert gpu_stack.check_resolution(gpu_stack.STACKS[13], CU13) == []


def test_a_faiss_of_another_cuda_major_is_named():
    cu12_faiss = [d for d in CU13 if d["metadata"]["name"] != "faiss-gpu-cu13-cuvs"] + [
        _dist("faiss-gpu-cu13-cuvs", "1.15.0", "nvidia-cuda-runtime-cu12<13,>=12.6", "libcuvs-cu13==26.6.0"),
        _dist("nvidia-cuda-runtime-cu12", "12.8.90")]
    problems = gpu_stack.check_resolution(gpu_stack.STACKS[13], cu12_faiss)
    assert "faiss-gpu-cu13-cuvs declares CUDA [12], not 13" in problems
    assert any(p.startswith("the CUDA runtimes resolved are") for p in problems)


def test_what_a_no_deps_faiss_needs_and_nothing_brings_is_named():
    missing = [d for d in CU13 if d["metadata"]["name"] != "libcuvs-cu13"] + [_dist("faiss-cpu", "1.15.1")]
    problems = gpu_stack.check_resolution(gpu_stack.STACKS[13], missing)
    assert "faiss-gpu-cu13-cuvs requires libcuvs-cu13==26.6.0, which nothing else brings" in problems
    assert "faiss-cpu is resolved: it would shadow FAISS's GPU build" in problems


@pytest.mark.slow
@pytest.mark.parametrize("cuda", ["12", "13"])
def test_each_stack_resolves_against_the_index(cuda, tmp_path):
    """``make install-gpu-dry-run CUDA=...``: pip resolves the stack with the project's dependencies
    for its node (metadata only) and the CUDA majors agree. Needs the package index."""
    report = tmp_path / "report.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--cuda", cuda, "dry-run", "--report", str(report)],
                          capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0 and "NewConnectionError" in done.stderr:
        pytest.skip(f"no package index here: {done.stderr.strip().splitlines()[-1]}")
    assert done.returncode == 0, done.stderr[-3000:]
    stack = gpu_stack.STACKS[int(cuda)]
    vllm = next(r for r in stack.requires if r.startswith("vllm=="))
    assert f"vllm {vllm.removeprefix('vllm==')}" in done.stdout and f"CUDA major is {cuda}" in done.stdout
    assert report.exists()
