"""What a GPU user runs first, on a GPU node before a sweep: the environment checked, the
real-engine tier, then a few questions.

    cbr2 smoke                                            # configs/paper.yaml, 9 questions
    cbr2 smoke --questions 3 data.name=kqapro data.root=/data/KQAPro
    make smoke-gpu                                        # the same, from the checkout
    python -m cbr2.cluster.smoke                          # the same again

Checks, in this order, each failing at once with one line that says what to do or run. First
what needs no GPU (so a login node or a CPU machine gets this far):

1. pytest is installed (the tier step runs it; ``--no-tier`` skips both, and so does an installed
   package without the checkout's tests);
2. the data: ``data.root`` validated file by file (``python -m cbr2.data check``), and ``data.name``
   loaded as the run loads it (KB and questions);
3. the structural retriever for that data: ``structural.checkpoint``, or the newest one trained
   on ``data.name`` in ``structural.checkpoints_dir`` (the embedded benchmarks train one on demand);
4. the weights are here: every model the configuration names, ``llm.model``, ``retrieval.encoder``
   and the structural retriever (a folder, a packaged copy, or in the Hugging Face cache), and the
   packaged Qwen2.5-Coder-0.5B of the test tier. Compute nodes often reach no hub, so a missing
   model fails with how to stage it (docs/cluster.md, "Staging weights"); ``--allow-download``
   accepts one that downloads on first use where the hub is reachable.

Then what needs the GPU node:

5. CUDA is visible to torch (a GPU allocated: ``--gpus`` / ``--gres``);
6. vLLM imports and its version meets the project's ``vllm`` extra (pyproject.toml);
7. FAISS is the GPU build, sees the GPUs and returns the CPU's results in a test search on each
   (``cbr2.common.devices.faiss_gpu_problem``; unless ``retrieval.device=cpu``);
8. free GPU memory holds the model's weights and one ``llm.max_model_len`` sequence of KV cache
   at ``llm.gpu_memory_utilization`` (the check vLLM makes at start, minutes later), beside what
   retrieval holds on the same GPU: the encoders and the FAISS indexes over the KB triples and
   training questions of ``data.name`` (``cbr2.retrieval.gpu_memory``).

Then it runs the ``vllm`` test tier (``pytest -m vllm``: the real engine against the ``hf``
backend, constrained decoding, a cut, killed and resumed ``evaluate.py``, a tiny Qwen3) and
``cbr2 evaluate --config configs/paper.yaml eval.limit=N`` into ``outputs/smoke-gpu``. The tier is
the checkout's ``tests/test_vllm_*.py`` (``tier_files``): an installed package carries no tests, so
there the smoke check says in one line how to run the tier from a checkout and goes on with the
evaluation. The first GPU hour is then not spent finding a missing driver, a wrong vLLM or absent
weights.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cbr2.config import DataConfig, GenerationConfig, LLMConfig, RetrievalConfig, StructuralConfig
    from cbr2.retrieval.gpu_memory import RetrievalMemory

CHECKOUT = Path(__file__).resolve().parents[2]
"""The folder that holds the package: the checkout's root when it runs from one (``pip install -e``
or the source tree), else the installation's ``site-packages``."""
TIER = "tests/test_vllm_*.py"
"""The test files of the ``vllm`` marker, in the checkout (as ``make test-vllm`` names them)."""
TIER_ELSEWHERE = ("smoke: the vllm test tier is not here (an installed package carries no tests); run it from a "
                  f"checkout: make test-vllm, or pytest -m vllm {TIER}")
"""What the smoke check says where it finds no tier, before it goes on with the evaluation."""
GIB = 1024**3
ACTIVATION_RESERVE = 2 * GIB
"""What vLLM keeps beside weights and KV cache for activations, CUDA graphs and the sampler: about
1-2 GiB for an 8B model in its profiling run; 2 GiB here (an estimate, not vLLM's own number)."""


class SmokeError(RuntimeError):
    """An environment problem, said in one line with what to do."""


def check_cuda() -> str:
    """The visible GPUs in words; SmokeError without CUDA."""
    import torch

    if not torch.cuda.is_available():
        raise SmokeError(f"no CUDA: torch {torch.__version__} sees no GPU (CUDA_VISIBLE_DEVICES="
                         f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}). Run on a GPU node with a GPU "
                         "allocated (sbatch --gpus=1), with the GPU environment (make install-gpu)")
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return f"{len(names)} GPU(s): {', '.join(names)}"


def tier_files() -> list[str]:
    """The ``vllm`` tier's test files, relative to ``CHECKOUT``; none outside a checkout.

    A checkout is told by its ``pyproject.toml`` beside the package: an installation's
    ``site-packages`` may hold some other distribution's ``tests`` folder, never the project file.
    """
    if not (CHECKOUT / "pyproject.toml").is_file():
        return []
    return sorted(str(p.relative_to(CHECKOUT)) for p in CHECKOUT.glob(TIER))


def vllm_requirement() -> str:
    """The project's own vLLM requirement (its ``vllm`` extra), e.g. ``vllm>=0.12``."""
    for req in importlib.metadata.requires("cbr2") or []:
        if req.startswith("vllm") and 'extra == "vllm"' in req:
            return req.split(";")[0].strip()
    raise SmokeError("the installed cbr2 declares no vllm extra; reinstall the project: make install-gpu")


def check_vllm(requirement: str) -> str:
    """vLLM's version; SmokeError when it does not import or does not meet ``requirement``."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    try:
        import vllm
    except (ImportError, OSError) as err:
        raise SmokeError(f"vLLM does not import ({err}); install it with make install-gpu") from err
    version = Version(vllm.__version__)
    if not Requirement(requirement).specifier.contains(version.base_version, prereleases=True):
        raise SmokeError(f"vLLM {vllm.__version__} does not meet the project's {requirement}; "
                         "make install-gpu (its stack for this node's driver)")
    return f"vLLM {vllm.__version__}"


def check_weights(name: str, what: str, allow_download: bool = False) -> str:
    """Where the weights of ``name`` are; SmokeError when they are not here.

    Args:
        name: A packaged short name or hub id, a hub id, or a folder.
        what: The setting that names it (``llm.model`` ...), for the message.
        allow_download: Accept a hub id that is not cached yet where the hub is reachable
            (``--allow-download``): it downloads on first use.
    """
    from cbr2.llm.hf_convert import looks_local
    from cbr2.llm.packaged import PACKAGED, chunk_paths
    from cbr2.retrieval.encoders import PACKAGED as PACKAGED_ENCODERS
    from cbr2.retrieval.encoders import resolve_model

    if name in PACKAGED:
        try:
            chunk_paths(PACKAGED[name])
        except OSError as err:
            raise SmokeError(f"{what} {name}: {err}") from err
        return f"{what} {name}: packaged"
    if name in PACKAGED_ENCODERS and Path(resolve_model(name)).is_dir():
        return f"{what} {name}: packaged"
    if looks_local(name):
        if not (Path(name).expanduser() / "config.json").is_file():
            raise SmokeError(f"{what} {name}: no config.json in that folder")
        return f"{what} {name}: folder"
    from huggingface_hub import constants, try_to_load_from_cache

    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return f"{what} {name}: in the Hugging Face cache"
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0")
    if allow_download and not offline:
        return f"{what} {name}: not cached yet, downloads on first use (--allow-download)"
    why = ("HF_HUB_OFFLINE is set" if offline
           else "compute nodes often reach no hub: --allow-download lets it download on first use where this one does")
    raise SmokeError(f"{what} {name} is not here: no such folder, and not in the Hugging Face cache "
                     f"{constants.HF_HUB_CACHE} ({why}). Stage it on a machine with internet into the shared cache this "
                     f"node reads: HF_HOME={constants.HF_HOME} hf download {name} (huggingface-cli download with an "
                     f"older huggingface_hub), or set {what.split()[0]}=/path/to/a/folder (docs/cluster.md, "
                     "'Staging weights')")


def check_pytest() -> str:
    """pytest's version; SmokeError when this interpreter lacks it (the tier step runs it)."""
    if importlib.util.find_spec("pytest") is None:
        raise SmokeError(f"pytest is not installed in {sys.executable}: make install-gpu (it installs the test "
                         "extra), or pip install -e .[dev], or pass --no-tier")
    return f"pytest {importlib.metadata.version('pytest')}"


def check_data(data: DataConfig, cache_dir: str | None = None) -> str:
    """The data of ``data.name`` / ``data.root``: the folder validated file by file
    (``python -m cbr2.data check``), then the benchmark loaded as the run loads it.

    Args:
        data: The ``data`` section.
        cache_dir: The cache root (the configuration's ``cache_dir``: the KB store).
    """
    from cbr2.common.errors import UserError
    from cbr2.data.benchmarks import Benchmark
    from cbr2.data.check import check_folder

    where = f"data.name={data.name}" + (f" data.root={data.root}" if data.root else "")
    try:
        bench = Benchmark.from_config(data, cache_dir)
        if data.root:
            report = check_folder(data.root, bench.family.name)
            if not report.clean:
                raise SmokeError(f"{where}: {len(report.problems)} problem(s), the first: {report.problems[0]}; "
                                 f"python -m cbr2.data check {data.root} lists them all (docs/data.md)")
        split = data.split or bench.family.eval_split
        questions, kb = bench.questions(split), bench.kb
    except (UserError, OSError) as err:
        raise SmokeError(f"{where}: {err} (python -m cbr2.data check {data.root or 'DIR'}; docs/data.md)") from err
    return f"{where}: {len(questions)} {split} questions, a KB of {len(kb.entities)} entities"


def check_structural(retrieval: RetrievalConfig, structural: StructuralConfig, data: DataConfig,
                     allow_download: bool = False) -> str:
    """Where the structural retriever of ``data.name`` is; SmokeError when there is none and none is
    trained on demand, or when what it is trained from is not here.

    Args:
        retrieval: The ``retrieval`` section (its ``cases``: whether a structural view is used).
        structural: The ``structural`` section (``checkpoint``, ``checkpoints_dir``).
        data: The ``data`` section (``name``, ``root``).
        allow_download: Accept weights not here yet that download on first use.
    """
    from cbr2.config.schema import StructuralTrainConfig
    from cbr2.structural.checkpoints import find_checkpoint

    if retrieval.cases not in ("dual", "structural"):
        return f"structural retriever: not used (retrieval.cases={retrieval.cases})"
    if structural.checkpoint:
        return check_weights(str(structural.checkpoint), "structural.checkpoint", allow_download)
    found = find_checkpoint(structural.checkpoints_dir, data.name)
    if found is None and data.name.endswith("metaqa"):  # the paper reuses the KQA Pro retriever
        found = find_checkpoint(structural.checkpoints_dir, data.name.replace("metaqa", "kqapro"))
    if found is not None:
        return f"structural retriever: {found}"
    if data.name.startswith("mini-"):
        backbone = check_weights(StructuralTrainConfig().backbone, "structural.checkpoint unset: its backbone",
                                 allow_download)
        return (f"structural retriever: none for {data.name} yet; the first run trains one (about a minute) "
                f"from {backbone.split(': ', 1)[1]}")
    root = f" data.root={data.root}" if data.root else " data.root=DIR"
    raise SmokeError(f"no structural retriever for {data.name} in {structural.checkpoints_dir}/: run "
                     f"sbatch slurm/train.sbatch data.name={data.name}{root} (or python train.py ...), "
                     "or set structural.checkpoint=PATH")


def check_faiss_gpus(device: str) -> str:
    """FAISS's build and GPUs; SmokeError when GPU retrieval is possible but FAISS cannot do it: the
    CPU build, no GPU seen, or a test search on a GPU that fails or differs from the CPU's (the
    probe a run makes at start, ``cbr2.common.devices.faiss_gpu_problem``)."""
    from cbr2.common.devices import FAISS_GPU_WHEELS, probe

    if device == "cpu":
        return f"FAISS {probe().faiss_build} build (retrieval.device=cpu)"
    dev = probe(faiss_search=True)
    if dev.faiss_gpus == 0:
        why = "is the CPU build" if dev.faiss_build == "cpu" else "is the GPU build but sees no GPU"
        raise SmokeError(f"FAISS {why}: indexes would stay on the CPU. Run make install-gpu (FAISS's GPU build of the "
                         "driver's CUDA major, without faiss-cpu), or set retrieval.device=cpu to search on the CPU")
    if dev.faiss_problem:
        raise SmokeError(f"{dev.faiss_problem}: install {FAISS_GPU_WHEELS}, in place of the one installed, or set "
                         "retrieval.device=cpu to search on the CPU (retrieval.device=auto does so by itself, "
                         "with a warning)")
    return f"FAISS GPU build, {dev.faiss_gpus} GPU(s), a test search on each returns the CPU's results"


@dataclass(frozen=True)
class MemoryPlan:
    """What one GPU must hold for vLLM to start, weights and one full-length sequence of KV cache,
    and what retrieval holds beside the engine (``retrieval``: encoders, indexes, FAISS scratch)."""

    weights: int
    kv_per_token: int
    max_model_len: int
    reserve: int = ACTIVATION_RESERVE
    retrieval: RetrievalMemory | None = None

    @property
    def kv(self) -> int:
        return self.kv_per_token * self.max_model_len

    @property
    def need(self) -> int:
        return self.weights + self.kv + self.reserve


def model_config(name: str) -> dict[str, Any] | None:
    """The ``config.json`` of a hub model (cached) or folder, or None when it is not here."""
    from cbr2.llm.hf_convert import looks_local

    if looks_local(name):
        path: Any = Path(name).expanduser() / "config.json"
    else:
        from huggingface_hub import try_to_load_from_cache

        path = try_to_load_from_cache(name, "config.json")
    if not isinstance(path, (str, Path)) or not Path(path).is_file():
        return None
    return json.loads(Path(path).read_text(encoding="utf-8"))


def parameters(config: dict[str, Any]) -> int:
    """A decoder's parameter count from its config (embeddings, attention, gated MLP; norms left out).

    Qwen3-8B: 8.19e9, as its model card says.
    """
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", heads)
    head_dim = config.get("head_dim") or hidden // heads
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    mlp = 3 * hidden * config["intermediate_size"]
    embeddings = config["vocab_size"] * hidden * (1 if config.get("tie_word_embeddings") else 2)
    return layers * (attention + mlp) + embeddings


def memory_plan(config: dict[str, Any], max_model_len: int | None, dtype: str = "auto",
                tensor_parallel: int = 1, retrieval: RetrievalMemory | None = None) -> MemoryPlan:
    """Per GPU: the weights, and the KV cache per token as the vLLM backend sizes it
    (``cbr2.llm.vllm.kv_bytes_per_token``: K and V of every layer's KV heads), both split over
    ``tensor_parallel`` GPUs; and what retrieval holds beside them.

    Args:
        config: The model's ``config.json``.
        max_model_len: ``llm.max_model_len``; the model's ``max_position_embeddings`` when None.
        dtype: ``llm.dtype``; ``auto`` is the model's bfloat16 on a GPU (2 bytes), ``float32`` 4.
        tensor_parallel: GPUs the model is split across.
        retrieval: ``cbr2.retrieval.gpu_memory.retrieval_beside`` of the run's configuration.
    """
    from types import SimpleNamespace

    from cbr2.llm.vllm import kv_bytes_per_token

    text = config.get("text_config") or config
    width = 4 if dtype == "float32" else 2
    length = max_model_len or text.get("max_position_embeddings") or 0
    return MemoryPlan(weights=parameters(text) * width // tensor_parallel,
                      kv_per_token=kv_bytes_per_token(SimpleNamespace(**text), dtype) // tensor_parallel,
                      max_model_len=int(length), retrieval=retrieval)


def fits(plan: MemoryPlan, free: int, total: int, utilization: float) -> str | None:
    """None when vLLM can start with ``plan`` on a GPU with ``free`` of ``total`` bytes, taking
    ``utilization`` of it, and retrieval keeps what it holds beside the engine; else why not."""
    budget = utilization * total
    beside = plan.retrieval.total if plan.retrieval is not None else 0
    if budget > free:
        return (f"vLLM takes llm.gpu_memory_utilization={utilization} of the GPU's {total / GIB:.1f} GiB, "
                f"{budget / GIB:.1f} GiB, but only {free / GIB:.1f} GiB are free: another process holds the GPU, "
                f"or lower llm.gpu_memory_utilization")
    if budget + beside > total:
        return (f"llm.gpu_memory_utilization={utilization} of {total / GIB:.1f} GiB leaves {(total - budget) / GIB:.1f} "
                f"GiB beside the engine, but {plan.retrieval.describe()}: set llm.gpu_memory_utilization="
                f"{int(100 * (1 - beside / total)) / 100} at most, or leave it unset (then the engine's share leaves it)")
    if plan.need > budget:
        tokens = int((budget - plan.weights - plan.reserve) // plan.kv_per_token)
        hint = f"llm.max_model_len={tokens} at most" if tokens > 0 else "a smaller llm.model or more GPUs"
        if plan.retrieval is not None and plan.retrieval.index_bytes:
            hint += ", retrieval.index=hnsw (the large indexes stay on the CPU)"
        why = f", leaving {plan.retrieval.describe()}" if beside else ""
        return (f"weights {plan.weights / GIB:.1f} GiB + KV cache of one {plan.max_model_len}-token sequence "
                f"{plan.kv / GIB:.1f} GiB + {plan.reserve / GIB:.0f} GiB reserve = {plan.need / GIB:.1f} GiB > "
                f"{budget / GIB:.1f} GiB ({utilization} of {total / GIB:.1f} GiB{why}): set {hint}, "
                "or llm.tensor_parallel_size=2 on two GPUs")
    return None


def structural_encoder(structural: StructuralConfig, data: DataConfig) -> str:
    """The structural retriever a run will load, to size it: ``structural.checkpoint``, else the
    newest trained on ``data.name`` (MetaQA: on KQA Pro), else the backbone one is trained from on
    demand (the same size).

    Args:
        structural: The ``structural`` section (``checkpoint``, ``checkpoints_dir``).
        data: The ``data`` section (its ``name``).
    """
    from cbr2.config.schema import StructuralTrainConfig
    from cbr2.structural.checkpoints import find_checkpoint

    if structural.checkpoint:
        return str(structural.checkpoint)
    for name in (data.name, data.name.replace("metaqa", "kqapro")):
        found = find_checkpoint(structural.checkpoints_dir, name)
        if found is not None:
            return str(found)
    return StructuralTrainConfig().backbone


def check_gpu_memory(llm: LLMConfig, data: DataConfig, retrieval: RetrievalConfig, structural: StructuralConfig,
                     gen: GenerationConfig, cache_dir: str | None = None) -> str:
    """Free memory of each visible GPU against the model and ``llm.max_model_len``, beside what
    retrieval of ``data.name`` holds on the same GPU.

    Args:
        llm: The ``llm`` section (model, dtype, ``max_model_len``, tensor parallelism, GPU share).
        data: The ``data`` section (the benchmark retrieval indexes).
        retrieval: The ``retrieval`` section (what it holds on the GPU).
        structural: The ``structural`` section (the structural retriever: ``structural_encoder``).
        gen: The ``generation`` section (its ``canonicalize`` encoder is held too).
        cache_dir: The cache root (the configuration's ``cache_dir``: the KB store).
    """
    import torch

    from cbr2.common.errors import SetupError
    from cbr2.common.slurm import visible_gpus
    from cbr2.data.benchmarks import Benchmark
    from cbr2.llm.vllm import memory_share, model_name, tensor_parallel_size
    from cbr2.retrieval.gpu_memory import retrieval_beside

    name = model_name(llm)
    config = model_config(name)
    if config is None:
        return f"GPU memory: not checked, no config.json of {name} here yet (it downloads on first use)"
    try:
        # As the smoke's evaluation holds it: its indexes are freed before the engine starts.
        bench = Benchmark.from_config(data, cache_dir)
        beside = retrieval_beside(bench, retrieval, structural_encoder(structural, data), gen.canonicalize,
                                  indexes_resident=False)
    except SetupError as err:  # an encoder not here yet: only with --allow-download
        return f"GPU memory: not checked, {err}"
    gpus = torch.cuda.device_count()
    tp = llm.tensor_parallel_size or tensor_parallel_size(visible_gpus() or gpus)
    plan = memory_plan(config, llm.max_model_len, str(llm.dtype), tp, beside)
    shares = []
    for i in range(min(tp, gpus)):
        free, total = torch.cuda.mem_get_info(i)
        # Unset, the backend computes the share as here: vLLM's 0.9, less what retrieval holds.
        utilization = llm.gpu_memory_utilization or memory_share(free, total, beside.total)
        why = fits(plan, free, total, utilization)
        if why:
            raise SmokeError(f"GPU {i}: {why}")
        shares.append(f"{100 * utilization:.0f}% of {total / GIB:.1f} GiB")
    return (f"GPU memory: {name} needs {plan.need / GIB:.1f} GiB per GPU (weights {plan.weights / GIB:.1f}, "
            f"KV of {plan.max_model_len} tokens {plan.kv / GIB:.1f}, reserve {plan.reserve / GIB:.0f}) on {tp} GPU(s), "
            f"within {', '.join(shares)}; beside it {beside.describe()}")


def main(argv: list[str] | None = None) -> int:
    from cbr2.config import CONFIG_DIR, compose
    from cbr2.llm.packaged import DEFAULT_MODEL

    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--config", default=str(CONFIG_DIR / "paper.yaml"), help="the run's configuration")
    parser.add_argument("--questions", type=int, default=9, help="questions of the evaluation run")
    parser.add_argument("--no-tier", action="store_true", help="skip the vllm test tier")
    parser.add_argument("--allow-download", action="store_true",
                        help="accept models not here yet that download on first use (the node reaches the hub)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the evaluation run")
    args = parser.parse_args(argv)
    cfg = compose(files=[args.config], overrides=args.overrides)
    tier = [] if args.no_tier else tier_files()
    checks = [
        # What needs no GPU: a login node or a CPU machine gets this far.
        *([check_pytest] if tier else []),
        lambda: check_data(cfg.data, cfg.cache_dir),
        lambda: check_structural(cfg.retrieval, cfg.structural, cfg.data, args.allow_download),
        lambda: check_weights(str(cfg.llm.model), "llm.model", args.allow_download),
        lambda: check_weights(str(cfg.retrieval.encoder), "retrieval.encoder", args.allow_download),
        lambda: check_weights(DEFAULT_MODEL, "the test tier's model"),
        # The GPU node's.
        check_cuda,
        lambda: check_vllm(vllm_requirement()),
        lambda: check_faiss_gpus(str(cfg.retrieval.device)),
        lambda: check_gpu_memory(cfg.llm, cfg.data, cfg.retrieval, cfg.structural, cfg.generation, cfg.cache_dir),
    ]
    try:
        for check in checks:
            print(f"ok  {check()}", flush=True)
    except SmokeError as err:
        print(f"smoke: {err}", file=sys.stderr)
        return 2
    if not tier and not args.no_tier:
        print(TIER_ELSEWHERE, flush=True)
    # The tier runs in the checkout it belongs to; the evaluation, as `cbr2 evaluate`, wherever the
    # package is: its outputs go under the folder the smoke check runs in.
    steps = [([sys.executable, "-m", "pytest", "-q", "-s", "-m", "vllm", *tier], CHECKOUT)] if tier else []
    steps.append(([sys.executable, "-m", "cbr2.cli", "evaluate", "--config", args.config,
                   f"eval.limit={args.questions}", "output_dir=outputs/smoke-gpu", *args.overrides], None))
    for cmd, cwd in steps:
        print("smoke: " + " ".join(cmd), flush=True)
        code = subprocess.call(cmd, cwd=cwd)
        if code != 0:
            print(f"smoke: failed (exit {code}): {' '.join(cmd)}", file=sys.stderr)
            return code
    print("smoke: all passed; outputs/smoke-gpu has the run's report and browser page")
    return 0


if __name__ == "__main__":
    sys.exit(main())
