"""Cost of the decoding grammar for a KQA Pro-sized KB: built, compiled cold, read from the cache.

    python benchmarks/grammar.py                          # synthetic vocabulary of KQA Pro's size
    python benchmarks/grammar.py --data kqapro --root /data/KQAPro
    python benchmarks/grammar.py --tokenizer /models/Qwen3-8B --format chain

The synthetic vocabulary has KQA Pro's published sizes (16,960 entities, 794 concepts, 846
attribute keys, 363 relations) made of word-like names, so the grammar's closed lists are as
long as on the real KB. Prints seconds for generating the EBNF, for xgrammar's cold compilation
against the tokenizer (the packaged CPU model's by default), and for reading the compiled
grammar back from the disk cache in a fresh memory cache, with their ratio: the cold cost is
paid once per KB, format, bounds and tokenizer.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time

from cbr2.data.benchmarks import Benchmark
from cbr2.generation.grammar import Bounds, ProgramGrammar
from cbr2.kb.model import Vocabulary
from cbr2.llm import xgrammar_masks
from cbr2.llm.xgrammar_masks import compiled

KQAPRO_SIZES = {"entities": 16960, "concepts": 794, "keys": 846, "qualifier_keys": 200, "relations": 363}
"""KQA Pro's KB sizes (its paper's statistics; qualifier keys rounded)."""


def synthetic_vocabulary(seed: int = 0) -> Vocabulary:
    """Word-like names in KQA Pro's numbers, with the value types spread as in a real KB."""
    rng = random.Random(seed)
    syllables = ["ka", "ro", "lin", "de", "mar", "tu", "sen", "vi", "lo", "an", "ber", "gi", "os", "el", "nu"]

    def word() -> str:
        return "".join(rng.choice(syllables) for _ in range(rng.randint(2, 4))).capitalize()

    def names(n: int, words: tuple[int, int]) -> set[str]:
        out: set[str] = set()
        while len(out) < n:
            out.add(" ".join(word() for _ in range(rng.randint(*words))))
        return out

    types = ["string", "quantity", "date", "year"]
    concepts = names(KQAPRO_SIZES["concepts"], (1, 2))
    return Vocabulary(
        names=concepts | names(KQAPRO_SIZES["entities"], (1, 4)),
        concepts=concepts,
        keys={k.lower(): rng.choice(types) for k in names(KQAPRO_SIZES["keys"], (1, 4))},
        qualifier_keys={k.lower(): rng.choice(types) for k in names(KQAPRO_SIZES["qualifier_keys"], (1, 3))},
        relations={r.lower() for r in names(KQAPRO_SIZES["relations"], (1, 4))},
        units={"length": {"metre", "kilometre", "centimetre"}, "money": {"United States dollar", "euro"}},
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=None, help="a benchmark name (default: the synthetic KQA Pro-sized one)")
    parser.add_argument("--root", default=None)
    parser.add_argument("--format", default="dag", choices=["dag", "chain"])
    parser.add_argument("--tokenizer", default=None, help="a tokenizer folder or hub id (default: the packaged model's)")
    parser.add_argument("--closed-entities", type=int, default=Bounds().closed_entities,
                        help="generation.closed_entities: Find is a closed list up to this many names")
    args = parser.parse_args()

    vocab = Benchmark(args.data, args.root).kb.vocabulary if args.data else synthetic_vocabulary()
    if args.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    else:
        from cbr2.config import load_config
        from cbr2.llm.hf import HFBackend

        tokenizer = HFBackend(load_config([]).llm).tokenizer()
    print(f"vocabulary: {len(vocab.names)} names, {len(vocab.concepts)} concepts, {len(vocab.keys)} keys, "
          f"{len(vocab.qualifier_keys)} qualifier keys, {len(vocab.relations)} relations; tokenizer of "
          f"{len(tokenizer)} tokens")

    t0 = time.perf_counter()
    grammar = ProgramGrammar(vocab, args.format, Bounds(closed_entities=args.closed_entities))
    grammar._xgr_grammar()
    build_s = time.perf_counter() - t0
    print(f"grammar: {len(grammar.ebnf) / 1e6:.2f} MB of EBNF, longest program {grammar.max_bytes} bytes, "
          f"built and parsed in {build_s:.2f} s")

    with tempfile.TemporaryDirectory() as cache:
        t0 = time.perf_counter()
        compiled(grammar.ebnf, tokenizer, cache_dir=cache)
        cold_s = time.perf_counter() - t0
        xgrammar_masks._COMPILED.clear()  # as a new process would start
        t0 = time.perf_counter()
        compiled(grammar.ebnf, tokenizer, cache_dir=cache)
        cached_s = time.perf_counter() - t0
    print(f"compile cold: {cold_s:.2f} s; from the disk cache: {cached_s:.2f} s; "
          f"cold / cached = {cold_s / max(cached_s, 1e-9):.1f}x")


if __name__ == "__main__":
    main()
