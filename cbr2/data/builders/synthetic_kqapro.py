"""A KQA Pro-sized synthetic KB in the official ``kb.json`` schema, with questions over it.

    kb, questions = generate(scale=1.0, seed=0)      # 17,000 entities, ~650,000 fact triples

``benchmarks/scale.py`` profiles the pipeline on it; nothing else depends on it. At scale 1 the
KB has KQA Pro's published sizes (16,960 entities rounded to 17,000, 794 concepts, 846
attribute keys, 363 relations; 200 qualifier keys); at another scale every count is
multiplied by it (with small floors) and the per-entity shape stays: 25 attribute values
(each key once) and about 12.5 forward relation facts per entity, each mirrored backward on
its object as the official file does (so about 25 relation entries per entity).

The ontology is realistic rather than random, so that what is derived from it (ontology
triples, the grammar's closed lists, the canonicaliser's slots) has a real KB's size:

* concepts form a forest of about 60 concepts per root, up to 4 levels deep, some with two
  parents; roots are abstract, the other concepts have instances, with Zipf popularity (the
  most popular, like KQA Pro's ``human``, holds about a seventh of the entities), and one
  entity in ten is a direct instance of a second concept of its family;
* attribute keys are typed (string 35 %, quantity 35 % with one unit per key, date 15 %,
  year 15 %); each root owns a pool of keys (plus a shared pool), each concept declares 6-12
  keys of its family's pools and inherits its parents'; an entity's 25 keys come from its
  concepts', the common ones more often;
* every concept with instances has 3-7 (relation, range concept) pairs, relations drawn with
  Zipf popularity and each relation ending in 1-3 range concepts, so relations connect a
  bounded set of concept pairs (about 5 per concept);
* about two keys and relations in three have 1-2 qualifier keys; 15 % of their attribute
  values and 25 % of their relation facts carry one qualifier value.

Questions come from the mini-kqapro generator (``mini_kqapro_questions``: the 9 categories,
descriptions checked to single out their entity, 10 choices) run on this KB; every gold
answer is what the official engine (``Executor(engine="kopl")``) returns for the program, and
programs with an empty, multiple or failing answer are dropped. Everything is a function of
``(scale, seed)``.

``build_splits`` writes a training pool and a validation set of KQA Pro's sizes (94,376 and
11,797 questions at full size) in its category mix: the validation counts per category are the
official ones, training follows the same proportions; ``write_benchmark`` puts them in a folder
``Benchmark("kqapro", folder)`` reads. The generator's shapes grow slowly with the pool: 166
distinct sketches at 500 questions, 242 at 1,000, 328 at 2,000, 420 at 4,000, 531 at 8,000
(about 105 more per doubling, on a scale-0.05 KB), so about 900 at 94,376; KQA Pro's own
composition (descriptions of up to two conditions, ``And``/``Or`` sets, nine categories) is of
the same kind, and the structural label stage is tested up to 20,000 distinct sketches, well
above either.
"""

from __future__ import annotations

import datetime as dt
import inspect
import logging
import math
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from cbr2.data.questions import KQAPRO_CATEGORIES

log = logging.getLogger(__name__)

VERSION = 1
"""Bump when the output for a given ``(scale, seed)`` changes (``benchmarks/scale.py`` keys its reuse on it)."""

QUESTIONS_PER_CATEGORY = 40
"""Default questions per category (9 categories: 360 questions)."""

TRAIN_SIZE, VAL_SIZE = 94_376, 11_797
"""KQA Pro's training and validation sizes (``build_splits`` at full size)."""


@dataclass(frozen=True)
class Sizes:
    """Counts of a synthetic KB.

    Attributes:
        entities, concepts, keys, relations, qualifier_keys: Schema and entity counts.
        attributes_per_entity: Attribute values per entity (each key at most once).
        forward_relations_per_entity: Mean forward relation facts per entity.
    """

    entities: int
    concepts: int
    keys: int
    relations: int
    qualifier_keys: int
    attributes_per_entity: int = 25
    forward_relations_per_entity: float = 12.5


FULL = Sizes(entities=17000, concepts=794, keys=846, relations=363, qualifier_keys=200)
"""KQA Pro's sizes (qualifier keys rounded)."""

FLOORS = Sizes(entities=300, concepts=24, keys=60, relations=20, qualifier_keys=8)
"""Least counts at small scales, so every category still has material."""


def sizes_at(scale: float) -> Sizes:
    """``FULL`` times ``scale``, each count at least its ``FLOORS`` value.

    Raises:
        ValueError: If ``scale`` is not positive.
    """
    if not scale > 0:
        raise ValueError(f"scale must be positive, got {scale!r}")
    counts = {f: max(getattr(FLOORS, f), round(getattr(FULL, f) * scale))
              for f in ("entities", "concepts", "keys", "relations", "qualifier_keys")}
    return replace(FULL, **counts)


# --------------------------------------------------------------------------- names

_SYLLABLES = ("ka", "lo", "mir", "ven", "ta", "ri", "so", "bel", "dor", "an", "el", "is", "ur", "gan", "ne",
              "pol", "tra", "vi", "zen", "hal", "mo", "ser", "fa", "ti", "ber", "lin", "od", "ra", "nu",
              "cas", "er", "im", "ol", "pe", "sa", "to", "wen", "ya", "dra", "gor")
_CONCEPT_HEADS = ("site", "group", "work", "person", "organisation", "award", "place", "event", "vessel",
                  "station", "body", "series", "region", "device", "species", "district", "language", "team",
                  "building", "prize", "festival", "journal", "mountain", "river", "school", "company")
_KEY_FORMS = {
    "string": ("{w} code", "{w} name", "{w} status", "{w} label", "{w} style", "{w} category"),
    "quantity": ("{w} height", "{w} length", "{w} mass", "{w} area", "{w} count", "{w} rate", "{w} score",
                 "{w} population", "{w} duration", "{w} capacity"),
    "date": ("date of {w}", "{w} date", "{w} day"),
    "year": ("year of {w}", "{w} year", "{w} season"),
}
_RELATION_FORMS = ("{w}", "{w} of", "{w} by", "{w}ed in", "{w} with", "member of {w}", "{w}ed at")
_QUALIFIER_FORMS = {"year": ("{w} time", "{w} point in time"), "date": ("{w} start", "{w} end date"),
                    "string": ("{w} role", "{w} mode"), "quantity": ("{w} share", "{w} amount")}
_UNITS = ("metre", "kilogram", "square kilometre", "United States dollar", "second", "kilometre", "litre",
          "tonne", "hectare", "euro", "centimetre", "gram")
_KEY_TYPES = (("string", 0.35), ("quantity", 0.35), ("date", 0.15), ("year", 0.15))
_QUALIFIER_TYPES = (("year", 0.4), ("date", 0.25), ("string", 0.2), ("quantity", 0.15))


class _Names:
    """Unique word-like names (one namespace for all kinds, so no key is also a relation)."""

    def __init__(self, rng: random.Random):
        self.rng, self.used = rng, set()

    def word(self, low: int = 2, high: int = 3) -> str:
        return "".join(self.rng.choice(_SYLLABLES) for _ in range(self.rng.randint(low, high)))

    def unique(self, make: Callable[[], str]) -> str:
        while True:
            name = make()
            if name.lower() not in self.used:
                self.used.add(name.lower())
                return name

    def entity(self) -> str:
        return self.unique(lambda: " ".join(self.word().capitalize() for _ in range(self.rng.choice((1, 2, 2, 3)))))

    def formed(self, forms: tuple[str, ...]) -> str:
        return self.unique(lambda: self.rng.choice(forms).format(w=self.word()))


def _weighted_type(rng: random.Random, table: tuple[tuple[str, float], ...]) -> str:
    return rng.choices([t for t, _ in table], [w for _, w in table])[0]


def _zipf(n: int, exponent: float = 1.0) -> list[float]:
    return [1.0 / (rank + 1) ** exponent for rank in range(n)]


def _weighted_sample(rng: random.Random, items: list, weights: list[float], k: int) -> list:
    """``k`` distinct items, each drawn with probability proportional to its weight (A-ES)."""
    keyed = sorted(((rng.random() ** (1.0 / w), i) for i, w in enumerate(weights)), reverse=True)
    return [items[i] for _, i in keyed[:k]]


# --------------------------------------------------------------------------- the KB

@dataclass
class _Key:
    name: str
    type: str
    unit: str | None = None  # quantities: "1" when unitless
    pool: list[str] | None = None  # strings: the values it takes
    scale: float = 1.0  # quantities: typical magnitude
    integral: bool = True
    qualifiers: tuple[str, ...] = ()
    weight: float = 1.0  # how common the key is among a concept's instances


class _KBBuilder:
    def __init__(self, sizes: Sizes, rng: random.Random):
        self.s, self.rng, self.names = sizes, rng, _Names(rng)

    # -- values
    def value(self, key: _Key) -> dict[str, Any]:
        rng = self.rng
        if key.type == "string":
            return {"type": "string", "value": rng.choice(key.pool)}
        if key.type == "quantity":
            x = key.scale * math.exp(rng.gauss(0, 0.8))
            number: float = max(1, round(x)) if key.integral else round(x, 2) or 0.5
            return {"type": "quantity", "value": number, "unit": key.unit}
        if key.type == "date":
            day = dt.date(1700, 1, 1) + dt.timedelta(days=rng.randrange(320 * 365))
            return {"type": "date", "value": day.isoformat()}
        return {"type": "year", "value": rng.randint(1500, 2020)}

    def typed_key(self, kind: str, forms: dict[str, tuple[str, ...]]) -> _Key:
        rng = self.rng
        key = _Key(self.names.formed(forms[kind]), kind, weight=rng.random() ** 2 + 0.05)
        if kind == "string":
            size = int(math.exp(rng.uniform(math.log(4), math.log(400))))
            key.pool = sorted({self.names.word(2, 4) for _ in range(size)})
        elif kind == "quantity":
            key.unit = "1" if rng.random() < 0.35 else rng.choice(_UNITS)
            key.scale = 10 ** rng.uniform(0, 7)
            key.integral = rng.random() < 0.7
        return key

    # -- schema
    def build(self) -> dict[str, Any]:
        s, rng = self.s, self.rng
        qkeys = [self.typed_key(_weighted_type(rng, _QUALIFIER_TYPES), _QUALIFIER_FORMS) for _ in range(s.qualifier_keys)]
        keys = [self.typed_key(_weighted_type(rng, _KEY_TYPES), _KEY_FORMS) for _ in range(s.keys)]
        for key in keys:
            if rng.random() < 0.65:
                key.qualifiers = tuple(sorted({q.name for q in rng.sample(qkeys, rng.choice((1, 1, 2)))}))
        qkey_by_name = {q.name: q for q in qkeys}

        # Concepts: a forest; roots abstract, the rest carry instances.
        n_roots = max(3, round(s.concepts / 60))
        cids = [f"Q{i}" for i in range(1, s.concepts + 1)]
        parents: dict[str, list[str]] = {}
        depth: dict[str, int] = {}
        family: dict[str, int] = {}
        cname: dict[str, str] = {}
        for i, cid in enumerate(cids):
            cname[cid] = self.names.unique(lambda: f"{self.names.word()} {rng.choice(_CONCEPT_HEADS)}"
                                           if rng.random() < 0.8 else self.names.word())
            if i < n_roots:
                parents[cid], depth[cid], family[cid] = [], 0, i
                continue
            candidates = [c for c in cids[:i] if depth[c] < 4]
            first = rng.choice(candidates)
            parents[cid] = [first]
            depth[cid], family[cid] = depth[first] + 1, family[first]
            if rng.random() < 0.08:
                second = [c for c in candidates if family[c] == family[first] and c != first]
                if second:
                    parents[cid].append(rng.choice(second))
        # Keys: a pool per family and a shared one; each concept declares some and inherits its parents'.
        shuffled = keys[:]
        rng.shuffle(shuffled)
        n_shared = max(4, len(keys) // 10)
        shared, rest = shuffled[:n_shared], shuffled[n_shared:]
        pools = [rest[f::n_roots] + shared for f in range(n_roots)]
        declared: dict[str, list[_Key]] = {}
        own_keys: dict[str, list[_Key]] = {}
        for cid in cids:
            inherited = {k.name: k for p in parents[cid] for k in declared[p]}
            pool = [k for k in pools[family[cid]] if k.name not in inherited]
            own = rng.sample(pool, min(len(pool), 12 if not parents[cid] else rng.randint(6, 12)))
            own_keys[cid] = own
            declared[cid] = list(inherited.values()) + own
        instance_concepts = cids[n_roots:]

        # Entities: direct concepts by Zipf popularity, one in ten with a second of its family.
        popularity = instance_concepts[:]
        rng.shuffle(popularity)
        weights = _zipf(len(popularity))
        eids = [f"Q{s.concepts + i}" for i in range(1, s.entities + 1)]
        direct: dict[str, list[str]] = {}
        members: dict[str, list[str]] = {c: [] for c in instance_concepts}
        by_family: dict[int, list[str]] = {}
        for c in instance_concepts:
            by_family.setdefault(family[c], []).append(c)
        for eid, first in zip(eids, rng.choices(popularity, weights, k=len(eids)), strict=True):
            own = [first]
            if rng.random() < 0.1:
                others = [c for c in by_family[family[first]] if c != first]
                if others:
                    own.append(rng.choice(others))
            direct[eid] = own
            for c in own:
                members[c].append(eid)
        entities: dict[str, dict[str, Any]] = {}
        for eid in eids:
            available = list({k.name: k for c in direct[eid] for k in declared[c]}.values())
            chosen = _weighted_sample(rng, available, [k.weight for k in available],
                                      min(s.attributes_per_entity, len(available)))
            attributes = []
            for key in chosen:
                quals: dict[str, list[dict]] = {}
                if key.qualifiers and rng.random() < 0.15:
                    q = qkey_by_name[rng.choice(key.qualifiers)]
                    quals[q.name] = [self.value(q)]
                attributes.append({"key": key.name, "value": self.value(key), "qualifiers": quals})
            entities[eid] = {"name": self.names.entity(), "instanceOf": direct[eid], "attributes": attributes,
                             "relations": []}

        # Relations: each ends in 1-3 range concepts; each concept with instances uses 3-7 of them.
        populated = [c for c in instance_concepts if len(members[c]) >= 2]
        relations = []
        for _ in range(s.relations):
            name = self.names.formed(_RELATION_FORMS)
            ranges = _weighted_sample(rng, populated, [len(members[c]) for c in populated], rng.choice((1, 1, 2, 3)))
            quals = tuple(sorted({q.name for q in rng.sample(qkeys, rng.choice((1, 2)))})) \
                if rng.random() < 0.65 else ()
            relations.append((name, ranges, quals))
        rel_weights = _zipf(len(relations), 0.8)
        pairs: dict[str, list[tuple[int, str]]] = {}
        for c in instance_concepts:
            chosen = _weighted_sample(rng, list(range(len(relations))), rel_weights, rng.randint(3, 7))
            pairs[c] = [(r, rng.choice(relations[r][1])) for r in chosen]
        seen: set[tuple[str, int, str]] = set()
        forward_budget = s.forward_relations_per_entity
        for eid in eids:
            options = [p for c in direct[eid] for p in pairs[c]]
            wanted = rng.randint(math.floor(forward_budget * 0.7), math.ceil(forward_budget * 1.3))
            made = tries = 0
            while made < wanted and tries < 4 * wanted:
                tries += 1
                r, target = rng.choice(options)
                obj = rng.choice(members[target])
                if obj == eid or (eid, r, obj) in seen:
                    continue
                seen.add((eid, r, obj))
                name, _, qual_keys = relations[r]
                quals = {}
                if qual_keys and rng.random() < 0.25:
                    q = qkey_by_name[rng.choice(qual_keys)]
                    quals[q.name] = [self.value(q)]
                entities[eid]["relations"].append({"relation": name, "direction": "forward", "object": obj,
                                                   "qualifiers": quals})
                entities[obj]["relations"].append({"relation": name, "direction": "backward", "object": eid,
                                                   "qualifiers": {k: [dict(v) for v in vs] for k, vs in quals.items()}})
                made += 1
        concepts = {cid: {"name": cname[cid], "subclassOf": parents[cid]} for cid in cids}
        return {"concepts": concepts, "entities": entities}


def build_kb(scale: float = 1.0, seed: int = 0) -> dict[str, Any]:
    """The synthetic KB at ``scale``, as a dict in the newer official ``kb.json`` schema.

    Raises:
        ValueError: If ``scale`` is not positive.
    """
    sizes = sizes_at(scale)
    return _KBBuilder(sizes, random.Random(f"synthetic-kqapro-kb-{seed}")).build()


# --------------------------------------------------------------------------- questions

def make_executor(kb: Any, engine: str = "kopl", timeout_s: float | None = None) -> Any:
    """``Executor(kb, timeout_s, engine=engine)``; the default engine where ``Executor`` has no choice."""
    from cbr2.kopl.executor import Executor

    if "engine" in inspect.signature(Executor).parameters:
        return Executor(kb, timeout_s, engine=engine)
    log.warning("this Executor has no engine choice; using its default engine instead of %r", engine)
    return Executor(kb, timeout_s)


def build_questions(kb_dict: dict[str, Any], seed: int = 0, per_category: int = QUESTIONS_PER_CATEGORY,
                    engine: str = "kopl", executor: Any = None) -> list[dict[str, Any]]:
    """Questions of every KQA Pro category over ``kb_dict``, in the official question-file format.

    Args:
        kb_dict: A KB dict in the newer official schema (read only).
        seed: Seed of the question RNG.
        per_category: Questions wanted per category (fewer when the KB cannot give them).
        engine: The executor engine whose answers are the gold answers (``kopl``: the reference).
        executor: An executor over the same KB to use instead of building one.

    Returns:
        ``[{question, program: [{function, dependencies, inputs}], choices, answer}]``, shuffled.
    """
    from cbr2.data.builders.mini_kqapro_questions import _Generator
    from cbr2.data.kb_loaders import kqapro_kb_from_dict
    from cbr2.kopl.program import Program

    if executor is None:
        executor = make_executor(kqapro_kb_from_dict(kb_dict, "<synthetic kqapro>"), engine)
    rng = random.Random(f"synthetic-kqapro-questions-{seed}")
    gen = _Generator(kb_dict, lambda program: executor.run(Program.from_json(program)), rng)
    items: list[dict[str, Any]] = []
    for category in KQAPRO_CATEGORIES:
        got, attempts = 0, 0
        while got < per_category and attempts < 100 * per_category:
            attempts += 1
            record = getattr(gen, category)()
            if record is not None:
                items.append(record["item"])
                got += 1
        if got < per_category:
            log.warning("%s: %d of %d questions after %d attempts", category, got, per_category, attempts)
    rng.shuffle(items)
    return items


def split_counts(n: int) -> dict[str, int]:
    """Questions per category for a split of ``n``: KQA Pro's validation mix (exactly its counts
    at ``VAL_SIZE``), each category at least ``min(100, n // 9)``."""
    from cbr2.data.builders.mini_kqapro_questions import _train_quotas

    return _train_quotas(n)


def build_splits(kb_dict: dict[str, Any], seed: int = 0, n_train: int = TRAIN_SIZE, n_val: int = VAL_SIZE,
                 engine: str = "kopl", executor: Any = None) -> dict[str, list[dict[str, Any]]]:
    """A training pool and a validation set over ``kb_dict`` in KQA Pro's category mix.

    Every question's answer is what ``engine`` returns for its program (``cbr2`` is the faster
    one at full size; ``check_answers`` reruns a sample on the other). No question text is in
    both splits.

    Args:
        kb_dict: A KB dict in the newer official schema (read only).
        seed: Seed of the question RNG (a stream of its own, apart from ``build_questions``').
        n_train: Training questions (``split_counts`` per category).
        n_val: Validation questions.
        engine: The executor engine whose answers are the gold answers.
        executor: An executor over the same KB to use instead of building one.

    Returns:
        ``{"train": [...], "val": [...]}`` in the official question-file format, each shuffled.

    Raises:
        ValueError: If the KB cannot give a category's questions (after 100 attempts per question).
    """
    from cbr2.data.builders.mini_kqapro_questions import _Generator
    from cbr2.data.kb_loaders import kqapro_kb_from_dict
    from cbr2.kopl.program import Program

    if executor is None:
        executor = make_executor(kqapro_kb_from_dict(kb_dict, "<synthetic kqapro>"), engine)
    rng = random.Random(f"synthetic-kqapro-splits-{seed}")
    gen = _Generator(kb_dict, lambda program: executor.run(Program.from_json(program)), rng)
    train_counts, val_counts = split_counts(n_train), split_counts(n_val)
    splits: dict[str, list[dict[str, Any]]] = {"train": [], "val": []}
    for category in KQAPRO_CATEGORIES:
        wanted = train_counts[category] + val_counts[category]
        items: dict[str, dict[str, Any]] = {}  # by question text: a text is in one split only
        attempts = 0
        while len(items) < wanted and attempts < 100 * wanted:
            attempts += 1
            record = getattr(gen, category)()
            if record is not None:
                items.setdefault(record["item"]["question"], record["item"])
        if len(items) < wanted:
            raise ValueError(f"{category}: the KB gave {len(items)} distinct questions of {wanted} "
                             f"after {attempts} attempts")
        made = list(items.values())
        rng.shuffle(made)
        splits["val"] += made[:val_counts[category]]
        splits["train"] += made[val_counts[category]:]
    for name in sorted(splits):
        rng.shuffle(splits[name])
    return splits


def check_answers(kb_dict: dict[str, Any], items: list[dict[str, Any]], engine: str = "kopl", sample: int = 200,
                  seed: int = 0) -> list[str]:
    """Rerun up to ``sample`` of ``items``' programs on ``engine``; the questions whose answer differs.

    What the gold answers promise (each program executes to its answer), checked on a seeded
    sample where a full pool would take hours on the reference engine.
    """
    from cbr2.data.kb_loaders import kqapro_kb_from_dict
    from cbr2.kopl.program import Program

    executor = make_executor(kqapro_kb_from_dict(kb_dict, "<synthetic kqapro>"), engine)
    picked = random.Random(f"synthetic-kqapro-check-{seed}").sample(items, min(sample, len(items)))
    wrong = []
    for item in picked:
        try:
            out = executor.run(Program.from_json(item["program"]))
        except Exception:  # noqa: BLE001 - a program that fails is a wrong answer here
            out = None
        # As the generator reads an answer: the distinct values, as text.
        got = sorted({str(x) for x in out}) if isinstance(out, (list, tuple, set)) else [str(out)]
        if got != [item["answer"]]:
            wrong.append(item["question"])
    return wrong


def write_benchmark(folder: Any, scale: float = 1.0, seed: int = 0, n_train: int | None = None,
                    n_val: int | None = None, engine: str = "cbr2") -> dict[str, Any]:
    """Write ``kb.json``, ``train.json`` and ``val.json`` of the synthetic KB at ``scale`` into ``folder``.

    Question counts default to KQA Pro's times ``scale`` (at least 9 x 4 training and 9 x 2
    validation questions).

    Returns:
        ``{"kb_mb", "train", "val", "per_category": {split: {category: n}}, "sketches": {split: n}}``.
    """
    import json
    from pathlib import Path

    from cbr2.data.questions import kqapro_category
    from cbr2.kopl.program import Program
    from cbr2.kopl.sketch import sketch

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    n_train = n_train if n_train is not None else max(36, round(TRAIN_SIZE * scale))
    n_val = n_val if n_val is not None else max(18, round(VAL_SIZE * scale))
    kb = build_kb(scale, seed)
    with (folder / "kb.json").open("w", encoding="utf-8") as handle:
        json.dump(kb, handle, ensure_ascii=False, separators=(",", ":"))
    splits = build_splits(kb, seed, n_train, n_val, engine)
    stats: dict[str, Any] = {"kb_mb": (folder / "kb.json").stat().st_size / 1e6, "per_category": {}, "sketches": {}}
    for name, items in splits.items():
        (folder / f"{name}.json").write_text(json.dumps(items, ensure_ascii=False), encoding="utf-8")
        programs = [Program.from_json(q["program"]) for q in items]
        stats[name] = len(items)
        stats["per_category"][name] = dict(Counter(kqapro_category(p) for p in programs))
        stats["sketches"][name] = len({tuple(sketch(p)) for p in programs})
    return stats


def generate(scale: float = 1.0, seed: int = 0, per_category: int = QUESTIONS_PER_CATEGORY,
             engine: str = "kopl") -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The synthetic KB at ``scale`` and questions over it whose answers ``engine`` gives.

    Returns:
        ``(kb_dict, questions)``: the KB in the newer official ``kb.json`` schema and the questions
        in the official ``val.json`` format (``question, program, choices, answer``).
    """
    kb = build_kb(scale, seed)
    return kb, build_questions(kb, seed, per_category, engine)


def question_stats(questions: list[dict[str, Any]]) -> dict[str, int]:
    """Questions per category."""
    from cbr2.data.questions import kqapro_category
    from cbr2.kopl.program import Program

    counts = Counter(kqapro_category(Program.from_json(q["program"])) for q in questions)
    return {c: counts.get(c, 0) for c in KQAPRO_CATEGORIES}
