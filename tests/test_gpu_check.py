"""``benchmarks/gpu_check.py``, the GPU path's checks for a bare GPU machine, rehearsed on this CPU
(``run --device cpu``: training with ``trainer.precision=auto``, encoding and exact search, the
``hf`` backend with a tiny random Qwen3), so the script a GPU day depends on does not rot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_gpu_check_passes_its_rehearsal_on_the_cpu(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "run", "--device", "cpu",
                           "--kit", str(tmp_path / "no-kit"), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, cwd=ROOT, timeout=900, check=False,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert {k for k, v in results.items() if isinstance(v, dict) and v.get("ok")} == {"train", "encode", "hf"}
    assert results["train"]["precision"] == results["train"]["recorded_precision"] == "32-true"  # auto on a CPU
    assert results["encode"]["top5_agreement"] == 1.0
    assert results["hf"]["batch_2"]["chat"] is True and results["hf"]["batch_2"]["device"] == "cpu"
