"""The Python API (``cbr2.service.KBQA``) and the ``ask`` command: one question answered with its whole
trace, failures that say where and why, bad questions as one-line user errors, execution bounded off
the main thread, and the run browser showing the trace the API returns."""

from __future__ import annotations

import json
import threading
import time

import pytest

from cbr2.common.errors import ConfigError, UserError
from cbr2.data.benchmarks import Benchmark
from cbr2.evaluation.trace import TRACE_VERSION
from cbr2.kopl.checker import check_text
from cbr2.kopl.errors import ExecutionError
from cbr2.kopl.executor import Executor
from cbr2.kopl.text import to_text
from cbr2.retrieval.cases import Query
from cbr2.service import KBQA, MAX_QUESTION_CHARS, QuestionError
from cbr2.service.api import custom_overrides, question_id
from cbr2.service.ask import main

BACKBONE = "structural.checkpoint=sentence-transformers/all-MiniLM-L6-v2"
"""The untrained backbone as the structural view (as tests/test_retrieval.py): no training in a test."""

FAST = ["llm.backend=fake", "retrieval.cases=random"]
"""The fake LLM (tests/conftest.py) and random cases: retrieval needs no encoder, linking still runs."""

QUESTION = "Between Australia and the sovereign state whose area is 9833520 square kilometre, which one has " \
           "the lower population?"
"""mini-kqapro's val-20 (answer: Australia); asked here as text only."""

TRACE_KEYS = {"version", "id", "question", "gold", "linked", "knowledge", "cases", "case_views", "prompt", "generation",
              "program", "steps", "answer", "answered", "correct", "error_kind", "error", "fallback"}


def asked(prompt) -> str:
    """The question a prompt asks: the text after its last ``Question:``."""
    return prompt.user.rsplit("Question: ", 1)[1].split("\n", 1)[0]


@pytest.fixture(scope="module")
def gold():
    """mini-kqapro's val questions by text: their gold programs (DAG text) and answers."""
    return {q.question: q for q in Benchmark("mini-kqapro").questions("val")}


@pytest.fixture(scope="module")
def kbqa():
    """One ``KBQA`` for the module over the fake backend (``llm.backend=fake``), and that fake."""
    import conftest

    from cbr2 import llm

    fake = conftest.FakeBackend()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(conftest, "_registered_fake", fake)
        patch.setitem(llm.BACKENDS, "fake", "conftest:_registered_fake")
        yield KBQA.load(overrides=FAST), fake


def test_the_api_answers_a_question_with_its_whole_trace(kbqa, gold):
    api, fake = kbqa
    program = to_text(gold[QUESTION].program)
    fake.reply = lambda prompt: program
    answer = api.ask(f"  {QUESTION}\n")  # white space is not part of the question
    assert (answer.answer, answer.ok, answer.program, answer.question) == ("Australia", True, program, QUESTION)
    trace = answer.trace
    assert set(trace) == TRACE_KEYS and trace["version"] == TRACE_VERSION
    assert json.loads(json.dumps(trace)) == trace  # plain JSON
    # A question is its text only: no gold side, nothing judged.
    assert (trace["question"], trace["id"], trace["gold"], trace["correct"]) == (QUESTION, question_id(QUESTION),
                                                                                None, None)
    assert trace["linked"] == {"entities": ["Australia"], "concepts": ["sovereign state"],
                               "values": {"quantity": ["9833520 square kilometre"]}}
    # Random cases (no knowledge: k_ontology = k_facts = 0), each with its question, program and view.
    assert trace["knowledge"] == {"ontology": [], "facts": []} and len(trace["cases"]) == 6
    case = trace["cases"][0]
    assert case["found_by"] == [{"view": "random", "score": None}] and case["id"].startswith("train-")
    assert case["question"] and check_text(case["program"]).ok
    assert trace["case_views"]["used"] == ["random"] and "retrieval.cases=random" in trace["case_views"]["why"]
    assert trace["prompt"]["chars"] == len(fake.prompts[-1].text) and trace["prompt"]["text"] is None
    assert trace["generation"]["text"] == program and trace["program"]["repairs"] == []
    # Each step's result, from the execution that gave the answer.
    steps = trace["steps"]
    assert [s["function"] for s in steps] == ["Find", "FindAll", "FilterNum", "FilterConcept", "SelectBetween"]
    assert steps[0] == {"step": 1, "function": "Find", "args": ["Australia"], "inputs": [], "holds": "entities",
                        "count": 1, "first": ["Australia"]}
    assert steps[1]["count"] > 500 and len(steps[1]["first"]) == 5  # FindAll: every entity, the first five
    assert steps[4]["inputs"] == [1, 4] and steps[4]["first"] == ["Australia"] and steps[4]["holds"] == "a name"
    assert trace["error"] is None and trace["error_kind"] is None and trace["answered"]
    shown = api.ask(QUESTION, show_prompt=True).trace["prompt"]["text"]
    assert shown == fake.render(fake.prompts[-1]) and f"Question: {QUESTION}\n" in shown and shown.endswith("Program:\n")


def test_retrieval_and_the_prompt_see_the_question_text_only(kbqa, gold, monkeypatch):
    """Retrieval gets ``Query(id, text)`` and the prompt a question without gold side, even for a
    question a benchmark split holds with its gold program (the pool's cases carry theirs)."""
    api, fake = kbqa
    seen = []
    retrieve = api._retriever.retrieve
    monkeypatch.setattr(api._retriever, "retrieve", lambda queries, *a: seen.append(list(queries)) or retrieve(
        queries, *a))
    fake.reply = lambda prompt: "r1: FindAll[] → Count[]"
    api.ask(QUESTION)
    assert seen == [[Query(question_id(QUESTION), QUESTION)]]
    prompt = fake.prompts[-1]
    gold_program = to_text(gold[QUESTION].program)
    cases = {to_text(q.program) for q in Benchmark("mini-kqapro").questions("train")}
    assert gold_program not in cases and gold_program not in prompt.text  # nothing of its gold side
    assert prompt.qid == question_id(QUESTION) and asked(prompt) == QUESTION


def test_ask_many_is_one_generate_call_in_order_and_a_repeated_question_is_answered_once(kbqa, gold):
    api, fake = kbqa
    texts = [QUESTION, "How many film production companies have an inception after 1912?", QUESTION]
    fake.reply = lambda prompt: to_text(gold[asked(prompt)].program)
    calls = []
    generate = fake.generate
    fake.generate = lambda prompts, on_result=None, **kw: calls.append(len(prompts)) or generate(prompts, on_result)
    try:
        answers = api.ask_many(texts)
    finally:
        del fake.generate
    assert calls == [2]
    assert [a.answer for a in answers] == ["Australia", "4", "Australia"] and answers[0] is answers[2]
    assert api.ask_many([]) == []


@pytest.mark.parametrize("text, kind, where, expected", [
    ("r1: Find[Australia]\nr2: r7 → QueryName[]", "syntax", "line 2 of the generated text",
     {"code": "undefined_reference", "line": 2}),
    ("r1: Find[Australia] → Count[] → QueryName[]", "type", "step 3",
     {"code": "input_type", "step": 3, "line": None}),
    ("r1: Find[Australia] → Relate[invented by | forward] → QueryName[]", "execution", "step 2 (Relate)",
     {"code": "unknown_relation", "step": 2, "steps": []}),
    ("r1: Find[Australia] → SelectAmong[number of pages | largest]", "execution", "step 2 (SelectAmong)",
     {"code": "IndexError", "step": 2, "steps": ["Find"]}),
    ("r1: Find[Australia] → QueryAttr[height]", "empty", "step 2 (QueryAttr), the first step with an empty result",
     {"step": 2, "steps": ["Find", "QueryAttr"]}),
])
def test_a_failing_program_says_where_and_why(kbqa, text, kind, where, expected):
    api, fake = kbqa
    fake.reply = lambda prompt: text
    answer = api.ask(QUESTION)
    trace = answer.trace
    assert not answer.ok and answer.answer is None and not trace["answered"]
    error = trace["error"]
    assert (trace["error_kind"], error["kind"], error["where"]) == (kind, kind, where)
    assert error["message"] and all(error[k] == v for k, v in expected.items() if k != "steps")
    if "steps" in expected:
        assert [s["function"] for s in trace["steps"]] == expected["steps"]  # those that ran before it failed
    else:
        assert trace["steps"] is None and trace["program"]["text"] is None


@pytest.mark.parametrize("text, message", [
    ("", "the question is empty"), (" \n\t ", "the question is empty"),
    ("x" * (MAX_QUESTION_CHARS + 1), f"the question has {MAX_QUESTION_CHARS + 1:,} characters; at most {MAX_QUESTION_CHARS:,}"),
    (None, "a question is text, not NoneType"),
])
def test_bad_questions_are_user_errors_of_one_line(kbqa, text, message):
    api, fake = kbqa
    before = len(fake.prompts)
    with pytest.raises(QuestionError, match=message) as caught:
        api.ask(text)
    assert isinstance(caught.value, UserError) and "\n" not in str(caught.value)
    with pytest.raises(QuestionError, match=f"question 2 of 2: {message}"):
        api.ask_many([QUESTION, text])
    assert len(fake.prompts) == before  # nothing was asked of the model
    assert api.ask("x" * MAX_QUESTION_CHARS).question == "x" * MAX_QUESTION_CHARS  # the bound itself is taken


def test_info_says_what_answers(kbqa):
    api, _ = kbqa
    info = api.info()
    assert info["benchmark"] == "mini-kqapro" and info["kb"]["entities"] == 643 and info["cases"] == 2000
    assert (info["backend"], info["case_views"]["used"], info["max_question_chars"]) == ("fake", ["random"],
                                                                                          MAX_QUESTION_CHARS)
    assert info["trace_version"] == TRACE_VERSION and json.loads(json.dumps(info)) == info


def test_execution_stays_bounded_off_the_main_thread(kbqa, monkeypatch):
    """A server's worker thread gets no SIGALRM: the executor's deadline between steps bounds it."""
    api, fake = kbqa
    executor = api._answerer.executor
    monkeypatch.setattr(executor, "timeout_s", 0.2)
    find_all = executor.engine.FindAll
    monkeypatch.setattr(executor.engine, "FindAll", lambda: time.sleep(0.5) or find_all())
    fake.reply = lambda prompt: "r1: FindAll[] → FilterConcept[city] → Count[]"
    done = {}
    worker = threading.Thread(target=lambda: done.update(answer=api.ask(QUESTION)))
    worker.start()
    worker.join(60)
    trace = done["answer"].trace
    assert (trace["error_kind"], trace["error"]["code"], trace["error"]["where"]) == ("execution", "timeout",
                                                                                       "step 1 (FindAll)")
    assert [s["function"] for s in trace["steps"]] == ["FindAll"]  # the steps after the deadline never ran


def test_the_executor_checks_its_deadline_between_steps_in_any_thread(tiny_kb, monkeypatch):
    executor = Executor(tiny_kb, timeout_s=0.2)
    find_all = executor.engine.FindAll
    monkeypatch.setattr(executor.engine, "FindAll", lambda: time.sleep(0.3) or find_all())
    program = check_text("r1: FindAll[] → FilterConcept[city] → Count[]").program
    memory, raised = [], []

    def run():
        try:
            executor.results(program, memory)
        except ExecutionError as err:
            raised.append(err)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(30)
    (err,) = raised
    assert (err.code, err.step, len(memory)) == ("timeout", 1, 1) and err.to_dict()["step"] == 1
    monkeypatch.setattr(executor, "timeout_s", 5)
    assert executor.summarize(program, executor.results(program))[-1]["first"] == ["2"]  # in time: two cities


def test_main_prints_the_report_or_the_trace_and_exits_by_the_outcome(fake_backend, gold, capsys):
    program = to_text(gold[QUESTION].program)
    fake_backend.reply = lambda prompt: program
    assert main([QUESTION, *FAST]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"Question: {QUESTION}\nLinked: entities Australia · concepts sovereign state · values "
                          "quantity 9833520 square kilometre\nKnowledge triples: none\n")
    assert "Cases (views random: retrieval.cases=random, as configured):\n    1. train-" in out
    assert f"Program that ran (no repair needed):\n    {program.splitlines()[0]}\n" in out
    assert "    1. Find[Australia]  ⇒  entities (1): Australia\n" in out
    assert "    5. SelectBetween[population | less] ← 1, 4  ⇒  a name: Australia\n" in out
    assert out.endswith("Answer: Australia\n")

    fake_backend.reply = lambda prompt: "r1: Find[Australia] → Relate[invented by | forward] → QueryName[]"
    assert main(["--json", QUESTION, "--show-prompt", *FAST]) == 1  # failed, the trace still printed
    trace = json.loads(capsys.readouterr().out)
    assert set(trace) == TRACE_KEYS and trace["error"]["where"] == "step 2 (Relate)" and trace["prompt"]["text"]
    assert main([QUESTION, *FAST]) == 1
    assert capsys.readouterr().out.endswith("Failed (execution) at step 2 (Relate): execution error "
                                            "[unknown_relation]: step 2 (Relate): relation 'invented by' is not "
                                            "in the KB\n")

    assert main(["   ", *FAST]) == 2  # a user error: one line, no trace
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.splitlines()[-1] == "error: the question is empty: write a question " \
                                                                     "about the KB"
    assert main([QUESTION, "llm.backend=gold"]) == 2
    assert "llm.backend=gold writes the gold programs" in capsys.readouterr().err


def test_your_own_kb_and_few_cases_answer_with_semantic_cases_and_the_trace_says_why(tmp_path, fake_backend,
                                                                                      monkeypatch):
    """``kb=`` and ``cases=`` load the custom benchmark; 5 cases are too few for the structural view,
    so the questions get semantic cases only (an evaluation refuses instead), and the trace says so."""
    from test_custom_kb import KB_FILE, _few_cases
    from test_retrieval import KeywordEncoder

    monkeypatch.setattr("cbr2.retrieval.retriever.load_encoder",
                        lambda *a, **k: KeywordEncoder(["who", "teaches", "which", "courses", "require", "how", "many"]))
    cases = _few_cases(tmp_path, 5)
    api = KBQA.load(overrides=["llm.backend=fake"], kb=KB_FILE, cases=cases)
    assert api.info()["benchmark"] == "custom" and api.info()["cases"] == 5
    fake_backend.reply = lambda prompt: "r1: Find[Data Structures] → Relate[prerequisite | forward] → QueryName[]"
    answer = api.ask("Which courses require Data Structures?")
    views = answer.trace["case_views"]
    assert views["used"] == ["semantic"] and views["setting"] == "semantic" and "holds 5 cases, fewer than" in views["why"]
    assert {f["view"] for c in answer.trace["cases"] for f in c["found_by"]} == {"semantic"}
    assert answer.trace["linked"]["entities"] == ["Data Structures"] and answer.ok


def test_kb_and_cases_stand_for_the_custom_benchmark_and_come_together():
    assert custom_overrides(None, None) == []
    assert custom_overrides("kb.json", "cases.yaml") == ["data.name=custom", "data.kb=kb.json", "data.cases=cases.yaml"]
    with pytest.raises(ConfigError, match=r"^cases= needs kb=: .* \(kb=FILE cases=FILE\)$"):
        custom_overrides(None, "cases.yaml")
    # A KB alone is refused, not turned into a custom benchmark that the config refuses later in
    # its own terms (data.kb, data.cases): a few-shot method has nothing to imitate without cases.
    with pytest.raises(ConfigError, match="^kb= needs cases=: a few-shot method"):
        custom_overrides("kb.json", None)
    with pytest.raises(ConfigError, match="^kb= needs cases=") as caught:
        KBQA.load(overrides=["llm.backend=fake"], kb="kb.json")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("given, missing", [(["--kb", "kb.tsv"], "--kb needs --cases"),
                                            (["--cases", "cases.yaml"], "--cases needs --kb")])
def test_ask_takes_kb_and_cases_together_and_says_so_in_its_own_words(given, missing, fake_backend, capsys):
    assert main(["Who teaches Databases?", *given, "llm.backend=fake"]) == 2
    captured = capsys.readouterr()
    (line,) = captured.err.splitlines()  # one line, nothing loaded before it
    assert captured.out == "" and line.startswith(f"error: {missing}: ")
    assert fake_backend.prompts == []  # refused before anything loaded or was asked


# ------------------------------------------------------------------------------------------ slow

@pytest.mark.slow
def test_the_run_browser_shows_the_trace_the_api_returns(tmp_path, fake_backend, gold):
    """The same questions evaluated (the browser's trace, built from predictions.jsonl and
    retrieval.jsonl) and asked (the API's): the same prompt to the byte, so retrieval saw the text
    alone, and the same trace but for what only an evaluated question has (its gold side, id)."""
    from test_browser import browser_page, trace_of

    from cbr2.config import Config, compose
    from cbr2.run.runner import run_evaluation

    setting = ["data.name=mini-kqapro", BACKBONE, "retrieval.k_ontology=3", "retrieval.k_facts=3", "llm.backend=fake"]
    fake_backend.reply = lambda prompt: to_text(gold[asked(prompt)].program)
    run_evaluation(compose(Config, overrides=[*setting, f"output_dir={tmp_path / 'run'}", "eval.per_category=null",
                                              "eval.limit=3", "wandb.mode=disabled"]))
    evaluated = [fake_backend.render(p) for p in fake_backend.prompts]
    data = browser_page((tmp_path / "run" / "browser.html").read_text(encoding="utf-8"))
    api = KBQA.load(overrides=setting)
    answers = api.ask_many([q["question"] for q in data["questions"]])
    assert [fake_backend.render(p) for p in fake_backend.prompts[3:]] == evaluated
    for row, answer in zip(data["questions"], answers, strict=True):
        page, trace = trace_of(data, row), answer.trace
        same = ("question", "linked", "knowledge", "cases", "program", "steps", "answer", "answered", "error_kind",
                "error")
        assert {k: page[k] for k in same} == {k: trace[k] for k in same}
        assert {k: page["prompt"][k] for k in ("chars", "hash")} == {k: trace["prompt"][k] for k in ("chars", "hash")}
        assert page["gold"]["answer"] == page["answer"] and page["correct"] and trace["gold"] is None
        scores = [t["score"] for t in trace["knowledge"]["facts"]]
        assert len(scores) == 3 and all(isinstance(s, float) for s in scores)
        assert all(isinstance(f["score"], float) for c in trace["cases"] for f in c["found_by"])


@pytest.mark.slow
def test_ask_on_the_cpu_default_answers_from_execution(capsys):
    """The CPU default for real (llama.cpp, the packaged Qwen2.5-Coder-0.5B) on one mini-kqapro
    question; the untrained backbone as the structural view, so that no retriever is trained here."""
    question = "How many film production companies have an inception after 1912?"
    assert main([question, "--json", BACKBONE]) == 0  # a program ran to an answer (right or wrong: not judged)
    trace = json.loads(capsys.readouterr().out)
    assert set(trace) == TRACE_KEYS and trace["answered"] and trace["gold"] is None and trace["correct"] is None
    assert trace["linked"]["concepts"] and trace["generation"]["text"] and trace["program"]["text"]
    assert trace["prompt"]["tokens"] > 1000 and trace["generation"]["tokens"] > 0 and trace["cases"]
    assert {f["view"] for c in trace["cases"] for f in c["found_by"]} == {"semantic", "structural"}
    # The answer is what the program that ran gives on the KB, step by step.
    bench = Benchmark("mini-kqapro")
    program = check_text(trace["program"]["text"]).program
    executor = Executor(bench.kb)
    results = executor.results(program)
    assert executor.summarize(program, results) == trace["steps"]
    assert bench.answer_from_values(executor.answer(results[-1]), program) == trace["answer"]
