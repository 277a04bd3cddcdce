"""Benchmarks by name: the official KQA Pro and MetaQA layouts, and the embedded mini versions.

A benchmark is a folder in an official layout plus the conventions of its family (which
splits exist, which one is evaluated by default, what form an answer takes).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

from cbr2.common.errors import ConfigError
from cbr2.data.questions import (
    DatasetFormatError,
    Question,
    kqapro_reasoning_types,
    load_kqapro_questions,
    load_metaqa_questions,
    metaqa_topics,
)
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
    kb_file: str


KQAPRO = Family("kqapro", ("train", "val", "test"), "val", "train", "kb.json")
METAQA = Family("metaqa", ("train", "dev", "test"), "test", "train", "kb.txt")

BENCHMARKS: dict[str, tuple[Family, str | None]] = {
    "mini-kqapro": (KQAPRO, "mini-kqapro"),
    "mini-metaqa": (METAQA, "mini-metaqa"),
    "kqapro": (KQAPRO, None),
    "metaqa": (METAQA, None),
}
"""``data.name`` → (family, embedded folder or None when ``data.root`` must be given)."""


class Benchmark:
    """One benchmark: its KB and its question splits.

    Args:
        name: One of ``BENCHMARKS``.
        root: Folder in the official layout; defaults to the embedded copy for ``mini-*``.
        cache_dir: Cache folder of the KB store (``cache_root``: default ``$CBR2_CACHE_DIR``,
            else ``~/.cache/cbr2``).

    Raises:
        ConfigError: On an unknown name, or a missing root for ``kqapro`` / ``metaqa``.
    """

    def __init__(self, name: str, root: str | Path | None = None, cache_dir: str | Path | None = None):
        if name not in BENCHMARKS:
            raise ConfigError(f"unknown data.name {name!r}; expected one of {', '.join(BENCHMARKS)}")
        self.name = name
        self.family, embedded = BENCHMARKS[name]
        if root is None:
            if embedded is None:
                raise ConfigError(f"data.name={name} needs data.root=DIR (a folder in the official {name} layout)")
            root = EMBEDDED_ROOT / embedded
        self.root = Path(root)
        self.cache_dir = cache_dir
        self._splits: dict[str, list[Question]] = {}
        if not (self.root / self.family.kb_file).is_file():
            raise DatasetFormatError(f"{self.root}: no {self.family.kb_file} (expected the official {self.family.name} layout)")

    @cached_property
    def kb(self) -> KB:
        """The KB, read once per process through the KB store (``cbr2.data.kb_store``).

        The first process to read a KB file parses it and writes its store entry; later ones
        (shards, sweep tasks) load the entry instead, in well under a second at KQA Pro's size.
        """
        from cbr2.data.kb_store import load_kb

        return load_kb(self.root / self.family.kb_file, self.family.name, self.cache_dir)

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
        following MetaQA's own convention (its gold answers never contain the topic).
        """
        if self.family is KQAPRO:
            return values[0] if values else None
        topics = metaqa_topics(program)
        return [v for v in values if v not in topics]
