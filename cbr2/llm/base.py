"""What every LLM backend receives and returns.

A backend gets ``Prompt`` objects (built by ``cbr2.generation.prompt``) and returns one ``Completion``
per prompt, in order; under constrained decoding it is built with the run's ``Grammar``, and a
prompt may carry a grammar of its own (``Prompt.grammar``). All three are records of
``cbr2.common.records``: data, so that the backends depend on nothing of the stages that make them.
How a prompt becomes model input is ``render``'s (``Rendering``, the one every backend shares):
``Prompt.text`` for a base model (plain completion), ``Prompt.messages`` in the model's chat form
for an instruction model (``llm.chat``); it shows exactly that input without loading weights, for
``evaluate.py --show-prompt``. ``Backend`` is the protocol that every backend satisfies; its
``capabilities`` name the decoding features (``FEATURES``) it honours, so a run asks the backend,
not its name, and one that asks for more stops at start.

Backends read their ``llm`` section (``cbr2.config.LLMConfig``, or a DictConfig of it) field by
field with no fallbacks of their own: every default is stated once, in the schema.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from cbr2.common.records import Completion, Grammar, Prompt

if TYPE_CHECKING:
    from cbr2.config import LLMConfig


FEATURES = {
    "constrained": "decodes under the run's grammar (``generation.constrained``): the backend is built "
                   "with a ``grammar``",
    "grounded": "decodes a prompt that carries a grammar of its own (``Prompt.grammar``: the run's, with the "
                "arguments drawn from the question's candidates, ``generation.grounded``) under that text",
}
"""The decoding features a backend may declare in ``capabilities``, and what declaring one promises."""


def prompt_seed(seed: int, text: str) -> int:
    """A sampling seed for one prompt from ``llm.seed`` and the prompt's text: a prompt's samples do
    not depend on the order, batch or shard it runs in."""
    return int.from_bytes(hashlib.sha256(f"{seed}\x00{text}".encode()).digest()[:4], "little") & 0x7FFFFFFF


@runtime_checkable
class Backend(Protocol):
    """What the evaluation loop (``cbr2.run.runner``) asks of a program generator.

    A backend is any object with these three methods and a ``capabilities`` class attribute
    (structural typing: a fake needs no base class; the project's backends share helpers and take
    their one ``render`` from ``Rendering``). ``make_backend`` builds the configured one; tests pass
    fakes. Building one loads nothing: weights load on the first ``generate``.
    """

    capabilities: frozenset[str]
    """The ``FEATURES`` it honours, declared on the class (read before anything is built)."""

    def identity(self) -> dict[str, Any]:
        """What, beside the prompt, decides the output: the predictions-cache key (JSON-serialisable,
        read without loading weights)."""
        ...

    def render(self, prompt: Prompt) -> str:
        """Exactly the model input for ``prompt`` (``evaluate.py --show-prompt``; reads at most a tokenizer)."""
        ...

    def generate(self, prompts: Sequence[Prompt],
                 on_result: Callable[[int, Completion], None] | None = None) -> list[Completion]:
        """One completion per prompt, in input order; ``on_result(index, completion)`` as each one is done."""
        ...


class Rendering:
    """The one ``render`` of the backends: a prompt becomes model input in one of two ways.

    A backend that inherits it says which with ``uses_chat`` (``llm.chat``, else its own default)
    and, when it may chat, how the messages are written with ``chat_text``: a chat template, or
    for a server that applies its own, the messages as they are sent.
    """

    uses_chat: bool
    """Whether prompts go in the model's chat form (an instruction model) rather than as plain text."""

    def render(self, prompt: Prompt) -> str:
        """Exactly the model input for ``prompt``: its chat form (``chat_text``) with ``uses_chat``,
        else its plain text (``Prompt.text``); reads at most a tokenizer, never weights."""
        return self.chat_text(prompt) if self.uses_chat else prompt.text

    def chat_text(self, prompt: Prompt) -> str:
        """``prompt``'s messages (``Prompt.messages``) in the model's chat form, ready for its answer."""
        raise NotImplementedError(f"{type(self).__name__} writes plain text only")


def stop_strings(cfg: LLMConfig) -> list[str]:
    """``llm.stop`` as a plain list of non-empty strings (a ListConfig is not JSON/pickle friendly)."""
    return [str(s) for s in cfg.stop if str(s)]


def cut_at_stop(text: str, stop: Iterable[str]) -> str:
    """``text`` up to the earliest occurrence of any stop string (the stop string excluded).

    Engines stop on these strings themselves; cutting again makes every backend's text end
    the same way whatever the engine includes.
    """
    end = len(text)
    for s in stop:
        if s:
            i = text.find(s, 0, end)
            if i != -1:
                end = i
    return text[:end]


def token_cap(cfg: LLMConfig, grammar: Grammar | None = None) -> int:
    """Most tokens one completion may have: ``llm.max_new_tokens``, or under a grammar
    (``generation.constrained``) its longest text in bytes plus the end-of-sequence token.

    Every token is at least one byte of the grammar's finite language, so that cap never cuts a
    constrained program mid-line, which ``llm.max_new_tokens`` could.
    """
    if grammar is not None:
        return grammar.max_bytes + 1
    return int(cfg.max_new_tokens)


def decoding_identity(cfg: LLMConfig, grammar: Grammar | None = None, **fields: Any) -> dict[str, Any]:
    """A backend's predictions-cache key: its own ``fields`` plus the decoding parameters, and the
    grammar's identity and token cap when it decodes under one.

    The seed only counts when sampling (temperature > 0): greedy output does not depend on it.
    """
    temperature = float(cfg.temperature)
    ident = {**fields, "max_new_tokens": int(cfg.max_new_tokens), "temperature": temperature,
             "top_p": float(cfg.top_p), "stop": stop_strings(cfg)}
    if temperature > 0:
        ident["seed"] = int(cfg.seed)
    if grammar is not None:
        ident.update(grammar.identity, max_new_tokens=token_cap(cfg, grammar))
    return ident


def request_grammar(grammar: Grammar, prompt: Prompt) -> str:
    """The grammar text one request decodes under: the prompt's own (``Prompt.grammar``, grounded
    decoding) when it has one, else the run's."""
    return prompt.grammar if prompt.grammar is not None else grammar.ebnf


def apply_chat_template(tokenizer: Any, prompt: Prompt) -> str:
    """The prompt in the model's chat template, ready for the assistant's answer.

    ``enable_thinking=False``: Qwen3's template then emits an empty think block, so the model
    answers directly; templates without the variable ignore it.
    """
    return tokenizer.apply_chat_template(prompt.messages, tokenize=False, add_generation_prompt=True,
                                         enable_thinking=False)
