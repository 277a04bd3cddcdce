"""Experiment tracking (Weights & Biases): the mode a run actually uses, and where its run went.

Compute nodes often have no route to the internet; an ``online`` run there would stall on
connection retries. Such runs log offline instead (``wandb sync`` uploads them later), with a
warning, so one config works on a laptop, a login node and a locked-down GPU node alike.
Training (``cbr2.structural.train``) and evaluation (``cbr2.report.tracking``) both use it.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any
from urllib.parse import urlparse

log = logging.getLogger(__name__)


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
    """
    if requested != "online":
        return requested
    url = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai"))
    port = url.port or (443 if url.scheme == "https" else 80)
    if _reachable(url.hostname or "api.wandb.ai", port, timeout_s):
        return "online"
    log.warning("wandb.mode=online but %s is unreachable: logging offline (upload later with `wandb sync`)",
                url.hostname)
    return "offline"


def announce(run: Any) -> None:
    """One line on where a finished W&B run is (W&B's own console lines are off: ``WANDB_SILENT``)."""
    if getattr(run, "url", None):
        log.info("W&B run: %s", run.url)
        return
    sync_dir = getattr(getattr(run, "settings", None), "sync_dir", None)
    if sync_dir:
        log.info("W&B offline run in %s (upload it with `wandb sync %s`)", sync_dir, sync_dir)
