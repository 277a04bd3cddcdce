"""Everything retrieved for a question, from one configuration: knowledge and cases.

``Retriever`` loads the encoders once, encodes each batch of questions once per encoder and
asks the knowledge and case retrievers. Its input is ``Query`` (id and text); the gold
program and answer of an evaluated question never reach this module.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cbr2.common.devices import pick_device
from cbr2.common.errors import ConfigError
from cbr2.common.files import cache_root
from cbr2.config import RetrievalConfig
from cbr2.data.benchmarks import Benchmark
from cbr2.data.reading import DataError
from cbr2.retrieval.cache import EmbeddingStore
from cbr2.retrieval.cases import VIEWS, Case, CaseRetriever, Query, Ranking
from cbr2.retrieval.encoders import encode, load_encoder, weights_fingerprint
from cbr2.retrieval.knowledge import Knowledge, KnowledgeRetriever
from cbr2.retrieval.linking import Linker, Links

log = logging.getLogger(__name__)

CASE_MODES: dict[str, tuple[str, ...]] = {
    "dual": ("semantic", "structural"),
    "semantic": ("semantic",),
    "structural": ("structural",),
    "random": ("random",),
    "none": (),
}
"""``retrieval.cases`` → the views whose cases go into the prompt, in merge order."""

METRIC_DEPTH = 5
"""Every computed view ranks at least this deep, so sketch-hit@5 is always measurable."""


@dataclass
class Retrieved:
    """What one question gets.

    Attributes:
        query: The question as retrieval saw it.
        knowledge: Its ontology and fact triples.
        cases: The merged cases of the configured views (the prompt's cases).
        case_knowledge: The triples retrieved for each case's own question, aligned with
            ``cases`` (the prompt shows each case with its knowledge).
        rankings: Per computed view, pool indices with scores, at least ``METRIC_DEPTH`` deep.
        links: What the question names (``retrieval.link``; None when off).
        case_links: What each case's question names, aligned with ``cases`` (empty when off).
    """

    query: Query
    knowledge: Knowledge
    cases: list[Case]
    case_knowledge: list[Knowledge] = field(default_factory=list)
    rankings: dict[str, Ranking] = field(default_factory=dict)
    links: Links | None = None
    case_links: list[Links] = field(default_factory=list)

    def to_record(self) -> dict:
        """One line of ``retrieval.jsonl``: ``id``, ``links`` (with linking), the question's
        ``ontology`` and ``facts`` triples (text, best first) with their similarities
        (``ontology_scores``, ``facts_scores``, aligned; left out when not known), and its
        ``cases``, each with ``views`` and their ``scores`` and its own triples."""
        k = self.knowledge
        scores = {name: list(values) for name, values in (("ontology_scores", k.ontology_scores),
                                                          ("facts_scores", k.facts_scores)) if values}
        return {
            "id": self.query.qid,
            **({"links": self.links.to_record()} if self.links is not None else {}),
            "ontology": [t.text for t in k.ontology],
            "facts": [t.text for t in k.facts],
            **scores,
            "cases": [{"id": c.question.qid, "views": list(c.views), "scores": list(c.scores),
                       "ontology": [t.text for t in k.ontology], "facts": [t.text for t in k.facts]}
                      for c, k in zip(self.cases, self.case_knowledge or [Knowledge()] * len(self.cases), strict=True)],
        }


def check_retrieval_config(retrieval: RetrievalConfig, cache_dir: str | Path | None = None) -> None:
    """Fail on a bad ``retrieval`` section before anything slow (training, encoding) starts.

    Args:
        retrieval: The ``retrieval`` section.
        cache_dir: The cache root (the configuration's ``cache_dir``; ``cache_root``), where an ONNX
            encoder's export is kept.

    Raises:
        OSError: When ``retrieval.encoder`` cannot be loaded (it is then cached for later use).
    """
    if retrieval.k_ontology > 0 or retrieval.k_facts > 0 or "semantic" in CASE_MODES[retrieval.cases]:
        load_encoder(retrieval.encoder, pick_device(retrieval.device), retrieval.encoder_backend, cache_dir)


class Retriever:
    """Knowledge and case retrieval for one benchmark and configuration.

    Args:
        bench: Gives the KB and the training pool (its family's train split).
        retrieval: The ``retrieval`` section.
        structural: Encoder of the structural view (a trained checkpoint folder); only needed
            when a structural view is computed.
        extra_views: Views ranked for metrics beyond those the cases use (``--retrieval-only``
            ranks all of them).
        cache_dir: The cache root of the embeddings, indexes and ONNX exports (the configuration's
            ``cache_dir``; ``cache_root``).

    Attributes:
        settings: The ``retrieval`` section it was built with.
    """

    def __init__(self, bench: Benchmark, retrieval: RetrievalConfig, structural: str | None = None,
                 extra_views: Sequence[str] = (), cache_dir: str | Path | None = None):
        check_retrieval_config(retrieval, cache_dir)
        self.settings = retrieval
        self.case_views = CASE_MODES[retrieval.cases]
        self.views = tuple(v for v in VIEWS if v in self.case_views or v in extra_views)
        if "structural" in self.views and not structural:
            raise ConfigError("the structural view needs a structural retriever (structural.checkpoint)")
        store = self.store = EmbeddingStore(cache_root(cache_dir))
        device = pick_device(retrieval.device)
        self.pool = bench.questions(bench.family.train_split)
        if self.case_views and (missing := sum(q.program is None for q in self.pool)):
            # Cases are (question, gold program) pairs; MetaQA's come from the qtype files.
            raise DataError(f"{bench.root}: {missing:,} of the {len(self.pool):,} {bench.family.train_split} questions "
                            "have no gold program, and the case pool needs them (MetaQA: "
                            "{1,2,3}-hop/qa_train_qtype.txt); see python -m cbr2.data check")
        self.encoders: dict[str, tuple[str, object]] = {}
        if retrieval.k_ontology > 0 or retrieval.k_facts > 0 or "semantic" in self.views:
            self.encoders["semantic"] = (retrieval.encoder, load_encoder(retrieval.encoder, device,
                                                                          retrieval.encoder_backend, cache_dir))
        if "structural" in self.views:
            self.encoders["structural"] = (structural, load_encoder(structural, device, retrieval.encoder_backend,
                                                                    cache_dir))
        self.knowledge = None
        if retrieval.k_ontology > 0 or retrieval.k_facts > 0:
            name, model = self.encoders["semantic"]
            self.knowledge = KnowledgeRetriever(bench.kb, model, name, store, retrieval.k_ontology,
                                                retrieval.k_facts, retrieval.index, device, retrieval.batch_size)
        case_encoders = {v: self.encoders[v] for v in ("semantic", "structural") if v in self.views}
        self.linker = Linker(bench.kb) if retrieval.link or retrieval.mask_mentions else None
        self.masked = retrieval.mask_mentions
        masked_pool = [self.linker.mask(q.question) for q in self.pool] if self.masked else None
        texts = dict.fromkeys(case_encoders, masked_pool) if self.masked else None
        self.cases = CaseRetriever(self.pool, store, case_encoders, retrieval.index, device, retrieval.batch_size,
                                   retrieval.seed, texts)
        self._case_knowledge: dict[int, Knowledge] = {}
        self._pool_embeddings: np.ndarray | None = None
        self._case_links: dict[str, Links] = {}

    def _k(self, view: str) -> int:
        if view == "random":  # the random_case ablation keeps the prompt's number of cases
            return self.settings.k_semantic + self.settings.k_structural
        return self.settings.k_semantic if view == "semantic" else self.settings.k_structural

    def _depth(self, view: str) -> int:
        return max(self._k(view), METRIC_DEPTH)

    def encode(self, queries: Sequence[Query], cache: bool = False) -> dict[str, np.ndarray]:
        """The questions' embeddings, one row per query, under the keys ``retrieve`` reads.

        ``written/{view}`` is the question as written, ``masked/{view}`` with its mentions
        masked (``retrieval.mask_mentions``: cases are compared by what is asked, knowledge by
        what is named); knowledge always reads ``written/semantic``.

        Args:
            queries: The questions.
            cache: Keep the embeddings in the store (keyed by the exact texts): a rerun of the
                same questions, a resumed run or another setting over them encodes nothing.
                Worth it for a whole run (at KQA Pro size this encoding was 69% of a warm
                run's retrieval); not for one batch.
        """
        # One question per forward pass: padded batches change the last bits of an embedding
        # with its batch-mates, which can swap near-tied cases, so a question's prompt would
        # depend on which other questions are evaluated with it (eval.limit, shards). The cache
        # holds the same one-per-pass embeddings, so a cached run's prompts are the same.
        written = [q.text for q in queries]
        masked = [self.linker.mask(t) for t in written] if self.masked else None
        out = {}
        for view, (name, model) in self.encoders.items():
            # Knowledge reads the semantic encoder's written form; cases read each view's masked
            # form when masking, else its written one.
            forms = {"written": written} if not self.masked or view == "semantic" else {}
            if self.masked:
                forms["masked"] = masked
            for form, texts in forms.items():
                if cache and texts:
                    out[f"{form}/{view}"], _ = self.store.get(
                        f"queries-{form}", texts, name, weights_fingerprint(model),
                        lambda t, m=model: encode(m, t, 1, progress=False), index_kind=None)
                else:
                    out[f"{form}/{view}"] = encode(model, texts, 1, progress=False)
        return out

    def retrieve(self, queries: Sequence[Query], embeddings: dict[str, np.ndarray] | None = None) -> list[Retrieved]:
        """Knowledge, cases and per-view rankings for each query.

        Args:
            queries: The questions, as id and text.
            embeddings: Their ``encode`` rows (rows in the order of ``queries``); encoded here
                when None.
        """
        if embeddings is None:
            embeddings = self.encode(queries)
        links = [self.linker.link(q.text) for q in queries] if self.settings.link else None
        knowledge = (self.knowledge.retrieve(embeddings["written/semantic"], [l.entities for l in links] if links else None)
                     if self.knowledge else [Knowledge()] * len(queries))
        form = "masked" if self.masked else "written"
        rankings = {view: self.cases.rank(view, queries, self._depth(view), embeddings.get(f"{form}/{view}"))
                    for view in self.views}
        out = []
        for i, query in enumerate(queries):
            mine = {view: rankings[view][i] for view in self.views}
            cases = self.cases.merge({view: mine[view][: self._k(view)] for view in self.case_views})
            item = Retrieved(query, knowledge[i], cases, rankings=mine, links=links[i] if links else None)
            if self.settings.link:
                item.case_links = [self._link_case(c.question) for c in cases]
            out.append(item)
        self._add_case_knowledge(out)
        return out

    def _link_case(self, question) -> Links:
        """A pool question's links (memoised): its text only, like the target's."""
        if question.qid not in self._case_links:
            self._case_links[question.qid] = self.linker.link(question.question)
        return self._case_links[question.qid]

    def _pool_semantic(self) -> np.ndarray:
        """The pool's questions in the knowledge encoder's space, loaded once.

        The semantic case view holds them already unless it encodes masked questions; otherwise
        they come from the cache (or are computed and cached).
        """
        if self._pool_embeddings is None and not self.masked:
            self._pool_embeddings = self.cases.embeddings.get("semantic")
        if self._pool_embeddings is None:
            name, model = self.encoders["semantic"]
            self._pool_embeddings, _ = self.store.get(
                "cases", [q.question for q in self.pool], name, weights_fingerprint(model),
                lambda t: encode(model, t, self.settings.batch_size), self.settings.index)
        return self._pool_embeddings

    def _add_case_knowledge(self, items: list[Retrieved]) -> None:
        """Give every case the knowledge its own question retrieves (memoised per pool question)."""
        if self.knowledge is None:
            for item in items:
                item.case_knowledge = [Knowledge()] * len(item.cases)
            return
        position = {q.qid: i for i, q in enumerate(self.pool)}
        missing = sorted({position[c.question.qid] for item in items for c in item.cases} - self._case_knowledge.keys())
        if missing:
            linked = [self._link_case(self.pool[i]).entities for i in missing] if self.settings.link else None
            found = self.knowledge.retrieve(np.ascontiguousarray(self._pool_semantic()[missing]), linked)
            self._case_knowledge.update(zip(missing, found, strict=True))
        for item in items:
            item.case_knowledge = [self._case_knowledge[position[c.question.qid]] for c in item.cases]
