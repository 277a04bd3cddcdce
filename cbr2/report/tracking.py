"""An evaluation's Weights & Biases run: summary metrics, tables and config.

The mode it logs in (``online`` becomes ``offline`` where the server cannot be reached) and the
line on where the run went are ``cbr2.common.tracking``'s, shared with training.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cbr2.common.tracking import announce, wandb_mode

if TYPE_CHECKING:
    from cbr2.config import WandbConfig


def log_evaluation(settings: WandbConfig, metrics: dict[str, Any], records: list[dict[str, Any]], out: Path,
                   name: str) -> None:
    """Send an evaluation to W&B: summary metrics, the per-category table, a predictions table, the config.

    Args:
        settings: The ``wandb`` section (mode, project, entity, group).
        metrics: ``metrics.json`` (its ``provenance.config`` becomes the run config).
        records: The ``predictions.jsonl`` records.
        out: The run folder (W&B's local files go to ``out/wandb``).
        name: The W&B run name.
    """
    mode = wandb_mode(settings.mode)
    if mode == "disabled":
        return
    import wandb

    config = {**metrics["provenance"]["config"],
              "provenance": {k: v for k, v in metrics["provenance"].items() if k != "config"}}
    run = wandb.init(project=settings.project, entity=settings.entity, group=settings.group, name=name, mode=mode,
                     dir=str(out), job_type="evaluate", config=config)
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


def _cell(value: Any) -> Any:
    # W&B tables want scalars; answers may be lists (MetaQA) or None.
    return value if isinstance(value, (str, int, float, bool)) or value is None else json.dumps(value, ensure_ascii=False)
