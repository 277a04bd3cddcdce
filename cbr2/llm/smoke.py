"""What a GPU user runs first: the environment checked, the real-engine tier, then a few questions.

    python -m cbr2.llm.smoke                              # configs/paper.yaml, 9 questions
    python -m cbr2.llm.smoke --questions 3 data.name=kqapro data.root=/data/KQAPro
    make smoke-gpu                                        # the same, from the checkout

Checks, in this order, each failing at once with one line that says what to do:

1. CUDA is visible to torch (a GPU allocated: ``--gpus`` / ``--gres``);
2. vLLM imports and its version meets the project's ``vllm`` extra (pyproject.toml);
3. the weights are here: the configuration's ``llm.model`` and ``retrieval.encoder`` (a folder,
   or in the Hugging Face cache; with the hub reachable a missing model is only announced, it
   downloads on first use), and the packaged Qwen2.5-Coder-0.5B of the test tier.

Then it runs the ``vllm`` test tier (``pytest -m vllm``: the real engine against the ``hf``
backend, constrained decoding, a killed and resumed ``evaluate.py``, a tiny Qwen3) and
``evaluate.py --config configs/paper.yaml eval.limit=N`` into ``outputs/smoke-gpu``. The first GPU
hour is then not spent finding a missing driver, a wrong vLLM or absent weights.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TIER = "tests/test_vllm_*.py"
"""The test files of the ``vllm`` marker (as ``make test-vllm`` names them)."""


class SmokeError(RuntimeError):
    """An environment problem, said in one line with what to do."""


def check_cuda() -> str:
    """The visible GPUs in words; SmokeError without CUDA."""
    import torch

    if not torch.cuda.is_available():
        raise SmokeError(f"no CUDA: torch {torch.__version__} sees no GPU (CUDA_VISIBLE_DEVICES="
                         f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}). Run on a GPU node with a GPU "
                         "allocated (sbatch --gpus=1), with a CUDA build of torch")
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return f"{len(names)} GPU(s): {', '.join(names)}"


def vllm_requirement() -> str:
    """The project's own vLLM requirement (its ``vllm`` extra), e.g. ``vllm>=0.12``."""
    for req in importlib.metadata.requires("cbr2") or []:
        if req.startswith("vllm") and 'extra == "vllm"' in req:
            return req.split(";")[0].strip()
    raise SmokeError("the installed cbr2 declares no vllm extra; reinstall the project: pip install -e .[vllm]")


def check_vllm(requirement: str) -> str:
    """vLLM's version; SmokeError when it does not import or does not meet ``requirement``."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    try:
        import vllm
    except (ImportError, OSError) as err:
        raise SmokeError(f"vLLM does not import ({err}); install it with pip install -e .[vllm]") from err
    version = Version(vllm.__version__)
    if not Requirement(requirement).specifier.contains(version.base_version, prereleases=True):
        raise SmokeError(f"vLLM {vllm.__version__} does not meet the project's {requirement}; "
                         f"pip install -e .[vllm] --upgrade")
    return f"vLLM {vllm.__version__}"


def check_weights(name: str, what: str) -> str:
    """Where the weights of ``name`` are; SmokeError when they are missing and cannot be fetched."""
    from cbr2.llm.hf_convert import looks_local
    from cbr2.llm.packaged import PACKAGED, chunk_paths

    if name in PACKAGED:
        try:
            chunk_paths(PACKAGED[name])
        except OSError as err:
            raise SmokeError(f"{what} {name}: {err}") from err
        return f"{what} {name}: packaged"
    if looks_local(name):
        if not (Path(name).expanduser() / "config.json").is_file():
            raise SmokeError(f"{what} {name}: no config.json in that folder")
        return f"{what} {name}: folder"
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return f"{what} {name}: in the Hugging Face cache"
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0"):
        raise SmokeError(f"{what} {name} is not in the Hugging Face cache and HF_HUB_OFFLINE is set: fetch it "
                         f"where the hub is reachable (huggingface-cli download {name}) or name a local folder")
    return f"{what} {name}: not cached yet, downloads on first use"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "paper.yaml"), help="the run's configuration")
    parser.add_argument("--questions", type=int, default=9, help="questions of the evaluation run")
    parser.add_argument("--no-tier", action="store_true", help="skip the vllm test tier")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the evaluation run")
    args = parser.parse_args(argv)
    from cbr2.config import compose
    from cbr2.llm.packaged import DEFAULT_MODEL

    cfg = compose(files=[args.config], overrides=args.overrides)
    try:
        for line in (check_cuda(), check_vllm(vllm_requirement()),
                     check_weights(str(cfg.llm.model), "llm.model"),
                     check_weights(str(cfg.retrieval.encoder), "retrieval.encoder"),
                     check_weights(DEFAULT_MODEL, "the test tier's model")):
            print(f"ok  {line}", flush=True)
    except SmokeError as err:
        print(f"smoke: {err}", file=sys.stderr)
        return 2
    tier = sorted(str(p.relative_to(ROOT)) for p in ROOT.glob(TIER))
    steps = [] if args.no_tier else [[sys.executable, "-m", "pytest", "-q", "-s", "-m", "vllm", *tier]]
    steps.append([sys.executable, "evaluate.py", "--config", args.config, f"eval.limit={args.questions}",
                  "output_dir=outputs/smoke-gpu", *args.overrides])
    for cmd in steps:
        print("smoke: " + " ".join(cmd), flush=True)
        code = subprocess.call(cmd, cwd=ROOT)
        if code != 0:
            print(f"smoke: failed (exit {code}): {' '.join(cmd)}", file=sys.stderr)
            return code
    print("smoke: all passed; outputs/smoke-gpu has the run's report and browser page")
    return 0


if __name__ == "__main__":
    sys.exit(main())
