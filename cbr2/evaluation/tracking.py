"""Experiment tracking (Weights & Biases): the mode a run actually uses.

Compute nodes often have no route to the internet; an ``online`` run there would stall on
connection retries. Such runs log offline instead (``wandb sync`` uploads them later), with a
warning, so one config works on a laptop, a login node and a locked-down GPU node alike.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from pathlib import Path
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


def log_evaluation(cfg: Any, metrics: dict[str, Any], records: list[dict[str, Any]], out: Path, name: str) -> None:
    """Send an evaluation to W&B: summary metrics, the per-category table, a predictions table, the config.

    Args:
        cfg: The ``wandb`` config section.
        metrics: ``metrics.json`` (its ``provenance.config`` becomes the run config).
        records: The ``predictions.jsonl`` records.
        out: The run folder (W&B's local files go to ``out/wandb``).
        name: The W&B run name.
    """
    mode = wandb_mode(cfg.mode)
    if mode == "disabled":
        return
    import wandb

    run = wandb.init(project=cfg.project, entity=cfg.entity, group=cfg.group, name=name, mode=mode, dir=str(out),
                     job_type="evaluate", config={**metrics["provenance"]["config"],
                                                  "provenance": {k: v for k, v in metrics["provenance"].items()
                                                                 if k != "config"}})
    try:
        run.summary.update({k: metrics[k] for k in ("hits@1", "ser", "ser_before_repair", "n")})
        run.summary.update({f"errors/{k}": v for k, v in metrics["errors"].items()})
        run.summary.update({f"generation/{k}": v for k, v in metrics.get("generation", {}).items() if v is not None})
        for cat, m in metrics["per_category"].items():
            run.summary.update({f"per_category/{cat}/hits@1": m["hits@1"], f"per_category/{cat}/ser": m["ser"]})
        for kind, m in (metrics.get("per_reasoning_type") or {}).items():
            run.summary.update({f"per_reasoning_type/{kind}/hits@1": m["hits@1"], f"per_reasoning_type/{kind}/n": m["n"]})
        per_cat = wandb.Table(columns=["category", "hits@1", "ser", "ser_before_repair", "n"],
                              data=[[c, m["hits@1"], m["ser"], m["ser_before_repair"], m["n"]]
                                    for c, m in metrics["per_category"].items()])
        columns = ["id", "category", "question", "generated", "program", "answer", "gold_answer", "correct",
                   "error_kind"]
        preds = wandb.Table(columns=columns, data=[[_cell(r.get(c)) for c in columns] for r in records])
        run.log({"per_category": per_cat, "predictions": preds})
    finally:
        run.finish()
        announce(run)


def announce(run: Any) -> None:
    """One line on where a finished W&B run is (W&B's own console lines are off: ``WANDB_SILENT``)."""
    if getattr(run, "url", None):
        log.info("W&B run: %s", run.url)
        return
    sync_dir = getattr(getattr(run, "settings", None), "sync_dir", None)
    if sync_dir:
        log.info("W&B offline run in %s (upload it with `wandb sync %s`)", sync_dir, sync_dir)


def _cell(value: Any) -> Any:
    # W&B tables want scalars; answers may be lists (MetaQA) or None.
    return value if isinstance(value, (str, int, float, bool)) or value is None else json.dumps(value, ensure_ascii=False)
