"""Which questions an evaluation judges: the selection, its shards, and the hashes that pin them.

The selection is the configured split, optionally category-balanced, cut to ``eval.limit``.
A sharded run (``eval.num_shards=N``) judges question i of the selection in shard
``i mod N``; each shard records the sha256 of its own question ids and of the whole
selection, so the merge (``cbr2.cluster.merge``) can prove that the shards it joins are the
shares of one selection, built from the same data.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig

from cbr2.common.errors import ConfigError, UserError
from cbr2.common.slurm import array_task
from cbr2.config import EvalConfig
from cbr2.data.benchmarks import KQAPRO, Benchmark
from cbr2.data.questions import KQAPRO_CATEGORIES, METAQA_CATEGORIES, Question


def select_questions(bench: Benchmark, split: str | None, ev: EvalConfig) -> list[Question]:
    """The evaluated questions: the configured split, optionally category-balanced, cut to ``eval.limit``.

    With ``eval.per_category=N`` the split is shuffled with ``random.Random(eval.sample_seed)``
    and the first N questions of each category are kept, in shuffled order (the few-shot
    literature's KQA Pro 9 x 100 recipe with N = 100 and seed 123). ``eval.skip_per_category=S``
    keeps questions S+1 .. S+N of each category instead: a sample disjoint from the first S of
    each category (settings chosen on those are then measured on other questions).

    Args:
        bench: The benchmark whose split is read.
        split: ``data.split``; the family's evaluation split when None.
        ev: The ``eval`` section (``per_category``, ``skip_per_category``, ``sample_seed``, ``limit``).

    Returns:
        The selected questions, in evaluation order.

    A split without gold answers (KQA Pro's test) is selected too: its questions are answered
    and written for submission, not scored.

    Raises:
        ConfigError: On a ``skip_per_category`` without ``per_category``, a ``per_category``
            on a split without gold programs, or a split where only some questions have answers.
    """
    questions = bench.questions(split)
    skip = ev.skip_per_category
    if skip < 0 or (skip and ev.per_category is None):
        raise ConfigError(f"eval.skip_per_category={skip}: must be at least 0, and needs eval.per_category")
    if ev.per_category is not None and any(q.category is None for q in questions):
        raise ConfigError(f"eval.per_category={ev.per_category}: split {_split(bench, split)!r} of {bench.name} has "
                          "no gold programs, so no categories to balance; set eval.per_category=null")
    if ev.per_category is not None:
        shuffled = list(questions)
        random.Random(ev.sample_seed).shuffle(shuffled)
        taken: Counter[str] = Counter()
        questions = []
        for q in shuffled:
            if taken[q.category] < skip + ev.per_category:
                taken[q.category] += 1
                if taken[q.category] > skip:  # the first `skip` of each category are another sample's
                    questions.append(q)
    if ev.limit is not None:
        questions = questions[: ev.limit]
    if len({q.answer is None for q in questions}) > 1:
        raise ConfigError(f"{bench.name} split {_split(bench, split)!r}: some questions have gold answers and some "
                          "do not")
    return questions


def _split(bench: Benchmark, split: str | None) -> str:
    return split or bench.family.eval_split


def whole_split(bench: Benchmark, split: str | None, selection: Sequence[Question]) -> bool:
    """Whether the selection is the whole configured split (``data.split``; the family's default
    when None), in the file's order."""
    return [q.qid for q in selection] == [q.qid for q in bench.questions(split)]


def categories_of(bench: Benchmark) -> tuple[str, ...]:
    """The benchmark's categories in the order metrics and reports list them first."""
    return KQAPRO_CATEGORIES if bench.family is KQAPRO else METAQA_CATEGORIES


def resolve_shard(section: DictConfig) -> tuple[int, int]:
    """``(shard, num_shards)`` of a run: as configured, else from the SLURM job array (task
    position of ``$SLURM_ARRAY_TASK_COUNT``), else one shard.

    Args:
        section: The ``eval`` section (read, not changed).

    Raises:
        ConfigError: On a shard outside ``[0, num_shards)`` or only one of the two set outside an array.
    """
    shard, num_shards = section.shard, section.num_shards
    if num_shards is None and shard is None:
        shard, num_shards = array_task() or (0, 1)
    elif shard is None:
        task = array_task()
        if num_shards > 1 and task is None:
            raise ConfigError(f"eval.num_shards={num_shards} needs eval.shard (0..{num_shards - 1}) outside a job array")
        shard = task[0] if task and num_shards > 1 else 0
    elif num_shards is None:
        raise ConfigError(f"eval.shard={shard} needs eval.num_shards")
    if num_shards < 1 or not 0 <= shard < num_shards:
        raise ConfigError(f"eval.shard={shard} is not one of eval.num_shards={num_shards} shards (0..{num_shards - 1})")
    return shard, num_shards


def shard_of(questions: Sequence[Question], shard: int, num_shards: int) -> list[Question]:
    """Question i of the selection goes to shard ``i mod num_shards``: deterministic, and every
    shard gets a near-equal share of each category of a balanced sample.

    Args:
        questions: The whole selection.
        shard: This shard's index, in ``[0, num_shards)``.
        num_shards: How many shards share the selection.

    Returns:
        The shard's questions, in selection order.
    """
    return list(questions[shard::num_shards])


def selection_sha256(questions: Sequence[Question]) -> str:
    """SHA-256 of the question ids in order: what the evaluated questions were."""
    return hashlib.sha256("\n".join(q.qid for q in questions).encode()).hexdigest()


def selection_provenance(selection: Sequence[Question], shard: int, num_shards: int) -> dict[str, Any]:
    """What ``metrics.json``'s provenance records about the questions a run (or shard) judged.

    Args:
        selection: The whole selection.
        shard: The run's shard index (0 for an unsharded run).
        num_shards: How many shards share the selection (1 for an unsharded run).

    Returns:
        ``{"question_ids_sha256"}`` of the judged questions, plus, for a shard, ``"shard":
        {"index", "count", "selection_n", "selection_sha256"}`` (what ``check_shard`` reads back).
    """
    prov: dict[str, Any] = {"question_ids_sha256": selection_sha256(shard_of(selection, shard, num_shards))}
    if num_shards > 1:
        prov["shard"] = {"index": shard, "count": num_shards, "selection_n": len(selection),
                         "selection_sha256": selection_sha256(selection)}
    return prov


def check_shard(selection: Sequence[Question], provenance: dict[str, Any], where: str, data_name: str) -> list[Question]:
    """The questions of one finished shard, after checking that it judged its share of ``selection``.

    Args:
        selection: The selection rebuilt now from the shards' shared configuration.
        provenance: The shard's ``metrics.json`` provenance (as ``selection_provenance`` wrote it).
        where: The shard's folder, for the error message.
        data_name: ``data.name`` of the selection, for the error message.

    Returns:
        The shard's questions (``shard_of`` the selection), in selection order.

    Raises:
        UserError: When the selection is not the one the shard was cut from (the data changed
            since it ran), or the shard's questions are not its share of it.
    """
    info = provenance["shard"]
    if selection_sha256(selection) != info["selection_sha256"]:
        raise UserError(f"the selection of {data_name} ({len(selection)} questions) is not the one the shards "
                         f"evaluated ({info['selection_n']}): the data changed since they ran")
    expected = shard_of(selection, info["index"], info["count"])
    if provenance.get("question_ids_sha256") != selection_sha256(expected):
        raise UserError(f"{where}: its questions are not shard {info['index']} of {info['count']} of this selection")
    return expected
