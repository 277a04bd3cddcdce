"""The adaptive fallback (``generation.fallback``): one correction round for visible failures only,
both passes recorded and scored, resumable; and the runner's wiring of the other generation switches."""

import json
import re

import pytest

from cbr2.common.records import Completion, Prompt
from cbr2.config import load_config
from cbr2.data.benchmarks import Benchmark
from cbr2.evaluation.scoring import score_generation
from cbr2.generation import fallback
from cbr2.generation.canonicalize import Canonicalizer
from cbr2.generation.prompt import EMPTY_ANSWER, FALLBACK_VERSION
from cbr2.kopl.executor import Executor
from cbr2.kopl.text import to_dag_text
from cbr2.report.run_report import render_fallback
from cbr2.run.run_folder import generation_key
from cbr2.run.runner import run_evaluation

BASE = ["llm.backend=fake", "generation.constrained=false", "eval.per_category=null", "eval.limit=24", "wandb.mode=disabled",
        "retrieval.cases=none", "retrieval.k_ontology=0", "retrieval.k_facts=0"]

EMPTY = "r1: Find[Paris] → FilterConcept[human] → QueryName[]"
"""Runs on mini-kqapro and answers nothing (no human is Paris)."""

GARBAGE = "I think the answer is yes."


def typo(q):
    """The gold program with its first ``Find`` argument misspelt: an execution error."""
    text = to_dag_text(q.program)
    return re.sub(r"Find\[([^\]]+)\]", r"Find[\1zq]", text, count=1) if "Find[" in text else GARBAGE


def mixed(q, i):
    """Right, misspelt, unparsable and empty first answers in turn."""
    return [to_dag_text(q.program), typo(q), GARBAGE, EMPTY][i % 4]


class _Fixer:
    """The fake backend's answers here: first answers from ``script(question, index)``, corrections
    from ``correction(question)`` (the gold program unless a test says otherwise).

    It reads gold programs, as the gold writer does; the correction prompts the fake receives are
    checked separately for what they reveal.
    """

    def __init__(self, fake):
        val = Benchmark("mini-kqapro").questions("val")
        self.fake = fake
        self.questions = {q.qid: q for q in val}
        self.order = {q.qid: i for i, q in enumerate(val)}  # question id -> position in the evaluated split
        self.script = mixed
        self.correction = lambda q: to_dag_text(q.program)
        fake.reply = self.reply

    def reply(self, p):
        q = self.questions[p.qid]
        text = self.correction(q) if _is_correction(p) else self.script(q, self.order[p.qid])
        return Completion(text, prompt_tokens=100, completion_tokens=10)

    @property
    def calls(self):
        """(question id, is a correction) per prompt generated."""
        return [(p.qid, _is_correction(p)) for p in self.fake.prompts]

    @property
    def corrections(self):
        """The correction prompts received."""
        return [p for p in self.fake.prompts if _is_correction(p)]

    @property
    def grammar(self):
        return self.fake.grammar

    def forget(self):
        """Forget the prompts received so far."""
        self.fake.prompts.clear()


def _is_correction(p):
    return "This program failed:" in p.user


@pytest.fixture()
def fixer(fake_backend):
    return _Fixer(fake_backend)


def evaluate(out, *overrides):
    cfg = load_config([f"output_dir={out}", *BASE, *overrides])
    return run_evaluation(cfg)


def records_of(out):
    """The final record of each question (the last line of its id wins, as on resume)."""
    by_id = {}
    for line in (out / "predictions.jsonl").read_text().splitlines():
        rec = json.loads(line)
        by_id[rec["id"]] = rec
    return list(by_id.values())


def test_failures_get_one_correction_and_both_passes_are_scored(tmp_path, fixer):
    out = tmp_path / "run"
    metrics = evaluate(out, "generation.fallback=true")
    records = records_of(out)
    single = {r["id"]: r["single_pass"] for r in records}
    failed = [qid for qid, s in single.items() if s["error_kind"]]
    assert len(failed) == 18  # three of every four first answers fail
    assert {s["error_kind"] for s in single.values()} == {None, "execution", "syntax", "empty"}

    # One first-pass call over all questions, then one call with exactly the failures' corrections.
    assert [qid for qid, c in fixer.calls if not c] == [r["id"] for r in records]
    assert sorted(qid for qid, c in fixer.calls if c) == sorted(failed)
    assert all(not c for _, c in fixer.calls[:24]) and all(c for _, c in fixer.calls[24:])

    fb = metrics["fallback"]
    assert (fb["fired"], fb["fixed"], fb["still_failing"]) == (18, 18, 0)
    assert fb["fired_rate"] == 18 / 24 and fb["fixed_rate_of_fired"] == 1.0 and fb["after"] == {"right": 18}
    kinds = {s["error_kind"] for s in single.values()}
    assert sum(c["fired"] for c in fb["by_error_kind"].values()) == 18
    assert all(fb["by_error_kind"][k]["fired"] == fb["by_error_kind"][k]["fixed"] > 0 for k in kinds - {None})
    assert metrics["single_pass"]["hits@1"] == 6 / 24 and metrics["hits@1"] == 1.0
    assert metrics["single_pass"]["errors"]["empty"] == 6 and metrics["errors"]["empty"] == 0
    assert metrics["single_pass"]["ser"] == pytest.approx(fb["by_error_kind"]["syntax"]["fired"] / 24)
    assert metrics["provenance"]["fallback_version"] == FALLBACK_VERSION

    for r in records:
        if r["id"] in failed:
            assert r["fallback"]["fired"] and r["fallback"]["fixed"] and r["correct"]
            assert r["latency_s"] == pytest.approx(r["single_pass"]["latency_s"] + r["fallback"]["latency_s"])
            assert (r["prompt_tokens"], r["completion_tokens"]) == (200, 20)
            assert r["fallback"]["version"] == FALLBACK_VERSION and len(r["fallback"]["prompt_hash"]) == 64
        else:
            assert r["fallback"] == {"fired": False}
            assert all(r[k] == v for k, v in r["single_pass"].items())
    # The cost per question includes the corrections.
    assert metrics["generation"]["seconds_per_question"] == pytest.approx(sum(r["latency_s"] for r in records) / 24)
    assert metrics["generation"]["completion_tokens"] == pytest.approx((6 * 10 + 18 * 20) / 24)
    assert metrics["fallback"]["extra_seconds_per_question"] == pytest.approx(
        sum(r["fallback"].get("latency_s", 0) for r in records) / 24)
    # Each failure's first pass was written (pending) before its final record.
    assert len((out / "predictions.jsonl").read_text().splitlines()) == 24 + 18


def test_a_correction_that_fails_no_less_visibly_does_not_replace_the_first_pass(tmp_path, fixer):
    fixer.correction = lambda q: "no program, sorry"  # every correction fails to parse
    metrics = evaluate(tmp_path / "run", "generation.fallback=true")
    fb = metrics["fallback"]
    assert fb["fired"] == 18 and fb["kept_correction"] == 0 and fb["fixed"] == 0
    assert fb["corrections"] == {"syntax": 18}
    # The visible result never got worse: the final metrics are the single pass's.
    for key in ("hits@1", "ser", "errors"):
        assert metrics[key] == metrics["single_pass"][key]
    for r in records_of(tmp_path / "run"):
        if r["fallback"]["fired"]:
            assert r["fallback"]["kept"] == "single_pass" and r["fallback"]["error_kind"] == "syntax"
            assert r["generated"] == r["single_pass"]["generated"] and r["error_kind"] == r["single_pass"]["error_kind"]
            assert r["fallback"]["generated"] == "no program, sorry"


def test_the_correction_prompt_shows_the_error_and_the_nearest_valid_items(tmp_path, fixer):
    out = tmp_path / "run"
    evaluate(out, "generation.fallback=true")
    records = {r["id"]: r for r in records_of(out)}
    prompts = {p.qid: p for p in fixer.corrections}
    for qid, p in prompts.items():
        first = records[qid]["single_pass"]
        message = (first["error"] or {}).get("message") or EMPTY_ANSWER
        assert message in p.user and first["generated"] in p.user
        assert p.user.endswith("Program:\n") and p.system.startswith("You translate questions")
        assert records[qid]["gold_program"] not in p.user  # the gold never reaches a prompt
    misspelt = [qid for qid, r in records.items() if r["single_pass"]["error_kind"] == "execution"]
    assert misspelt
    for qid in misspelt:
        name = re.search(r"Find\[([^\]]+)zq\]", records[qid]["single_pass"]["generated"]).group(1)
        assert f'- Find name "{name}zq": "{name}"' in prompts[qid].user
    empty = [qid for qid, r in records.items() if r["single_pass"]["error_kind"] == "empty"]
    # An empty answer gets alternatives for the schema arguments it used.
    assert all('- Find name "Paris": ' in prompts[qid].user and '- FilterConcept concept "human": '
               in prompts[qid].user for qid in empty)


def test_right_and_wrong_first_answers_never_fire_it(tmp_path, fixer):
    # A wrong but non-empty answer cannot be told from a right one without the gold answer.
    fixer.script = lambda q, i: to_dag_text(q.program) if i % 2 else "r1: FindAll[] → Count[]"
    out = tmp_path / "run"
    metrics = evaluate(out, "generation.fallback=true")
    records = records_of(out)
    assert {r["error_kind"] for r in records} == {None, "wrong"}
    assert not any(c for _, c in fixer.calls) and len(fixer.calls) == 24
    assert all(r["fallback"] == {"fired": False} for r in records)
    assert metrics["fallback"]["fired"] == 0 and metrics["fallback"]["fixed_rate_of_fired"] is None
    core = ("hits@1", "ser", "ser_before_repair", "n", "per_category", "errors")
    assert {k: metrics["single_pass"][k] for k in core} == {k: metrics[k] for k in core}


def test_with_the_fallback_off_records_and_metrics_are_the_single_pass(tmp_path, fixer):
    off = evaluate(tmp_path / "off")
    records = records_of(tmp_path / "off")
    assert not any(c for _, c in fixer.calls)
    assert not any("fallback" in r or "single_pass" in r for r in records)
    assert "fallback" not in off and "single_pass" not in off and off["provenance"]["fallback_version"] is None
    on = evaluate(tmp_path / "on", "generation.fallback=true")
    core = ("hits@1", "ser", "ser_before_repair", "n", "per_category", "errors")
    assert {k: on["single_pass"][k] for k in core} == {k: off[k] for k in core}


def test_a_pending_record_resumes_with_its_correction_only(tmp_path, fixer):
    out = tmp_path / "run"
    full = evaluate(out, "generation.fallback=true")
    pred = out / "predictions.jsonl"
    lines = pred.read_text().splitlines(keepends=True)
    # Killed after the first pass of the last failure, before its correction was written.
    last = json.loads(lines[-1])
    assert last["fallback"]["fired"]
    pred.write_text("".join(lines[:-1]))
    fixer.forget()
    resumed = evaluate(out, "generation.fallback=true")
    assert fixer.calls == [(last["id"], True)]
    timing = ("provenance", "generation", "fallback")
    assert {k: v for k, v in resumed.items() if k not in timing} == {k: v for k, v in full.items() if k not in timing}
    assert resumed["fallback"]["fixed"] == full["fallback"]["fixed"]
    fixer.forget()
    evaluate(out, "generation.fallback=true")
    assert fixer.calls == []  # everything is final now


def test_shards_merge_into_the_fallback_metrics_of_the_whole_run(tmp_path, fixer):
    from cbr2.cluster.merge import merge

    whole = evaluate(tmp_path / "whole", "generation.fallback=true")
    for i in range(2):
        evaluate(tmp_path / "run", "generation.fallback=true", "eval.num_shards=2", f"eval.shard={i}")
    merged = merge([tmp_path / "run" / f"shard-{i}-of-2" for i in range(2)], tmp_path / "merged")
    assert merged["single_pass"] == whole["single_pass"]
    timing = ("extra_seconds_per_question", "extra_seconds_per_fired")
    assert ({k: v for k, v in merged["fallback"].items() if k not in timing}
            == {k: v for k, v in whole["fallback"].items() if k not in timing})
    assert merged["hits@1"] == whole["hits@1"] == 1.0 and merged["fallback"]["fired"] == 18


def test_the_generation_section_keys_the_cache(fixer):
    from cbr2.llm import make_backend

    keys = set()
    for overrides in ([], ["generation.fallback=true"], ["generation.canonicalize=true"],
                      ["generation.constrained=true"], ["generation.max_lines=4"]):
        cfg = load_config([*BASE, *overrides])
        keys.add(generation_key(cfg.generation, make_backend(cfg.llm)))
    assert len(keys) == 5


def test_canonicalize_and_constrained_reach_scoring_and_the_backend(tmp_path, fixer, monkeypatch):
    from cbr2.generation.grammar import build_grammar

    built, grammars = [], []

    def grammar(gen, program_format, bench):
        built.append("grammar")
        grammars.append(build_grammar(gen, program_format, bench))
        return grammars[-1]

    def canonicalizer(retrieval, threshold, bench, cache_dir):
        built.append("canon")
        return Canonicalizer(bench.kb.vocabulary)

    monkeypatch.setattr("cbr2.run.runner.build_canonicalizer", canonicalizer)
    monkeypatch.setattr("cbr2.run.runner.build_grammar", grammar)
    fixer.script = lambda q, i: typo(q)
    out = tmp_path / "run"
    metrics = evaluate(out, "generation.canonicalize=true", "generation.constrained=true", "generation.fallback=true")
    # The backend gets the grammar as data (its text, bound and identity), not the generator.
    assert built == ["grammar", "canon"] and fixer.grammar == grammars[0].record()
    records = records_of(out)
    snapped = [r for r in records if any(c["snapped"] for c in r["single_pass"]["canonicalized"])]
    assert snapped and all(r["single_pass"]["correct"] and r["fallback"] == {"fired": False} for r in snapped)
    assert metrics["fallback"]["fired"] == 24 - len(snapped)


# ------------------------------------------------------------------ units

@pytest.fixture(scope="module")
def kqapro():
    bench = Benchmark("mini-kqapro")
    return bench, bench.questions("val")[0], Executor(bench.kb, 10)


def test_the_correction_prompt_is_built_from_the_failure_only(kqapro):
    bench, q, executor = kqapro
    text = "r1: Find[Swizerland] → Relate[country | backward] → Frobnicate[] → QueryName[]"
    record = score_generation(text, q, bench, executor)
    assert record["error_kind"] == "syntax" and record["program"] is None
    record.update(gold_answer="SECRET-ANSWER", gold_program="SECRET-PROGRAM", question="SECRET-QUESTION")
    prompt = Prompt(q.qid, "SYSTEM", "USER Program:\n")
    correction = fallback.build_correction(prompt, record, bench.kb.vocabulary,
                                           Canonicalizer(bench.kb.vocabulary).nearest)
    assert "SECRET" not in correction.system + correction.user
    assert correction.system == "SYSTEM" and correction.user.startswith("USER Program:\nr1: Find[Swizerland]")
    assert record["error"]["message"] in correction.user
    assert '- Find name "Swizerland": "Switzerland"' in correction.user


def test_arguments_are_found_in_text_that_does_not_parse(kqapro):
    bench, _, _ = kqapro
    text = r"r1: Find[Swizerland] → Relate[country | backward → What[] ; Find[a\|b] FilterConcept[cty | extra] Nope[x]"
    args = fallback.called_arguments(text)
    assert [(a["function"], a["arg"], a["value"]) for a in args] == [
        ("Find", "name", "Swizerland"), ("Find", "name", "a|b"), ("FilterConcept", "concept", "cty")]
    failure = fallback.Failure(text, "syntax", "msg", None, ())
    assert [a["value"] for a in fallback.involved_arguments(failure, bench.kb.vocabulary)] == ["Swizerland", "a|b", "cty"]


def test_suggestions_are_capped_and_leave_out_the_value_itself():
    def nearest(value, kind, k=5, function=None):
        return [(value, 1.0)] + [(f"{value}-{n}", 0.5) for n in range(k - 1)]

    args = [{"function": "Find", "arg": "name", "kind": "entity", "value": f"v{n}"} for n in range(9)]
    found = fallback.suggestions(args, nearest)
    assert len(found) == fallback.MAX_ARGUMENTS
    assert all(len(items) <= fallback.MAX_ITEMS and value not in items for _, _, value, items in found)


def test_render_fallback_compares_the_two_passes():
    metrics = {"hits@1": 0.5, "ser": 0.0, "ser_before_repair": 0.1, "n": 4,
               "single_pass": {"hits@1": 0.25, "ser": 0.25, "ser_before_repair": 0.25},
               "fallback": {"fired": 2, "fired_rate": 0.5, "fixed": 1, "fixed_rate_of_fired": 0.5, "still_failing": 1,
                            "after": {"right": 1, "empty": 1},
                            "by_error_kind": {"syntax": {"fired": 1, "fixed": 1}, "empty": {"fired": 1, "fixed": 0}},
                            "extra_seconds_per_question": 0.5, "extra_seconds_per_fired": 1.0}}
    text = "\n".join(render_fallback(metrics))
    assert "| Hits@1 (%) ↑ | 25.00 | 50.00 |" in text and "| SER (%) ↓ | 25.00 | 0.00 |" in text
    assert "Fired on 2 of 4 questions (50.00%); fixed 1 (50.00% of those); 1 still not right." in text
    assert "0.50 s per question, 1.00 s per correction" in text and "| syntax | 1 | 1 |" in text
    assert render_fallback({"hits@1": 1.0}) == []
