"""The records the stages pass on: a prompt, a completion, a prediction.

``cbr2.generation.prompt`` builds a ``Prompt``; an LLM backend (``cbr2.llm``) returns one
``Completion`` per prompt, decoding under the run's ``Grammar`` (``generation.constrained``) or a
prompt's own grammar text; ``cbr2.evaluation.scoring`` turns it into a ``Prediction`` (one line
of ``predictions.jsonl``), which ``cbr2.generation.fallback`` may correct and ``cbr2.evaluation``,
``cbr2.report``, ``cbr2.run`` and ``cbr2.cluster`` read back. They live in the core layer because
each is written by one package and read by others above and below it; a question (``Question``)
is ``cbr2.data``'s, as it carries a KoPL program.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypedDict


@dataclass(frozen=True)
class Prompt:
    """One question's prompt, in two parts so backends can cache and template them.

    Attributes:
        qid: Question id (backends ignore it; the gold writer looks the program up by it).
        system: Role instructions and the KoPL function definitions: identical for every
            question of a run, so it is a shareable prefix (vLLM prefix caching, the ``hf``
            backend's KV cache).
        user: The cases with their knowledge, the target question with its knowledge, and
            the closing ``Program:`` slot.
        grounding: ``(argument kind, candidates)`` pairs of grounded decoding
            (``cbr2.generation.grounded``, ``generation.grounded``): the values the question's
            arguments may take; empty when off. The prompt's hash and its record read them.
        grammar: The grammar text this prompt decodes under when it has one of its own: the
            run's grammar narrowed to its ``grounding`` (``ProgramGrammar.grounded_ebnf``, set by
            the runner as the prompt goes to the backend); None: the run's ``Grammar``, if any.
            Its language is a subset of the run's, so ``Grammar.max_bytes`` bounds it too.
    """

    qid: str
    system: str
    user: str
    grounding: tuple[tuple[str, tuple[str, ...]], ...] = ()
    grammar: str | None = field(default=None, repr=False)

    @property
    def text(self) -> str:
        """The plain-text prompt of a base model: system part, blank line, user part."""
        return f"{self.system}\n\n{self.user}"

    @property
    def messages(self) -> list[dict[str, str]]:
        """The chat form: one system and one user message."""
        return [{"role": "system", "content": self.system}, {"role": "user", "content": self.user}]


@dataclass(frozen=True)
class Completion:
    """What a backend generated for one prompt.

    Attributes:
        text: The generated text, cut at the first stop string (the stop string excluded).
        prompt_tokens: Tokens the model read, when the backend knows.
        completion_tokens: Tokens it generated, when the backend knows.
        overflow: Set (saying by how much) when the prompt did not fit the model's context, so
            nothing was generated: the run records the question as a failure of its own kind
            (``PROMPT_TOO_LONG``) and goes on.
    """

    text: str
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    overflow: str | None = None


@dataclass(frozen=True)
class Grammar:
    """The run's grammar as the LLM backends receive it (``generation.constrained``): its text and
    what a backend needs to know of it, not the generator that wrote it
    (``cbr2.generation.grammar.ProgramGrammar.record``).

    Attributes:
        ebnf: The grammar text (xgrammar's EBNF dialect, which vLLM's structured outputs take too).
        max_bytes: UTF-8 bytes of the longest text it accepts, and of every prompt's own grammar
            (``Prompt.grammar``, a subset): the token cap under it.
        identity: What the predictions cache keys on (``ProgramGrammar.identity``).
    """

    ebnf: str = field(repr=False)
    max_bytes: int
    identity: dict[str, Any]


PROMPT_TOO_LONG = "prompt_too_long"
"""``error_kind`` of a question whose prompt does not fit the model's context (``Completion.overflow``)."""



Record = dict[str, Any]
"""Any JSONL record: a JSON object with a string ``id`` (``retrieval.jsonl`` lines are these)."""

Answer = str | list[str] | None
"""One string (KQA Pro), a list of names (MetaQA), or None."""


class _Judged(TypedDict):
    """What ``scoring.score_generation`` writes for every prediction (see its docstring)."""

    id: str
    question: str
    category: str | None
    gold_answer: Answer
    gold_program: str | None
    generated: str
    repairs: list[str]
    syntax_error_before_repair: bool
    syntax_error: bool
    program: str | None
    unknown_arguments: list[dict[str, Any]] | None
    canonicalized: list[dict[str, Any]]
    answer: Answer
    values: list[Any] | None
    correct: bool
    error_kind: str | None
    error: dict[str, Any] | None


class FallbackInfo(TypedDict, total=False):
    """A prediction's ``fallback`` block (``cbr2.generation.fallback`` describes the layout).

    ``{"pending": True}`` for a first pass awaiting its correction, ``{"fired": False}`` when
    none was needed, else ``fired`` with the other fields.
    """

    pending: bool
    fired: bool
    kept: str
    generated: str
    error_kind: str | None
    latency_s: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    fixed: bool
    prompt_hash: str
    version: str


class Prediction(_Judged, total=False):
    """One line of ``predictions.jsonl``.

    The required keys are ``score_generation``'s; the optional ones are added on the way:
    ``generated_chars`` / ``generated_sha256`` for a clipped text, ``values_count`` for clipped
    values and ``emptied_at`` (``{"step", "function"}``, 1-based: where a program that answered
    nothing first had an empty result), ``steps`` (each executed step's result: function, arguments,
    what it holds, its size and first items, ``cbr2.kopl.executor.Executor.summarize``; None when no
    program ran) (``scoring``); the cache keys ``prompt_hash`` and ``generation_key``, the token
    counts, ``prompt_chars`` (the prompt's length as plain text) and ``latency_s`` (the runner); ``grounded`` with grounded decoding (each grounded-kind
    argument and whether the question's candidates held it, ``cbr2.generation.grounded``);
    ``single_pass`` and ``fallback`` with ``generation.fallback`` on; ``reasoning_types`` (KQA Pro's, of the
    gold program: ``data.questions.question_record``). Records of older runs may lack some keys; readers use ``.get``
    for those. They may also carry keys no run writes any more (``candidates``, of the retired
    execution-guided choice), which readers leave alone.
    """

    generated_chars: int
    generated_sha256: str
    values_count: int
    emptied_at: dict[str, Any]
    steps: list[dict[str, Any]] | None
    prompt_hash: str
    generation_key: str
    prompt_tokens: int | None
    completion_tokens: int | None
    prompt_chars: int
    latency_s: float | None
    grounded: list[dict[str, Any]]
    reasoning_types: list[str]
    single_pass: dict[str, Any]
    fallback: FallbackInfo
