"""A GPU asked for where there is none stops a run at start, in one line (cbr2.common.devices)."""

from __future__ import annotations

import logging

import faiss
import pytest
import torch

import evaluate
import train
from cbr2.common import devices
from cbr2.common.devices import Devices, check_devices, probe, wants_gpu
from cbr2.common.errors import SetupError
from cbr2.config import Config, TrainConfig, compose
from cbr2.run.runner import device_settings

NONE = Devices(cuda=0, faiss_build="cpu", faiss_gpus=0, torch_version="2.13.0+cpu", vllm_cpu=False)
ONE_GPU_CPU_FAISS = Devices(cuda=1, faiss_build="cpu", faiss_gpus=0, torch_version="2.14.0", vllm_cpu=False)
ONE_GPU = Devices(cuda=1, faiss_build="gpu", faiss_gpus=1, torch_version="2.14.0", vllm_cpu=False)


@pytest.fixture
def no_cuda(monkeypatch):
    """This machine as it is (no CUDA), whatever machine the test runs on."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def one_gpu(monkeypatch):
    """One CUDA GPU and FAISS's GPU build seeing it and searching there (its test search passes):
    the positive path, which this machine cannot show (tests/test_faiss_gpu_probe.py fakes the probe's failures)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(faiss, "StandardGpuResources", object, raising=False)
    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 1)
    monkeypatch.setattr(devices, "faiss_gpu_problem", lambda: None)


def _cfg(*overrides):
    return compose(Config, overrides=list(overrides))


def _check(cfg, llm=True, dev=None):
    """The device check of an evaluation of ``cfg``, as ``evaluate.py`` makes it."""
    return check_devices(**device_settings(cfg, llm=llm), dev=dev)


def test_gpu_device_names():
    assert all(wants_gpu(d) for d in ("cuda", "cuda:1", "CUDA:0", "gpu"))
    assert not any(wants_gpu(d) for d in ("auto", "cpu", "mps"))


def test_the_probe_sees_this_machine(no_cuda):
    dev = probe()
    assert dev.cuda == 0 and dev.faiss_build in ("cpu", "gpu")
    assert dev.faiss_gpus == (faiss.get_num_gpus() if dev.faiss_build == "gpu" else 0)


@pytest.mark.parametrize(("overrides", "key"), [
    (["retrieval.device=cuda"], "retrieval.device=cuda"),
    (["llm.backend=hf", "llm.device=cuda:0"], "llm.device=cuda:0"),
    (["llm.backend=vllm"], "llm.backend=vllm"),
])
def test_a_gpu_where_there_is_none_is_one_line(no_cuda, overrides, key):
    with pytest.raises(SetupError, match=f"^{key} asks for a GPU, but torch .* sees none") as err:
        _check(_cfg(*overrides))
    assert "\n" not in str(err.value) and "make install-gpu" in str(err.value)


def test_auto_and_cpu_settings_run_without_a_gpu(no_cuda):
    assert _check(_cfg()).cuda == 0
    _check(_cfg("llm.backend=hf", "llm.device=cpu", "retrieval.device=cpu"))
    # A device of the LLM is not checked when the run does not load it (--show-prompt, --retrieval-only).
    _check(_cfg("llm.backend=vllm"), llm=False)


def test_vllms_cpu_build_runs_without_a_gpu():
    _check(_cfg("llm.backend=vllm"), dev=Devices(0, "cpu", 0, "2.13.0+cpu", vllm_cpu=True))


def test_gpu_retrieval_needs_faiss_gpus():
    with pytest.raises(SetupError, match=r"^retrieval.device=cuda asks for GPU retrieval, .* the CPU build"):
        _check(_cfg("retrieval.device=cuda"), dev=ONE_GPU_CPU_FAISS)
    with pytest.raises(SetupError, match="the GPU build but sees no GPU"):
        _check(_cfg("retrieval.device=cuda"), dev=Devices(1, "gpu", 0, "2.14.0", False))


def test_auto_with_cpu_faiss_on_a_gpu_says_so(caplog):
    with caplog.at_level(logging.INFO, logger="cbr2.common.devices"):
        _check(_cfg(), dev=ONE_GPU_CPU_FAISS)
    assert "FAISS is the cpu build and sees 0 GPU(s)" in caplog.text
    assert any(r.levelno == logging.WARNING for r in caplog.records)


def test_a_gpu_number_beyond_the_allocation_is_named():
    with pytest.raises(SetupError, match=r"llm.device=cuda:1: torch sees 1 GPU\(s\), numbered 0..0"):
        _check(_cfg("llm.backend=hf", "llm.device=cuda:1"), dev=ONE_GPU)


def test_gpus_that_are_there_pass(one_gpu, caplog):
    with caplog.at_level(logging.INFO, logger="cbr2.common.devices"):
        dev = _check(_cfg("retrieval.device=cuda", "llm.backend=vllm"))
    assert (dev.cuda, dev.faiss_build, dev.faiss_gpus) == (1, "gpu", 1)
    assert "FAISS is the gpu build and sees 1 GPU(s)" in caplog.text
    check_devices(accelerator=compose(TrainConfig, overrides=["trainer.accelerator=gpu"]).trainer.accelerator)


def test_evaluate_stops_before_reading_the_data(no_cuda, tmp_path, capsys):
    # The data folder does not exist: the device check must answer first.
    code = evaluate.main(["retrieval.device=cuda", "data.name=kqapro", f"data.root={tmp_path / 'nothing'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("error: retrieval.device=cuda asks for a GPU")
    assert "Traceback" not in "\n".join(err)


def test_train_stops_before_reading_the_data(no_cuda, tmp_path, capsys):
    code = train.main(["trainer.accelerator=gpu", "data.name=kqapro", f"data.root={tmp_path / 'nothing'}"])
    assert code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: trainer.accelerator=gpu asks for a GPU")


def test_a_faiss_that_cannot_search_on_its_gpu_stops_cuda_and_warns_auto_once(caplog):
    problem = ("FAISS (faiss-gpu-cu12 1.14.1) cannot search on GPU 0 (NVIDIA H100 80GB HBM3, compute capability 9.0): "
               "CUDA error 209 no kernel image is available for execution on the device")
    broken = Devices(1, "gpu", 1, "2.14.0", False, faiss_problem=problem)
    with pytest.raises(SetupError, match=r"^retrieval.device=cuda: FAISS \(faiss-gpu-cu12 1.14.1\) cannot search on "
                                         r"GPU 0 .*9.0.*faiss-gpu 1.15.1 .*faiss-gpu-cu13-cuvs") as err:
        _check(_cfg("retrieval.device=cuda"), dev=broken)
    assert "\n" not in str(err.value)
    devices.faiss_cpu_fallback.cache_clear()
    with caplog.at_level(logging.WARNING, logger="cbr2.common.devices"):
        _check(_cfg(), dev=broken)
        _check(_cfg(), dev=broken)  # a sweep task's second run in the same process: said once
        _check(_cfg("retrieval.device=cpu"), dev=broken)  # no GPU retrieval: nothing to say
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith(f"retrieval: {problem}; the FAISS indexes stay on the CPU")
    devices.faiss_cpu_fallback.cache_clear()
