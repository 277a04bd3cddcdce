"""The ``hf`` backend's packaged models: a GGUF file converted once into a plain transformers folder.

Reading a GGUF costs transformers 20-100 s, so a packaged model (``cbr2.llm.packaged``) is
converted once into a plain fp32 folder under ``<cache>/llm/`` (``<cache>``: the cache root the
backend is handed, ``cbr2.common.files.cache_root``; loads in ~0.5 s after). The
conversion is written beside its destination and renamed into place with a marker written last,
so a killed conversion never leaves a folder that looks complete, and concurrent jobs agree on
one folder (``cbr2.common.locks.build_lock``).

``torch`` and ``transformers`` are imported inside ``convert_gguf`` only.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from pathlib import Path

from cbr2.common.files import cache_root, publish_folder
from cbr2.common.locks import build_lock
from cbr2.llm.packaged import PACKAGED, gguf_fingerprint, gguf_path

log = logging.getLogger(__name__)

CONVERSION_FORMAT = 1
"""Bump when the converted folder's layout or content changes (old folders are then ignored)."""

MARKER = "cbr2-conversion.json"
"""Written last into a converted folder: a folder without it is never used."""


def looks_local(name: str) -> bool:
    """Whether ``name`` is meant as a folder rather than a hub id (``org/name``)."""
    path = Path(name).expanduser()
    return path.is_absolute() or name.startswith((".", "~")) or name.count("/") > 1 or path.exists()


def model_source(configured: str) -> tuple[str | None, str]:
    """What ``llm.model`` names, for the backends that read transformers folders (``hf``, ``vllm``).

    Args:
        configured: A packaged short name, a local folder or a hub id.

    Returns:
        (the packaged short name or None, the source): ``name@<sha256 prefix>`` for a packaged
        model (its weights' identity), the absolute path of a folder, or the hub id as given.

    Raises:
        OSError: When ``configured`` looks like a path but no folder is there.
    """
    if configured in PACKAGED:
        return configured, f"{configured}@{PACKAGED[configured].sha256[:12]}"
    if looks_local(configured):
        path = Path(configured).expanduser().resolve()
        if not path.is_dir():
            raise OSError(f"llm.model {configured!r}: no model folder at {path}")
        return None, str(path)
    return None, configured


def model_folder(packaged: str | None, source: str, cache_dir: str | Path | None = None) -> str:
    """What ``from_pretrained`` (or vLLM) reads: the converted folder of a packaged model
    (reassembled and converted under the cache root ``cache_dir`` now when it is not yet), else
    ``source`` itself."""
    if packaged is not None:
        return str(ensure_converted(gguf_path(packaged, cache_dir), cache_dir))
    return source


def converted_dir(gguf: str | Path, cache_dir: str | Path | None = None) -> Path:
    """Where the plain-folder conversion of ``gguf`` lives: ``<cache>/llm/<name>-<hash>``.

    Args:
        gguf: The GGUF file.
        cache_dir: The cache root (``cbr2.common.files.cache_root``).
    """
    gguf = Path(gguf)
    name = gguf.name.removesuffix(".gguf")
    return cache_root(cache_dir) / "llm" / f"{name}-{gguf_fingerprint(gguf)}"


def is_converted(folder: str | Path, fingerprint: str) -> bool:
    """Whether ``folder`` is a complete conversion of the GGUF with ``fingerprint``."""
    folder = Path(folder)
    try:
        meta = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return False
    if meta.get("format") != CONVERSION_FORMAT or meta.get("gguf") != fingerprint:
        return False
    files = meta.get("files", {})
    return bool(files) and all((folder / f).is_file() and (folder / f).stat().st_size == size
                               for f, size in files.items())


def convert_gguf(gguf: str | Path, out: str | Path) -> None:
    """Write the model and tokenizer of a GGUF file to ``out`` as a plain fp32 HF folder.

    A model loaded from a GGUF refuses ``save_pretrained``, so a fresh model is built from its
    config (without the GGUF quantisation entry) and given its de-quantised weights.

    Args:
        gguf: The GGUF file.
        out: An existing, empty folder.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = Path(gguf)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        # Left in, it would make from_pretrained look for the GGUF file again.
        delattr(config, "quantization_config")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True, assign=True)
    model.tie_weights()
    model.generation_config = copy.deepcopy(loaded.generation_config)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))


def ensure_converted(gguf: str | Path, cache_dir: str | Path | None = None) -> Path:
    """The converted folder of ``gguf`` (``converted_dir``), converting it now when no complete one exists.

    The conversion (``convert_gguf``) is written to a temporary folder beside its destination and
    renamed into place, so a killed conversion never leaves a folder that looks complete; a
    folder without a valid marker (half-written, other GGUF, older format) is replaced. When two
    processes convert at once, the first rename wins and the other process uses its folder.

    Args:
        gguf: The GGUF file.
        cache_dir: The cache root (``cbr2.common.files.cache_root``).

    Returns:
        The folder, complete.
    """
    gguf = Path(gguf)
    dest = converted_dir(gguf, cache_dir)
    fingerprint = gguf_fingerprint(gguf)
    if is_converted(dest, fingerprint):
        return dest
    with build_lock(dest, f"the converted {gguf.name}"):
        if not is_converted(dest, fingerprint):  # another job may have converted it meanwhile
            _convert_into(gguf, dest, fingerprint)
    return dest


def _convert_into(gguf: Path, dest: Path, fingerprint: str) -> None:
    log.info("converting %s to a plain model folder %s (once; takes ~20-60 s)", gguf.name, dest)
    start = time.perf_counter()

    def write(tmp: Path) -> None:
        convert_gguf(gguf, tmp)
        files = {p.name: p.stat().st_size for p in tmp.iterdir() if p.is_file()}
        (tmp / MARKER).write_text(json.dumps({"format": CONVERSION_FORMAT, "gguf": fingerprint,
                                              "source": str(gguf), "files": files}, indent=1))

    # A folder at dest was found incomplete (no valid marker) before this build: it is replaced.
    if not publish_folder(dest, write, replace=dest.exists()) and not is_converted(dest, fingerprint):
        raise OSError(f"{dest} appeared during the conversion of {gguf.name} and is not its conversion")
    log.info("converted %s in %.1f s", gguf.name, time.perf_counter() - start)
