"""Program generators ("LLM backends"), registered by name and imported only when chosen.

A backend (the ``Backend`` protocol of ``cbr2.llm.base``) turns ``Prompt``s into ``Completion``s with
``generate(prompts, on_result=None)``, shows the exact model input with ``render(prompt)``
and names what its outputs depend on with ``identity()`` (the predictions cache key). Heavy
packages (torch, transformers, vLLM, openai) are imported inside the backends, so choosing
``gold`` never loads them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from cbr2.common.console import did_you_mean
from cbr2.common.errors import ConfigError
from cbr2.llm.base import Backend

if TYPE_CHECKING:
    from cbr2.data.questions import Question
    from cbr2.generation.grammar import ProgramGrammar

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


def make_backend(section: Any, questions: Sequence[Question] = (), grammar: ProgramGrammar | None = None,
                 program_format: str = "dag") -> Backend:
    """The configured backend, built but not loaded (weights load on the first ``generate``).

    Args:
        section: The ``llm`` section (``cbr2.config_schema.LLMConfig``), which the backends read.
        questions: The evaluated questions; only ``gold`` reads them (their gold programs).
        grammar: Decode under this grammar (``generation.constrained``); ``hf``, ``vllm`` and
            ``openai`` honour it, ``gold`` writes gold programs and ignores it.
        program_format: ``prompt.format``, the form the ``gold`` writer writes programs in.

    Raises:
        ConfigError: For an unknown ``llm.backend``.
    """
    cls = backend_class(section.backend)
    if section.backend == "gold":
        return cls(program_format, {q.qid: q.program for q in questions})
    return cls(section, grammar=grammar) if grammar is not None else cls(section)
