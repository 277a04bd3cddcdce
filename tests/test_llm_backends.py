"""Every backend is a ``Backend`` (the protocol the evaluation loop relies on), and every backend
takes its defaults from the schema (``LLMConfig``), never from a fallback of its own.

Nothing here loads a model: building a backend reads no weights.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
from conftest import FakeBackend
from omegaconf import OmegaConf

from cbr2.common.records import Prompt
from cbr2.config import LLMConfig, load_config
from cbr2.llm import BACKENDS, backend_class, make_backend
from cbr2.llm.base import FEATURES, Backend, Rendering, token_cap

LLM_DIR = Path(__file__).resolve().parents[1] / "cbr2" / "llm"


def _cheap_instances():
    """One built backend per registered name (none loads weights or needs a model file)."""
    from cbr2.llm.gold import GoldBackend
    from cbr2.llm.hf import HFBackend
    from cbr2.llm.llamacpp import LlamaCppBackend
    from cbr2.llm.openai_compat import OpenAIBackend
    from cbr2.llm.vllm import VLLMBackend

    return {"gold": GoldBackend("dag", {}), "hf": HFBackend(LLMConfig(backend="hf")),
            "llamacpp": LlamaCppBackend(LLMConfig()), "openai": OpenAIBackend(LLMConfig(backend="openai", model="m")),
            "vllm": VLLMBackend(LLMConfig(backend="vllm"))}


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_every_registered_backend_has_the_protocols_methods_and_declares_its_features(name):
    cls = backend_class(name)
    # Declared on the class (read before one is built), and only features the runner knows.
    assert isinstance(cls.__dict__.get("capabilities"), frozenset) and cls.capabilities <= set(FEATURES), name
    for method in ("identity", "render", "generate"):
        ours = list(inspect.signature(getattr(Backend, method)).parameters)
        theirs = list(inspect.signature(getattr(cls, method)).parameters)
        assert theirs[:len(ours)] == ours, (name, method)
    assert inspect.signature(cls.generate).parameters["on_result"].default is None


def test_built_backends_are_backends_without_loading_anything():
    built = _cheap_instances()
    assert sorted(built) == sorted(BACKENDS)
    for name, backend in built.items():
        assert isinstance(backend, Backend), name
    assert built["hf"]._model is None and built["llamacpp"]._llm is None
    assert isinstance(FakeBackend(), Backend)  # the tests' stand-in honours the same contract
    assert not isinstance(object(), Backend)


def test_make_backend_builds_the_configured_backend(fake_backend):
    cfg = load_config(["llm.backend=fake"])
    assert make_backend(cfg.llm) is fake_backend and fake_backend.cfg.backend == "fake"
    gold = make_backend(load_config(["llm.backend=gold"]).llm, program_format="chain")
    assert isinstance(gold, Backend) and gold.identity() == {"backend": "gold", "format": "chain"}


def test_make_backend_hands_each_backend_what_it_takes(tmp_path):
    from cbr2.common.records import Grammar
    from cbr2.data.benchmarks import Benchmark

    question = Benchmark("mini-kqapro").questions("val")[0]
    gold = make_backend(load_config(["llm.backend=gold"]).llm, {question.qid: question.program}, cache_dir=tmp_path)
    assert gold.generate([Prompt(question.qid, "S", "U")])[0].text.startswith("r1: ")
    grammar = Grammar('root ::= "r1: FindAll[] → Count[]"', 30, {"grammar": "g"})
    # The backends that keep files get the cache root; a served model's client keeps none.
    cpp = make_backend(load_config([]).llm, grammar=grammar, cache_dir=tmp_path)
    assert cpp.cache_dir == tmp_path and cpp.grammar is grammar and cpp.max_new_tokens == 31
    assert cpp.identity()["grammar"] == "g"
    served = make_backend(load_config(["llm.backend=openai", "llm.model=m", "llm.base_url=http://localhost:1/v1"]).llm,
                          grammar=grammar, cache_dir=tmp_path)
    assert not hasattr(served, "cache_dir") and served.grammar is grammar
    keep_files = {name for name in BACKENDS if getattr(backend_class(name), "uses_cache", False)}
    assert keep_files == {"hf", "llamacpp", "vllm"}


def test_every_backend_renders_with_the_one_render():
    assert {name: backend_class(name).render for name in BACKENDS} == dict.fromkeys(BACKENDS, Rendering.render)
    from cbr2.llm.llamacpp import LlamaCppBackend
    from cbr2.llm.openai_compat import OpenAIBackend

    prompt = Prompt("q", "SYSTEM", "USER")
    plain = [_cheap_instances()["gold"], LlamaCppBackend(LLMConfig(chat=False)),
             OpenAIBackend(LLMConfig(model="m", chat=False))]
    assert [backend.render(prompt) for backend in plain] == [prompt.text] * 3
    # A served model's messages, as they are sent (the server applies its template).
    assert OpenAIBackend(LLMConfig(model="m")).render(prompt) == "[system]\nSYSTEM\n\n[user]\nUSER"


def test_the_fake_backend_replies_and_records(fake_backend):
    from cbr2.common.records import Completion

    prompts = [Prompt("q1", "S", "U1"), Prompt("q2", "S", "U2")]
    seen = []
    fake_backend.reply = lambda p: Completion(p.user.lower(), 3, 1) if p.qid == "q2" else p.user
    out = fake_backend.generate(prompts, on_result=lambda i, c: seen.append(i))
    assert out == [Completion("U1"), Completion("u2", 3, 1)] and seen == [0, 1]
    assert fake_backend.prompts == prompts and fake_backend.qids == ["q1", "q2"]


def test_backends_take_their_defaults_from_the_schema():
    from cbr2.llm.hf import HFBackend
    from cbr2.llm.llamacpp import DEFAULT_CONTEXT, LlamaCppBackend
    from cbr2.llm.openai_compat import OpenAIBackend
    from cbr2.llm.vllm import engine_kwargs, sampling_kwargs

    schema = LLMConfig()
    for section in (schema, OmegaConf.structured(LLMConfig)):
        assert token_cap(section) == schema.max_new_tokens
        hf = HFBackend(section)
        assert (hf.max_new_tokens, hf.temperature, hf.top_p, hf.seed, hf.batch_size) == (
            schema.max_new_tokens, schema.temperature, schema.top_p, schema.seed, schema.batch_size)
        cpp = LlamaCppBackend(section)
        assert (cpp.max_new_tokens, cpp.n_ctx) == (schema.max_new_tokens, DEFAULT_CONTEXT)
        sampled = sampling_kwargs(OmegaConf.merge(section, {"temperature": 0.5}))
        assert (sampled["top_p"], sampled["seed"], sampled["max_tokens"]) == (schema.top_p, schema.seed,
                                                                            schema.max_new_tokens)
        assert engine_kwargs(section)["dtype"] == schema.dtype
    openai = OpenAIBackend(LLMConfig(model="m", base_url="http://localhost:1/v1"))
    assert openai.request_kwargs(Prompt("q", "S", "U"))["max_tokens"] == schema.max_new_tokens
    client = openai.client()
    assert (client.max_retries, client.timeout) == (schema.max_retries, schema.timeout_s)


def test_no_backend_keeps_a_default_of_its_own():
    """Each default is stated once, in the schema: no ``getattr(cfg, key, default)`` in ``cbr2/llm``."""
    fallback = re.compile(r"getattr\(\s*(self\.)?cfg\s*,|\boption\(")
    offenders = [f"{path.name}:{i}" for path in sorted(LLM_DIR.glob("*.py"))
                 for i, line in enumerate(path.read_text().splitlines(), 1) if fallback.search(line)]
    assert offenders == []
