"""Program generators ("LLM backends"), registered by name and imported only when chosen.

A backend (the ``Backend`` protocol of ``cbr2.llm.base``) turns ``Prompt``s into ``Completion``s with
``generate(prompts, on_result=None)``, shows the exact model input with ``render(prompt)``
and names what its outputs depend on with ``identity()`` (the predictions cache key). Each
backend class declares the decoding features it honours (``capabilities``, ``cbr2.llm.base.FEATURES``);
``check_capabilities`` stops a run at start whose settings ask its backend for more. Heavy
packages (torch, transformers, vLLM, openai) are imported inside the backends, so choosing
``gold`` never loads them.

The package is a leaf of the drawing: it reads its ``llm`` section (``cbr2.config``), the records
of ``cbr2.common`` (a prompt, a completion, the run's grammar as text) and program text
(``cbr2.kopl``: the gold writer), and is handed the rest as values (the gold programs, the cache
root, what retrieval holds on the GPU); ``tests/test_layout.py`` holds it to that.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cbr2.common.console import did_you_mean
from cbr2.common.errors import ConfigError
from cbr2.common.records import Grammar
from cbr2.llm.base import FEATURES, Backend

if TYPE_CHECKING:
    from cbr2.config import GenerationConfig, LLMConfig
    from cbr2.kopl.program import Program

BACKENDS: dict[str, str] = {
    "hf": "cbr2.llm.hf:HFBackend",
    "vllm": "cbr2.llm.vllm:VLLMBackend",
    "openai": "cbr2.llm.openai_compat:OpenAIBackend",
    "llamacpp": "cbr2.llm.llamacpp:LlamaCppBackend",
    "gold": "cbr2.llm.gold:GoldBackend",
}
"""``llm.backend`` name → ``module:Class``."""


def backend_class(name: str) -> Callable[..., Backend]:
    """The class registered under ``name``, imported now (its heavy packages load only when built).

    Raises:
        ConfigError: For an unknown name, with the closest registered names.
    """
    if name not in BACKENDS:
        raise ConfigError(f"unknown llm.backend {name!r}{did_you_mean(name, BACKENDS)}; "
                         f"available: {', '.join(BACKENDS)}")
    module, cls = BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def requested_features(gen: GenerationConfig, link: bool) -> dict[str, str]:
    """The decoding features (``FEATURES``) a run's configuration asks of its backend, each with
    the setting that asks for it (as the user would write it).

    Grounded decoding is asked only where it acts: under the grammar, with linking on (without
    ``retrieval.link`` no prompt carries candidates).

    Args:
        gen: The ``generation`` section.
        link: ``retrieval.link``.
    """
    asked = {}
    if gen.constrained:
        asked["constrained"] = "generation.constrained=true"
        if gen.grounded and link:
            asked["grounded"] = "generation.grounded=true"
    assert set(asked) <= set(FEATURES)
    return asked


def check_capabilities(llm: LLMConfig, gen: GenerationConfig, link: bool) -> None:
    """Stops a run whose configuration asks its backend for a decoding feature it lacks, before
    anything is retrieved or loaded, naming the backends that have it.

    Args:
        llm: The ``llm`` section (its ``backend``).
        gen: The ``generation`` section (the features it asks for: ``requested_features``).
        link: ``retrieval.link`` (grounded decoding acts only with it).

    Raises:
        ConfigError: For an unknown ``llm.backend``, or a feature the backend does not declare.
    """
    name = llm.backend
    have = backend_class(name).capabilities
    for feature, setting in requested_features(gen, link).items():
        if feature not in have:
            # The gold writer accepts every setting but decodes nothing: it is no alternative to offer.
            able = [n for n in BACKENDS if n != "gold" and feature in backend_class(n).capabilities]
            key = setting.split("=")[0]
            raise ConfigError(f"{setting}: llm.backend={name} cannot decode it; use llm.backend={' or '.join(able)}, "
                              f"or set {key}=false")


def make_backend(section: Any, programs: Mapping[str, Program | None] | None = None, grammar: Grammar | None = None,
                 program_format: str = "dag", gpu_reserve_bytes: int = 0,
                 cache_dir: str | Path | None = None) -> Backend:
    """The configured backend, built but not loaded (weights load on the first ``generate``).

    Args:
        section: The ``llm`` section (``cbr2.config.LLMConfig``), which the backends read.
        programs: The gold program of each evaluated question id; only ``gold`` reads them.
        grammar: Decode under this grammar (``generation.constrained``); every backend but
            ``gold``, which writes gold programs, decodes under it (``capabilities``).
        program_format: ``prompt.format``, the form the ``gold`` writer writes programs in.
        gpu_reserve_bytes: What the rest of the process holds on the GPU beside an engine that
            takes a share of it at start (``shares_gpu``: vLLM); ``cbr2.retrieval.gpu_memory``.
        cache_dir: The cache root (the configuration's ``cache_dir``; ``cbr2.common.files.cache_root``)
            of a backend that keeps files there (``uses_cache``: packaged and converted weights,
            compiled grammars).

    Raises:
        ConfigError: For an unknown ``llm.backend``.
    """
    cls = backend_class(section.backend)
    if section.backend == "gold":
        return cls(program_format, programs or {})
    kwargs: dict[str, Any] = {"grammar": grammar} if grammar is not None else {}
    if getattr(cls, "shares_gpu", False):
        kwargs["reserve_bytes"] = gpu_reserve_bytes
    if getattr(cls, "uses_cache", False):
        kwargs["cache_dir"] = cache_dir
    return cls(section, **kwargs)
