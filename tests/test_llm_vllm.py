"""The ``vllm`` backend at its boundary with vLLM: a fake ``vllm`` module records what it is given.

One ``gpu`` test really generates with a small Qwen3 model; it runs only where CUDA and vLLM
are present.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from cbr2.common.records import Completion, Grammar, Prompt
from cbr2.config import LLMConfig
from cbr2.llm import backend_class
from cbr2.llm import vllm as vllm_backend
from cbr2.llm.base import cut_at_stop
from cbr2.llm.vllm import (
    CPU_KV_TOKENS,
    CPU_MAX_MODEL_LEN,
    DEFAULT_MODEL,
    MEMORY_HEADROOM,
    MEMORY_SHARE,
    TOO_LONG,
    VLLMBackend,
    cpu_engine_kwargs,
    cpu_environment,
    engine_kwargs,
    memory_share,
    parse_outputs,
    sampling_kwargs,
    tensor_parallel_size,
)

PROMPTS = [Prompt(qid=f"q{i}", system="SYSTEM PART", user=f"question {i}\nProgram:") for i in range(3)]


def _cfg(**overrides):
    """The ``llm`` section as the runner passes it: a DictConfig over the dataclass schema."""
    return OmegaConf.merge(OmegaConf.structured(LLMConfig(backend="vllm")), overrides)


def _output(text, n_prompt, n_out):
    """A stand-in for vLLM's ``RequestOutput``."""
    return SimpleNamespace(prompt_token_ids=list(range(n_prompt)),
                           outputs=[SimpleNamespace(text=text, token_ids=list(range(n_out)))])


class FakeEngine:
    """vLLM's ``LLMEngine`` as ``run_requests`` drives it: requests finish in reverse order, one per step."""

    def __init__(self, llm):
        self.llm, self.queue = llm, []

    def add_request(self, request_id, prompt, params):
        limit = self.llm.kwargs.get("max_model_len")
        if limit is not None and len(prompt) >= limit:  # a character is a token here, as in step()
            # vLLM 0.32's VLLMValidationError is no ValueError: the backend must not rely on one.
            raise RuntimeError(f"The decoder prompt (length {len(prompt)}) is longer than the maximum model "
                               f"length of {limit}. Make sure that `max_model_len` is no smaller than the "
                               "number of text tokens.")
        if not self.queue:
            self.llm.calls.append(([], params))
        self.llm.calls[-1][0].append(prompt)
        self.queue.append((request_id, prompt))

    def has_unfinished_requests(self):
        return bool(self.queue)

    def step(self):
        rid, p = self.queue.pop()
        # The answer names its prompt, then runs past the stop string as a raw model would.
        out = _output(f"Find({p.splitlines()[-2]})\n\nJUNK", len(p), 7)
        out.request_id, out.finished = rid, True
        return [out]


@pytest.fixture
def fake_vllm(monkeypatch):
    """A ``vllm`` module (GPU platform) whose engine echoes each prompt's tail and records its calls."""
    mod = types.ModuleType("vllm")
    mod.engines = []

    class SamplingParams:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

    class LLM:
        def __init__(self, **kwargs):
            self.kwargs = kwargs
            self.calls = []
            self.llm_engine = FakeEngine(self)
            mod.engines.append(self)

    mod.LLM, mod.SamplingParams = LLM, SamplingParams
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = SimpleNamespace(is_cpu=lambda: False)
    sampling = types.ModuleType("vllm.sampling_params")
    sampling.RequestOutputKind = SimpleNamespace(FINAL_ONLY="final only")
    monkeypatch.setitem(sys.modules, "vllm", mod)
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", sampling)
    monkeypatch.setattr(vllm_backend, "_gpu_facts", lambda: (1, None, None))
    monkeypatch.setattr(vllm_backend, "_ENGINES", {})  # each test its own engines, as each process has
    return mod


class FakeTokenizer:
    """Records ``apply_chat_template`` calls and renders messages with visible markers."""

    def __init__(self):
        self.calls = []

    def apply_chat_template(self, messages, **kwargs):
        self.calls.append(kwargs)
        return "".join(f"<{m['role']}>{m['content']}</{m['role']}>\n" for m in messages) + "<assistant>"


@pytest.fixture
def fake_tokenizer(monkeypatch):
    loaded = []
    tok = FakeTokenizer()

    def load(model):
        loaded.append(model)
        return tok

    monkeypatch.setattr(vllm_backend, "load_tokenizer", load)
    tok.loaded = loaded
    return tok


def test_registry_resolves_the_class():
    assert backend_class("vllm") is VLLMBackend


def test_engine_kwargs_from_config():
    kw = engine_kwargs(_cfg(tensor_parallel_size=2, gpu_memory_utilization=0.8, max_model_len=8192, seed=3,
                            dtype="bfloat16"))
    assert kw == {"model": DEFAULT_MODEL, "tensor_parallel_size": 2, "gpu_memory_utilization": 0.8, "seed": 3,
                  "dtype": "bfloat16", "enable_prefix_caching": True, "max_model_len": 8192}
    # The dataclass works too; an unset context length is left to the model.
    kw = engine_kwargs(LLMConfig(backend="vllm", model="Qwen/Qwen3-0.6B"))
    assert kw["model"] == "Qwen/Qwen3-0.6B" and "max_model_len" not in kw and kw["enable_prefix_caching"] is True


def test_unset_sizes_come_from_the_allocation():
    assert [tensor_parallel_size(n) for n in (None, 0, 1, 2, 3, 4, 7, 8)] == [1, 1, 1, 2, 2, 4, 4, 8]
    gib = 1 << 30
    assert memory_share(None, None) == MEMORY_SHARE  # no CUDA facts: vLLM's own default
    assert memory_share(80 * gib, 80 * gib) == MEMORY_SHARE  # a free GPU
    assert memory_share(60 * gib, 80 * gib) == round(0.75 - MEMORY_HEADROOM, 3)  # encoders hold 20 GiB
    assert memory_share(1 * gib, 80 * gib) == 0.05
    kw = engine_kwargs(LLMConfig(backend="vllm"), gpus=4, free_bytes=60 * gib, total_bytes=80 * gib)
    assert kw["tensor_parallel_size"] == 4 and kw["gpu_memory_utilization"] == round(0.75 - MEMORY_HEADROOM, 3)
    # Values set in the config win over the allocation.
    kw = engine_kwargs(_cfg(tensor_parallel_size=1, gpu_memory_utilization=0.5), gpus=4, free_bytes=gib,
                       total_bytes=80 * gib)
    assert kw["tensor_parallel_size"] == 1 and kw["gpu_memory_utilization"] == 0.5


QWEN25_05B = SimpleNamespace(num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, hidden_size=896,
                             max_position_embeddings=32768)
"""The sizes of Qwen2.5-Coder-0.5B's config that the KV cache depends on (head dim 896 / 14 = 64)."""


def test_cpu_engine_kwargs():
    kw = cpu_engine_kwargs(_cfg(), "/models/q", QWEN25_05B)
    per_token = 2 * 24 * 2 * 64 * 4  # keys and values, fp32
    assert kw == {"model": "/models/q", "seed": 0, "dtype": "float32", "enable_prefix_caching": True,
                  "max_model_len": CPU_MAX_MODEL_LEN, "kv_cache_memory_bytes": per_token * CPU_KV_TOKENS,
                  "enforce_eager": True}
    # An explicit dtype and context are kept; the KV cache then holds at least one full context.
    kw = cpu_engine_kwargs(_cfg(dtype="bfloat16", max_model_len=100_000), "/m", QWEN25_05B)
    assert kw["dtype"] == "bfloat16" and kw["max_model_len"] == 100_000
    assert kw["kv_cache_memory_bytes"] == 2 * 24 * 2 * 64 * 2 * 100_000
    # A model with a shorter context than the CPU cap keeps its own.
    short = SimpleNamespace(**{**vars(QWEN25_05B), "max_position_embeddings": 2048, "head_dim": 32})
    kw = cpu_engine_kwargs(_cfg(), "/m", short)
    assert kw["max_model_len"] == 2048 and kw["kv_cache_memory_bytes"] == 2 * 24 * 2 * 32 * 4 * CPU_KV_TOKENS


def test_cpu_environment_keeps_the_engine_in_process_on_every_core():
    assert cpu_environment(2) == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "2"}
    assert cpu_environment(0)["OMP_NUM_THREADS"] == "1"


def test_model_names_a_packaged_model_a_folder_or_a_hub_id(tmp_path):
    packaged = VLLMBackend(_cfg(model="qwen2.5-coder-0.5b"))
    assert packaged.identity()["model"] == "qwen2.5-coder-0.5b@1d9614638d18" and packaged.uses_chat
    assert not VLLMBackend(_cfg(model="smollm2-135m")).uses_chat  # registered as plain text
    assert VLLMBackend(_cfg(model=str(tmp_path))).folder() == str(tmp_path)
    assert VLLMBackend(_cfg(model="Qwen/Qwen3-0.6B")).folder() == "Qwen/Qwen3-0.6B"
    with pytest.raises(OSError, match="no model folder"):
        VLLMBackend(_cfg(model=str(tmp_path / "missing")))


def test_sampling_kwargs_greedy_and_sampled():
    greedy = sampling_kwargs(_cfg(max_new_tokens=64, top_p=0.9, stop=["\n\n", "Question:"]))
    assert greedy == {"temperature": 0.0, "top_p": 1.0, "max_tokens": 64, "stop": ["\n\n", "Question:"], "seed": None}
    assert type(greedy["stop"]) is list  # a plain list, not a ListConfig
    sampled = sampling_kwargs(_cfg(temperature=0.7, top_p=0.9, seed=5))
    assert sampled["temperature"] == 0.7 and sampled["top_p"] == 0.9 and sampled["seed"] == 5


def test_cut_at_stop_takes_the_earliest():
    assert cut_at_stop("a\n\nb END c", ["END", "\n\n"]) == "a"
    assert cut_at_stop("abc", ["x", ""]) == "abc"


def test_parse_outputs():
    got = parse_outputs([_output("Find(x)\n\nrest", 11, 4), _output("Count()", 5, 2)], stop=["\n\n"])
    assert got == [Completion("Find(x)", 11, 4), Completion("Count()", 5, 2)]


def test_generate_one_batch_in_order(fake_vllm):
    backend = VLLMBackend(_cfg(chat=False, max_new_tokens=32, max_model_len=4096))
    assert fake_vllm.engines == []  # nothing built before the first generate
    assert backend.render(PROMPTS[0]) == PROMPTS[0].text and fake_vllm.engines == []
    seen = []
    got = backend.generate(PROMPTS, on_result=lambda i, c: seen.append((i, c)))

    (engine,) = fake_vllm.engines
    assert engine.kwargs["model"] == DEFAULT_MODEL and engine.kwargs["max_model_len"] == 4096
    assert engine.kwargs["enable_prefix_caching"] is True
    (call,) = engine.calls
    texts, params = call
    assert texts == [p.text for p in PROMPTS]
    assert params.kwargs == {"temperature": 0.0, "top_p": 1.0, "max_tokens": 32, "stop": ["\n\n", "\nQuestion:"], "seed": None}
    assert params.output_kind == "final only"  # no partial outputs
    assert [c.text for c in got] == [f"Find(question {i})" for i in range(3)]
    assert all(c.prompt_tokens == len(p.text) and c.completion_tokens == 7 for c, p in zip(got, PROMPTS))
    assert seen == list(reversed(list(enumerate(got))))  # as each request finishes, results in input order

    backend.generate(PROMPTS[:1])
    assert len(fake_vllm.engines) == 1 and len(engine.calls) == 2  # the engine is built once
    assert backend.generate([]) == []


def test_a_prompt_over_the_context_is_an_overflow_and_the_others_go_on(fake_vllm):
    long = Prompt(qid="long", system="x" * 5000, user="question long\nProgram:")
    prompts = [PROMPTS[0], long, PROMPTS[1]]
    seen = []
    got = VLLMBackend(_cfg(chat=False, max_model_len=4096)).generate(prompts, on_result=lambda i, c: seen.append(i))
    assert [c.text for c in got] == ["Find(question 0)", "", "Find(question 1)"]
    assert got[1].overflow.startswith("vLLM: The decoder prompt (length 5") and TOO_LONG in got[1].overflow
    assert got[0].overflow is None and got[2].overflow is None
    assert sorted(seen) == [0, 1, 2]  # the refused prompt is reported too, so the run records it


def test_any_other_refusal_of_a_request_is_raised(fake_vllm, monkeypatch):
    def refuse(self, request_id, prompt, params):
        raise RuntimeError("This model does not support generation")

    monkeypatch.setattr(FakeEngine, "add_request", refuse)
    with pytest.raises(RuntimeError, match="does not support generation"):
        VLLMBackend(_cfg(chat=False)).generate(PROMPTS[:1])


def test_chat_rendering_turns_thinking_off(fake_vllm, fake_tokenizer):
    backend = VLLMBackend(_cfg(model="Qwen/Qwen3-0.6B"))
    assert backend.uses_chat  # chat is the default
    rendered = backend.render(PROMPTS[1])
    assert rendered == "<system>SYSTEM PART</system>\n<user>question 1\nProgram:</user>\n<assistant>"
    assert fake_tokenizer.calls[0] == {"tokenize": False, "add_generation_prompt": True, "enable_thinking": False}
    assert fake_tokenizer.loaded == ["Qwen/Qwen3-0.6B"] and fake_vllm.engines == []  # no weights for render

    backend.generate(PROMPTS)
    (texts, _), = fake_vllm.engines[0].calls
    assert texts == [backend.render(p) for p in PROMPTS]
    assert fake_tokenizer.loaded == ["Qwen/Qwen3-0.6B"]  # loaded once


def test_plain_mode_loads_no_tokenizer(fake_tokenizer):
    backend = VLLMBackend(_cfg(chat=False))
    assert not backend.uses_chat and backend.render(PROMPTS[0]) == "SYSTEM PART\n\nquestion 0\nProgram:"
    assert fake_tokenizer.loaded == []


def test_identity_needs_nothing(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # importing it would fail
    greedy = VLLMBackend(LLMConfig(backend="vllm")).identity()
    assert greedy == {"backend": "vllm", "model": DEFAULT_MODEL, "chat": True, "max_new_tokens": 128,
                      "temperature": 0.0, "top_p": 1.0, "stop": ["\n\n", "\nQuestion:"]}
    sampled = VLLMBackend(_cfg(temperature=0.5, seed=9, chat=False)).identity()
    assert sampled["seed"] == 9 and sampled["chat"] is False


def test_missing_vllm_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ImportError, match=r"make install-gpu"):
        VLLMBackend(_cfg(chat=False)).generate(PROMPTS)


def _gpu_ready() -> bool:
    if importlib.util.find_spec("vllm") is None or importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not _gpu_ready(), reason="needs CUDA and vllm (make install-gpu)")
def test_real_generation_with_a_small_qwen3():
    model = os.environ.get("CBR2_VLLM_TEST_MODEL", "Qwen/Qwen3-0.6B")
    backend = VLLMBackend(_cfg(model=model, max_new_tokens=24, max_model_len=2048, gpu_memory_utilization=0.3))
    try:
        backend.tokenizer()
    except OSError as e:  # conftest sets HF_HUB_OFFLINE=1: the model must be cached (or a local folder)
        pytest.skip(f"{model} is not available locally: {e}")
    prompts = [Prompt(qid="a", system="Answer with one word.", user="What is the capital of France?"),
               Prompt(qid="b", system="Answer with one word.", user="What colour is the sky on a clear day?")]
    if "qwen3" in model.lower():  # thinking off: the template closes an empty think block itself
        assert backend.render(prompts[0]).endswith("<think>\n\n</think>\n\n")
    got = backend.generate(prompts)
    assert len(got) == 2
    for c in got:
        assert isinstance(c.text, str) and "\n\n" not in c.text
        assert c.prompt_tokens and c.prompt_tokens > 5 and 0 < c.completion_tokens <= 24
    assert "paris" in got[0].text.lower()


GRAMMAR = Grammar('root ::= "r1: FindAll[] → Count[]"', 99, {"grammar": "abc", "format": "dag", "max_bytes": 99})


def test_constrained_generation_sends_the_grammar_and_its_cap(fake_vllm, monkeypatch):
    class StructuredOutputsParams:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

    sys.modules["vllm.sampling_params"].StructuredOutputsParams = StructuredOutputsParams
    backend = VLLMBackend(_cfg(chat=False, max_new_tokens=32), grammar=GRAMMAR)
    backend.generate(PROMPTS[:1])
    (engine,) = fake_vllm.engines
    (_, params), = engine.calls
    assert params.kwargs["structured_outputs"].kwargs == {"grammar": GRAMMAR.ebnf}
    assert params.kwargs["max_tokens"] == 100  # the grammar's longest text, not llm.max_new_tokens
    assert backend.identity()["grammar"] == "abc" and VLLMBackend(_cfg()).identity().get("grammar") is None
    assert "structured_outputs" not in sampling_kwargs(_cfg())


@pytest.fixture
def structured(fake_vllm):
    class StructuredOutputsParams:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

    sys.modules["vllm.sampling_params"].StructuredOutputsParams = StructuredOutputsParams
    return fake_vllm


def test_a_grounded_prompt_decodes_under_its_own_grammar(structured, monkeypatch):
    sent = []
    add = FakeEngine.add_request
    monkeypatch.setattr(FakeEngine, "add_request", lambda self, rid, p, params: (sent.append((p, params)),
                                                                                   add(self, rid, p, params)))
    grounded = Prompt("g", "SYSTEM PART", "question g\nProgram:", grounding=(("entity", ("Spain", "Peru")),),
                      grammar="root ::= entity=Spain|Peru")
    backend = VLLMBackend(_cfg(chat=False, max_new_tokens=32), grammar=Grammar("root ::= kb", 99, {"grammar": "kb"}))
    got = backend.generate([PROMPTS[0], grounded, PROMPTS[1]])
    grammars = [params.kwargs["structured_outputs"].kwargs["grammar"] for _, params in sent]
    assert grammars == ["root ::= kb", "root ::= entity=Spain|Peru", "root ::= kb"]
    assert sent[0][1] is sent[2][1]  # ungrounded prompts share one SamplingParams
    assert {params.kwargs["max_tokens"] for _, params in sent} == {100}  # the KB grammar's bound holds
    assert [c.text for c in got] == ["Find(question 0)", "Find(question g)", "Find(question 1)"]


def test_backends_of_the_same_engine_settings_share_one_engine(monkeypatch):
    """A local sweep's runs, one after another in one process, start one engine: the key leaves out
    what a run computes from free GPU memory, and names everything the engine is built with."""
    from cbr2.llm import vllm as module

    monkeypatch.setattr(module, "_ENGINES", {})
    base = {"model": "Qwen/Qwen3-0.6B"}
    a, b = VLLMBackend(_cfg(**base)), VLLMBackend(_cfg(**base), reserve_bytes=2**30)
    assert a.engine_key() == b.engine_key()
    for other in ({"dtype": "float32"}, {"max_model_len": 4096}, {"seed": 1}, {"gpu_memory_utilization": 0.5},
                  {"model": "Qwen/Qwen3-1.7B"}):
        assert VLLMBackend(_cfg(**{**base, **other})).engine_key() != a.engine_key(), other

    class Engine:  # what close() touches of a vllm.LLM
        def __init__(self):
            self.stopped = False
            self.llm_engine = type("E", (), {"engine_core": type("C", (), {"shutdown": lambda _: setattr(self, "stopped", True)})()})()

    engine = Engine()
    monkeypatch.setitem(module._ENGINES, a.engine_key(), engine)
    assert a.engine() is engine and b.engine() is engine  # no new engine built
    a.close()
    assert engine.stopped and a.engine_key() not in module._ENGINES and a._llm is None
