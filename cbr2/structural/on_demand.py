"""On-demand training: the structural retriever an evaluation uses, trained when none exists.

The embedded benchmarks train one with ``train.py``'s defaults on first use (a few minutes on a
CPU), under a build lock so concurrent shards train it once; the real benchmarks ask for the
``train.py`` command instead.
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig

from cbr2.common.errors import ConfigError
from cbr2.common.locks import build_lock
from cbr2.config import TrainConfig, compose
from cbr2.data.benchmarks import METAQA, Benchmark
from cbr2.structural.checkpoints import find_checkpoint

log = logging.getLogger(__name__)


def resolve_structural(cfg: DictConfig, bench: Benchmark) -> str:
    """The structural retriever evaluation uses.

    Order: ``structural.checkpoint`` when set (a folder, or any encoder name, e.g. the
    untrained backbone for comparison); else the newest checkpoint trained on ``data.name``;
    for MetaQA, else the newest trained on the matching KQA Pro benchmark (the paper reuses
    the KQA Pro retriever for MetaQA); for the embedded benchmarks, else one trained now
    with ``train.py``'s defaults.

    Raises:
        ConfigError: When none exists, with the ``train.py`` command that makes one.
    """
    if cfg.structural.checkpoint:
        return str(cfg.structural.checkpoint)
    where = Path(cfg.structural.checkpoints_dir)
    candidates = [cfg.data.name]
    if bench.family is METAQA:
        candidates.append(cfg.data.name.replace("metaqa", "kqapro"))
    for name in candidates:
        found = find_checkpoint(where, name)
        if found is not None:
            if name != cfg.data.name:
                log.info("no structural retriever trained on %s; using %s's (as the paper does)", cfg.data.name, name)
            log.info("structural retriever: %s", found)
            return str(found)
    train_on = candidates[-1]
    if not train_on.startswith("mini-"):
        # For MetaQA the command trains on KQA Pro, whose folder is not MetaQA's data.root.
        root = f" data.root={cfg.data.root}" if cfg.data.root and train_on == cfg.data.name else " data.root=DIR"
        raise ConfigError(f"no structural retriever for {cfg.data.name} in {where}/; train one with "
                         f"`python train.py data.name={train_on}{root}` or set structural.checkpoint=PATH")
    # Lightning and torch load only when training is needed (evaluate.py must start fast).
    from cbr2.structural.train import train

    with build_lock(where / f"structural-{train_on}", f"the {train_on} structural retriever"):
        found = find_checkpoint(where, train_on)  # trained by another job while this one waited?
        if found is not None:
            return str(found)
        log.warning("no structural retriever for %s in %s/; training one now (python train.py data.name=%s)",
                    cfg.data.name, where, train_on)
        train_cfg = compose(TrainConfig, overrides=[f"data.name={train_on}", f"structural.checkpoints_dir={where}"])
        return str(train(train_cfg)["checkpoint"])
