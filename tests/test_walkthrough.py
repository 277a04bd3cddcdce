"""The walk-through (``docs/walkthrough.md``) end to end: from the university's files to answers.

The fast tier runs ``benchmarks/walkthrough.py`` over ``examples/university`` with the fake LLM
writing each asked question's gold program (from ``questions.yaml``), so everything after
generation is the real path: linking over the university's KB, retrieval of its cases by both
views, the prompt, grounded and constrained decoding's KB-own candidates, parsing, execution, the
trace; every answer must be ``questions.yaml``'s. It also checks that the example files are clean
and that every command the walk-through shows parses with the parser of the command it names
(the ``check`` outputs it shows are what ``check`` prints today). The slow tier asks one question
on the CPU default for real, the structural retriever trained on the cases on the way.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import sys
from pathlib import Path

import pytest
from test_ask import TRACE_KEYS, asked
from test_custom_kb import CASES_FILE, KB_FILE, QUESTIONS_FILE
from test_retrieval import KeywordEncoder

from cbr2.config import Config, compose
from cbr2.data.cases import load_cases
from cbr2.data.kb_loaders import load_custom_kb
from cbr2.kopl.checker import check_text
from cbr2.kopl.executor import Executor
from cbr2.kopl.text import to_text

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "walkthrough.md"
SCRIPT = ROOT / "benchmarks" / "walkthrough.py"

WORDS = ["who", "teaches", "which", "courses", "require", "how", "many", "credits", "students", "department",
         "located", "heads", "taller", "founded", "prerequisites", "enrolled", "worth"]
"""The fake encoder's vocabulary (tests/test_retrieval.py): cases are found by these words, exactly."""

STRUCTURAL = "structural.checkpoint=keyword-encoder"
"""A structural view without training one: ``load_encoder`` is the keyword encoder for any name."""


def _script():
    """``benchmarks/walkthrough.py`` as a module (it is a script, not a package's)."""
    name = "walkthrough_benchmark"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, SCRIPT)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # before it runs: its dataclasses look their module up
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="module")
def university():
    """The university's KB and its new questions (their gold programs and answers), by text."""
    kb = load_custom_kb(KB_FILE)
    return kb, {q.question: q for q in load_cases(QUESTIONS_FILE, kb)}


# ------------------------------------------------------------------ the whole path after generation

def test_the_walkthrough_answers_every_new_question_from_execution(university, fake_backend, monkeypatch):
    kb, questions = university
    monkeypatch.setattr("cbr2.retrieval.retriever.load_encoder", lambda *a, **k: KeywordEncoder(WORDS))
    fake_backend.reply = lambda prompt: to_text(questions[asked(prompt)].program)
    script = _script()
    result = script.run(KB_FILE, CASES_FILE, QUESTIONS_FILE, overrides=["llm.backend=fake", STRUCTURAL])

    assert len(result.rows) == len(questions) == 11 and result.right == 11
    assert [row.question for row in result.rows] == list(questions)  # in the file's order, each once
    cases = {q.qid: q for q in load_cases(CASES_FILE, kb)}
    pairs = {f"{r['relation']} | {r['direction']}" for ent in kb.entities.values() for r in ent["relations"]}
    narrowed, views = 0, set()
    executor = Executor(kb)
    for row, prompt in zip(result.rows, fake_backend.prompts, strict=True):
        q, trace = questions[row.question], row.trace
        assert set(trace) == TRACE_KEYS and json.loads(json.dumps(trace)) == trace
        assert trace["gold"] is None and trace["correct"] is None  # asked: nothing judged by the API
        # Linking finds the university's entities the gold program starts from.
        finds = {s.inputs[0] for s in q.program.steps if s.function == "Find"}
        assert finds <= set(trace["linked"]["entities"]), row.question
        # Cases: the university's own, by both views, each shown with its question and program.
        assert trace["case_views"]["used"] == ["semantic", "structural"] and trace["cases"]
        for case in trace["cases"]:
            pool = cases[case["id"]]
            assert (case["question"], case["program"]) == (pool.question, to_text(pool.program))
            assert case["question"] in prompt.text
        views |= {f["view"] for c in trace["cases"] for f in c["found_by"]}
        assert row.question not in {c.question for c in cases.values()}  # a new question, not a case
        # Grounded decoding's Relate candidates are the KB's own pairs, narrowed around the linked
        # entities, and leave the gold program's pairs in.
        relate = dict(prompt.grounding).get("relate", ())
        gold_pairs = {f"{s.inputs[0]} | {s.inputs[1]}" for s in q.program.steps if s.function == "Relate"}
        assert set(relate) <= pairs and gold_pairs <= set(relate)
        narrowed += bool(relate) and set(relate) < pairs
        # The answer is the executed program's, step by step, and it is the gold one.
        assert trace["program"]["text"] == to_text(q.program) and trace["answered"] and not trace["error"]
        assert trace["steps"] == executor.summarize(q.program, executor.results(q.program))
        assert script.same_answer(trace["answer"], q.answer) and row.right
    assert narrowed  # narrowing acted on at least one question
    assert views == {"semantic", "structural"}
    # Constrained decoding's grammar names the university's relations, and only them.
    (rule,) = [line for line in fake_backend.grammar.ebnf.splitlines() if line.startswith("k_relation ::=")]
    assert set(re.findall(r'"([^"]+)"', rule)) == kb.vocabulary.relations
    table = script.report(result, QUESTIONS_FILE)
    assert "right 11/11;" in table and table.count(" right ") == 11 and "examples/university/questions.yaml" in table


def test_a_wrong_answer_is_scored_wrong_with_the_gold_beside_it(university, fake_backend, monkeypatch):
    """The script's score can fail: a program that runs to another answer, one that fails."""
    _, questions = university
    monkeypatch.setattr("cbr2.retrieval.retriever.load_encoder", lambda *a, **k: KeywordEncoder(WORDS))
    first, second = list(questions)[:2]
    wrong = {first: "r1: Find[Databases] → Relate[taught by | forward] → QueryName[]",  # Ada Lovelace
             second: "r1: Find[Marie Curie] → QueryAttr[height]"}  # nothing: an empty answer
    fake_backend.reply = lambda prompt: wrong.get(asked(prompt)) or to_text(questions[asked(prompt)].program)
    script = _script()
    result = script.run(KB_FILE, CASES_FILE, QUESTIONS_FILE, overrides=["llm.backend=fake", STRUCTURAL])
    assert [row.right for row in result.rows[:3]] == [False, False, True] and result.right == 9
    assert result.rows[0].answer == ["Ada Lovelace"] and result.rows[0].error is None
    assert result.rows[1].answer == [] and result.rows[1].error.startswith("empty: ")
    table = script.report(result, QUESTIONS_FILE)
    assert "wrong  " in table and "(gold: Grace Hopper)" in table and "right 9/11;" in table
    assert not script.same_answer(["Electromagnetism"], ["Electromagnetism", "Statistical Physics"])
    assert script.same_answer("Grace Hopper", ["Grace Hopper"]) and not script.same_answer(None, ["x"])


def test_the_example_files_are_clean_and_the_new_questions_are_none_of_the_cases(university, capsys, monkeypatch):
    from cbr2.data.__main__ import main

    monkeypatch.setattr("cbr2.data.__main__.setup_logging", lambda: None)
    assert main(["check", "--kb", str(KB_FILE), "--cases", str(CASES_FILE)]) == 0
    out = capsys.readouterr().out
    assert out.endswith("result: clean\n") and "structural retriever: trained on them (39 cases" in out
    kb, questions = university
    assert len(questions) == 11 and not set(questions) & {q.question for q in load_cases(CASES_FILE, kb)}


# ------------------------------------------------------------------ the doc's commands

def _blocks(text: str) -> list[tuple[str, list[str]]]:
    """The fenced blocks of a Markdown text: ``(language, lines)``."""
    fences = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
    return [(m.group(1), m.group(2).splitlines()) for m in fences.finditer(text)]


def _commands() -> list[tuple[str, list[str]]]:
    """Every command the walk-through shows, with the output lines it shows after it (if any): the
    lines of its ``bash`` blocks, and each ``$ `` line of its other blocks."""
    found = []
    for language, lines in _blocks(DOC.read_text(encoding="utf-8")):
        if language == "bash":
            found += [(line, []) for line in lines if line.strip() and not line.lstrip().startswith("#")]
            continue
        for n, line in enumerate(lines):
            if line.startswith("$ "):
                shown = []
                for after in lines[n + 1:]:
                    if after.startswith("$ "):
                        break
                    shown.append(after)
                found.append((line[2:], shown))
    return found


def _argv(command: str) -> tuple[str, list[str]]:
    """``(program, arguments)`` of a shell line: environment settings, ``.venv/bin/`` and a
    trailing comment left out; ``python -m cbr2.service.ask`` and ``cbr2 ask`` are both ``ask``."""
    words = shlex.split(command, comments=True)
    while words and re.match(r"^\w+=", words[0]):
        words.pop(0)
    words[0] = words[0].removeprefix(".venv/bin/")
    if words[0] == "cbr2":
        return words[1], words[2:]
    if words[:2] == ["python", "-m"]:
        return {"cbr2.service.ask": "ask", "cbr2.data": "data", "cbr2.cli": words[3]}.get(words[2], words[2]), \
            words[3 + (words[2] == "cbr2.cli"):]
    if words[0] == "python" and words[1].endswith(".py"):
        return words[1], words[2:]
    return words[0], words[1:]


class _Parsed(Exception):
    """Raised by the stand-in ``KBQA.load``: the command line parsed and reached loading."""


def test_the_walkthrough_shows_each_kind_of_command():
    programs = [_argv(command)[0] for command, _ in _commands()]
    assert {"ask", "data", "serve", "benchmarks/walkthrough.py"} <= set(programs)
    assert programs.count("ask") >= 3


@pytest.mark.parametrize("command, shown", _commands(), ids=[c for c, _ in _commands()])
def test_every_command_of_the_walkthrough_parses(command, shown, monkeypatch, capsys):
    program, args = _argv(command)
    for path in re.findall(r"examples/\S+", command):
        assert (ROOT / path).is_file(), path
    if program == "ask":
        from cbr2.service import ask

        loaded = []

        def load(config, overrides, ablation, *, kb=None, cases=None):
            # The configuration must compose as the real load composes it.
            from cbr2.service.api import custom_overrides

            compose(Config, ablation=ablation, files=list(config), overrides=[*overrides,
                                                                              *custom_overrides(kb, cases)])
            loaded.append((kb, cases))
            raise _Parsed

        monkeypatch.setattr(ask.KBQA, "load", load)
        monkeypatch.setattr(ask, "setup_logging", lambda: None)  # the test process keeps its logging
        try:
            code = ask.main(args)
        except _Parsed:
            assert all(loaded[0])  # the walk-through asks over the university's files
        else:
            # Refused before loading: the doc shows the one line it prints, as printed.
            assert code == 2 and not loaded and shown
            assert capsys.readouterr().err.splitlines() == [s for s in shown if s.strip()]
    elif program == "data":
        from cbr2.data.__main__ import main

        monkeypatch.chdir(ROOT)
        monkeypatch.setattr("cbr2.data.__main__.setup_logging", lambda: None)
        assert main(args) == 0
        printed = capsys.readouterr().out.splitlines()
        # What the doc shows is what check prints today, in order ("..." stands for lines left out).
        at = 0
        for line in (s for s in shown if s.strip() not in ("...", "…", "")):
            assert line in printed[at:], line
            at = printed.index(line, at) + 1
    elif program == "benchmarks/walkthrough.py":
        args_ = _script().parser().parse_intermixed_args(args)
        assert args_.kb.is_file() and args_.cases.is_file() and args_.questions.is_file()
        compose(Config, files=args_.config, overrides=list(args_.overrides))
    elif program == "serve":
        from cbr2.cli import VERBS

        assert "serve" in VERBS and {"--kb", "--cases"} <= set(args)
        module = VERBS["serve"].target.split(":")[0]
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not here yet")
        with pytest.raises(SystemExit) as done:
            importlib.import_module(module).main(["--help"])
        assert done.value.code == 0 and "--kb" in capsys.readouterr().out
    else:
        pytest.fail(f"the walk-through shows a command this test does not check: {command}")


def test_the_walkthroughs_python_parses():
    snippets = ["\n".join(lines) for language, lines in _blocks(DOC.read_text(encoding="utf-8"))
                if language == "python"]
    assert snippets
    for snippet in snippets:
        compile(snippet, str(DOC), "exec")
    assert "KBQA.load(kb=" in "".join(snippets)


# ------------------------------------------------------------------ slow: the CPU default for real

@pytest.mark.slow
def test_ask_over_the_university_on_the_cpu_default(tmp_path, capsys, university):
    """One real ``ask`` (llama.cpp, the packaged Qwen2.5-Coder-0.5B) over the university's files,
    with an empty checkpoints folder: the structural retriever is trained on the 39 cases on the
    way (about a minute on 2 cores), and the trace says which case views answered."""
    from cbr2.service.ask import main

    kb, _ = university
    question = "Which courses require Calculus II?"
    code = main([question, "--json", "--kb", str(KB_FILE), "--cases", str(CASES_FILE),
                 f"structural.checkpoints_dir={tmp_path}"])
    trace = json.loads(capsys.readouterr().out)
    assert code == (0 if trace["answered"] else 1)
    assert set(trace) == TRACE_KEYS and trace["gold"] is None and trace["generation"]["text"]
    assert "Calculus II" in trace["linked"]["entities"] and trace["cases"]
    views = trace["case_views"]
    trained = list(tmp_path.glob("structural-custom-*"))
    if views["used"] == ["semantic"]:
        assert "semantic cases only" in views["why"] and not trained
    else:
        assert views["used"] == ["semantic", "structural"] and "enough to train" in views["why"]
        assert len(trained) == 1  # trained here, on first use
    assert all(c["id"].startswith("case-") for c in trace["cases"])
    if trace["program"]["text"] is not None and trace["steps"] and trace["answered"]:
        # The answer is what the program that ran gives on the university's KB.
        program = check_text(trace["program"]["text"]).program
        executor = Executor(kb)
        results = executor.results(program)
        assert executor.summarize(program, results) == trace["steps"]
        assert sorted(executor.answer(results[-1])) == sorted(trace["answer"])
    else:
        assert trace["error"]["kind"] and trace["error"]["message"]  # failed: it says where and why
