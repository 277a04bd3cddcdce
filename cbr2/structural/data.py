"""Question pairs for training and validating the structural retriever.

The training split is cut in two by a hash of each question id: the fit pool, which training
pairs are drawn from, and held-out questions, which validation pairs are drawn from and which
query the fit pool for sketch-hit@k. A question never pairs across the cut, so validation
measures what the encoder learnt about unseen questions.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from cbr2.common.errors import ConfigError
from cbr2.data.benchmarks import Benchmark
from cbr2.data.questions import Question
from cbr2.kopl.sketch import sketch
from cbr2.structural.labels import PairSampler, Sketch, SketchTable

log = logging.getLogger(__name__)

Pair = tuple[str, str, float]
Batch = tuple[list[str], list[str], torch.Tensor]

_TRAIN_STREAM, _VAL_STREAM = 0, 1  # keep training and validation draws independent for one seed


@dataclass(frozen=True)
class QuestionSet:
    """Some questions' ids, texts and sketches, in the same order."""

    qids: list[str]
    texts: list[str]
    sketches: list[Sketch]

    @classmethod
    def of(cls, questions: Sequence[Question]) -> QuestionSet:
        """The set of ``questions``, which must all have a program."""
        return cls([q.qid for q in questions], [q.question for q in questions],
                   [sketch(q.program) for q in questions])

    def __len__(self) -> int:
        return len(self.qids)

    def first_by_hash(self, n: int) -> QuestionSet:
        """At most ``n`` of these questions: those with the smallest hash of their id, in input order."""
        if len(self) <= n:
            return self
        keys = [hashlib.sha256(f"sketch-hit:{qid}".encode()).digest() for qid in self.qids]
        keep = sorted(sorted(range(len(self)), key=keys.__getitem__)[:n])
        return QuestionSet([self.qids[i] for i in keep], [self.texts[i] for i in keep],
                           [self.sketches[i] for i in keep])


def is_heldout(qid: str, share: float) -> bool:
    """Whether question ``qid`` is held out: its hash falls in the first ``share`` of the range.

    Depends on nothing but the id, so the cut is the same for every seed, run and machine.
    """
    return int.from_bytes(hashlib.sha256(qid.encode()).digest()[:8], "big") < share * 2**64


def split_holdout(questions: Sequence[Question], share: float) -> tuple[list[Question], list[Question]]:
    """``(fit pool, held-out)`` questions, each in input order."""
    fit, held = [], []
    for q in questions:
        (held if is_heldout(q.qid, share) else fit).append(q)
    return fit, held


def collate_pairs(items: Sequence[Pair]) -> Batch:
    """``[(text_a, text_b, label)]`` → ``(texts_a, texts_b, labels)`` with a float32 label tensor."""
    a, b, y = zip(*items, strict=True)
    return list(a), list(b), torch.tensor(y, dtype=torch.float32)


def _rank_and_world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class PairStream(IterableDataset):
    """Freshly drawn training pairs, ``pairs_per_epoch`` per epoch over all processes.

    Each (epoch, rank, worker) has its own random stream seeded by ``(seed, epoch, rank,
    worker)``, so epochs see new pairs, DDP ranks and data-loader workers draw different
    ones, and a resumed run draws what an uninterrupted one would have.

    Args:
        questions: The fit pool.
        sampler: A sampler over the fit pool's ``SketchTable``.
        pairs_per_epoch: Pairs per epoch, split evenly across DDP ranks.
        seed: Base seed.
        epoch_fn: Returns the current epoch when an epoch's iteration starts.
    """

    def __init__(self, questions: QuestionSet, sampler: PairSampler, pairs_per_epoch: int, seed: int,
                 epoch_fn: Callable[[], int] = lambda: 0):
        self.questions, self.sampler = questions, sampler
        self.pairs_per_epoch, self.seed, self.epoch_fn = pairs_per_epoch, seed, epoch_fn
        self.skip = 0
        """Pairs to leave out at the start of the next pass (set by ``ResumableLoader`` on resume)."""

    def __len__(self) -> int:
        # Every rank gets the same number of pairs: DDP ranks must step the same number of times.
        return math.ceil(self.pairs_per_epoch / _rank_and_world()[1])

    def pairs(self, epoch: int, rank: int = 0, world: int = 1, worker: int = 0, workers: int = 1) -> list[Pair]:
        """The pairs one worker of one rank yields in ``epoch``."""
        per_rank = math.ceil(self.pairs_per_epoch / world)
        n = per_rank // workers + (worker < per_rank % workers)
        rng = np.random.default_rng([self.seed, _TRAIN_STREAM, epoch, rank, worker])
        texts = self.questions.texts
        return [(texts[a], texts[b], y) for a, b, y in self.sampler.sample(rng, n)]

    def __iter__(self):
        rank, world = _rank_and_world()
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        skip, self.skip = self.skip, 0  # a resumed epoch's first pass only
        return iter(self.pairs(self.epoch_fn(), rank, world, worker, workers)[skip:])


class ResumableLoader(DataLoader):
    """The training loader, resumable inside an epoch.

    Lightning stores the ``state_dict`` of a loader that has one in its checkpoints (also in the
    ``hpc_ckpt`` of a SLURM requeue) and hands it back before iterating on resume. The state is
    the epoch and the batches the fit loop had completed; on resume in that epoch those batches'
    pairs are skipped, so the rest of the epoch is what an uninterrupted run would have drawn.

    Args:
        stream: The pair stream (read in the main process: ``num_workers=0``).
        position_fn: Returns ``(epoch, batches completed in it)`` from the trainer.
        **kwargs: ``DataLoader`` arguments.
    """

    def __init__(self, stream: PairStream, position_fn: Callable[[], tuple[int, int]], **kwargs):
        super().__init__(stream, num_workers=0, **kwargs)
        self.position_fn = position_fn
        self._resume: tuple[int, int] | None = None

    def state_dict(self) -> dict[str, int]:
        """Where the fit loop is: ``{"epoch", "batches"}``."""
        epoch, batches = self.position_fn()
        return {"epoch": int(epoch), "batches": int(batches)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Skip ``state["batches"]`` batches when the next pass is of ``state["epoch"]``."""
        self._resume = (state["epoch"], state["batches"])

    def __iter__(self):
        if self._resume is not None:
            epoch, batches = self._resume
            self._resume = None
            if epoch == self.dataset.epoch_fn():
                self.dataset.skip = batches * self.batch_size
        return super().__iter__()


class PairDataModule(L.LightningDataModule):
    """The training split of one benchmark as streamed training pairs and fixed validation pairs.

    After ``setup``, ``fit_pool`` and ``heldout`` hold the two sides of the cut (texts and
    sketches), and ``hit_queries`` and ``hit_pool`` the parts of them validation encodes for
    sketch-hit@k. Each stage of ``setup`` is timed in the log.

    Args:
        data_name: Benchmark name (``data.name``).
        data_root: Benchmark folder (``data.root``); the embedded copy for ``mini-*`` when None.
        kb: ``custom`` only: the KB file (``data.kb``).
        cases: ``custom`` only: the cases file (``data.cases``), whose cases are the training split.
        label: Label function name (``structural.label``).
        label_bins: Label bins of the pair sampler.
        pairs_per_epoch: Training pairs per epoch.
        val_pairs: Validation pairs (fixed for the whole run).
        holdout: Share of questions held out, strictly between 0 and 1.
        batch_size: Pairs per batch.
        seed: Seed of the pair draws.
        hit_queries: Held-out questions that query for sketch-hit@k (``QuestionSet.first_by_hash``).
        hit_pool: Fit-pool questions they retrieve from.

    Raises:
        ConfigError: On a holdout share outside (0, 1) or non-positive pair counts.
    """

    def __init__(self, data_name: str, data_root: str | None = None, label: str = "seqmatch", label_bins: int = 5,
                 pairs_per_epoch: int = 2048, val_pairs: int = 1000, holdout: float = 0.1, batch_size: int = 32,
                 seed: int = 0, hit_queries: int = 2000, hit_pool: int = 10000, kb: str | None = None,
                 cases: str | None = None):
        super().__init__()
        if not 0 < holdout < 1:
            raise ConfigError(f"structural.holdout must be strictly between 0 and 1, got {holdout}")
        for key, value in (("pairs_per_epoch", pairs_per_epoch), ("val_pairs", val_pairs), ("batch_size", batch_size),
                           ("sketch_hit_queries", hit_queries), ("sketch_hit_pool", hit_pool)):
            if value < 1:
                raise ConfigError(f"structural.{key} must be positive, got {value}")
        self.data_name, self.data_root, self.label, self.label_bins = data_name, data_root, label, label_bins
        self.data_kb, self.data_cases = kb, cases
        self.pairs_per_epoch, self.val_pairs, self.holdout = pairs_per_epoch, val_pairs, holdout
        self.batch_size, self.seed, self.hit_sizes = batch_size, seed, (hit_queries, hit_pool)
        self.fit_pool: QuestionSet | None = None
        self.heldout: QuestionSet | None = None
        self.hit_queries: QuestionSet | None = None
        self.hit_pool: QuestionSet | None = None
        self._train_sampler: PairSampler | None = None
        self._val: list[Pair] = []

    def setup(self, stage: str | None = None) -> None:
        """Read the training split, cut it, and build both samplers (once per process)."""
        if self.fit_pool is not None:
            return
        clock = time.perf_counter()

        def timed(stage: str) -> None:  # what start-up costs at full size, stage by stage
            nonlocal clock
            now = time.perf_counter()
            log.info("setup: %s in %.1f s", stage, now - clock)
            clock = now

        bench = Benchmark(self.data_name, self.data_root, kb=self.data_kb, cases=self.data_cases)
        questions = [q for q in bench.questions(bench.family.train_split) if q.program is not None]
        timed(f"read {len(questions)} training questions")
        fit, held = split_holdout(questions, self.holdout)
        if len(fit) < 2 or len(held) < 2:
            raise ConfigError(f"{self.data_name}: structural.holdout={self.holdout} leaves {len(fit)} fit and "
                             f"{len(held)} held-out questions; both sides need at least 2")
        self.fit_pool, self.heldout = QuestionSet.of(fit), QuestionSet.of(held)
        self.hit_queries = self.heldout.first_by_hash(self.hit_sizes[0])
        self.hit_pool = self.fit_pool.first_by_hash(self.hit_sizes[1])
        timed(f"cut into {len(fit)} fit and {len(held)} held-out questions, sketched")
        table = SketchTable(self.fit_pool.sketches, self.label)
        self._train_sampler = PairSampler(table, self.label_bins)
        timed(f"labels of the fit pool's {len(table)} distinct sketches")
        val_table = SketchTable(self.heldout.sketches, self.label)
        val_sampler = PairSampler(val_table, self.label_bins)
        rng = np.random.default_rng([self.seed, _VAL_STREAM])
        texts = self.heldout.texts
        self._val = [(texts[a], texts[b], y) for a, b, y in val_sampler.sample(rng, self.val_pairs)]
        timed(f"labels of the held-out {len(val_table)} distinct sketches and {len(self._val)} validation pairs")

    def _current_epoch(self) -> int:
        return self.trainer.current_epoch if self.trainer is not None else 0

    def train_dataloader(self) -> DataLoader:
        """Training pairs; a new draw each epoch."""
        stream = PairStream(self.fit_pool, self._train_sampler, self.pairs_per_epoch, self.seed, self._current_epoch)
        # Drawing pairs costs microseconds, so worker processes would only add start-up time.
        return ResumableLoader(stream, self._position, batch_size=self.batch_size, collate_fn=collate_pairs)

    def _position(self) -> tuple[int, int]:
        loop = self.trainer.fit_loop.epoch_loop
        return self.trainer.current_epoch, loop.batch_progress.current.completed

    def val_dataloader(self) -> DataLoader:
        """The fixed validation pairs, in order."""
        return DataLoader(self._val, batch_size=self.batch_size, shuffle=False, collate_fn=collate_pairs)
