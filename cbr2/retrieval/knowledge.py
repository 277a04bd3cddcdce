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

from dataclasses import dataclass

import numpy as np

from cbr2.kb.model import KB
from cbr2.kb.triples import Triple, fact_triples, ontology_triples
from cbr2.retrieval.cache import EmbeddingStore
from cbr2.retrieval.encoders import encode, weights_fingerprint
from cbr2.retrieval.index import search, to_device


@dataclass(frozen=True)
class Knowledge:
    """Triples retrieved for one question, best first."""

    ontology: tuple[Triple, ...] = ()
    facts: tuple[Triple, ...] = ()

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

    def retrieve(self, query_embeddings: np.ndarray, linked: list[tuple[str, ...]] | None = None) -> list[Knowledge]:
        """Knowledge for each question embedding (rows of ``query_embeddings``).

        Args:
            query_embeddings: One row per question.
            linked: The entities each question names (``Links.entities``); their facts come first.
        """
        found = {}
        for label, triples, k in (("ontology", self.ontology, self.k_ontology), ("facts", self.facts, self.k_facts)):
            if label in self._indexes:
                _, ids = search(self._indexes[label], query_embeddings, k)
                found[label] = [tuple(triples[i] for i in row if i >= 0) for row in ids]
            else:
                found[label] = [()] * len(query_embeddings)
        if linked is not None and self._fact_embeddings is not None:
            found["facts"] = [self._linked_first(q, names, nearest)
                              for q, names, nearest in zip(query_embeddings, linked, found["facts"], strict=True)]
        return [Knowledge(ont, facts) for ont, facts in zip(found["ontology"], found["facts"], strict=True)]

    def _linked_first(self, query: np.ndarray, names: tuple[str, ...], nearest: tuple[Triple, ...]) -> tuple[Triple, ...]:
        """The K_f facts: the linked entities' facts nearest the question, then ``nearest``."""
        ids = sorted({i for name in names for i in self.facts_of(name)})
        if not ids:
            return nearest
        scores = self._fact_embeddings[ids] @ query
        order = [ids[j] for j in np.argsort(-scores, kind="stable")[: self.k_facts]]
        chosen = [self.facts[i] for i in order]
        chosen += [t for t in nearest if t not in chosen]
        return tuple(chosen[: self.k_facts])
