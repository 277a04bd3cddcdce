"""FAISS's test search on the GPU (``cbr2.common.devices.faiss_gpu_problem``) and what a run does with
its answer: ``auto`` keeps the indexes on the CPU with one warning, ``cuda`` stops in one line, a
good probe moves them to the GPU on shared resources, and the probe runs once per process.

No GPU is needed: a stand-in ``faiss`` package (``FAKE_FAISS``) is what this process imports and
what the probe's child process finds first on its ``PYTHONPATH``; its GPU search works, raises,
aborts the process (as FAISS's CUDA assertions do) or returns other neighbours.
"""

from __future__ import annotations

import importlib.util
import logging
import subprocess
import sys

import numpy as np
import pytest
import torch

from cbr2.cluster import smoke
from cbr2.common import devices
from cbr2.common.devices import check_devices, faiss_gpu_problem, probe
from cbr2.common.errors import SetupError
from cbr2.config import Config, compose
from cbr2.retrieval import index as index_module
from cbr2.run.runner import device_settings

FAKE_FAISS = '''
"""A stand-in for FAISS's GPU build: numpy searches on the CPU; the GPU as FAKE_FAISS_GPU says."""
import os
import sys

import numpy as np

__version__ = "1.14.1"
NO_KERNEL = "CUDA error 209 no kernel image is available for execution on the device"


class IndexFlatIP:
    def __init__(self, dim):
        self.d, self.xb = dim, np.zeros((0, dim), np.float32)

    @property
    def ntotal(self):
        return len(self.xb)

    def add(self, x):
        self.xb = np.vstack([self.xb, np.asarray(x, np.float32)])

    def search(self, q, k):
        scores = np.asarray(q, np.float32) @ self.xb.T
        ids = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        return np.take_along_axis(scores, ids, 1), ids


class IndexHNSWFlat(IndexFlatIP):
    pass


class StandardGpuResources:
    temp = None

    def setTempMemory(self, size):
        self.temp = size


class GpuIndexFlatIP:
    def __init__(self, cpu, resources, gpu=0):
        self.cpu, self.resources, self.gpu, self.ntotal = cpu, resources, gpu, cpu.ntotal

    def search(self, q, k):
        mode = os.environ.get("FAKE_FAISS_GPU", "ok")
        if os.environ.get("FAKE_FAISS_BAD_GPU", str(self.gpu)) != str(self.gpu):
            mode = "ok"
        if mode == "raise":
            raise RuntimeError("Error in virtual void faiss::gpu::... " + NO_KERNEL)
        if mode == "abort":  # what FAISS_ASSERT_FMT does on a CUDA error
            print("Faiss assertion 'err__ == cudaSuccess' failed in void faiss::gpu::runL2Norm at "
                  "faiss/gpu/impl/L2Norm.cu:271; details: " + NO_KERNEL, file=sys.stderr, flush=True)
            os.abort()
        scores, ids = self.cpu.search(q, k)
        return (scores, ids[:, ::-1]) if mode == "wrong" else (scores, ids)


def get_num_gpus():
    return int(os.environ.get("FAKE_FAISS_GPUS", "1"))


def index_cpu_to_gpu(resources, gpu, index):
    return GpuIndexFlatIP(index, [resources], gpu)


def index_cpu_to_gpu_multiple_py(resources, index, co=None, gpus=None):
    return GpuIndexFlatIP(index, resources)
'''


@pytest.fixture
def fake_faiss(tmp_path, monkeypatch):
    """The stand-in FAISS here and in the probe's child; one H100 as torch sees it; fresh caches.

    Yields the list of the probe's child processes (their command lines), to count them.
    """
    package = tmp_path / "fake" / "faiss"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(FAKE_FAISS)
    spec = importlib.util.spec_from_file_location("faiss", package / "__init__.py")
    fake = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fake)
    monkeypatch.setitem(sys.modules, "faiss", fake)  # where the functions that use FAISS import it from
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "fake"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H100 80GB HBM3")
    children = []
    run = subprocess.run

    def counted(cmd, *args, **kwargs):
        if cmd[1:3] == ["-m", "cbr2.common.devices"]:
            children.append(cmd)
        return run(cmd, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", counted)
    caches = (faiss_gpu_problem, devices.faiss_cpu_fallback, index_module.gpu_resources)
    for cache in caches:
        cache.cache_clear()
    yield children
    for cache in caches:
        cache.cache_clear()


def _cfg(device: str):
    return compose(Config, overrides=[f"retrieval.device={device}"])


def _check(cfg, llm=True):
    """The device check of an evaluation of ``cfg``, as ``evaluate.py`` makes it."""
    return check_devices(**device_settings(cfg, llm=llm))


def _cpu_index():
    import faiss  # the stand-in

    index = faiss.IndexFlatIP(8)
    index.add(np.eye(8, dtype=np.float32))
    return index


def test_the_probe_search_separates_its_neighbours_beyond_rounding():
    import faiss  # the real one: the CPU reference the probe compares with

    rng = np.random.default_rng(devices.PROBE_SEED)
    base = rng.standard_normal((devices.PROBE_VECTORS, devices.PROBE_DIM)).astype(np.float32)
    queries = base[: devices.PROBE_QUERIES] + 0.5 * rng.standard_normal(
        (devices.PROBE_QUERIES, devices.PROBE_DIM)).astype(np.float32)
    index = faiss.IndexFlatIP(devices.PROBE_DIM)
    index.add(base)
    scores, _ = index.search(queries, devices.PROBE_K + 1)
    assert float(-np.diff(scores, axis=1).max()) >= 0.3  # as PROBE_VECTORS' docstring says


def test_a_probe_that_raises_keeps_auto_on_the_cpu_with_one_warning(fake_faiss, monkeypatch, caplog):
    monkeypatch.setenv("FAKE_FAISS_GPU", "raise")
    cpu = _cpu_index()
    with caplog.at_level(logging.INFO):
        dev = _check(_cfg("auto"))
        moved = [index_module.to_device(cpu, "auto") for _ in range(3)]
    assert dev.faiss_gpus == 1 and "no kernel image" in dev.faiss_problem
    assert all(m is cpu for m in moved)  # searched on the CPU
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "\n" not in warnings[0], warnings
    assert "cannot search on GPU 0 (NVIDIA H100 80GB HBM3, compute capability 9.0)" in warnings[0]
    assert "stay on the CPU" in warnings[0] and "faiss-gpu 1.15.1" in warnings[0]
    assert len(fake_faiss) == 1  # the probe ran once for the start check and the three indexes


def test_explicit_cuda_stops_in_one_line_naming_the_build_the_gpu_and_the_wheels(fake_faiss, monkeypatch):
    monkeypatch.setenv("FAKE_FAISS_GPU", "raise")
    with pytest.raises(SetupError) as err:
        _check(_cfg("cuda"))
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("retrieval.device=cuda: FAISS (faiss-")  # the installed distribution and version
    assert "GPU 0 (NVIDIA H100 80GB HBM3, compute capability 9.0): " in message and "no kernel image" in message
    assert "faiss-gpu 1.15.1" in message and "faiss-gpu-cu13-cuvs" in message and "sm_90" in message
    assert message.endswith("or set retrieval.device=auto to search on the CPU")
    with pytest.raises(SetupError, match="^retrieval.device=cuda: FAISS"):
        index_module.to_device(_cpu_index(), "cuda")  # the library path says the same
    assert len(fake_faiss) == 1


def test_a_probe_that_aborts_its_process_is_a_problem_not_a_crash(fake_faiss, monkeypatch):
    monkeypatch.setenv("FAKE_FAISS_GPU", "abort")
    problem = faiss_gpu_problem()
    assert problem.endswith("the test search died (CUDA error 209 no kernel image is available for execution on "
                            "the device)"), problem


def test_other_neighbours_than_the_cpus_are_a_problem(fake_faiss, monkeypatch):
    monkeypatch.setenv("FAKE_FAISS_GPU", "wrong")
    assert "returned other neighbours than the same search on the CPU" in faiss_gpu_problem()


def test_a_good_probe_moves_the_indexes_to_the_gpu_on_shared_resources(fake_faiss, caplog):
    with caplog.at_level(logging.INFO):
        dev = _check(_cfg("cuda"))
        first, second = (index_module.to_device(_cpu_index(), device) for device in ("cuda", "auto"))
    assert dev.faiss_problem is None
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert type(first).__name__ == type(second).__name__ == "GpuIndexFlatIP"
    # One set of resources for the process, with bounded scratch memory, shared by both indexes.
    assert first.resources == second.resources and first.resources[0] is second.resources[0]
    assert [r.temp for r in first.resources] == [index_module.FAISS_TEMP_MEMORY]
    assert len(fake_faiss) == 1


def test_the_probe_runs_only_where_retrieval_would_search_on_the_gpus(fake_faiss):
    _check(_cfg("cpu"))
    _check(compose(Config, overrides=["retrieval.device=cpu", "llm.backend=gold"]), llm=False)
    assert probe().faiss_problem is None and not fake_faiss
    assert probe(faiss_search=True).faiss_problem is None and len(fake_faiss) == 1


def test_every_gpu_is_probed_and_the_failing_one_named(fake_faiss, monkeypatch):
    monkeypatch.setenv("FAKE_FAISS_GPUS", "2")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("FAKE_FAISS_GPU", "raise")
    monkeypatch.setenv("FAKE_FAISS_BAD_GPU", "1")
    assert "cannot search on GPU 1 (NVIDIA H100 80GB HBM3, compute capability 9.0): " in faiss_gpu_problem()
    assert [cmd[-1] for cmd in fake_faiss] == ["0", "1"]  # one child per GPU, once
    assert "GPU 1" in faiss_gpu_problem() and len(fake_faiss) == 2


def test_the_smoke_check_fails_on_the_probe_in_one_line(fake_faiss, monkeypatch):
    monkeypatch.setenv("FAKE_FAISS_GPU", "abort")
    with pytest.raises(smoke.SmokeError) as err:
        smoke.check_faiss_gpus("auto")
    assert "\n" not in str(err.value)
    assert "cannot search on GPU 0 (NVIDIA H100 80GB HBM3, compute capability 9.0)" in str(err.value)
    assert "faiss-gpu 1.15.1" in str(err.value) and "retrieval.device=cpu" in str(err.value)
    assert "retrieval.device=cpu" in smoke.check_faiss_gpus("cpu")


def test_the_smoke_check_passes_a_good_probe(fake_faiss):
    assert smoke.check_faiss_gpus("auto").startswith("FAISS GPU build, 1 GPU(s), a test search on each")
