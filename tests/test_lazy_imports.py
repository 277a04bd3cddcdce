"""A run imports the heavy packages of the components it uses, and only those.

The entry points and a whole gold run without retrieval, in a fresh interpreter, import none of
torch, FAISS, the encoders' and LLM engines' packages or W&B; the device check probes torch and
FAISS exactly when the configuration uses one of them. ``tests/test_imports.py`` checks each
module's own import.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cbr2.common import devices
from cbr2.common.devices import Devices, check_devices, uses_torch_or_faiss
from cbr2.config import Config, TrainConfig, compose
from cbr2.run.runner import device_settings

ROOT = Path(__file__).resolve().parents[1]

HEAVY = ("torch", "faiss", "transformers", "sentence_transformers", "lightning", "llama_cpp", "vllm", "xgrammar",
         "onnxruntime", "wandb")
"""Top-level names of the packages a gold run without retrieval has no use for."""

NO_RETRIEVAL = ["llm.backend=gold", "retrieval.cases=none", "retrieval.k_ontology=0", "retrieval.k_facts=0",
                "generation.constrained=false", "wandb.mode=disabled"]
"""The gold writer without retrieval, grammar or W&B: a run that needs neither torch nor FAISS."""

RUN = r"""
import importlib, json, sys

import evaluate
import train
from cbr2.cli import VERBS

heavy, argv = json.loads(sys.argv[1]), sys.argv[2:]
for verb in ("evaluate", "train", "config", "data", "compare"):
    importlib.import_module(VERBS[verb].target.partition(":")[0])
code = evaluate.main(argv)
print(json.dumps({"code": code, "heavy": sorted({m.partition(".")[0] for m in sys.modules} & set(heavy))}))
"""
"""Imports the entry points and the verbs' modules, runs ``evaluate.py``'s main, then reports the
heavy packages in ``sys.modules`` (on the last line of stdout)."""


def test_the_entry_points_and_a_gold_run_without_retrieval_import_no_heavy_package(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", RUN, json.dumps(HEAVY), *NO_RETRIEVAL, "data.name=mini-kqapro",
                           "eval.per_category=null", "eval.limit=6", f"output_dir={run}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    result = json.loads(lines[-1])
    assert result["code"] == 0 and "Hits@1 1.0000  SER 0.0000  n=6" in lines[-2], proc.stdout
    assert result["heavy"] == [], f"a gold run without retrieval imported {', '.join(result['heavy'])}"
    assert (run / "metrics.json").is_file() and "devices: not probed" in proc.stderr


ONE_GPU = Devices(cuda=1, faiss_build="gpu", faiss_gpus=1, torch_version="2.14.0", vllm_cpu=False)


@pytest.fixture
def probes(monkeypatch) -> list[bool]:
    """The probe replaced by a machine with one GPU; the list of its calls (``faiss_search`` each)."""
    calls: list[bool] = []

    def probe(faiss_search: bool = False) -> Devices:
        calls.append(faiss_search)
        return ONE_GPU

    monkeypatch.setattr(devices, "probe", probe)
    return calls


@pytest.mark.parametrize(("overrides", "kwargs", "probed"), [
    ([], {}, False),
    (["llm.backend=llamacpp"], {}, False),
    (["llm.backend=openai"], {}, False),
    (["llm.backend=hf"], {}, True),
    (["llm.backend=vllm"], {}, True),
    (["llm.backend=vllm"], {"llm": False}, False),  # --show-prompt: the LLM is not loaded
    (["retrieval.cases=semantic"], {}, True),
    (["retrieval.cases=random"], {}, True),
    (["retrieval.k_ontology=3"], {}, True),
    (["retrieval.k_facts=3"], {}, True),
    ([], {"llm": False, "retrieval_only": True}, True),  # --retrieval-only scores every view
    (["generation.canonicalize=true"], {}, True),  # the retrieval encoder embeds the vocabulary
    (["generation.canonicalize=true"], {"llm": False}, False),  # nothing is scored
])
def test_the_probe_runs_when_the_run_uses_torch_or_faiss(probes, overrides, kwargs, probed):
    cfg = compose(Config, overrides=[*NO_RETRIEVAL, *overrides])
    settings = device_settings(cfg, **kwargs)
    assert uses_torch_or_faiss(encodes=settings["encodes"], llm_backend=settings["llm_backend"]) is probed
    dev = check_devices(**settings)
    assert (dev is ONE_GPU, len(probes)) == ((True, 1) if probed else (False, 0))


def test_training_is_always_probed(probes):
    accelerator = str(compose(TrainConfig, overrides=[]).trainer.get("accelerator", "auto"))
    assert check_devices(accelerator=accelerator) is ONE_GPU and probes == [False]


def test_a_gpu_setting_of_a_component_the_run_does_not_use_is_not_checked(probes):
    # No encoder: retrieval.device places nothing, and a machine without GPUs may run this.
    cfg = compose(Config, overrides=[*NO_RETRIEVAL, "retrieval.device=cuda"])
    assert check_devices(**device_settings(cfg)) is None
    assert not probes
