"""Case retrieval: solved training questions found from two views, merged without duplicates.

* ``semantic``: the questions most similar in meaning (the knowledge encoder, e.g. bge-m3);
* ``structural``: the questions whose programs the trained structural retriever predicts to
  be most alike (a MiniLM fine-tuned on sketch similarity, see ``cbr2.structural``);
* ``random``: random training questions, seeded per question (the ``random_case`` ablation).

A query is only an id and a text: retrieval never sees the program or answer of the question
it serves. The id is used for one thing, to keep a question from being its own case.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cbr2.data.questions import Question
from cbr2.retrieval.cache import EmbeddingStore
from cbr2.retrieval.encoders import encode, weights_fingerprint
from cbr2.retrieval.index import search, to_device

VIEWS = ("semantic", "structural", "random")


@dataclass(frozen=True)
class Query:
    """All that retrieval may see of a question."""

    qid: str
    text: str


@dataclass(frozen=True)
class Case:
    """A retrieved training question (with its gold program: that is what a case is for).

    Attributes:
        question: The training question.
        views: The views that found it, in merge order.
        scores: Its similarity in each of those views (None for ``random``).
    """

    question: Question
    views: tuple[str, ...]
    scores: tuple[float | None, ...]


Ranking = list[tuple[int, float | None]]
"""Pool indices with scores, best first."""


class CaseRetriever:
    """Ranks a training pool for queries, per view.

    Args:
        pool: The training questions cases are drawn from.
        store: Embedding/index cache.
        encoders: Per embedding view (``semantic``, ``structural``), ``(name, model)``; a view
            without an encoder cannot be ranked.
        index_kind: ``flat``, ``hnsw`` or ``ivf``.
        device: Where searches run.
        batch_size: Encoder batch size for the pool.
        seed: Seed of the ``random`` view.
        texts: Per view, the pool's texts as that view encodes them (default: the questions
            as written; masked ones with ``retrieval.mask_mentions``).
    """

    def __init__(self, pool: Sequence[Question], store: EmbeddingStore, encoders: dict[str, tuple[str, object]],
                 index_kind: str = "flat", device: str = "cpu", batch_size: int = 64, seed: int = 0,
                 texts: dict[str, list[str]] | None = None):
        self.pool = list(pool)
        self.seed = seed
        self._position = {q.qid: i for i, q in enumerate(self.pool)}
        self._indexes = {}
        self.embeddings: dict[str, np.ndarray] = {}
        """The pool's embeddings per view (the knowledge retriever reuses the semantic ones)."""
        written = [q.question for q in self.pool]
        for view, (name, model) in encoders.items():
            view_texts = (texts or {}).get(view, written)
            self.embeddings[view], index = store.get("cases", view_texts, name, weights_fingerprint(model),
                                 lambda t, m=model: encode(m, t, batch_size), index_kind)
            self._indexes[view] = to_device(index, device)

    def rank(self, view: str, queries: Sequence[Query], k: int, embeddings: np.ndarray | None = None) -> list[Ranking]:
        """The top-``k`` pool entries of each query in one view, the query itself excluded.

        Args:
            view: One of ``VIEWS``.
            queries: The questions, as id and text.
            k: Cases per query.
            embeddings: The queries encoded by the view's encoder (not needed for ``random``).
        """
        if k <= 0:
            return [[] for _ in queries]
        if view == "random":
            return [self._random(q, k) for q in queries]
        if view not in self._indexes:
            raise ValueError(f"case view {view!r} has no encoder; built views: {', '.join(self._indexes) or 'none'}")
        # One extra hit covers the query itself when it is in the pool (evaluating train).
        scores, ids = search(self._indexes[view], embeddings, k + 1)
        out = []
        for q, row_scores, row_ids in zip(queries, scores, ids, strict=True):
            self_pos = self._position.get(q.qid)
            ranked = [(int(i), float(s)) for s, i in zip(row_scores, row_ids) if i >= 0 and i != self_pos]
            out.append(ranked[:k])
        return out

    def _random(self, query: Query, k: int) -> Ranking:
        # Seeded by the question id, so a question gets the same cases in any order or shard.
        rng = np.random.default_rng([self.seed, int(hashlib.sha256(query.qid.encode()).hexdigest()[:12], 16)])
        self_pos = self._position.get(query.qid)
        picks = [int(i) for i in rng.permutation(len(self.pool))[: k + 1] if i != self_pos]
        return [(i, None) for i in picks[:k]]

    def merge(self, rankings: dict[str, Ranking]) -> list[Case]:
        """One case list from several views' rankings, in view order, duplicates removed.

        A case found by several views appears once, at its first place, and keeps every view
        that found it with that view's score.
        """
        found: dict[int, tuple[list[str], list[float | None]]] = {}
        for view, ranking in rankings.items():
            for idx, score in ranking:
                views, scores = found.setdefault(idx, ([], []))
                views.append(view)
                scores.append(score)
        return [Case(self.pool[i], tuple(v), tuple(s)) for i, (v, s) in found.items()]
