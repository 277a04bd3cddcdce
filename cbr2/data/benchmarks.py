"""Benchmarks by name: the official KQA Pro and MetaQA layouts, the embedded mini versions, and
``custom``: a KB and a cases file of your own.

A benchmark is a folder in an official layout plus the conventions of its family (which
splits exist, which one is evaluated by default, what form an answer takes); ``custom`` is two
files instead (``data.kb``, ``data.cases``), whose one split is the cases (``cbr2.data.cases``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from cbr2.common.errors import ConfigError
from cbr2.common.files import file_sha256
from cbr2.config.load import CUSTOM_DATA_NEEDS
from cbr2.data.cases import load_cases
from cbr2.data.kb_loaders import custom_kb_kind
from cbr2.data.questions import (
    DatasetFormatError,
    Question,
    kqapro_reasoning_types,
    load_kqapro_questions,
    load_metaqa_questions,
    metaqa_topics,
)
from cbr2.data.reading import DataError
from cbr2.kb.model import KB
from cbr2.kopl.program import Program

EMBEDDED_ROOT = Path(__file__).parent / "embedded"
"""Where the generated mini benchmarks live inside the package."""


@dataclass(frozen=True)
class Family:
    """Conventions shared by every benchmark of one dataset family."""

    name: str
    splits: tuple[str, ...]
    eval_split: str
    train_split: str
    kb_file: str | None
    """The KB's file in the folder; None for ``custom``, whose KB is ``data.kb``."""


KQAPRO = Family("kqapro", ("train", "val", "test"), "val", "train", "kb.json")
METAQA = Family("metaqa", ("train", "dev", "test"), "test", "train", "kb.txt")
CUSTOM = Family("custom", ("train",), "train", "train", None)
"""Your own KB and cases: the one split is the cases, the case pool; evaluating it is leave-one-out
(case retrieval never returns the question itself)."""

BENCHMARKS: dict[str, tuple[Family, str | None]] = {
    "mini-kqapro": (KQAPRO, "mini-kqapro"),
    "mini-metaqa": (METAQA, "mini-metaqa"),
    "kqapro": (KQAPRO, None),
    "metaqa": (METAQA, None),
    "custom": (CUSTOM, None),
}
"""``data.name`` → (family, embedded folder or None when ``data.root`` must be given; ``custom``
reads ``data.kb`` and ``data.cases`` instead)."""


def structural_name(data: Mapping[str, Any]) -> str:
    """The name a structural retriever trained on ``data`` (a ``data`` config section) is exported
    and looked up under: ``data.name``, and for ``custom`` ``custom-`` and the first 12 hex digits
    of the cases file's SHA-256, so that a changed cases file is trained on anew.

    Raises:
        DataError: If the cases file of ``custom`` does not exist.
    """
    if data["name"] != CUSTOM.name:
        return data["name"]
    path = Path(data["cases"])
    if not path.is_file():
        raise DataError(f"{path}: file not found (data.cases)")
    return f"{CUSTOM.name}-{file_sha256(path)[:12]}"


class Benchmark:
    """One benchmark: its KB and its question splits.

    Args:
        name: One of ``BENCHMARKS``.
        root: Folder in the official layout; defaults to the embedded copy for ``mini-*``.
        cache_dir: Cache folder of the KB store (``cache_root``: default ``$CBR2_CACHE_DIR``,
            else ``~/.cache/cbr2``).
        kb: ``custom`` only: the KB file (``cbr2.data.kb_loaders.load_custom_kb``).
        cases: ``custom`` only: the cases file (``cbr2.data.cases``).

    Attributes:
        kb_path: The KB file.
        cases_path: ``custom``'s cases file, else None.

    Raises:
        ConfigError: On an unknown name, a missing root for ``kqapro`` / ``metaqa``, a missing
            ``kb`` or ``cases`` for ``custom`` (or a root), or either of them for another benchmark.
        DataError: When the KB file (or the cases file) does not exist.
    """

    def __init__(self, name: str, root: str | Path | None = None, cache_dir: str | Path | None = None, *,
                 kb: str | Path | None = None, cases: str | Path | None = None):
        if name not in BENCHMARKS:
            raise ConfigError(f"unknown data.name {name!r}; expected one of {', '.join(BENCHMARKS)}")
        self.name = name
        self.family, embedded = BENCHMARKS[name]
        self.cache_dir = cache_dir
        self._splits: dict[str, list[Question]] = {}
        self.cases_path: Path | None = None
        if self.family is CUSTOM:
            if root is not None:
                raise ConfigError(f"data.name=custom does not read data.root; it reads {CUSTOM_DATA_NEEDS}")
            if not kb or not cases:
                raise ConfigError(f"data.name=custom needs {CUSTOM_DATA_NEEDS}")
            self.kb_path, self.cases_path = Path(kb), Path(cases)
            for path, key in ((self.kb_path, "data.kb"), (self.cases_path, "data.cases")):
                if not path.is_file():
                    raise DatasetFormatError(f"{path}: file not found ({key})")
            self.root = self.cases_path.parent  # where the data lives, for messages and provenance
            return
        if kb or cases:
            raise ConfigError(f"data.kb and data.cases are read with data.name=custom only (not {name})")
        if root is None:
            if embedded is None:
                raise ConfigError(f"data.name={name} needs data.root=DIR (a folder in the official {name} layout)")
            root = EMBEDDED_ROOT / embedded
        self.root = Path(root)
        self.kb_path = self.root / self.family.kb_file
        if not self.kb_path.is_file():
            raise DatasetFormatError(f"{self.root}: no {self.family.kb_file} (expected the official {self.family.name} layout)")

    @classmethod
    def from_config(cls, data: Mapping[str, Any], cache_dir: str | Path | None = None) -> Benchmark:
        """The benchmark a ``data`` config section names (``name``, ``root``, and ``custom``'s
        ``kb`` and ``cases``; a section without those keys, as older runs saved it, has none)."""
        return cls(data["name"], data.get("root"), cache_dir, kb=data.get("kb"), cases=data.get("cases"))

    @cached_property
    def kb(self) -> KB:
        """The KB, read once per process through the KB store (``cbr2.data.kb_store``).

        The first process to read a KB file parses it and writes its store entry; later ones
        (shards, sweep tasks) load the entry instead, in well under a second at KQA Pro's size.
        """
        from cbr2.data.kb_store import load_kb

        kind = custom_kb_kind(self.kb_path) if self.family is CUSTOM else self.family.name
        return load_kb(self.kb_path, kind, self.cache_dir)

    @property
    def structural_name(self) -> str:
        """The name its structural retriever is exported and found under (``structural_name``)."""
        return structural_name({"name": self.name, "cases": self.cases_path})

    def questions(self, split: str | None = None) -> list[Question]:
        """Questions of a split (default: the family's evaluation split), read once per process.

        KQA Pro questions with a gold program carry their reasoning types
        (``kqapro_reasoning_types``; zero-shot against the training split's answers).

        Raises:
            ConfigError: On a split the family does not have.
        """
        split = split or self.family.eval_split
        if split not in self.family.splits:
            raise ConfigError(f"data.split={split!r} is not a {self.family.name} split; expected one of {self.family.splits}")
        if split not in self._splits:
            self._splits[split] = self._read(split)
        return list(self._splits[split])

    def _read(self, split: str) -> list[Question]:
        if self.family is CUSTOM:
            return load_cases(self.cases_path, self.kb)
        if self.family is not KQAPRO:
            return load_metaqa_questions(self.root, split)
        questions = load_kqapro_questions(self.root / f"{split}.json", split)
        if not any(q.program is not None for q in questions):
            return questions  # the test split: no programs, no types
        answers = None  # no training split beside it: zero-shot cannot be told
        if split == self.family.train_split or (self.root / f"{self.family.train_split}.json").is_file():
            train = questions if split == self.family.train_split else self.questions(self.family.train_split)
            answers = frozenset(q.answer for q in train if isinstance(q.answer, str))
        return [replace(q, reasoning_types=kqapro_reasoning_types(q.program, q.answer, answers))
                if q.program is not None else q for q in questions]

    def answer_from_values(self, values: list[str], program: Program) -> str | list[str] | None:
        """Turn an executed result into the dataset's answer form.

        KQA Pro answers are one string: the first of the (sorted) result values, None when
        the result is empty. MetaQA answers are a set of names without the topic entity,
        following MetaQA's own convention (its gold answers never contain the topic). ``custom``
        answers are the set of values itself, as its cases' answers are (``cbr2.data.cases``): a
        program over your KB answers what it says, the names it starts from included.
        """
        if self.family is KQAPRO:
            return values[0] if values else None
        if self.family is CUSTOM:
            return list(values)
        topics = metaqa_topics(program)
        return [v for v in values if v not in topics]
