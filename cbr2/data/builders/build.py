"""Regenerate the embedded benchmarks from their hand-written sources.

    python -m cbr2.data.builders.build            # rewrites cbr2/data/embedded/
    python -m cbr2.data.builders.build --out DIR  # somewhere else (tests compare the two)

``mini-kqapro``: ``sources/mini_kqapro_kb.yaml`` → ``kb.json``, then questions whose answers
come from executing their programs with the project's executor (the official engine).
``mini-metaqa``: ``sources/mini_metaqa_movies.yaml`` → ``kb.txt`` and the question files.
Both are deterministic for a fixed seed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from cbr2.data.benchmarks import EMBEDDED_ROOT
from cbr2.data.kb_loaders import kqapro_kb_from_dict
from cbr2.kopl.executor import Executor
from cbr2.kopl.program import Program

SOURCES = Path(__file__).resolve().parent.parent / "sources"
SEED = 0


def _dump(path: Path, data: Any) -> None:
    # One item per line keeps the files diffable and small while staying plain JSON.
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, list):
        body = ",\n".join(json.dumps(x, ensure_ascii=False, separators=(",", ":")) for x in data)
        path.write_text(f"[\n{body}\n]\n", encoding="utf-8")
    else:
        path.write_text(json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")


def build_mini_kqapro(out_dir: Path, seed: int = SEED) -> dict[str, Any]:
    """Write ``kb.json``, ``train.json``, ``val.json`` and ``test.json`` of mini-kqapro.

    Returns:
        The generator's statistics.
    """
    from cbr2.data.builders.mini_kqapro_kb import build_kb
    from cbr2.data.builders.mini_kqapro_questions import generate

    kb_dict = build_kb(SOURCES / "mini_kqapro_kb.yaml")
    executor = Executor(kqapro_kb_from_dict(kb_dict, "mini_kqapro_kb.yaml"), timeout_s=None,
                        engine="kopl")  # gold answers of the embedded data come from the reference engine
    splits, stats = generate(kb_dict, lambda program: executor.run(Program.from_json(program)), seed=seed)
    _dump(out_dir / "kb.json", kb_dict)
    for split, items in splits.items():
        _dump(out_dir / f"{split}.json", items)
    return stats


def build_all(root: Path = EMBEDDED_ROOT, seed: int = SEED) -> dict[str, Any]:
    """Rebuild both embedded benchmarks under ``root``."""
    from cbr2.data.builders.mini_metaqa import build_mini_metaqa

    return {
        "mini-kqapro": build_mini_kqapro(root / "mini-kqapro", seed),
        "mini-metaqa": build_mini_metaqa(SOURCES / "mini_metaqa_movies.yaml", root / "mini-metaqa", seed),
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m cbr2.data.builders.build`` (``cbr2 build``): rebuild, then print each benchmark's sizes."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=EMBEDDED_ROOT)
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    stats = build_all(args.out, args.seed)
    print(json.dumps(stats, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
