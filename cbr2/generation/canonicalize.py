"""Argument canonicalisation: snap an argument the KB does not know to the nearest item it does.

The paper's error study finds programs that are right except for one schema name written as
a paraphrase ("altitude above sea level" where the KB says "elevation above sea level"); the
engine answers them with nothing. With ``generation.canonicalize`` every such argument is
compared with the valid items of its slot (``cbr2.kopl.grounding``) and replaced by the best
one when the similarity reaches ``generation.canonicalize_threshold``; each decision is
recorded in the prediction's ``canonicalized`` list, snapped or not.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from rapidfuzz import fuzz, process, utils

from cbr2.kb.model import Vocabulary
from cbr2.kopl.functions import get_spec
from cbr2.kopl.grounding import SLOT_KINDS, slot_items, unknown_arguments
from cbr2.kopl.program import Program, Step

if TYPE_CHECKING:  # the cache pulls faiss and the encoders torch; build_canonicalizer imports them when called
    from cbr2.config import RetrievalConfig
    from cbr2.data.benchmarks import Benchmark

log = logging.getLogger(__name__)

Embed = Callable[[Sequence[str]], np.ndarray]
"""Texts → one L2-normalised row each (inner product = cosine)."""

ItemEmbeddings = Callable[[str, Sequence[str]], np.ndarray]
"""(slot kind, its items in order) → their embeddings, e.g. from the on-disk cache."""

CANDIDATE_DEPTH = 20
"""Each retriever (lexical, embedding) proposes at least this many candidates for rescoring:
the combined score can rank an item first that neither ranks first on its own."""

_MEMO_SIZE = 4096
"""Argument embeddings kept per canonicaliser (a few MB for a 1024-dimensional encoder)."""

_TYPED_KEY_KINDS = ("key", "qkey")

_VALUE_TYPES: dict[str, frozenset[str]] = {
    "string": frozenset({"string"}),
    "quantity": frozenset({"quantity"}),
    # KoPL compares years and dates with each other (a date key filtered by a year compares its
    # year), and the vocabulary types a key with both as a date key, so each admits the other.
    "year": frozenset({"year", "date"}),
    "date": frozenset({"date", "year"}),
}

_QUANTITY_SELECTORS = frozenset({"SelectBetween", "SelectAmong"})
"""Functions that compare a key's values without a typed value argument: always quantities."""


def key_value_types(function: str | None) -> frozenset[str] | None:
    """The value types a key or qualifier key of ``function`` must have, or None when any will do.

    Read off the function table: the type of the function's value argument (``FilterNum`` and
    ``QFilterNum`` → quantity, ``FilterYear`` → year or date, ``FilterStr`` → string ...), and
    quantity for ``SelectBetween`` / ``SelectAmong``. Functions whose value is ``any``
    (``QueryAttrUnderCondition``) or that take none (``QueryAttr``) constrain nothing.
    """
    spec = get_spec(function) if function else None
    if spec is None:
        return None
    if spec.name in _QUANTITY_SELECTORS:
        return _VALUE_TYPES["quantity"]
    for arg in spec.args:
        if arg.kind in _VALUE_TYPES:
            return _VALUE_TYPES[arg.kind]
    return None


def lexical_similarity(a: str, b: str) -> float:
    """Case- and punctuation-insensitive string similarity in [0, 1].

    The better of the normalised edit similarity (typos: "Barak Obama") and its word-order
    insensitive variant ("birth date" / "date of birth"). Subset matching (``token_set_ratio``)
    is left out on purpose: it rates "city" and "big city" as identical.
    """
    return _lexical(utils.default_process(a), utils.default_process(b))


def _lexical(a: str, b: str) -> float:
    """``lexical_similarity`` of two already processed strings."""
    return max(fuzz.ratio(a, b), fuzz.token_sort_ratio(a, b)) / 100.0


@dataclass
class _Slot:
    """The valid items of one slot kind, in a fixed order, with what matching needs."""

    items: list[str]
    processed: list[str]
    types: list[str] | None  # per item, for key slots
    vectors: np.ndarray | None = None


class Canonicalizer:
    """Snaps program arguments that name no KB item to the nearest valid item of their slot.

    Similarity of a value to an item (``nearest``):

    * lexical: ``lexical_similarity`` (rapidfuzz, case-insensitive), in [0, 1];
    * semantic: cosine of their embeddings, clipped to [0, 1], when an encoder is given;
    * score: the mean of the two, or the lexical similarity alone without an encoder.

    The mean asks both signals to agree. The encoder recognises paraphrases that share few
    characters ("altitude above sea level" / "elevation above sea level": lexical 0.78,
    cosine 0.94, score 0.86), while the lexical half keeps it from snapping to items that are
    merely related ("date of birth" / "date of death": cosine 0.58, score 0.67; "height" /
    "elevation above sea level": 0.29). Taking the maximum instead would let the encoder alone
    decide, and sentence encoders rate many related-but-different schema names near 0.8.

    Args:
        vocab: The KB's vocabulary (``bench.kb.vocabulary``).
        embed: Texts → L2-normalised embeddings; None compares strings only.
        threshold: Least score of a snap; below it the argument is kept as written.
        item_embeddings: How a slot's items are embedded (``build_canonicalizer`` reads them
            from the embedding cache); by default ``embed`` itself. Ignored without ``embed``.
    """

    def __init__(self, vocab: Vocabulary, embed: Embed | None = None, threshold: float = 0.8,
                 item_embeddings: ItemEmbeddings | None = None):
        self.vocab = vocab
        self.embed = embed
        self.threshold = threshold
        self._item_embeddings = item_embeddings
        self._slots: dict[str, _Slot] = {}
        self._query_vectors: dict[str, np.ndarray] = {}

    def _query_vector(self, value: str) -> np.ndarray:
        """The embedding of an argument, memoised: generated programs repeat the same wrong names."""
        vector = self._query_vectors.get(value)
        if vector is None:
            if len(self._query_vectors) >= _MEMO_SIZE:
                self._query_vectors.clear()
            vector = np.asarray(self.embed([value]), dtype=np.float32).reshape(-1)
            self._query_vectors[value] = vector
        return vector

    def _slot(self, kind: str) -> _Slot:
        """The slot's items, processed strings and (with an encoder) embeddings, built on first use."""
        slot = self._slots.get(kind)
        if slot is None:
            items = sorted(slot_items(self.vocab, kind))  # sorted: sets have no stable order across runs
            types = None
            if kind in _TYPED_KEY_KINDS:
                table = self.vocab.keys if kind == "key" else self.vocab.qualifier_keys
                types = [table[item] for item in items]
            slot = _Slot(items, [utils.default_process(item) for item in items], types)
            if self.embed is not None:
                vectors = (self._item_embeddings(kind, items) if self._item_embeddings is not None
                           else self.embed(items))
                slot.vectors = np.ascontiguousarray(vectors, dtype=np.float32)
                if slot.vectors.shape[0] != len(items):
                    raise ValueError(f"{len(items)} {kind} items but {slot.vectors.shape[0]} embeddings")
            self._slots[kind] = slot
        return slot

    def prepare(self, kinds: Sequence[str] = SLOT_KINDS) -> None:
        """Build the slots now (embedding their items) instead of at the first unknown argument."""
        for kind in kinds:
            self._slot(kind)

    def nearest(self, value: str, kind: str, k: int = 5, function: str | None = None) -> list[tuple[str, float]]:
        """The valid items of a slot most similar to ``value``, best first.

        Candidates are the union of the lexical top items (``rapidfuzz.process.extract``) and
        the embedding top items (inner products with the slot's item vectors), each at least
        ``CANDIDATE_DEPTH`` deep, rescored with the combined score (see the class).

        Args:
            value: The argument as written.
            kind: Its slot kind (one of ``SLOT_KINDS``).
            k: How many items to return.
            function: The function the argument belongs to. For ``key`` and ``qkey`` slots it
                restricts candidates to keys of the value type the function compares
                (``key_value_types``), or to all keys when the KB has none of that type.

        Returns:
            Up to ``k`` ``(item, score)`` pairs, scores in [0, 1]; ties keep the items' order.

        Raises:
            KeyError: For a kind that does not name KB items.
        """
        slot = self._slot(kind)
        pool = self._restrict(slot, function)
        if k <= 0 or not len(pool):
            return []
        depth = min(max(k, CANDIDATE_DEPTH), len(pool))
        query = utils.default_process(value)
        candidates: set[int] = set()
        choices = slot.processed if len(pool) == len(slot.items) else [slot.processed[i] for i in pool]
        for scorer in (fuzz.ratio, fuzz.token_sort_ratio):
            candidates.update(int(pool[j]) for _, _, j in
                              process.extract(query, choices, scorer=scorer, processor=None, limit=depth))
        cosine: np.ndarray | None = None
        if slot.vectors is not None:
            cosine = slot.vectors @ self._query_vector(value)
            sims = cosine[pool]
            top = np.argpartition(-sims, depth - 1)[:depth] if depth < len(pool) else np.arange(len(pool))
            candidates.update(int(pool[j]) for j in top)
        scored = []
        for i in candidates:
            score = _lexical(query, slot.processed[i])
            if cosine is not None:
                score = (score + min(max(float(cosine[i]), 0.0), 1.0)) / 2.0
            scored.append((-score, i))
        scored.sort()
        return [(slot.items[i], -neg) for neg, i in scored[:k]]

    @staticmethod
    def _restrict(slot: _Slot, function: str | None) -> np.ndarray:
        """Indices of the slot's items a ``function`` argument may name (all when nothing fits)."""
        everything = np.arange(len(slot.items))
        wanted = key_value_types(function) if slot.types is not None else None
        if wanted is None:
            return everything
        typed = np.array([i for i, typ in enumerate(slot.types) if typ in wanted], dtype=np.int64)
        return typed if len(typed) else everything

    def __call__(self, program: Program) -> tuple[Program, list[dict[str, Any]]]:
        """Snap every argument of ``program`` that names no item of its slot.

        Returns:
            The program with snapped arguments replaced (steps otherwise unchanged; the same
            object when nothing snapped), and one record per unknown argument, in program order:
            ``{"step", "function", "arg", "kind", "from", "to", "score", "snapped"}``, where
            ``to`` is None and ``snapped`` False when the best item scores below the threshold
            (``score`` is then that best item's score, 0 when the slot is empty).
        """
        records = []
        inputs = [list(step.inputs) for step in program.steps]
        for unknown in unknown_arguments(program, self.vocab):
            best = self.nearest(unknown["value"], unknown["kind"], k=1, function=unknown["function"])
            item, score = best[0] if best else (None, 0.0)
            snapped = item is not None and score >= self.threshold
            if snapped:
                names = [arg.name for arg in get_spec(unknown["function"]).args]
                inputs[unknown["step"]][names.index(unknown["arg"])] = item
            records.append({"step": unknown["step"], "function": unknown["function"], "arg": unknown["arg"],
                            "kind": unknown["kind"], "from": unknown["value"], "to": item if snapped else None,
                            "score": round(score, 4), "snapped": snapped})
        if not any(r["snapped"] for r in records):
            return program, records
        steps = tuple(step if list(step.inputs) == new else Step(step.function, tuple(new), step.dependencies)
                      for step, new in zip(program.steps, inputs, strict=True))
        return Program(steps), records


def build_canonicalizer(retrieval: RetrievalConfig, threshold: float, bench: Benchmark,
                        cache_dir: str | Path | None = None) -> Canonicalizer:
    """The canonicaliser of a run: the benchmark's vocabulary, embedded with the retrieval encoder.

    The item embeddings of every slot go through the embedding cache (entries
    ``vocab-{kind}-...``), so a KQA Pro-sized vocabulary is encoded once and later runs, and
    concurrent shards, load it.

    Args:
        retrieval: The ``retrieval`` section: its ``encoder``, ``device``, ``encoder_backend`` and
            ``batch_size`` embed the vocabulary and the arguments.
        threshold: ``generation.canonicalize_threshold``, the least similarity of a snap.
        bench: Gives the KB whose vocabulary arguments are snapped to.
        cache_dir: The cache root of the embeddings (the configuration's ``cache_dir``; ``cache_root``).

    Raises:
        OSError: When the encoder cannot be loaded.
    """
    from cbr2.common.devices import pick_device
    from cbr2.common.files import cache_root
    from cbr2.retrieval.cache import EmbeddingStore
    from cbr2.retrieval.encoders import encode, load_encoder, weights_fingerprint

    model = load_encoder(retrieval.encoder, pick_device(retrieval.device), retrieval.encoder_backend, cache_dir)
    store = EmbeddingStore(cache_root(cache_dir))
    fingerprint = weights_fingerprint(model)

    def embed(texts: Sequence[str]) -> np.ndarray:
        # One text per forward pass, as the retriever embeds questions: padding with batch-mates
        # would change the last bits of a value's embedding.
        return encode(model, texts, 1, progress=False)

    def item_embeddings(kind: str, items: Sequence[str]) -> np.ndarray:
        vectors, _ = store.get(f"vocab-{kind}", items, retrieval.encoder, fingerprint,
                               lambda texts: encode(model, texts, retrieval.batch_size))
        return vectors

    canonicalizer = Canonicalizer(bench.kb.vocabulary, embed, float(threshold), item_embeddings)
    canonicalizer.prepare()
    log.info("canonicalisation: threshold %.2f, encoder %s", canonicalizer.threshold, retrieval.encoder)
    return canonicalizer
