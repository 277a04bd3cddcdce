"""On-demand training: the structural retriever an evaluation uses, trained when none exists.

The embedded benchmarks train one with ``train.py``'s defaults on first use (a few minutes on a
CPU), under a build lock so concurrent shards train it once; the real benchmarks ask for the
``train.py`` command instead.

Your own cases (``data.name=custom``) train one the same way when there are enough of them
(``MIN_STRUCTURAL_CASES``), exported as ``custom-<12 hex digits of the cases file's SHA-256>``
(``cbr2.data.benchmarks.structural_name``), so a changed cases file trains anew. With fewer, no
retriever is trained: ``case_views_for`` says which case views a run can use and why (semantic
cases only), for the ``ask`` path to use and show; an evaluation, whose ``retrieval.cases`` is
never changed behind the user's back, refuses a structural view in one line instead
(``resolve_structural``).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from cbr2.common.errors import ConfigError
from cbr2.common.locks import build_lock
from cbr2.config import DataConfig, RetrievalConfig, StructuralConfig, TrainConfig, compose
from cbr2.data.benchmarks import CUSTOM, METAQA, Benchmark
from cbr2.data.cases import MIN_STRUCTURAL_CASES
from cbr2.retrieval.retriever import CASE_MODES
from cbr2.structural.checkpoints import find_checkpoint

log = logging.getLogger(__name__)


def case_views_for(retrieval: RetrievalConfig, bench: Benchmark) -> tuple[str, str]:
    """The ``retrieval.cases`` mode a run over ``bench`` can use, and why, in words for a log or a trace.

    The configured mode, except for your own cases (``custom``) when they are fewer than
    ``MIN_STRUCTURAL_CASES`` and the mode has a structural view: then ``semantic`` (no structural
    retriever can be trained on so few). Logged when it differs from the configured one. The
    ``ask`` path runs with the mode returned; an evaluation keeps the configured one and fails in
    ``resolve_structural`` instead.

    Args:
        retrieval: The ``retrieval`` section (its ``cases``).
        bench: The benchmark whose case pool is counted.

    Returns:
        ``(mode, why)``: a key of ``CASE_MODES`` and one line saying why it is that one.
    """
    mode = retrieval.cases
    if bench.family is not CUSTOM:
        return mode, f"retrieval.cases={mode}, as configured"
    n = len(bench.questions(CUSTOM.train_split))
    if n >= MIN_STRUCTURAL_CASES:
        return mode, (f"retrieval.cases={mode}, as configured ({n} cases in {bench.cases_path}: enough to train the "
                      f"structural retriever on, at least {MIN_STRUCTURAL_CASES})")
    if "structural" not in CASE_MODES[mode]:
        return mode, f"retrieval.cases={mode}, as configured ({n} cases in {bench.cases_path})"
    why = (f"semantic cases only: {bench.cases_path} holds {n} cases, fewer than the {MIN_STRUCTURAL_CASES} a "
           f"structural retriever is trained on (retrieval.cases={mode} asked for the structural view)")
    log.info("%s", why)
    return "semantic", why


def resolve_structural(structural: StructuralConfig, data: DataConfig, bench: Benchmark) -> str:
    """The structural retriever evaluation uses.

    Order: ``structural.checkpoint`` when set (a folder, or any encoder name, e.g. the
    untrained backbone for comparison); else the newest checkpoint trained on ``data.name``;
    for MetaQA, else the newest trained on the matching KQA Pro benchmark (the paper reuses
    the KQA Pro retriever for MetaQA); for the embedded benchmarks, else one trained now
    with ``train.py``'s defaults. Your own cases (``custom``): the newest trained on this cases
    file's content, else one trained now, when there are at least ``MIN_STRUCTURAL_CASES``.

    Args:
        structural: The ``structural`` section (``checkpoint``, ``checkpoints_dir``).
        data: The ``data`` section (``name``, ``root``: what the retriever is looked up and trained for).
        bench: The benchmark of ``data``.

    Raises:
        ConfigError: When none exists, with the ``train.py`` command that makes one; for
            ``custom`` with fewer than ``MIN_STRUCTURAL_CASES`` cases, saying to set
            ``retrieval.cases=semantic`` (or add cases).
    """
    if structural.checkpoint:
        return str(structural.checkpoint)
    where = Path(structural.checkpoints_dir)
    if bench.family is CUSTOM:
        return _custom_structural(bench, where)
    candidates = [data.name]
    if bench.family is METAQA:
        candidates.append(data.name.replace("metaqa", "kqapro"))
    for name in candidates:
        found = find_checkpoint(where, name)
        if found is not None:
            if name != data.name:
                log.info("no structural retriever trained on %s; using %s's (as the paper does)", data.name, name)
            log.info("structural retriever: %s", found)
            return str(found)
    train_on = candidates[-1]
    if not train_on.startswith("mini-"):
        # For MetaQA the command trains on KQA Pro, whose folder is not MetaQA's data.root.
        root = f" data.root={data.root}" if data.root and train_on == data.name else " data.root=DIR"
        raise ConfigError(f"no structural retriever for {data.name} in {where}/; train one with "
                         f"`python train.py data.name={train_on}{root}` or set structural.checkpoint=PATH")
    # Lightning and torch load only when training is needed (evaluate.py must start fast).
    from cbr2.structural.train import train

    with build_lock(where / f"structural-{train_on}", f"the {train_on} structural retriever"):
        found = find_checkpoint(where, train_on)  # trained by another job while this one waited?
        if found is not None:
            return str(found)
        log.warning("no structural retriever for %s in %s/; training one now (python train.py data.name=%s)",
                    data.name, where, train_on)
        train_cfg = compose(TrainConfig, overrides=[f"data.name={train_on}", f"structural.checkpoints_dir={where}"])
        return str(train(train_cfg)["checkpoint"])


def _custom_structural(bench: Benchmark, where: Path) -> str:
    """The structural retriever of your own cases: found by their content's name, else trained now."""
    n = len(bench.questions(CUSTOM.train_split))
    if n < MIN_STRUCTURAL_CASES:
        raise ConfigError(f"data.cases={bench.cases_path} holds {n} cases, fewer than the {MIN_STRUCTURAL_CASES} a "
                          "structural retriever is trained on: set retrieval.cases=semantic, add cases, or set "
                          "structural.checkpoint=PATH")
    name = bench.structural_name
    found = find_checkpoint(where, name)
    if found is not None:
        log.info("structural retriever: %s (trained on %s as it is now)", found, bench.cases_path)
        return str(found)
    from cbr2.structural.train import train

    with build_lock(where / f"structural-{name}", f"the structural retriever of {bench.cases_path}"):
        found = find_checkpoint(where, name)  # trained by another job while this one waited?
        if found is not None:
            return str(found)
        log.warning("no structural retriever trained on %s as it is now (%s) in %s/; training one on its %d cases",
                    bench.cases_path, name, where, n)
        # JSON-quoted: a path is taken as written, whatever YAML would make of it.
        files = [f"data.{key}={json.dumps(str(path.resolve()))}"
                 for key, path in (("kb", bench.kb_path), ("cases", bench.cases_path))]
        train_cfg = compose(TrainConfig, overrides=[f"data.name={CUSTOM.name}", *files,
                                                    f"structural.checkpoints_dir={where}"])
        return str(train(train_cfg)["checkpoint"])
