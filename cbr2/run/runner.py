"""The evaluation loop: questions → retrieval → prompts → one generation each (and, with
``generation.fallback``, one correction for each visible failure) → scored predictions →
metrics, report and W&B (``run_folder.finish_run``).

Which questions are judged is ``cbr2.evaluation.selection``'s; the folder, its config check,
provenance and the predictions cache are ``cbr2.run.run_folder``'s.

``predictions.jsonl`` is appended (and flushed) as answers come, so a crashed or interrupted
run resumes where it stopped: questions already in the file are not generated again.

The stages are functions and one class that the Python API (``cbr2.service``) calls too, so a
question asked there goes the way an evaluated one does: ``prepare`` (checks, the structural
retriever resolved), a ``Retriever`` when the configuration ``retrieves``, ``reach_of`` and
``build_prompts``, then an ``Answerer`` (the backend under the run's grammar, the executor and the
canonicaliser, built once) whose ``answer`` generates, scores and, with the fallback, corrects.

The run loop hands the lower stages what they would otherwise read from sections not theirs, as
values: the cache root (the configuration's ``cache_dir``) to the KB store, retrieval, the
canonicaliser and the backend; the grammar to the backend as data (``ProgramGrammar.record``), and
to each prompt it generates for its own grammar text (``ProgramGrammar.request_prompt``); the
gold programs to the gold writer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from cbr2.common.console import progress
from cbr2.common.errors import UserError
from cbr2.common.locks import hold_folder
from cbr2.common.records import PROMPT_TOO_LONG, Completion, Prediction, Prompt
from cbr2.config import GenerationConfig, LLMConfig, RetrievalConfig, canonical_ablation
from cbr2.data.benchmarks import Benchmark
from cbr2.data.questions import Question
from cbr2.evaluation.records import append_record, is_pending, load_predictions
from cbr2.evaluation.scoring import score_completion, unanswered
from cbr2.evaluation.selection import resolve_shard, select_questions, shard_of
from cbr2.generation.canonicalize import Canonicalizer, build_canonicalizer
from cbr2.generation.fallback import build_correction, corrected, first_pass
from cbr2.generation.grammar import build_grammar
from cbr2.generation.grounded import ANSWER, Reach, case_answer_types, grounded_arguments, pool_hops, slot_candidates
from cbr2.generation.prompt import PromptBuilder, prompt_hash
from cbr2.kopl.executor import Executor
from cbr2.kopl.sketch import schema_items, sketch
from cbr2.kopl.text import parse_text
from cbr2.llm import backend_class, check_capabilities, make_backend
from cbr2.retrieval.cases import VIEWS, Query
from cbr2.retrieval.knowledge import Knowledge
from cbr2.retrieval.metrics import linking_metrics, retrieval_metrics
from cbr2.retrieval.retriever import CASE_MODES, Retrieved, Retriever, check_retrieval_config
from cbr2.run.run_folder import (
    check_same_config,
    finish_run,
    generation_key,
    output_dir,
    provenance,
    write_config,
)
from cbr2.structural.on_demand import resolve_structural

log = logging.getLogger(__name__)

BATCH = 64
"""Questions per retrieval batch."""


def device_settings(cfg: DictConfig, llm: bool = True, retrieval_only: bool = False) -> dict[str, Any]:
    """What ``cbr2.common.devices.check_devices`` checks of an evaluation, read off its configuration:
    its keyword arguments (``check_devices(**device_settings(cfg))``).

    Args:
        cfg: An evaluation's configuration (``cbr2.config.Config``).
        llm: Whether the run generates (``--show-prompt`` and ``--retrieval-only`` do not load the LLM).
        retrieval_only: Whether the run scores every retrieval view (``--retrieval-only``).

    Returns:
        ``retrieval_device``, ``encoder_backend``, ``encodes`` (a case view, knowledge triples, every
        view with ``--retrieval-only``, or ``generation.canonicalize``'s encoder when it generates),
        ``llm_backend`` (None when the run does not generate) and ``llm_device``.
    """
    r = cfg.retrieval
    encodes = retrieves(r, VIEWS if retrieval_only else ()) or (llm and bool(cfg.generation.canonicalize))
    return {"retrieval_device": str(r.device), "encoder_backend": str(r.encoder_backend), "encodes": encodes,
            "llm_backend": cfg.llm.backend if llm else None, "llm_device": str(cfg.llm.device)}


def prepare(cfg: DictConfig, bench: Benchmark, retrieval_only: bool = False) -> DictConfig:
    """Checks that fail fast; the configuration with the structural retriever resolved (a new
    one: the caller's is left as it is), trained first when an embedded benchmark has none
    (``resolve_structural``)."""
    if not retrieval_only:
        # A misspelt backend, or one that cannot decode what the generation section asks, fails
        # before minutes of retrieval and model loading.
        check_capabilities(cfg.llm, cfg.generation, cfg.retrieval.link)
    check_retrieval_config(cfg.retrieval, cfg.cache_dir)
    if retrieval_only or "structural" in CASE_MODES[cfg.retrieval.cases]:
        # Resolved once and saved in config.yaml, so the run records the exact retriever used.
        structural = resolve_structural(cfg.structural, cfg.data, bench)
        return OmegaConf.merge(cfg, {"structural": {"checkpoint": structural}})
    return cfg


def reach_of(gen: GenerationConfig, link: bool, bench: Benchmark) -> Reach | None:
    """The KB around linked entities for ``generation.narrow`` (None where grounded decoding does
    not act), its hops the training pool's longest ``Relate`` chain.

    Args:
        gen: The ``generation`` section (``narrow``, ``grounded``, ``constrained``).
        link: ``retrieval.link`` (grounded decoding acts only with it).
        bench: Gives the KB and the training pool.
    """
    if not (gen.narrow and gen.grounded and gen.constrained and link):
        return None
    hops = pool_hops(q.program for q in bench.questions(bench.family.train_split))
    log.info("generation.narrow: Relate pairs and concepts within %d hop(s) of the linked entities "
             "(the training pool's longest Relate chain)", hops)
    return Reach(bench.kb, hops)


def build_prompts(prompt: DictConfig, generation: DictConfig, questions: Sequence[Question],
                  retrieved: dict[str, Retrieved], reach: Reach | None = None) -> list[Prompt]:
    """One prompt per question, from its text and what retrieval returned for it.

    The builder is given ``Query(id, text)`` for the target question, never the question
    itself: its gold program and answer cannot reach the prompt.

    Args:
        prompt: The ``prompt`` section (program format, triples per case, knowledge style).
        generation: The ``generation`` section (grounded decoding's candidates; with
            ``answer_type=structural`` the answer types of the structural view's cases join them).
        questions: The questions, in order.
        retrieved: What retrieval returned, by question id (a question without it gets none).
        reach: With ``generation.narrow`` (``reach_of``), the relation pairs and concepts around
            each question's linked entities join its candidates.
    """
    builder = PromptBuilder(prompt.format, prompt.case_triples, prompt.knowledge_style)
    empty = Retrieved(Query("", ""), Knowledge(), [])
    ground = generation.grounded and generation.constrained
    prompts = []
    for q in questions:
        item = retrieved.get(q.qid, empty)
        grounding = ()
        if ground and item.links is not None:
            found = slot_candidates(item.links, q.question, generation.find_needs_link)
            if reach is not None:
                found.update(reach.candidates(item.links))
            if generation.answer_type == "structural" and (answers := case_answer_types(item.cases)):
                found[ANSWER] = answers
            grounding = tuple(found.items())
        prompts.append(builder.build(Query(q.qid, q.question), item.knowledge, item.cases, item.case_knowledge,
                                     item.links, item.case_links or None, grounding))
    return prompts


def show_prompt(cfg: DictConfig, index: int) -> str:
    """Exactly what the model would read for question ``index`` (0-based) of the selected questions.

    Retrieves for that one question and renders its prompt the way the configured backend
    would (plain text, or the model's chat template), without loading an LLM.

    Raises:
        ValueError: If ``index`` is outside the selected questions.
    """
    bench = Benchmark.from_config(cfg.data, cfg.cache_dir)
    questions = select_questions(bench, cfg.data.split, cfg.eval)
    if not 0 <= index < len(questions):
        raise UserError(f"--show-prompt {index}: the selection has {len(questions)} questions (0..{len(questions) - 1})")
    cfg = prepare(cfg, bench)
    question = questions[index]
    # On stderr (stdout is the prompt alone), so the prompt can be matched to predictions.jsonl.
    log.info("--show-prompt %d: question id %s (%s), number %d of the %d selected: %s", index, question.qid,
             question.category, index + 1, len(questions), question.question)
    retrieved = {}
    if retrieves(cfg.retrieval):
        retriever = Retriever(bench, cfg.retrieval, cfg.structural.checkpoint, cache_dir=cfg.cache_dir)
        retrieved = {question.qid: retriever.retrieve([Query(question.qid, question.question)])[0]}
    (prompt,) = build_prompts(cfg.prompt, cfg.generation, [question], retrieved,
                              reach_of(cfg.generation, cfg.retrieval.link, bench))
    backend = make_backend(cfg.llm, {question.qid: question.program}, program_format=cfg.prompt.format,
                           cache_dir=cfg.cache_dir)
    return backend.render(prompt)


def run_evaluation(cfg: DictConfig, retrieval_only: bool = False, ablation: str | None = None,
                   config_files: Sequence[str | Path] = ()) -> dict[str, Any]:
    """Evaluate a configuration end to end and write its output folder.

    Args:
        cfg: The resolved configuration (``cbr2.config.Config``).
        retrieval_only: Retrieve and score retrieval only (every view), no generation.
        ablation: The ``--ablation`` name the configuration came from (recorded; names the folder).
            The Table 5 setting the run is labelled with is read off the configuration itself
            (``config.setting_of``), so a run of the CPU defaults is w/o_knowledge with or
            without ``--ablation w/o_knowledge``.
        config_files: The ``--config`` files of the base the ablation was applied to (recorded).

    Returns:
        The metrics (also written to ``metrics.json``).
    """
    ablation = canonical_ablation(ablation)
    bench = Benchmark.from_config(cfg.data, cfg.cache_dir)
    shard, num_shards = resolve_shard(cfg.eval)
    cfg = OmegaConf.merge(cfg, {"eval": {"shard": shard, "num_shards": num_shards}})  # as config.yaml records it
    selection = select_questions(bench, cfg.data.split, cfg.eval)
    questions = shard_of(selection, shard, num_shards)
    out = output_dir(cfg, bench, retrieval_only, ablation)
    cfg = prepare(cfg, bench, retrieval_only)
    out.mkdir(parents=True, exist_ok=True)
    # One writer per folder, from the config check to the last file: a second run (the same
    # command in two terminals, a requeued task whose first incarnation still runs) waits for it.
    with hold_folder(out, cfg.eval.folder_wait_s):
        if not retrieval_only:
            check_same_config(out, cfg)
        write_config(out, cfg)
        prov = provenance(cfg, bench, out, selection, ablation, config_files)

        retrieval, retrieved = run_retrieval(cfg.retrieval, bench, questions, out, cfg.structural.checkpoint,
                                             extra_views=VIEWS if retrieval_only else (), cache_dir=cfg.cache_dir)
        records: list[Prediction] | None = None  # None: a retrieval-only run
        if not retrieval_only:
            prompts = build_prompts(cfg.prompt, cfg.generation, questions, retrieved,
                                    reach_of(cfg.generation, cfg.retrieval.link, bench))
            records = generate_and_score(cfg, bench, questions, prompts, out)
        return finish_run(out, cfg, bench, prov, selection, len(questions), records, retrieval)


def generate_and_score(cfg: DictConfig, bench: Benchmark, questions: Sequence[Question], prompts: Sequence[Prompt],
                       out: Path) -> list[Prediction]:
    """Generate what is not cached, score it, append it to ``predictions.jsonl`` as it comes.

    ``predictions.jsonl`` doubles as the cache: a record is reused when its prompt hash and
    generation key (backend, model, sampling parameters, ``generation`` section) equal this
    run's, so an interrupted run resumes where it stopped and a changed prompt is generated again.

    With ``generation.fallback`` the single pass is followed by one correction round for the
    programs that failed (``cbr2.generation.fallback``): a failed first pass is written at once,
    marked pending, and its final record is appended after the correction, so a resumed run
    runs only the corrections still missing.

    Returns:
        The records of ``questions``, in order.
    """
    pred_path = out / "predictions.jsonl"
    answerer = Answerer(cfg, bench, questions)
    gen_key = answerer.generation_key
    hashes = [prompt_hash(p) for p in prompts]
    done = load_predictions(pred_path, repair=True)  # cuts a half-written last record before appending
    cached = {q.qid for q, h in zip(questions, hashes, strict=True)
              if q.qid in done and done[q.qid].get("prompt_hash") == h and done[q.qid].get("generation_key") == gen_key}
    todo = [i for i, q in enumerate(questions) if q.qid not in cached]
    pending = [i for i, q in enumerate(questions) if q.qid in cached and is_pending(done[q.qid])]
    log.info("%s: %d questions, %d cached in %s (%d awaiting their correction), %d to generate with %s", bench.name,
             len(questions), len(cached), pred_path, len(pending), len(todo), cfg.llm.backend)
    if not todo and not pending:
        return [done[q.qid] for q in questions]

    with pred_path.open("a", encoding="utf-8") as sink:
        def write(record: Prediction) -> None:
            append_record(sink, record)
            done[record["id"]] = record

        answerer.answer(questions, prompts, write, todo, [(i, done[questions[i].qid]) for i in pending], hashes)
    return [done[q.qid] for q in questions]


def gpu_reserve(llm: LLMConfig, retrieval: RetrievalConfig, structural: str | None, canonicalize: bool,
                bench: Benchmark, indexes_resident: bool) -> int:
    """Bytes an engine that takes a share of the GPU at start (vLLM) must leave to retrieval in this
    process (``cbr2.retrieval.gpu_memory.retrieval_beside``, logged); 0 for other backends, or when
    ``llm.gpu_memory_utilization`` is set (the user's share is the one that runs).

    Args:
        llm: The ``llm`` section (``backend``, ``gpu_memory_utilization``).
        retrieval: The ``retrieval`` section (what it holds on the GPU).
        structural: ``structural.checkpoint``, the structural retriever (resolved: ``prepare``).
        canonicalize: ``generation.canonicalize`` (its encoder is held too).
        bench: The benchmark whose KB and case pool the indexes cover.
        indexes_resident: Whether retrieval's indexes stay beside the engine (``Answerer``).
    """
    if llm.gpu_memory_utilization is not None or not getattr(backend_class(llm.backend), "shares_gpu", False):
        return 0
    from cbr2.retrieval.gpu_memory import retrieval_beside

    beside = retrieval_beside(bench, retrieval, structural, bool(canonicalize), indexes_resident)
    log.info("the engine's share of the GPU leaves %s", beside.describe())
    return beside.total


class Answerer:
    """Generation and scoring of prompts for one configuration: the backend (under the run's grammar
    with ``generation.constrained``), the executor and the canonicaliser, each built once and used
    for every ``answer`` call (the evaluation loop makes one per run; the Python API one for all its
    questions).

    Building it loads no weights (they load on the first generation); the executor and the
    canonicaliser are built when something is first scored, or by ``load``: a run whose answers
    are all cached builds neither.

    Args:
        cfg: The resolved configuration (``prepare``).
        bench: The benchmark: its KB (grammar, executor, canonicaliser) and answer form.
        questions: The questions the gold writer (``llm.backend=gold``) writes programs for:
            ``make_backend`` hands it their gold programs; other backends get none.
        indexes_resident: Whether retrieval's indexes stay beside the engine (a process that
            answers questions as they come) rather than being freed before it starts (a run): an
            engine that takes a share of the GPU at start leaves them room (``gpu_reserve``).

    Attributes:
        grammar: The run's grammar (``generation.constrained``), else None.
        backend: The built backend (``cbr2.llm.make_backend``).
        generation_key: The predictions cache's second key (``run_folder.generation_key``).
    """

    def __init__(self, cfg: DictConfig, bench: Benchmark, questions: Sequence[Question] = (),
                 indexes_resident: bool = False):
        self.cfg, self.bench = cfg, bench
        gen = cfg.generation
        self.grammar = build_grammar(gen, cfg.prompt.format, bench) if gen.constrained else None
        self.backend = make_backend(cfg.llm, {q.qid: q.program for q in questions},
                                    grammar=self.grammar.record() if self.grammar is not None else None,
                                    program_format=cfg.prompt.format,
                                    gpu_reserve_bytes=gpu_reserve(cfg.llm, cfg.retrieval, cfg.structural.checkpoint,
                                                                  gen.canonicalize, bench, indexes_resident),
                                    cache_dir=cfg.cache_dir)
        self.generation_key = generation_key(gen, self.backend)
        self._executor: Executor | None = None
        self._canonicalize: Canonicalizer | None = None

    def load(self) -> None:
        """Build the executor and the canonicaliser now, if not yet (a server's first question then
        costs what the next ones do)."""
        if self._executor is None:
            self._executor = Executor(self.bench.kb, self.cfg.eval.timeout_s, engine=self.cfg.eval.executor)
            if self.cfg.generation.canonicalize:
                self._canonicalize = build_canonicalizer(self.cfg.retrieval,
                                                         self.cfg.generation.canonicalize_threshold, self.bench,
                                                         self.cfg.cache_dir)

    @property
    def executor(self) -> Executor:
        """The executor of ``eval.executor``, bounded by ``eval.timeout_s`` (built on first use)."""
        self.load()
        return self._executor

    def score(self, text: str, question: Question) -> Prediction:
        """``score_completion`` of a generated text for ``question`` under this configuration."""
        return score_completion(text, question, self.bench, self.executor, self.cfg.prompt.format,
                                canonicalize=self._canonicalize)

    def answer(self, questions: Sequence[Question], prompts: Sequence[Prompt], write: Callable[[Prediction], None],
               todo: Sequence[int] | None = None, pending: Sequence[tuple[int, Prediction]] = (),
               hashes: Sequence[str] | None = None, show_progress: bool = True) -> None:
        """Generate for the questions of ``todo`` in one ``generate`` call, score each text as it
        comes and hand its record to ``write``; with ``generation.fallback``, then one correction
        round, in one more call, for the first passes that failed visibly (each written at once,
        marked pending, then again as its final record).

        A record carries what its prompt and the backend say of it: ``prompt_hash``,
        ``generation_key``, the token counts, ``prompt_chars``, ``grounded`` (with grounded decoding), and ``latency_s``: the wall time since the
        previous answer, so that their sum is the generation time, also for backends that return
        a whole batch at once.

        Args:
            questions: The questions (ids and texts; their gold side is read only to judge).
            prompts: Their prompts (``build_prompts``), aligned with ``questions``.
            write: Receives each record (pending first passes, then final records).
            todo: The indices of the questions to generate for (default: all).
            pending: ``(index, pending first-pass record)`` of corrections still owed (a resumed run's).
            hashes: ``prompt_hash`` of each prompt (computed when not given).
            show_progress: Show the progress display.
        """
        gen = self.cfg.generation
        todo = list(range(len(questions)) if todo is None else todo)
        hashes = list(hashes) if hashes is not None else [prompt_hash(p) for p in prompts]
        corrections = list(pending)

        def score(text: str, i: int) -> Prediction:
            return self.score(text, questions[i])

        if todo:
            with progress(total=len(todo), desc="generate", unit="q", disable=not show_progress) as bar:
                last = [time.perf_counter()]

                def on_result(j: int, completion: Completion) -> None:
                    i = todo[j]
                    now = time.perf_counter()
                    record = (unanswered(questions[i], PROMPT_TOO_LONG, completion.overflow) if completion.overflow
                              else score(completion.text, i))
                    record.update(_prompt_fields(record, prompts[i]))
                    record.update(prompt_hash=hashes[i], generation_key=self.generation_key,
                                  prompt_tokens=completion.prompt_tokens,
                                  completion_tokens=completion.completion_tokens, prompt_chars=len(prompts[i].text),
                                  latency_s=now - last[0])
                    last[0] = now
                    if gen.fallback:
                        record = first_pass(record)
                        if is_pending(record):
                            corrections.append((i, record))
                    write(record)
                    bar.update()

                self.backend.generate([self._request(prompts[i]) for i in todo], on_result=on_result)
        if corrections:
            self.load()
            # A correction prompt carries no candidates: it decodes under the run's grammar.
            _correct(self.bench, self._canonicalize, self.backend,
                     [(i, prompts[i], record) for i, record in corrections], score, write, show_progress)

    def _request(self, prompt: Prompt) -> Prompt:
        """``prompt`` as the backend decodes it: with its own grammar text when the run's grammar
        narrows to its candidates (``ProgramGrammar.request_prompt``)."""
        return self.grammar.request_prompt(prompt) if self.grammar is not None else prompt


def _prompt_fields(record: Prediction, prompt: Prompt) -> dict[str, Any]:
    """The record's fields that compare its program with what its prompt offered: ``grounded``,
    which of the program's grounded-kind arguments came from the question's candidates (with
    grounded decoding; none without)."""
    if not prompt.grounding:
        return {}
    program = None
    if record.get("program"):
        try:
            program = parse_text(record["program"], "dag")
        except ValueError:
            program = None
    return {"grounded": grounded_arguments(program, dict(prompt.grounding))}


def _correct(bench: Benchmark, canonicalize: Any, backend: Any, failed: Sequence[tuple[int, Prompt, Prediction]],
             score: Callable[[str, int], Prediction], write: Callable[[Prediction], None],
             show_progress: bool = True) -> None:
    """The fallback's correction round: one prompt per failed first pass, all in one ``generate`` call.

    The same backend object generates (under the same grammar when constrained). Suggestions
    come from the canonicaliser when ``generation.canonicalize`` built one; otherwise from a
    lexical-only ``Canonicalizer``, which needs no encoder: loading one and embedding a KB's
    whole vocabulary would cost more than the few corrections of a run, and the model reading
    the suggestions judges their meaning itself. Each correction's latency includes building
    its prompt.

    Args:
        failed: ``(question index, its prompt, its pending first-pass record)`` each.
        score: Scores a generated text for question index ``i``.
        write: Receives each final record (the run appends it to ``predictions.jsonl``).
        show_progress: Show the progress display.
    """
    start = time.perf_counter()
    if canonicalize is None:
        canonicalize = Canonicalizer(bench.kb.vocabulary)
    corrections = [build_correction(prompt, record, bench.kb.vocabulary, canonicalize.nearest)
                   for _, prompt, record in failed]
    log.info("fallback: correcting %d failed programs", len(corrections))
    with progress(total=len(corrections), desc="correct", unit="q", disable=not show_progress) as bar:
        last = [start]

        def on_result(j: int, completion: Completion) -> None:
            i, _, first = failed[j]
            now = time.perf_counter()
            write(corrected(first, score(completion.text, i), completion, now - last[0], prompt_hash(corrections[j])))
            last[0] = now
            bar.update()

        backend.generate(corrections, on_result=on_result)


def retrieves(r: RetrievalConfig, extra_views: Sequence[str] = ()) -> bool:
    """Whether the ``retrieval`` section retrieves anything (cases, triples, or ``extra_views`` to score)."""
    return bool(extra_views) or r.cases != "none" or r.k_ontology > 0 or r.k_facts > 0


def run_retrieval(retrieval: RetrievalConfig, bench: Benchmark, questions: list[Question], out: Path,
                  structural: str | None = None, extra_views: tuple[str, ...] = (),
                  cache_dir: str | Path | None = None) -> tuple[dict[str, Any] | None, dict[str, Retrieved]]:
    """Retrieve for every question, write ``retrieval.jsonl`` and score retrieval.

    Retrieval sees ``Query(id, text)`` only; the gold programs are read afterwards, to score
    what was retrieved.

    Args:
        retrieval: The ``retrieval`` section.
        bench: The benchmark (KB and case pool).
        questions: The questions to retrieve for.
        out: The run folder (``retrieval.jsonl`` is written there).
        structural: ``structural.checkpoint``, the structural retriever (resolved: ``prepare``).
        extra_views: Views ranked for metrics beyond those the cases use (``--retrieval-only``: all).
        cache_dir: The cache root (the configuration's ``cache_dir``).

    Returns:
        The ``retrieval`` block of ``metrics.json`` (None when the configuration retrieves
        nothing) and the retrieved items by question id.
    """
    if not retrieves(retrieval, extra_views):
        return None, {}
    retriever = Retriever(bench, retrieval, structural, extra_views, cache_dir)
    start = time.perf_counter()
    queries = [Query(q.qid, q.question) for q in questions]
    embeddings = retriever.encode(queries, cache=True)
    retrieved: list[Retrieved] = []
    with progress(total=len(queries), desc="retrieve", unit="q", disable=len(queries) <= BATCH) as bar:
        for i in range(0, len(queries), BATCH):
            batch = queries[i: i + BATCH]
            retrieved += retriever.retrieve(batch, {key: rows[i: i + BATCH] for key, rows in embeddings.items()})
            bar.update(len(batch))
    seconds = time.perf_counter() - start
    with (out / "retrieval.jsonl").open("w", encoding="utf-8") as sink:
        for item in retrieved:
            append_record(sink, item.to_record())

    if any(q.program is None for q in questions):  # a test split: nothing to score retrieval against
        return {"seconds_per_question": seconds / max(1, len(questions))}, {item.query.qid: item for item in retrieved}
    pool_sketches = [sketch(q.program) for q in retriever.pool]
    view_sketches = {view: [[pool_sketches[i] for i, _ in item.rankings[view]] for item in retrieved]
                     for view in retriever.views}
    knowledge = retriever.knowledge is not None
    block = retrieval_metrics(
        [sketch(q.program) for q in questions], view_sketches,
        gold_items=[schema_items(q.program) for q in questions] if knowledge else None,
        ontology_terms=[{t for tr in item.knowledge.ontology for t in tr.terms} for item in retrieved],
        fact_terms=[{t for tr in item.knowledge.facts for t in tr.terms} for item in retrieved],
    )
    if retrieval.link:
        block["linking"] = linking_metrics([q.program for q in questions],
                                           [{"entities": item.links.entities, "values": item.links.all_values()}
                                            for item in retrieved])
    block["seconds_per_question"] = seconds / max(1, len(questions))
    block["encoders"] = {view: name for view, (name, _) in retriever.encoders.items()}
    return block, {item.query.qid: item for item in retrieved}
