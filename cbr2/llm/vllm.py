"""The ``vllm`` backend: vLLM's offline engine on one or more GPUs.

All prompts of a ``generate`` call go to the engine in one ``LLM.generate`` call, so vLLM
schedules them with continuous batching; prefix caching is on because every prompt of a run
starts with the same system part (role instructions and KoPL function definitions).

``vllm`` (and ``torch``/``transformers``) are imported only when needed: ``identity`` needs
nothing, ``render`` needs only the model's tokenizer (chat mode), and the engine, which loads
the weights, is built on the first ``generate``. The helpers ``engine_kwargs``,
``sampling_kwargs`` and ``parse_outputs`` are pure so the boundary with vLLM is testable
without a GPU.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from cbr2.llm.base import (
    Completion,
    Prompt,
    apply_chat_template,
    cut_at_stop,
    decoding_identity,
    stop_strings,
    token_cap,
)

if TYPE_CHECKING:
    from cbr2.config import LLMConfig

log = logging.getLogger(__name__)

DEFAULT_MODEL = "Qwen/Qwen3-8B"
"""The model used when ``llm.model`` is unset."""

INSTALL_HINT = "install it with `pip install -e .[vllm]` on a GPU node (vLLM needs CUDA)"
"""What to do when ``import vllm`` fails."""


def model_name(cfg: LLMConfig) -> str:
    """The configured model, or ``DEFAULT_MODEL`` when ``llm.model`` is unset."""
    return cfg.model or DEFAULT_MODEL


MEMORY_SHARE = 0.9
"""vLLM's own default share of GPU memory, used when nothing else holds the GPU."""
MEMORY_HEADROOM = 0.03
"""Share of a GPU left free beyond what is already in use (CUDA context, allocator slack)."""


def tensor_parallel_size(gpus: int | None) -> int:
    """GPUs to split the model across when ``llm.tensor_parallel_size`` is unset.

    The largest power of two not above the visible GPUs: tensor parallelism must divide the
    attention heads, and Qwen3's head counts (e.g. 8 KV heads) are powers of two, so 3 GPUs
    give 2, not 3.
    """
    if not gpus or gpus < 1:
        return 1
    return 1 << (gpus.bit_length() - 1)


def memory_share(free_bytes: int | None, total_bytes: int | None) -> float:
    """``gpu_memory_utilization`` when it is unset: vLLM's 0.9, or less when part of the GPU is
    already taken (the retrieval encoder and FAISS run in the same process before the engine
    starts, and vLLM refuses to start when the share it asks for is not free)."""
    if not free_bytes or not total_bytes:
        return MEMORY_SHARE
    return round(max(0.05, min(MEMORY_SHARE, free_bytes / total_bytes - MEMORY_HEADROOM)), 3)


def _gpu_facts() -> tuple[int | None, int | None, int | None]:
    """(visible GPUs, free bytes, total bytes) of this process's first GPU; Nones without CUDA."""
    import torch  # present wherever vLLM is

    from cbr2.cluster.slurm import visible_gpus

    if not torch.cuda.is_available():
        return visible_gpus(), None, None
    free, total = torch.cuda.mem_get_info()
    return visible_gpus() or torch.cuda.device_count(), free, total


def engine_kwargs(cfg: LLMConfig, gpus: int | None = None, free_bytes: int | None = None,
                  total_bytes: int | None = None) -> dict[str, Any]:
    """Keyword arguments of ``vllm.LLM(...)`` for the llm config section.

    Args:
        cfg: The ``llm`` config section (DictConfig or ``LLMConfig``).
        gpus: GPUs of the allocation (sizes an unset ``tensor_parallel_size``).
        free_bytes: Free memory of the first GPU now (sizes an unset ``gpu_memory_utilization``).
        total_bytes: Its total memory.

    Returns:
        ``model``, ``tensor_parallel_size``, ``gpu_memory_utilization``, ``seed``, ``dtype``,
        ``enable_prefix_caching`` and, when set, ``max_model_len``.
    """
    tp = cfg.tensor_parallel_size
    share = cfg.gpu_memory_utilization
    kwargs: dict[str, Any] = {
        "model": model_name(cfg),
        "tensor_parallel_size": int(tp) if tp is not None else tensor_parallel_size(gpus),
        "gpu_memory_utilization": float(share) if share is not None else memory_share(free_bytes, total_bytes),
        "seed": int(cfg.seed),
        "dtype": str(cfg.dtype),
        # Every prompt of a run shares the long system part: its KV blocks are computed once.
        "enable_prefix_caching": True,
    }
    if cfg.max_model_len is not None:
        kwargs["max_model_len"] = int(cfg.max_model_len)
    return kwargs


def sampling_kwargs(cfg: LLMConfig, grammar: Any = None) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams(...)`` for the llm config section.

    Temperature 0 is greedy decoding: ``top_p`` is then 1 and no per-request seed is set (it
    would change nothing and costs vLLM a generator per request).

    Args:
        cfg: The ``llm`` config section (DictConfig or ``LLMConfig``).
        grammar: A ``ProgramGrammar`` to decode under (``generation.constrained``): vLLM's
            structured outputs (xgrammar) mask every step, and ``max_tokens`` becomes the
            grammar's longest text in bytes, so no program is cut mid-line.

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
        kwargs["structured_outputs"] = {"grammar": grammar.ebnf}
    return kwargs


def parse_outputs(outputs: Sequence[Any], stop: Iterable[str] = ()) -> list[Completion]:
    """``Completion``s from vLLM ``RequestOutput``s, in the same order.

    Args:
        outputs: What ``LLM.generate`` returned: each has ``prompt_token_ids`` and
            ``outputs[0]`` with ``text`` and ``token_ids``.
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
                          "or use llm.backend=hf (CPU) or llm.backend=openai (a served model)") from e
    return vllm


class VLLMBackend:
    """Generates with vLLM's offline engine, all prompts of a call in one batch.

    Args:
        cfg: The ``llm`` config section (DictConfig or ``LLMConfig``).
        grammar: Decode under this ``ProgramGrammar`` (``generation.constrained``).
    """

    name = "vllm"

    def __init__(self, cfg: LLMConfig, grammar: Any = None):
        self.cfg = cfg
        self.grammar = grammar
        self.model = model_name(cfg)
        self.stop = stop_strings(cfg)
        self._tokenizer: Any = None
        self._llm: Any = None

    @property
    def uses_chat(self) -> bool:
        """``llm.chat`` when set, else True (the default model is an instruction model)."""
        return True if self.cfg.chat is None else bool(self.cfg.chat)

    def identity(self) -> dict[str, Any]:
        """What, beside the prompt, decides the output: the predictions-cache key."""
        return decoding_identity(self.cfg, self.grammar, backend=self.name, model=self.model, chat=self.uses_chat)

    def tokenizer(self) -> Any:
        """The model's tokenizer, loaded once."""
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.model)
        return self._tokenizer

    def render(self, prompt: Prompt) -> str:
        """Exactly the text the engine gets for ``prompt`` (loads the tokenizer in chat mode, never weights)."""
        if not self.uses_chat:
            return prompt.text
        return apply_chat_template(self.tokenizer(), prompt)

    def engine(self) -> Any:
        """The ``vllm.LLM``, built (weights loaded) on first use."""
        if self._llm is None:
            vllm = _import_vllm()
            kwargs = engine_kwargs(self.cfg, *_gpu_facts())
            log.info("vLLM engine: %s on %d GPU(s), %.0f%% of GPU memory", kwargs["model"],
                     kwargs["tensor_parallel_size"], 100 * kwargs["gpu_memory_utilization"])
            self._llm = vllm.LLM(**kwargs)
        return self._llm

    def generate(self, prompts: Sequence[Prompt],
                 on_result: Callable[[int, Completion], None] | None = None) -> list[Completion]:
        """One completion per prompt, in input order, from one ``LLM.generate`` call.

        Args:
            prompts: The prompts of the run.
            on_result: Called as ``on_result(index, completion)`` for every prompt once the
                batch is done (vLLM returns the whole batch at once).

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
        kwargs = sampling_kwargs(self.cfg, self.grammar)
        if "structured_outputs" in kwargs:
            from vllm.sampling_params import StructuredOutputsParams

            kwargs["structured_outputs"] = StructuredOutputsParams(**kwargs["structured_outputs"])
        params = vllm.SamplingParams(**kwargs)
        outputs = llm.generate(texts, params)
        if len(outputs) != len(texts):
            raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(texts)} prompts")
        completions = parse_outputs(outputs, self.stop)
        if on_result is not None:
            for i, completion in enumerate(completions):
                on_result(i, completion)
        return completions
