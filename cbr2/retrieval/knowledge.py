"""Knowledge retrieval: the top-K_o ontology triples and top-K_f fact triples for a question.

The two kinds are indexed and searched separately (the paper's Section 4.1), so schema
constraints are never crowded out by the far more numerous facts.

With linking (``retrieval.link``), the facts of the question's own entities come first: the
facts with a linked entity as subject or object, ranked by the same embedding similarity, then
the nearest facts of the whole KB fill the rest of the K_f. A fact about the question's entity
shows the relation and which side of it that entity is on (``Australia | capital | Canberra``
for "the country whose capital is Canberra"); a fact of an unrelated entity mostly invites the
model to copy that entity.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cbr2.kb.model import KB
from cbr2.kb.triples import Triple, fact_triples, ontology_triples
from cbr2.retrieval.cache import EmbeddingStore
from cbr2.retrieval.encoders import encode, weights_fingerprint
from cbr2.retrieval.index import search, to_device

Scored = tuple[Triple, float]
"""A retrieved triple with its similarity to the question."""


@dataclass(frozen=True)
class Knowledge:
    """Triples retrieved for one question, best first.

    Attributes:
        ontology: Ontology triples.
        facts: Fact triples.
        ontology_scores: The question's similarity to each ontology triple (inner product of
            their embeddings), aligned with ``ontology``; empty when not known (built by hand).
        facts_scores: The same for ``facts``.
    """

    ontology: tuple[Triple, ...] = ()
    facts: tuple[Triple, ...] = ()
    ontology_scores: tuple[float, ...] = ()
    facts_scores: tuple[float, ...] = ()

    def terms(self) -> set[tuple[str, str]]:
        """Schema items mentioned by any retrieved triple (for knowledge recall)."""
        return {term for t in (*self.ontology, *self.facts) for term in t.terms}


class KnowledgeRetriever:
    """Searches a KB's ontology and fact triples by embedding similarity.

    Args:
        kb: The knowledge base.
        model: Sentence encoder (the one that also embeds the questions).
        encoder: Its name (part of the cache key).
        store: Embedding/index cache.
        k_ontology: Ontology triples per question; 0 skips building that index.
        k_facts: Fact triples per question; 0 skips building that index.
        index_kind: ``flat``, ``hnsw`` or ``ivf``.
        device: Where searches run (``cpu`` or a GPU when faiss-gpu can).
        batch_size: Encoder batch size for the triples.
    """

    def __init__(self, kb: KB, model, encoder: str, store: EmbeddingStore, k_ontology: int = 10,
                 k_facts: int = 10, index_kind: str = "flat", device: str = "cpu", batch_size: int = 64):
        self.k_ontology, self.k_facts = k_ontology, k_facts
        fingerprint = weights_fingerprint(model)

        def embedder(total: int):
            # No encoder bar: the store shows one progress display over the resumable parts of a
            # large collection, and logs the start of a small one.
            return lambda texts: encode(model, texts, batch_size)

        self.ontology: list[Triple] = ontology_triples(kb) if k_ontology > 0 else []
        self.facts: list[Triple] = list(fact_triples(kb)) if k_facts > 0 else []
        self._indexes = {}
        self._fact_embeddings: np.ndarray | None = None
        for label, triples in (("ontology", self.ontology), ("facts", self.facts)):
            if triples:
                embeddings, index = store.get(label, [t.text for t in triples], encoder, fingerprint,
                                              embedder(len(triples)), index_kind)
                self._indexes[label] = to_device(index, device)
                if label == "facts":
                    self._fact_embeddings = embeddings
        # Entity name → its facts (as subject or as the object of a relation), built on first use.
        self._facts_of: dict[str, list[int]] | None = None

    def facts_of(self, name: str) -> list[int]:
        """Indices of the fact triples with ``name`` as subject or object."""
        if self._facts_of is None:
            by_name: dict[str, list[int]] = {}
            for i, t in enumerate(self.facts):
                by_name.setdefault(t.subject, []).append(i)
                if t.object != t.subject and ("relation", t.predicate) in t.terms:
                    by_name.setdefault(t.object, []).append(i)
            self._facts_of = by_name
        return self._facts_of.get(name, [])

    def retrieve(self, query_embeddings: np.ndarray,
                 linked: Sequence[tuple[str, ...]] | None = None) -> list[Knowledge]:
        """Knowledge for each question embedding (rows of ``query_embeddings``).

        Args:
            query_embeddings: One row per question.
            linked: The entities each question names (``Links.entities``); their facts come first.
        """
        # Each kind as (triple, score) pairs per question: the scores go into the records with the triples.
        found: dict[str, list[tuple[Scored, ...]]] = {}
        for label, triples, k in (("ontology", self.ontology, self.k_ontology), ("facts", self.facts, self.k_facts)):
            if label in self._indexes:
                scores, ids = search(self._indexes[label], query_embeddings, k)
                found[label] = [tuple((triples[i], float(s)) for s, i in zip(srow, row) if i >= 0)
                                for srow, row in zip(scores, ids, strict=True)]
            else:
                found[label] = [()] * len(query_embeddings)
        if linked is not None and self._fact_embeddings is not None:
            found["facts"] = [self._linked_first(q, names, nearest, self.k_facts)
                              for q, names, nearest in zip(query_embeddings, linked, found["facts"], strict=True)]
        return [Knowledge(tuple(t for t, _ in ont), tuple(t for t, _ in facts),
                          tuple(s for _, s in ont), tuple(s for _, s in facts))
                for ont, facts in zip(found["ontology"], found["facts"], strict=True)]

    def _linked_first(self, query: np.ndarray, names: tuple[str, ...], nearest: tuple[Scored, ...],
                      limit: int) -> tuple[Scored, ...]:
        """The linked entities' facts nearest the question, then ``nearest``; the first ``limit``.
        Each with its similarity: the inner product the index ranks ``nearest`` by."""
        ids = sorted({i for name in names for i in self.facts_of(name)})
        if not ids:
            return nearest[:limit]
        scores = self._fact_embeddings[ids] @ query
        order = np.argsort(-scores, kind="stable")[:limit]
        chosen = [(self.facts[ids[j]], float(scores[j])) for j in order]
        seen = {t for t, _ in chosen}
        chosen += [pair for pair in nearest if pair[0] not in seen]
        return tuple(chosen[:limit])
