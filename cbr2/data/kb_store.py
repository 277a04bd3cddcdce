"""The KB store: a KB file parsed once, kept on disk in a form later processes load in a second.

    kb = load_kb("data/kqapro/kb.json")          # a StoredKB (a KB); Benchmark.kb calls this

Parsing a KQA Pro-sized ``kb.json`` (~80 MB, 17,000 entities, ~650,000 facts with qualifiers)
costs every process that needs the KB 6-7 s and 0.9 GB (JSON, schema validation, the KB
model), and the engine's indexes over it another 1.7 s; a sweep pays that once per shard and
task. The store pays it once per file content: the first ``load_kb`` of a file parses and
validates it with the ordinary loader, builds the engine's indexes (``Engine.indexes``) and
writes an entry (8 s at full size, ``benchmarks/kb_store.py``); every later one, in any
process, hashes the file, finds the entry and returns a ``StoredKB`` (0.25 s) that reads only
what is asked of it:

* ``vocabulary``, ``concepts``, ``stats()``, ``name_of`` and ``source``: read with the entry
  (a small header);
* the engine's indexes: their directories are read when the first ``Engine``
  (``Executor(engine="cbr2")``) is built, and each attribute key, relation or entity's facts
  when a program first asks for it (``KeyedIndex``; all of them at full size took 0.35 s to
  load whole); shared by every engine of the KB, so ``Engine(kb)`` never walks the entities;
  a large KB's are frozen for the cyclic collector as they are read (``FREEZE_FACTS``);
* ``entities``: a read-only mapping whose every access unpickles that one entity from the
  entry (a fresh dict each time; mutating it changes nothing). Walking all of them (what fact
  and ontology triples and ``to_kopl_dict`` for ``engine="kopl"`` do) takes about 0.5 s at full
  size and holds only what the caller keeps: the nested dict of the whole KB is never in
  memory unless a caller builds it (``to_kopl_dict`` does, for the reference engine).

An entry is the folder ``<cache_root()>/kb/<sha256 of the file>/`` with ``store.bin`` (pickle
protocol 5 sections: a header, the four engine indexes (each keyed: a directory, then one pickle per key), the entity offsets as int64 and the
entities one pickle each, read through ``mmap``) and ``meta.json`` (format, kind, the source's
hash and size, the sections' offsets, the size and SHA-256 of ``store.bin``). Like the
retrieval cache (``cbr2.retrieval.cache``) it is written to a temporary folder and renamed into
place (``cbr2.common.files.publish_folder``) under a build lock (``cbr2.common.locks``), so shards starting together build it once and never
see half of it; on every load the metadata, sizes and checksum are verified (the file and
``store.bin`` are hashed once per file identity, ``cbr2.common.files.known_sha256``: a file
rewritten or touched is hashed anew), and an entry that
does not check out, whatever is wrong with it, is removed with a warning and rebuilt (the layout
and the writer: ``cbr2.data.kb_store_layout``). The
pickles are read with an unpickler that resolves no global except ``datetime.date`` (the only
one the store writes), so a planted entry cannot name a function for them to call. Entries of
other files or formats are not deleted (as in the retrieval cache).

When the entry cannot be written (a read-only cache, a full disk), the file changed while it
was read, or the engine cannot index the KB (a date that is neither a date nor a year, which
the schema check lets through), ``load_kb`` warns and returns the KB the loader read, as
before the store existed: the cbr2 engine then raises where it always did.
"""

from __future__ import annotations

import gc
import io
import json
import logging
import mmap
import pickle
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from functools import cached_property
from pathlib import Path
from typing import Any

from cbr2.common.files import cache_root, file_sha256, gc_paused, known_sha256, open_entry
from cbr2.common.locks import build_lock
from cbr2.data.kb_loaders import load_kqapro_kb, load_metaqa_kb, load_triples_kb
from cbr2.data.kb_store_layout import ENGINE_SECTIONS, FORMAT, HEADER_KEYS, MAGIC, SECTIONS, write_entry
from cbr2.kb.model import KB, Vocabulary

log = logging.getLogger(__name__)

LOADERS: dict[str, Callable[[str | Path], KB]] = {"kqapro": load_kqapro_kb, "metaqa": load_metaqa_kb,
                                                  "triples": load_triples_kb}
"""``kind`` → the loader that reads such a file (KQA Pro ``kb.json``, MetaQA ``kb.txt``, a triples
file of your own)."""

FREEZE_FACTS = 20_000
"""From this many facts on, each read of the engine's indexes ends with ``gc.freeze()``.

The indexes are millions of container objects without cycles (at full size). Left to the
collector, they are scanned by the first collections after loading and by every full one
(0.8 s over a 360-program run at full size, six times what the programs take); frozen, they
are never scanned (and still freed when the KB is dropped). ``gc.freeze`` moves every object
alive at that moment, not only the indexes (cycles among those are then never collected), so
small KBs, the embedded ones among them (under 5,000 facts), are left alone.
"""

# ----------------------------------------------------------------------------- helpers

class _Unpickler(pickle.Unpickler):
    """Resolves ``datetime.date`` and nothing else: the store's pickles hold only plain data."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("datetime", "date"):
            from datetime import date

            return date
        raise pickle.UnpicklingError(f"the KB store holds no {module}.{name}")


def _loads(data: memoryview | bytes) -> Any:
    return _Unpickler(io.BytesIO(data)).load()


def _infer_kind(path: Path) -> str:
    return "metaqa" if path.suffix == ".txt" else "kqapro"


# ----------------------------------------------------------------------------- the stored KB

class StoredEntities(Mapping):
    """``KB.entities`` of a stored KB: entity id → a fresh dict, unpickled from the entry per access.

    Iteration follows the KB's order. Nothing is cached, so walking every entity holds one at
    a time; a caller that needs the same entities many times should keep the dicts it gets.
    """

    def __init__(self, ids: list[str], offsets: memoryview, data: memoryview):
        self._ids, self._offsets, self._data = ids, offsets, data

    @cached_property
    def _position(self) -> dict[str, int]:
        return {eid: i for i, eid in enumerate(self._ids)}

    def _load(self, i: int) -> dict[str, Any]:
        return _loads(self._data[self._offsets[i]:self._offsets[i + 1]])

    def __getitem__(self, eid: str) -> dict[str, Any]:
        return self._load(self._position[eid])

    def __contains__(self, eid: object) -> bool:
        return eid in self._position

    def __iter__(self) -> Iterator[str]:
        return iter(self._ids)

    def __len__(self) -> int:
        return len(self._ids)

    def values(self) -> Iterator[dict[str, Any]]:  # type: ignore[override]
        """The entities in KB order (one pass; a generator, unlike ``dict.values``)."""
        for i in range(len(self._ids)):
            yield self._load(i)

    def items(self) -> Iterator[tuple[str, dict[str, Any]]]:  # type: ignore[override]
        """``(id, entity)`` in KB order (one pass; a generator, unlike ``dict.items``)."""
        return zip(self._ids, self.values())

    def __repr__(self) -> str:
        return f"<StoredEntities: {len(self)} entities>"


class KeyedIndex(Mapping):
    """One of the engine's fact indexes in a store entry (``kb_store_layout.write_keyed``): key →
    value, each value unpickled when its key is first asked for and kept from then on.

    A run reads the attribute keys, relations and entities its programs touch: 30 KQA Pro
    questions at full size read a few percent of the 29 MB of indexes, where loading them whole
    took 0.35 s. With ``freeze`` (a large KB, ``FREEZE_FACTS``) each value read ends with
    ``gc.freeze()``, as the whole load did, so the collector does not rescan them; there are at
    most as many such reads as keys.
    """

    def __init__(self, view: memoryview, freeze: bool = False):
        size = int.from_bytes(view[:8], "little")
        with gc_paused():
            self._directory: dict[Any, tuple[int, int]] = _loads(view[8:8 + size])
        self._data, self._freeze = view[8 + size:], freeze
        self._loaded: dict[Any, Any] = {}

    def __getitem__(self, key: Any) -> Any:
        try:
            return self._loaded[key]
        except KeyError:
            pass
        start, length = self._directory[key]  # KeyError for a key the index lacks, as a dict
        with gc_paused():
            value = self._loaded[key] = _loads(self._data[start:start + length])
            if self._freeze:
                gc.freeze()
        return value

    def __contains__(self, key: object) -> bool:
        return key in self._directory

    def __iter__(self) -> Iterator[Any]:
        return iter(self._directory)

    def __len__(self) -> int:
        return len(self._directory)

    @property
    def read(self) -> int:
        """How many keys have been read so far."""
        return len(self._loaded)

    def __repr__(self) -> str:
        return f"<KeyedIndex: {self.read} of {len(self)} keys read>"


class KBStore:
    """One opened, verified store entry.

    Attributes:
        entry: The entry's folder.
        meta: Its ``meta.json``.
        header: The header section (concepts, entity ids, vocabulary, stats, node ids and
            names, concept members, key types).
    """

    def __init__(self, entry: Path, meta: dict[str, Any], header: dict[str, Any], view: memoryview):
        self.entry, self.meta, self.header = entry, meta, header
        self._view = view

    def section(self, name: str) -> memoryview:
        """The bytes of a section (a view of the mapped file, no copy)."""
        start, length = self.meta["sections"][name]
        return self._view[start:start + length]

    @cached_property
    def engine_indexes(self) -> dict[str, Any]:
        """What ``Engine.indexes`` returned when the entry was built, its four fact indexes as
        ``KeyedIndex`` mappings that read a key when it is first asked for; shared by every engine."""
        started = time.perf_counter()
        head = self.header
        indexes = {k: head[k] for k in ("ids", "nodes", "names", "members", "key_type")}
        large = head["stats"].get("attribute_facts", 0) + head["stats"].get("relation_facts", 0) >= FREEZE_FACTS
        for name in ENGINE_SECTIONS:
            indexes[name] = KeyedIndex(self.section(name), freeze=large)
        log.debug("KB store %s: engine index directories read in %.2f s", self.entry, time.perf_counter() - started)
        return indexes

    @cached_property
    def entities(self) -> StoredEntities:
        offsets = self.section("entity_offsets").cast("q")
        return StoredEntities(self.header["entity_ids"], offsets, self.section("entities"))

    @cached_property
    def vocabulary(self) -> Vocabulary:
        return Vocabulary(**self.header["vocabulary"])


class StoredKB(KB):
    """A ``KB`` read from the store (see the module docstring for what each part costs).

    ``concepts``, ``vocabulary``, ``stats()`` and ``name_of`` come from the entry's header;
    ``entities`` is a ``StoredEntities``; ``Engine(kb)`` takes ``engine_indexes()`` instead of
    walking the entities. Pickling it pickles the entry's path (it reopens the entry).
    """

    def __init__(self, store: KBStore, source: str):  # not the dataclass __init__: the fields are properties
        self.store = store
        self.source = source
        self.__dict__["vocabulary"] = store.vocabulary  # KB.vocabulary is a cached_property

    @property
    def concepts(self) -> dict[str, dict[str, Any]]:  # type: ignore[override]
        return self.store.header["concepts"]

    @property
    def entities(self) -> StoredEntities:  # type: ignore[override]
        return self.store.entities

    def engine_indexes(self) -> dict[str, Any]:
        """The engine's indexes (``cbr2.kopl.engine.Engine`` uses them instead of building its own)."""
        return self.store.engine_indexes

    @cached_property
    def _node(self) -> dict[str, int]:
        return {i: n for n, i in enumerate(self.store.header["ids"][:self.store.header["nodes"]])}

    def entity_ids_by_name(self) -> dict[str, list[str]]:
        """Each entity name's ids, from the header (no entity is unpickled)."""
        names, node, ids = self.store.header["names"], self._node, {}
        for eid in self.store.header["entity_ids"]:
            ids.setdefault(names[node[eid]], []).append(eid)
        return ids

    def name_of(self, item_id: str) -> str:
        """Name of an entity or concept id (an entity's when the id is both, as in ``KB``)."""
        return self.store.header["names"][self._node[item_id]]

    def stats(self) -> dict[str, int]:
        """Sizes for reports and logs (counted when the entry was built)."""
        return dict(self.store.header["stats"])

    def to_kopl_dict(self) -> dict[str, Any]:
        """The reference engine's input: fresh dicts (every entity is unpickled anew; no deep copy needed)."""
        import copy

        with gc_paused():
            return {"concepts": copy.deepcopy(self.concepts), "entities": dict(self.entities.items())}

    def __repr__(self) -> str:
        stats = self.store.header["stats"]
        return f"StoredKB({self.source!r}, {stats.get('entities')} entities, entry={str(self.store.entry)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return _reopen, (str(self.store.entry), self.source)


def _reopen(entry: str, source: str) -> StoredKB:
    meta = json.loads((Path(entry) / "meta.json").read_text(encoding="utf-8"))
    return StoredKB(_read(Path(entry), meta), source)


# ----------------------------------------------------------------------------- loading

def load_kb(path: str | Path, kind: str | None = None, cache_dir: str | Path | None = None) -> KB:
    """The KB of ``path`` from its store entry, built first when there is none (see the module).

    Args:
        path: A KQA Pro ``kb.json`` (either schema), a MetaQA ``kb.txt`` or a triples file.
        kind: ``kqapro``, ``metaqa`` or ``triples`` (which loader reads the file, ``LOADERS``); by
            default from the suffix (``.txt``: metaqa).
        cache_dir: The cache folder (``cache_root(cache_dir)``: default ``$CBR2_CACHE_DIR``, else
            ``~/.cache/cbr2``); entries live in its ``kb/`` folder.

    Returns:
        A ``StoredKB``; the loader's ``KB`` where no entry could be written or used (warned).

    Raises:
        DataError: As the loader, when the file is missing or malformed (nothing is stored).
    """
    path = Path(path)
    kind = kind or _infer_kind(path)
    if kind not in LOADERS:
        raise ValueError(f"unknown KB kind {kind!r}; expected one of {', '.join(LOADERS)}")
    if not path.is_file():
        return LOADERS[kind](path)  # raises the loader's DataError (file not found)
    sha = known_sha256(path, cache_dir)
    entry = cache_root(str(cache_dir) if cache_dir is not None else None) / "kb" / sha
    expected = _expected_meta(kind, sha, path.stat().st_size)
    kb = _open(entry, expected, str(path))
    if kb is None:
        try:
            with build_lock(entry, f"the KB store of {path}"):
                kb = _open(entry, expected, str(path))  # built by another process while this one waited?
                if kb is None:
                    return _build(entry, expected, path, kind)
        except OSError as err:  # no cache folder to lock in (read-only, not a folder)
            log.warning("cannot use the KB store in %s (%s); parsing %s", entry.parent, err, path)
            return LOADERS[kind](path)
    log.info("KB store hit: %s (%s)", entry, path)
    return kb


load_store = load_kb
"""The name ``benchmarks/scale.py`` looks for."""


def _expected_meta(kind: str, sha: str, size: int) -> dict[str, Any]:
    from cbr2.kopl.engine import INDEX_FORMAT

    return {"format": FORMAT, "engine_format": INDEX_FORMAT, "kind": kind, "source_sha256": sha,
            "source_bytes": size, "byteorder": sys.byteorder}


def _open(entry: Path, expected: dict[str, Any], source: str) -> StoredKB | None:
    """The entry as a ``StoredKB``, or None when it is missing or unusable (then removed, warned)."""
    def read(folder: Path) -> StoredKB:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
        if not isinstance(meta, dict):
            raise TypeError(f"meta.json holds a JSON {type(meta).__name__}, not an object")
        if {k: meta.get(k) for k in expected} != expected:
            raise ValueError("stale entry: its meta.json describes another file, kind or format")
        return StoredKB(_read(folder, meta), source)

    return open_entry(entry, read, log, "KB store entry")


def _read(entry: Path, meta: dict[str, Any]) -> KBStore:
    """Verify ``store.bin`` against ``meta`` (size, checksum, sections, header) and map it."""
    path = entry / "store.bin"
    size = path.stat().st_size
    if size != meta.get("store_bytes"):
        raise ValueError(f"store.bin has {size} bytes, meta.json says {meta.get('store_bytes')!r}")
    sections = meta.get("sections")
    if not isinstance(sections, dict) or set(sections) != set(SECTIONS):
        raise ValueError(f"meta.json lists sections {sorted(sections) if isinstance(sections, dict) else sections!r}")
    for name, span in sections.items():
        if (not isinstance(span, list) or len(span) != 2 or not all(type(x) is int for x in span)
                or span[0] < len(MAGIC) or span[1] < 0 or span[0] + span[1] > size):
            raise ValueError(f"section {name} at {span!r} is not within store.bin")
    # The entry's folder is the cache's own (cache_root/kb/...), so its hash memo lives there too.
    if known_sha256(path, entry.parent.parent) != meta.get("store_sha256"):
        raise ValueError("store.bin does not match its checksum")
    with path.open("rb") as handle:
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    view = memoryview(mapped)
    if view[:len(MAGIC)] != MAGIC:
        raise ValueError("store.bin does not start with the store's magic bytes")
    store = KBStore(entry, meta, {}, view)
    header = _loads(store.section("header"))
    if not isinstance(header, dict) or not all(k in header for k in HEADER_KEYS):
        raise ValueError("the header section lacks what the store writes")
    n_entities = len(header["entity_ids"])
    if sections["entity_offsets"][1] != 8 * (n_entities + 1):
        raise ValueError(f"{sections['entity_offsets'][1]} bytes of entity offsets for {n_entities} entities")
    store.header = header
    offsets = store.entities._offsets
    if offsets[0] != 0 or offsets[n_entities] != sections["entities"][1]:
        raise ValueError("the entity offsets do not span the entities section")
    return store


# ----------------------------------------------------------------------------- building

def _build(entry: Path, expected: dict[str, Any], path: Path, kind: str) -> KB:
    """Parse ``path``, write its entry and return it opened (or the parsed KB, warned, when it cannot be stored)."""
    started = time.perf_counter()
    log.info("building the KB store of %s (%s)", path, entry)
    with gc_paused():  # the loader pauses it only while validating; the engine while building
        return _parse_and_store(entry, expected, path, kind, started)


def _parse_and_store(entry: Path, expected: dict[str, Any], path: Path, kind: str, started: float) -> KB:
    from cbr2.kopl.engine import Engine

    kb = LOADERS[kind](path)
    if file_sha256(path) != expected["source_sha256"]:
        log.warning("%s changed while it was read; its KB is not stored", path)
        return kb
    try:
        indexes = Engine(kb).indexes()
    except ValueError as err:  # a value the engine cannot read: it raises again when an executor is built
        log.warning("%s: not stored, the cbr2 engine cannot index it (%s)", path, err)
        return kb
    try:
        write_entry(entry, expected, kb, indexes, path, started)
    except OSError as err:
        log.warning("could not store the KB of %s in %s (%s); it is parsed again next time", path, entry, err)
        return kb
    del indexes
    stored = _open(entry, expected, str(path))
    if stored is None:  # removed by another process already (e.g. of another format)
        return kb
    log.info("KB store of %s built in %.1f s", path, time.perf_counter() - started)
    return stored
