"""Prompt lengths of a setting in tokens: what ``llm.max_model_len`` must hold (configs/paper.yaml).

    python benchmarks/prompt_lengths.py                                     # configs/paper.yaml on mini-kqapro
    python benchmarks/prompt_lengths.py eval.per_category=5 structural.checkpoint=sentence-transformers/all-MiniLM-L6-v2

Every selected question's prompt is retrieved and rendered as ``evaluate.py --show-prompt``
renders it, through the chat template of the packaged Qwen2.5-Coder GGUF (Qwen3 shares its
vocabulary), and tokenized by llama.cpp from the GGUF's vocabulary alone (no weights). The
encoder is the packaged MiniLM (the paper's BAAI/bge-m3 needs the hub). Prints one JSON line:
the longest prompt with its question and category, the five longest, mean, median and shortest.
Extra arguments are config overrides over ``--config configs/paper.yaml``.
"""

from __future__ import annotations

import json
import sys
import time

from cbr2.config import CONFIG_DIR, Config, compose
from cbr2.data.benchmarks import Benchmark
from cbr2.llm import make_backend
from cbr2.retrieval.retriever import Query, Retriever
from cbr2.run.runner import build_prompts, prepare, select_questions

TOKENIZER = ["llm.backend=llamacpp", "llm.model=qwen2.5-coder-0.5b", "llm.chat=true"]
"""Renders and counts as Qwen's chat template and tokenizer do, without loading weights."""
ENCODER = "retrieval.encoder=sentence-transformers/all-MiniLM-L6-v2"


def main(overrides: list[str]) -> dict:
    cfg = compose(Config, files=[CONFIG_DIR / "paper.yaml"], overrides=[ENCODER, *TOKENIZER, *overrides])
    bench = Benchmark.from_config(cfg.data)
    questions = select_questions(bench, cfg.data.split, cfg.eval)
    cfg = prepare(cfg, bench, retrieval_only=False)
    start = time.time()
    retrieved = Retriever(bench, cfg.retrieval, cfg.structural.checkpoint).retrieve(
        [Query(q.qid, q.question) for q in questions])
    prompts = build_prompts(cfg.prompt, cfg.generation, questions, {q.qid: r for q, r in zip(questions, retrieved)})
    backend = make_backend(cfg.llm, {q.qid: q.program for q in questions}, program_format=cfg.prompt.format)
    sizes = sorted(((len(backend.tokenize(backend.render(p))), q.qid, q.category) for p, q in zip(prompts, questions)),
                   reverse=True)
    lengths = [n for n, _, _ in sizes]
    return {"data": cfg.data.name, "questions": len(questions), "structural": cfg.structural.checkpoint,
            "max": sizes[0], "top5": sizes[:5], "mean": round(sum(lengths) / len(lengths), 1),
            "median": lengths[len(lengths) // 2], "min": lengths[-1], "seconds": round(time.time() - start)}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
