"""How alike two programs are, and which question pairs the retriever trains on.

The label of a question pair is a similarity of its two function sketches in [0, 1]. Most
random pairs of KQA Pro questions have dissimilar programs, so pairs drawn uniformly would
teach the encoder mostly "near zero"; the sampler instead draws a label bin first, so every
part of the label range is seen about equally often.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence

import numpy as np
from rapidfuzz.distance import LCSseq

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


def label_fn(name: str) -> LabelFn:
    """The label function called ``name``.

    Raises:
        ConfigError: On an unknown name, listing the known ones.
    """
    if name not in LABELS:
        raise ConfigError(f"unknown structural.label {name!r}; expected one of {', '.join(LABELS)}")
    return LABELS[name]


class SketchTable:
    """Questions grouped by distinct sketch, with the label of every pair of distinct sketches.

    Many questions share a sketch (a few hundred sketches cover KQA Pro), so the label is
    computed once per distinct sketch pair and looked up for question pairs.

    Args:
        sketches: The sketch of each question, in question order.
        label: A label name (see ``LABELS``) or a function of two sketches.

    Attributes:
        distinct: The distinct sketches, in order of first appearance.
        of_question: Per question, the index of its sketch in ``distinct``.
        members: Per distinct sketch, the indices of its questions.
        matrix: Symmetric ``(len(distinct), len(distinct))`` float64 label matrix.
    """

    def __init__(self, sketches: Sequence[Sketch], label: str | LabelFn = "seqmatch"):
        fn = label_fn(label) if isinstance(label, str) else label
        index: dict[Sketch, int] = {}
        self.of_question = np.array([index.setdefault(tuple(s), len(index)) for s in sketches], dtype=np.int64)
        self.distinct: list[Sketch] = list(index)
        self.members: list[np.ndarray] = [np.flatnonzero(self.of_question == i) for i in range(len(index))]
        n = len(self.distinct)
        self.matrix = np.zeros((n, n), dtype=np.float64)
        for i in range(n):
            for j in range(i, n):
                self.matrix[i, j] = self.matrix[j, i] = fn(self.distinct[i], self.distinct[j])

    def __len__(self) -> int:
        return len(self.distinct)


class PairSampler:
    """Draws question pairs so that the label range is covered evenly.

    A draw picks one of ``bins`` equal-width label bins over [0, 1] uniformly among the
    non-empty ones, then a pair of sketches in that bin uniformly, then a question of each
    sketch. A sketch paired with itself (label 1.0, top bin) is a candidate only when at least
    two questions have it, and then gives two different questions.

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
        i, j = np.triu_indices(len(table))
        sizes = np.array([len(m) for m in table.members])
        keep = (i != j) | (sizes[i] >= 2)  # a sketch pairs with itself only through two questions
        i, j = i[keep], j[keep]
        # Label 1.0 belongs to the top bin, not to a bin of its own.
        which = np.minimum((table.matrix[i, j] * bins).astype(np.int64), bins - 1)
        self.pairs_in_bin: list[np.ndarray] = [np.stack([i[which == b], j[which == b]], axis=1) for b in range(bins)]
        self.nonempty = np.array([b for b in range(bins) if len(self.pairs_in_bin[b])], dtype=np.int64)
        if not len(self.nonempty):
            raise UserError(f"no pair of two different questions among {len(table.of_question)} questions")

    def sample(self, rng: np.random.Generator, n: int) -> list[tuple[int, int, float]]:
        """``n`` pairs as ``(question index, question index, label)``.

        Args:
            rng: The source of randomness; the same generator state gives the same pairs.
            n: How many pairs.
        """
        out = []
        for b in rng.choice(self.nonempty, size=n):
            candidates = self.pairs_in_bin[b]
            si, sj = candidates[rng.integers(len(candidates))]
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
            out.append((a, b_, float(self.table.matrix[si, sj])))
        return out
