"""Experiment tracking (Weights & Biases): the mode a run actually uses.

Compute nodes often have no route to the internet; an ``online`` run there would stall on
connection retries. Such runs log offline instead (``wandb sync`` uploads them later), with a
warning, so one config works on a laptop, a login node and a locked-down GPU node alike.
"""

from __future__ import annotations

import logging
import os
import socket
from urllib.parse import urlparse

log = logging.getLogger(__name__)

WANDB_MODES = ("online", "offline", "disabled")


def _reachable(host: str, port: int, timeout_s: float) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def wandb_mode(requested: str, timeout_s: float = 3.0) -> str:
    """The W&B mode to use for a run that asked for ``requested``.

    ``online`` becomes ``offline`` when the W&B server (``$WANDB_BASE_URL``, by default
    api.wandb.ai) cannot be reached within ``timeout_s``; other modes are returned as they are.

    Raises:
        ValueError: On a mode that is not one of ``WANDB_MODES``.
    """
    if requested not in WANDB_MODES:
        raise ValueError(f"wandb.mode={requested!r}; expected one of {', '.join(WANDB_MODES)}")
    if requested != "online":
        return requested
    url = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai"))
    port = url.port or (443 if url.scheme == "https" else 80)
    if _reachable(url.hostname or "api.wandb.ai", port, timeout_s):
        return "online"
    log.warning("wandb.mode=online but %s is unreachable: logging offline (upload later with `wandb sync`)",
                url.hostname)
    return "offline"
