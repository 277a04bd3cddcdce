"""How alike two programs are, and which question pairs the retriever trains on.

The label of a question pair is a similarity of its two function sketches in [0, 1]. Most
random pairs of KQA Pro questions have dissimilar programs, so pairs drawn uniformly would
teach the encoder mostly "near zero"; the sampler instead draws a label bin first, so every
part of the label range is seen about equally often.

A training pool can have thousands of distinct sketches (tested up to 20,000), so nothing here
holds a table over all pairs of them. The sampler counts, per sketch, its partners
in each label bin, scoring one block of sketches against the rest at a time in rapidfuzz's C
code (``process.cdist``, each sketch written one character per function); a drawn pair's row is
scored again when drawn, and only drawn pairs get their label.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence

import numpy as np
from rapidfuzz.distance import LCSseq
from rapidfuzz.process import cdist

from cbr2.common.errors import ConfigError, UserError

Sketch = tuple[str, ...]
LabelFn = Callable[[Sketch, Sketch], float]


def seqmatch(a: Sketch, b: Sketch) -> float:
    """``difflib.SequenceMatcher`` ratio of two sketches: 2·matches / (len a + len b).

    difflib matches greedily, so the ratio can depend on which sketch comes first (about 5% of
    mini-kqapro's sketch pairs); the larger of the two is taken, which makes the label
    symmetric like the cosine it trains.
    """
    return max(difflib.SequenceMatcher(None, a, b).ratio(), difflib.SequenceMatcher(None, b, a).ratio())


def lcs(a: Sketch, b: Sketch) -> float:
    """Longest common subsequence of two sketches over the longer one's length."""
    return LCSseq.normalized_similarity(a, b)


LABELS: dict[str, LabelFn] = {"seqmatch": seqmatch, "lcs": lcs}
"""``structural.label`` → label function."""


def _ratio_bound(a: list[str], b: list[str], len_a: np.ndarray, len_b: np.ndarray) -> np.ndarray:
    # 2·LCS / (len a + len b): the ratio difflib would give if its greedy matching always found a
    # longest common subsequence, so never below ``seqmatch``; divided as difflib divides, so
    # the two are the same float wherever they agree. On mini-kqapro's 20,706 sketch pairs it
    # differs on 1.5% (mean |error| 0.0019, max 0.23) and bins 0.8% of pairs one bin higher.
    common = cdist(a, b, scorer=LCSseq.similarity, dtype=np.int64, workers=-1)
    return 2.0 * common / np.maximum(len_a[:, None] + len_b[None, :], 1)


def _lcs_scores(a: list[str], b: list[str], len_a: np.ndarray, len_b: np.ndarray) -> np.ndarray:
    return cdist(a, b, scorer=LCSseq.normalized_similarity, dtype=np.float64, workers=-1)


BinScorer = Callable[[list[str], list[str], np.ndarray, np.ndarray], np.ndarray]

BIN_SCORERS: dict[str, BinScorer] = {"seqmatch": _ratio_bound, "lcs": _lcs_scores}
"""``structural.label`` → the scores that bin sketch pairs for sampling, over sketches written one
character per function (and their lengths): ``lcs`` itself, and for ``seqmatch`` its upper bound
through the longest common subsequence (difflib has no vectorised form; on 20,000 random sketches
of 2-15 functions it differs on 8% of pairs, mean |error| 0.008, 4% one bin higher). The label a
drawn pair trains on is always the label function's own."""

_BLOCK_CELLS = 4_000_000
"""Sketch pairs scored per ``cdist`` call while counting: bounds the memory of the count (32 MB
of float64 scores), whatever the number of distinct sketches."""


def label_fn(name: str) -> LabelFn:
    """The label function called ``name``.

    Raises:
        ConfigError: On an unknown name, listing the known ones.
    """
    if name not in LABELS:
        raise ConfigError(f"unknown structural.label {name!r}; expected one of {', '.join(LABELS)}")
    return LABELS[name]


class SketchTable:
    """Questions grouped by distinct sketch; labels of sketch pairs, computed when asked for.

    Many questions share a sketch, so a label is computed once per distinct sketch pair and
    looked up for question pairs.

    Args:
        sketches: The sketch of each question, in question order.
        label: A label name (see ``LABELS``).

    Attributes:
        distinct: The distinct sketches, in order of first appearance.
        of_question: Per question, the index of its sketch in ``distinct``.
        members: Per distinct sketch, the indices of its questions.
        codes: Per distinct sketch, one character per function (what the bin scorer reads).
    """

    def __init__(self, sketches: Sequence[Sketch], label: str = "seqmatch"):
        self.fn = label_fn(label)
        self.scorer = BIN_SCORERS[label]
        index: dict[Sketch, int] = {}
        self.of_question = np.array([index.setdefault(tuple(s), len(index)) for s in sketches], dtype=np.int64)
        self.distinct: list[Sketch] = list(index)
        order = np.argsort(self.of_question, kind="stable")
        starts = np.searchsorted(self.of_question[order], np.arange(len(index) + 1))
        self.members: list[np.ndarray] = [order[starts[i]:starts[i + 1]] for i in range(len(index))]
        alphabet: dict[str, str] = {}
        self.codes = ["".join(alphabet.setdefault(f, chr(0x100 + len(alphabet))) for f in s) for s in self.distinct]
        self._lengths = np.array([len(c) for c in self.codes], dtype=np.int64)
        self._labels: dict[tuple[int, int], float] = {}

    def __len__(self) -> int:
        return len(self.distinct)

    def label(self, i: int, j: int) -> float:
        """The label of distinct sketches ``i`` and ``j`` (computed on the first call)."""
        key = (i, j) if i <= j else (j, i)
        if key not in self._labels:
            self._labels[key] = self.fn(self.distinct[key[0]], self.distinct[key[1]])
        return self._labels[key]

    def bin_scores(self, rows: slice | np.ndarray, start: int) -> np.ndarray:
        """``(rows, len - start)`` float64 bin scores of the sketches ``rows`` (a slice or indices)
        against those from ``start`` on."""
        codes = self.codes[rows] if isinstance(rows, slice) else [self.codes[i] for i in rows]
        return self.scorer(codes, self.codes[start:], self._lengths[rows], self._lengths[start:])


class PairSampler:
    """Draws question pairs so that the label range is covered evenly.

    A draw picks one of ``bins`` equal-width label bins over [0, 1] uniformly among the
    non-empty ones, then a pair of sketches in that bin uniformly, then a question of each
    sketch. A sketch paired with itself (label 1.0, top bin) is a candidate only when at least
    two questions have it, and then gives two different questions. Pairs are binned by the
    table's bin scorer (``BIN_SCORERS``).

    Only per-sketch counts are kept (``len(table) × bins``): the k-th pair of a bin is found
    through them and its scored row, so memory is linear in the distinct sketches.

    Args:
        table: The questions' sketches and labels.
        bins: Number of label bins.

    Raises:
        ConfigError: If ``bins < 1``.
        UserError: If no pair of two different questions exists.
    """

    def __init__(self, table: SketchTable, bins: int = 5):
        if bins < 1:
            raise ConfigError(f"structural.label_bins must be at least 1, got {bins}")
        self.table = table
        self.bins = bins
        n = len(table)
        self._pairs_itself = np.array([len(m) >= 2 for m in table.members])
        counts = np.zeros((n, bins), dtype=np.int64)  # sketch i's partners j >= i, per bin
        rows = max(1, _BLOCK_CELLS // max(n, 1))
        for lo in range(0, n, rows):
            hi = min(n, lo + rows)
            which = self._bins(table.bin_scores(slice(lo, hi), lo))  # (hi - lo, n - lo)
            offset = np.arange(hi - lo)[:, None]
            which[np.arange(n - lo)[None, :] < offset] = -1  # below the diagonal: counted from the other side
            diagonal = which[np.arange(hi - lo), np.arange(hi - lo)]
            which[np.arange(hi - lo), np.arange(hi - lo)] = np.where(self._pairs_itself[lo:hi], diagonal, -1)
            for b in range(bins):
                counts[lo:hi, b] = (which == b).sum(axis=1)
        self.sizes = counts.sum(axis=0)
        """Pairs of sketches in each bin."""
        self._cumulative = np.cumsum(counts, axis=0)  # (n, bins): pairs in rows 0..i of each bin
        self.nonempty = np.flatnonzero(self.sizes)
        if not len(self.nonempty):
            raise UserError(f"no pair of two different questions among {len(table.of_question)} questions")

    def _bins(self, scores: np.ndarray) -> np.ndarray:
        # Label 1.0 belongs to the top bin, not to a bin of its own.
        return np.minimum((scores * self.bins).astype(np.int64), self.bins - 1)

    def _pairs(self, which_bin: np.ndarray, k: np.ndarray) -> np.ndarray:
        """``(n, 2)`` sketch pairs ``(i, j)``, ``i <= j``: the ``k``-th of bin ``which_bin`` in row-major order.

        The rows the pairs lie in are scored again, a block of them per ``cdist`` call.
        """
        rows = np.array([np.searchsorted(self._cumulative[:, b], x, side="right")
                         for b, x in zip(which_bin, k, strict=True)], dtype=np.int64)
        before = np.where(rows > 0, self._cumulative[np.maximum(rows - 1, 0), which_bin], 0)
        out = np.empty((len(k), 2), dtype=np.int64)
        out[:, 0] = rows
        unique, of_draw = np.unique(rows, return_inverse=True)
        draws_of = np.split(np.argsort(of_draw, kind="stable"), np.cumsum(np.bincount(of_draw))[:-1])
        n = len(self.table)
        per_call = max(1, _BLOCK_CELLS // max(n, 1))
        for lo in range(0, len(unique), per_call):
            block = unique[lo:lo + per_call]
            start = int(block[0])
            scores = self.table.bin_scores(block, start)  # (len(block), n - start)
            for r, i in enumerate(block):
                which = self._bins(scores[r, i - start:])  # partners j >= i
                if not self._pairs_itself[i]:
                    which[0] = -1
                for d in draws_of[lo + r]:
                    out[d, 1] = i + np.flatnonzero(which == which_bin[d])[k[d] - before[d]]
        return out

    def sample(self, rng: np.random.Generator, n: int) -> list[tuple[int, int, float]]:
        """``n`` pairs as ``(question index, question index, label)``.

        Args:
            rng: The source of randomness; the same generator state gives the same pairs.
            n: How many pairs.
        """
        which_bin = rng.choice(self.nonempty, size=n)
        pairs = self._pairs(which_bin, rng.integers(self.sizes[which_bin])) if n else np.empty((0, 2), np.int64)
        out = []
        for si, sj in pairs.tolist():
            mi, mj = self.table.members[si], self.table.members[sj]
            qa = rng.integers(len(mi))
            if si == sj:  # two different questions of the same sketch
                qb = rng.integers(len(mi) - 1)
                qb += qb >= qa
            else:
                qb = rng.integers(len(mj))
            a, b_ = int(mi[qa]), int(mj[qb])
            if rng.random() < 0.5:  # neither side is always the shorter sketch
                a, b_ = b_, a
            out.append((a, b_, self.table.label(si, sj)))
        return out
