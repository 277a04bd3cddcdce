"""The Python API: load a configuration once, then answer questions, each with its whole trace.

    from cbr2.service import KBQA

    kbqa = KBQA.load()                                   # the CPU default, as python evaluate.py
    kbqa = KBQA.load(config=["configs/quality.yaml"], overrides=["llm.model=qwen2.5-coder-1.5b"],
                     ablation="full")                    # composed as evaluate composes it
    answer = kbqa.ask("Who is taller, Marie Curie or Pierre Curie?")
    answer.answer, answer.program, answer.ok, answer.trace   # the trace: cbr2.evaluation.trace
    answers = kbqa.ask_many(["How many cities are there?", "Where was Marie Curie born?"])
    kbqa.info()                                          # benchmark, KB sizes, model, case views

``KBQA.load`` does what an evaluation does before its first question, once: it composes the
configuration (``cbr2.config.compose``: the schema, ``configs/evaluate.yaml``, the ``config``
files, the ablation's setting, the overrides), loads the benchmark's KB and case pool, resolves
the structural retriever (``resolve_structural``: trained first when an embedded benchmark has
none), builds the retriever, the prompt's reach, the grammar, the backend and the executor. The
LLM's weights load with the first question (``Backend.generate``) and stay.

A question is text only: it goes through the evaluation's own stages
(``cbr2.run.runner``: ``Retriever.retrieve`` of ``Query(id, text)``, ``build_prompts``,
``Answerer.answer``, which generates, scores and corrects exactly as a run does). No gold
program or answer exists for it, so nothing is judged: its trace has ``gold`` None and
``correct`` None, and ``ok`` says whether a program ran to an answer.

Bounds: a question is at most ``MAX_QUESTION_CHARS`` characters (``QuestionError`` otherwise,
as for an empty one); a program's execution stops at ``eval.timeout_s`` whatever thread asks
(``cbr2.kopl.executor``: the alarm on the main thread, a deadline checked between steps on any
other). One ``KBQA`` answers one batch at a time (a lock): LLM engines are not built for
concurrent calls, and a batch is one ``generate`` call, which vLLM batches and llama.cpp answers
in turn; ``ask_many``'s ``on_answer`` hands on each answer as soon as it is final, so a caller
need not wait for the whole batch (``cbr2.service.server`` resolves each request so).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from cbr2.common.devices import check_devices
from cbr2.common.errors import ConfigError, UserError
from cbr2.common.records import Prediction
from cbr2.config import Config, compose
from cbr2.data.benchmarks import Benchmark
from cbr2.data.questions import Question
from cbr2.evaluation.records import is_pending
from cbr2.evaluation.trace import TRACE_VERSION, build_trace
from cbr2.kopl.text import to_text
from cbr2.retrieval.cases import Query
from cbr2.retrieval.retriever import CASE_MODES, Retrieved, Retriever
from cbr2.run.runner import Answerer, build_prompts, device_settings, prepare, reach_of, retrieves
from cbr2.structural.on_demand import case_views_for

log = logging.getLogger(__name__)

MAX_QUESTION_CHARS = 1_000
"""The longest question ``ask`` takes, in characters (after runs of white space become one
space): a question, not a document; a longer text would only make a longer prompt."""


class QuestionError(UserError):
    """A question the API does not take: not text, empty, or longer than ``MAX_QUESTION_CHARS``."""


def clean_question(text: Any) -> str:
    """The question as retrieval and the prompt read it: runs of white space (line breaks
    included: the prompt is laid out in lines) become one space, and the ends are trimmed.

    Raises:
        QuestionError: For anything but a string, an empty (or white-space) question, or one of
            more than ``MAX_QUESTION_CHARS`` characters.
    """
    if not isinstance(text, str):
        raise QuestionError(f"a question is text, not {type(text).__name__}")
    question = " ".join(text.split())
    if not question:
        raise QuestionError("the question is empty: write a question about the KB")
    if len(question) > MAX_QUESTION_CHARS:
        raise QuestionError(f"the question has {len(question):,} characters; at most {MAX_QUESTION_CHARS:,} are "
                            "taken: shorten it")
    return question


def custom_overrides(kb: str | Path | None, cases: str | Path | None, *,
                     names: tuple[str, str] = ("kb=", "cases=")) -> list[str]:
    """The overrides ``kb=`` and ``cases=`` stand for: the ``custom`` benchmark over those files
    (``data.name=custom data.kb=FILE data.cases=FILE``).

    The two come together. Cases are solved questions over that KB, so they mean nothing without
    it; and a KB without cases gives the model nothing to imitate: the method is few-shot, its
    prompt is its retrieved cases, and the case pool is what the structural retriever is trained on.

    Args:
        kb: The KB file, or None.
        cases: Its cases file, or None.
        names: How the caller spells the two in a message (``("--kb", "--cases")`` for ``ask``).

    Raises:
        ConfigError: For one without the other, in one line naming the missing one.
    """
    if kb is None and cases is None:
        return []
    kb_name, cases_name = names
    if kb is None:
        both = " ".join(name + ("FILE" if name.endswith("=") else " FILE") for name in names)
        raise ConfigError(f"{cases_name} needs {kb_name}: the cases are questions over that KB ({both})")
    if cases is None:
        raise ConfigError(f"{kb_name} needs {cases_name}: a few-shot method answers after solved cases over that KB, "
                          "a YAML list of questions with their programs (docs/data.md, \"The cases file\"; "
                          "examples/university/cases.yaml)")
    return ["data.name=custom", f"data.kb={kb}", f"data.cases={cases}"]


def question_id(question: str) -> str:
    """A question's id: from its text, so that a question is retrieved for (the ``random`` view is
    seeded by the id) and cached the same way each time it is asked, and never a pool question's id
    (retrieval keeps a question from being its own case by id)."""
    return "ask-" + hashlib.sha256(question.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def case_views(cfg: DictConfig, bench: Benchmark) -> tuple[DictConfig, dict[str, Any]]:
    """Which case views the questions' prompts use and why: the configuration to answer with and a
    trace's ``case_views`` (``{"used", "setting", "why"}``).

    CASE VIEWS: the one place they are decided for asked questions and recorded in the trace.
    ``retrieval.cases`` as configured, except where ``case_views_for`` says the benchmark cannot
    carry a view: your own cases (``data.name=custom``) too few to train the structural retriever
    on get semantic cases only, and the trace says so. (An evaluation refuses that setting
    instead: it never changes ``retrieval.cases`` behind the user's back.)
    """
    mode, why = case_views_for(cfg.retrieval, bench)
    if mode != cfg.retrieval.cases:
        cfg = OmegaConf.merge(cfg, {"retrieval": {"cases": mode}})
    return cfg, {"used": list(CASE_MODES[mode]), "setting": mode, "why": why}


@dataclass(frozen=True)
class Answer:
    """One asked question's outcome.

    Attributes:
        question: The question as it was read (``clean_question``).
        answer: The executed answer (a string; a list of names on MetaQA-style KBs), None when
            no program ran to one.
        program: The program that ran (DAG text, after repair), None when none parsed and
            type-checked.
        ok: Whether a program ran to a non-empty answer (nothing judges whether it is right).
        trace: Everything between question and answer, plain JSON (``cbr2.evaluation.trace``).
    """

    question: str
    answer: str | list[str] | None
    program: str | None
    ok: bool
    trace: dict[str, Any] = field(repr=False)


class KBQA:
    """Questions answered on one benchmark with one configuration, loaded once (``KBQA.load``).

    Attributes:
        cfg: The resolved configuration (the case views and the structural retriever as used).
        bench: The benchmark: its KB and its case pool.
    """

    def __init__(self, cfg: DictConfig, bench: Benchmark, retriever: Retriever | None, answerer: Answerer,
                 views: dict[str, Any], ablation: str | None = None):
        self.cfg, self.bench = cfg, bench
        self.ablation = ablation
        self._retriever = retriever
        self._answerer = answerer
        self._reach = reach_of(cfg.generation, cfg.retrieval.link, bench)
        self._case_views = views
        self._lock = threading.Lock()

    @classmethod
    def load(cls, config: Sequence[str | Path] = (), overrides: Sequence[str] = (), ablation: str | None = None, *,
             kb: str | Path | None = None, cases: str | Path | None = None) -> KBQA:
        """Compose the configuration as ``evaluate.py`` does and load everything a question needs.

        Args:
            config: YAML files over ``configs/evaluate.yaml`` (``--config``), in order.
            overrides: ``key=value`` pairs over them (``llm.model=...``, ``data.name=...``).
            ablation: A Table 5 setting (``--ablation``; ``cbr2.config.ABLATIONS``).
            kb: With ``cases``, shorthand for ``data.name=custom data.kb=FILE``: a KB of your own.
            cases: With ``kb``, shorthand for ``data.cases=FILE``: its solved cases (one without
                the other is a ``ConfigError``: ``custom_overrides``).

        Raises:
            UserError: A ``ConfigError`` for a configuration that does not compose or a backend
                that cannot answer a question of its own (``gold``), a ``DataError`` for data
                files, a ``SetupError`` for what the machine lacks; each one line.
        """
        cfg = compose(Config, ablation=ablation, files=list(config),
                      overrides=[*overrides, *custom_overrides(kb, cases)])
        if cfg.llm.backend == "gold":
            raise ConfigError("llm.backend=gold writes the gold programs of a benchmark's questions, and an asked "
                              "question has none: choose an LLM backend (llamacpp, hf, vllm, openai)")
        check_devices(**device_settings(cfg, llm=True))
        bench = Benchmark.from_config(cfg.data, cfg.cache_dir)
        cfg, views = case_views(cfg, bench)
        cfg = prepare(cfg, bench)
        retriever = (Retriever(bench, cfg.retrieval, cfg.structural.checkpoint, cache_dir=cfg.cache_dir)
                     if retrieves(cfg.retrieval) else None)
        # The retriever stays loaded beside the engine: its indexes are left room on a shared GPU.
        answerer = Answerer(cfg, bench, indexes_resident=True)
        answerer.load()
        log.info("ready: %s, %s with %s", bench.name, cfg.llm.backend,
                 answerer.backend.identity().get("model") or cfg.llm.model)
        return cls(cfg, bench, retriever, answerer, views, ablation)

    def info(self) -> dict[str, Any]:
        """What this instance answers with (for a health endpoint): benchmark, KB sizes, case pool,
        model and backend, the case views and knowledge per question, the bounds. Reads no weights."""
        cfg = self.cfg
        pool = self._retriever.pool if self._retriever is not None else self.bench.questions(
            self.bench.family.train_split)
        return {
            "benchmark": self.bench.name,
            "kb": self.bench.kb.stats(),
            "cases": len(pool),
            "backend": cfg.llm.backend,
            "model": self._answerer.backend.identity().get("model") or cfg.llm.model,
            "ablation": self.ablation,
            "case_views": {**self._case_views, "used": list(self._case_views["used"])},
            "k": {"semantic": cfg.retrieval.k_semantic, "structural": cfg.retrieval.k_structural,
                  "ontology": cfg.retrieval.k_ontology, "facts": cfg.retrieval.k_facts},
            "structural_retriever": cfg.structural.checkpoint,
            "program_format": cfg.prompt.format,
            "constrained": bool(cfg.generation.constrained),
            "executor": cfg.eval.executor,
            "timeout_s": cfg.eval.timeout_s,
            "max_question_chars": MAX_QUESTION_CHARS,
            "trace_version": TRACE_VERSION,
        }

    def ask(self, question: str, *, show_prompt: bool = False) -> Answer:
        """Answer one question (``ask_many`` of one).

        Args:
            question: The question's text.
            show_prompt: Put the whole prompt, as the model read it, in the trace (``prompt.text``).

        Raises:
            QuestionError: For an empty question or one over ``MAX_QUESTION_CHARS``.
        """
        return self.ask_many([question], show_prompt=show_prompt)[0]

    def ask_many(self, questions: Sequence[str], *, show_prompt: bool = False,
                 on_answer: Callable[[int, Answer], None] | None = None) -> list[Answer]:
        """Answer several questions: one retrieval batch, one ``generate`` call (vLLM batches it;
        llama.cpp answers the prompts in turn) and, with ``generation.fallback``, one call of
        corrections. A question asked twice is answered once.

        Args:
            questions: The questions' texts.
            show_prompt: Put each whole prompt in its trace.
            on_answer: Called as ``on_answer(n, answer)`` as soon as the answer to ``questions[n]``
                is final (once its program ran; after its correction with ``generation.fallback``),
                so that the first answers of a batch llama.cpp answers in turn can be handed on
                before the last is generated. It runs in the calling thread, with this instance's
                lock held: it must not ask this instance.

        Returns:
            One ``Answer`` per question, in order.

        Raises:
            QuestionError: Naming the first question that is empty or too long (nothing is answered).
        """
        texts = []
        for n, text in enumerate(questions, 1):
            try:
                texts.append(clean_question(text))
            except QuestionError as err:
                raise QuestionError(f"question {n} of {len(questions)}: {err}" if len(questions) > 1 else str(err)) \
                    from None
        asked = [Question(question_id(t), t, None, None, None) for t in dict.fromkeys(texts)]
        if not asked:
            return []
        positions: dict[str, list[int]] = {}
        for n, text in enumerate(texts):
            positions.setdefault(text, []).append(n)
        index = {q.qid: i for i, q in enumerate(asked)}
        by_text: dict[str, Answer] = {}
        with self._lock:
            retrieved = self._retrieve(asked)
            prompts = build_prompts(self.cfg.prompt, self.cfg.generation, asked, retrieved, self._reach)

            def write(record: Prediction) -> None:
                if is_pending(record):  # a first pass whose correction is still to come
                    return
                i = index[record["id"]]
                q = asked[i]
                text = self._answerer.backend.render(prompts[i]) if show_prompt else None
                trace = self._trace(record, retrieved.get(q.qid), text)
                answer = Answer(q.question, trace["answer"], trace["program"]["text"], trace["answered"], trace)
                by_text[q.question] = answer
                if on_answer is not None:
                    for n in positions[q.question]:
                        on_answer(n, answer)

            self._answerer.answer(asked, prompts, write, show_progress=False)
        return [by_text[t] for t in texts]

    def _retrieve(self, questions: Sequence[Question]) -> dict[str, Retrieved]:
        """What retrieval returns for each question, by id: it is given ``Query(id, text)`` only."""
        if self._retriever is None:
            return {}
        found = self._retriever.retrieve([Query(q.qid, q.question) for q in questions])
        return {item.query.qid: item for item in found}

    def _trace(self, record: Prediction, item: Retrieved | None, prompt_text: str | None) -> dict[str, Any]:
        """``build_trace`` of an asked question: its records, the cases' texts and programs (which the
        retrieval record names by id), the case views, and the prompt when asked for."""
        cases = {}
        if item is not None:
            cases = {c.question.qid: {"question": c.question.question,
                                      "program": to_text(c.question.program, self.cfg.prompt.format)}
                     for c in item.cases}
        return build_trace(record, item.to_record() if item is not None else None, cases=cases,
                           case_views=self._case_views, prompt_text=prompt_text)
