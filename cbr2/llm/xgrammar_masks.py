"""Grammar texts compiled by xgrammar for one tokenizer's vocabulary: the token masks of the
``hf`` and ``llamacpp`` backends (vLLM compiles its own, and an ``openai`` server its own).

A backend receives its grammar as text (``cbr2.common.records.Grammar``: the run's, and a prompt's
own in ``Prompt.grammar``); turning a text into token masks is its concern, so the compilers and
their caches live here, with the cache root handed in (the configuration's ``cache_dir``).

The run's grammar is the same for every question and, for a KQA Pro-sized KB, takes seconds to
compile, so its compiled form is kept in memory and on disk under ``<cache>/grammars/``
(``compiled``, ``compiled_for``), shared by every run of the same grammar and vocabulary. A
prompt's own grammar (grounded decoding) takes hundredths of a second and is compiled per request
by the vocabulary's compiler, one per process (``compiled_text``).

``xgrammar`` is imported inside the functions.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from cbr2.common.files import cache_root
from cbr2.common.locks import build_lock
from cbr2.common.records import Grammar

log = logging.getLogger(__name__)

_COMPILED: dict[str, Any] = {}
"""Run grammars compiled in this process, by ``compiled_for``'s key."""

_TOKENIZERS: dict[str, Any] = {}
"""Each vocabulary's ``xgrammar.TokenizerInfo``, by fingerprint: built once per process."""

_COMPILERS: dict[str, Any] = {}
"""Each vocabulary's ``xgrammar.GrammarCompiler``, by fingerprint: built when a grammar is first
compiled for it (a run grammar read from the disk cache needs none)."""

COMPILER_CACHE_BYTES = 256 * 2**20
"""What a vocabulary's compiler keeps of the grammars it compiled (least recently used dropped
first). A run compiles one grounded grammar per question, about 1.6 MB each for Qwen2.5's vocabulary
on mini-kqapro, so an unbounded cache would grow with the run; what it keeps serves a question
asked again (``cbr2 serve``)."""


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """SHA-256 of a tokenizer's vocabulary and special tokens: when it changes, so do the token masks."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    data = json.dumps([vocab, tokenizer.eos_token_id, len(tokenizer)], ensure_ascii=False)
    return hashlib.sha256(data.encode()).hexdigest()


def compiled(ebnf: str, tokenizer: Any, vocab_size: int | None = None, stop_ids: Iterable[int] | None = None,
             cache_dir: str | Path | None = None) -> Any:
    """A run's grammar text compiled by xgrammar for a transformers ``tokenizer`` (see ``compiled_for``).

    Args:
        ebnf: The grammar text (``Grammar.ebnf``).
        tokenizer: A transformers tokenizer.
        vocab_size: Rows of the model's output layer, when larger than the tokenizer's vocabulary.
        stop_ids: Token ids that end generation (allowed once the program is complete); the
            tokenizer's end-of-sequence token when None.
        cache_dir: The cache root (``cbr2.common.files.cache_root``).
    """
    import xgrammar as xgr

    stops = sorted(stop_ids) if stop_ids is not None else None
    fingerprint = "\x00".join([tokenizer_fingerprint(tokenizer), str(vocab_size), str(stops)])
    return compiled_for(ebnf, lambda: xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                                         stop_token_ids=stops),
                        fingerprint, cache_dir)


def compiled_for(ebnf: str, tokenizer_info: Callable[[], Any], fingerprint: str,
                 cache_dir: str | Path | None = None) -> Any:
    """A run's grammar text compiled by xgrammar for one vocabulary: from memory, else from the disk
    cache, else compiled now and stored (under ``<cache>/grammars/``, with a build lock).

    Args:
        ebnf: The grammar text; its rule ``root`` is where a program starts.
        tokenizer_info: Builds the ``xgrammar.TokenizerInfo`` of the vocabulary (called once per process).
        fingerprint: Changes whenever the token masks would (vocabulary, special and stop tokens).
        cache_dir: The cache root (``cbr2.common.files.cache_root``).
    """
    import xgrammar as xgr

    key = hashlib.sha256("\x00".join([ebnf, fingerprint, str(xgr.get_serialization_version())]).encode()
                         ).hexdigest()[:24]
    if key in _COMPILED:
        return _COMPILED[key]
    info = _tokenizer_info(tokenizer_info, fingerprint)
    path = cache_root(cache_dir) / "grammars" / f"{key}.json"
    with build_lock(path, "compiled grammar"):
        result = None
        if path.exists():
            try:
                result = xgr.CompiledGrammar.deserialize_json(path.read_text(encoding="utf-8"), info)
                log.info("compiled grammar read from %s", path)
            except (xgr.DeserializeFormatError, xgr.DeserializeVersionError, RuntimeError) as err:
                log.warning("%s: unreadable compiled grammar (%s); compiling again", path, err)
        if result is None:
            start = time.perf_counter()
            parsed = xgr.Grammar.from_ebnf(ebnf, root_rule_name="root")
            result = _compiler(tokenizer_info, fingerprint).compile_grammar(parsed)
            # One rule a line (ProgramGrammar writes it so).
            log.info("compiled the grammar (%d rules) in %.1f s", ebnf.count("\n"), time.perf_counter() - start)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(result.serialize_json(), encoding="utf-8")
            tmp.replace(path)
    _COMPILED[key] = result
    return result


def compiled_text(grammar: Grammar, ebnf: str, tokenizer_info: Callable[[], Any], fingerprint: str,
                  cache_dir: str | Path | None = None) -> Any:
    """The grammar text one request decodes under (``cbr2.llm.base.request_grammar``), compiled by
    xgrammar for one vocabulary.

    The run's own text (``grammar.ebnf``) is its compiled form (``compiled_for``: memory, disk, or
    compiled once). Any other text, a prompt's own (``Prompt.grammar``), is compiled now by the
    vocabulary's compiler (kept per process with its cache, ``COMPILER_CACHE_BYTES``): about 0.02 s
    per question of mini-kqapro for Qwen2.5's vocabulary, against seconds of decoding, so it is
    not written to disk.

    Args:
        grammar: The run's grammar.
        ebnf: The request's grammar text.
        tokenizer_info: Builds the ``xgrammar.TokenizerInfo`` of the vocabulary (called once per process).
        fingerprint: Changes whenever the token masks would (vocabulary, special and stop tokens).
        cache_dir: The cache root of the run grammar's compiled form (``cbr2.common.files.cache_root``).
    """
    if ebnf == grammar.ebnf:
        return compiled_for(ebnf, tokenizer_info, fingerprint, cache_dir)
    return _compiler(tokenizer_info, fingerprint).compile_grammar(ebnf)


def _tokenizer_info(build: Callable[[], Any], fingerprint: str) -> Any:
    if fingerprint not in _TOKENIZERS:
        _TOKENIZERS[fingerprint] = build()
    return _TOKENIZERS[fingerprint]


def _compiler(tokenizer_info: Callable[[], Any], fingerprint: str) -> Any:
    """The vocabulary's xgrammar compiler, one per process and fingerprint."""
    if fingerprint not in _COMPILERS:
        import xgrammar as xgr

        _COMPILERS[fingerprint] = xgr.GrammarCompiler(_tokenizer_info(tokenizer_info, fingerprint),
                                                      cache_limit_bytes=COMPILER_CACHE_BYTES)
    return _COMPILERS[fingerprint]
