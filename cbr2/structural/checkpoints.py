"""Exported structural retrievers: sentence-transformers folders with a metadata file.

``train.py`` exports the best model of a run to ``{checkpoints_dir}/structural-{data}-{run id}/``;
evaluation takes the newest export trained on its benchmark unless told which one to use.
"""

from __future__ import annotations

import json
import logging
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cbr2.common.files import publish_folder

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

log = logging.getLogger(__name__)

META_FILE = "cbr2_structural.json"
"""What an export was trained on, when, and how well it did; lies beside the model files."""


def _jsonable(value: Any) -> Any:
    # NaN (e.g. a Spearman over constant predictions) is not JSON; write null instead.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def export_checkpoint(model: SentenceTransformer, checkpoints_dir: str | Path, data_name: str, run_id: str,
                      meta: dict[str, Any]) -> Path:
    """Save ``model`` so that ``SentenceTransformer(str(path))`` loads it, with its metadata.

    The folder is written under a hidden temporary name and renamed into place
    (``publish_folder``), so a half-written export is never found; an earlier export of the same
    run is replaced.

    Args:
        model: The trained encoder.
        checkpoints_dir: Folder of exports (created when missing).
        data_name: Benchmark the model was trained on (``data.name``).
        run_id: The training run's id.
        meta: Written to ``META_FILE`` (``data``, ``backbone``, ``metrics``, ``baseline``,
            ``config``, ``git``, ``run_dir`` ...); ``created`` (UTC, ISO 8601) and
            ``data.name`` are set here.

    Returns:
        The export's folder, ``{checkpoints_dir}/structural-{data_name}-{run_id}``.
    """
    final = Path(checkpoints_dir) / f"structural-{data_name}-{run_id}"

    def write(tmp: Path) -> None:
        tmp.chmod(0o755)  # mkdtemp makes it private; an export is meant to be shared
        model.save(str(tmp))
        record = {**meta, "data": {"root": None, **meta.get("data", {}), "name": data_name},
                  "created": datetime.now(timezone.utc).isoformat()}
        (tmp / META_FILE).write_text(json.dumps(_jsonable(record), indent=2) + "\n", encoding="utf-8")

    publish_folder(final, write, replace=True)
    log.info("exported the structural retriever to %s", final)
    return final


def read_meta(path: str | Path) -> dict[str, Any]:
    """The metadata of the export at ``path``.

    Raises:
        OSError: If ``META_FILE`` cannot be read.
        ValueError: If it is not JSON.
    """
    return json.loads((Path(path) / META_FILE).read_text(encoding="utf-8"))


def _created(meta: dict[str, Any]) -> datetime:
    created = datetime.fromisoformat(meta["created"])
    return created if created.tzinfo else created.replace(tzinfo=timezone.utc)


def find_checkpoint(checkpoints_dir: str | Path, data_name: str) -> Path | None:
    """The newest export trained on ``data_name``, by its metadata's ``created`` time.

    Folders whose metadata is missing or unreadable are skipped with a warning; hidden
    folders (exports being written) are ignored.

    Args:
        checkpoints_dir: Folder of exports.
        data_name: Benchmark name (``data.name``).

    Returns:
        The export's folder, or None when no export of ``data_name`` exists.
    """
    root = Path(checkpoints_dir)
    if not root.is_dir():
        return None
    newest: tuple[datetime, Path] | None = None
    for folder in sorted(root.iterdir()):
        if not folder.is_dir() or folder.name.startswith("."):
            continue
        try:
            meta = read_meta(folder)
            name, created = meta["data"]["name"], _created(meta)
        except (OSError, ValueError, KeyError, TypeError) as err:
            log.warning("%s: skipped, no readable %s (%s)", folder, META_FILE, err)
            continue
        if name == data_name and (newest is None or created > newest[0]):
            newest = (created, folder)
    return newest[1] if newest else None
