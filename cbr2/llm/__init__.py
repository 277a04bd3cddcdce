"""Program generators ("LLM backends"), registered by name and imported only when chosen.

A backend turns questions into program texts. GPU-only packages (vLLM) are imported inside
their backend's module, so choosing ``gold`` never loads them.
"""

from __future__ import annotations

import difflib
import importlib
from typing import Any

BACKENDS: dict[str, str] = {
    "gold": "cbr2.llm.gold:GoldBackend",
}
"""``llm.backend`` name → ``module:Class``."""


def backend_class(name: str) -> type:
    """The class registered under ``name``, imported now (its heavy packages load only when built).

    Raises:
        ValueError: For an unknown name, with the closest registered names.
    """
    if name not in BACKENDS:
        close = difflib.get_close_matches(name, BACKENDS, n=2)
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        raise ValueError(f"unknown llm.backend {name!r}{hint}; available: {', '.join(BACKENDS)}")
    module, cls = BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def get_backend(name: str, **kwargs: Any) -> Any:
    """Instantiate the backend registered under ``name``.

    Raises:
        ValueError: For an unknown name, with the closest registered names.
    """
    return backend_class(name)(**kwargs)
