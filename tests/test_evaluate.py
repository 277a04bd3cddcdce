"""`evaluate.py` end to end: gold scores 1/0 on every layout, failures are honest, runs resume."""

import json
import shutil
from dataclasses import replace

import pytest
from conftest import to_old_schema

from cbr2.config import ConfigError, load_config
from cbr2.run.runner import run_evaluation

FIELDS = {"id", "question", "category", "gold_answer", "answer", "correct", "generated", "program",
          "error_kind", "repairs", "syntax_error", "syntax_error_before_repair"}


NO_RETRIEVAL = ["retrieval.cases=none", "retrieval.k_ontology=0", "retrieval.k_facts=0"]
"""These tests check the path after generation; retrieval has its own tests (test_retrieval.py)."""

GOLD = ["llm.backend=gold", "eval.per_category=null", "wandb.mode=disabled", "generation.constrained=false"]
"""The gold writer over whole splits, no W&B, the unconstrained path (the fakes take no grammar)."""


def evaluate(tmp_path, *overrides):
    cfg = load_config([f"output_dir={tmp_path / 'run'}", *GOLD, *NO_RETRIEVAL, *overrides])
    return run_evaluation(cfg), tmp_path / "run"


@pytest.mark.parametrize("name, fmt", [("mini-kqapro", "dag"), ("mini-kqapro", "chain"),
                                       ("mini-metaqa", "dag"), ("mini-metaqa", "chain")])
def test_gold_scores_one_and_zero(tmp_path, name, fmt):
    metrics, out = evaluate(tmp_path, f"data.name={name}", f"prompt.format={fmt}")
    assert metrics["hits@1"] == 1.0 and metrics["ser"] == 0.0 and metrics["ser_before_repair"] == 0.0
    assert metrics["n"] >= 450
    assert all(m["hits@1"] == 1.0 for m in metrics["per_category"].values())
    for f in ("predictions.jsonl", "metrics.json", "report.md", "config.yaml"):
        assert (out / f).is_file()
    lines = (out / "predictions.jsonl").read_text().splitlines()
    assert len(lines) == metrics["n"] and FIELDS <= json.loads(lines[0]).keys()
    assert json.loads((out / "metrics.json").read_text())["n"] == metrics["n"]


def test_official_kqapro_layout_in_the_older_kb_schema(tmp_path):
    from cbr2.data.benchmarks import EMBEDDED_ROOT

    root = tmp_path / "KQAPro"
    root.mkdir()
    kb = json.loads((EMBEDDED_ROOT / "mini-kqapro" / "kb.json").read_text())
    (root / "kb.json").write_text(json.dumps(to_old_schema(kb)))
    val = json.loads((EMBEDDED_ROOT / "mini-kqapro" / "val.json").read_text())
    for item in val[::2]:  # redistributed copies write `rewrite` instead of `question`
        item["rewrite"] = item.pop("question")
    (root / "val.json").write_text(json.dumps(val))
    metrics, _ = evaluate(tmp_path, "data.name=kqapro", f"data.root={root}")
    assert (metrics["hits@1"], metrics["ser"], metrics["n"]) == (1.0, 0.0, 450)


def test_official_metaqa_layout(tmp_path):
    from cbr2.data.benchmarks import EMBEDDED_ROOT

    root = tmp_path / "MetaQA"
    shutil.copytree(EMBEDDED_ROOT / "mini-metaqa", root)
    metrics, _ = evaluate(tmp_path, "data.name=metaqa", f"data.root={root}", "data.split=dev")
    assert (metrics["hits@1"], metrics["ser"]) == (1.0, 0.0)
    assert set(metrics["per_category"]) == {"1-hop", "2-hop", "3-hop"}


def test_config_errors_are_clear(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown key 'data\.nmae' \(did you mean data\.name[ ?]"):
        load_config(["data.nmae=x"])
    with pytest.raises(ConfigError, match="eval.limit"):
        load_config(["eval.limit=many"])
    with pytest.raises(ValueError, match="unknown data.name 'kqa'"):
        run_evaluation(load_config(["data.name=kqa"]))
    with pytest.raises(ValueError, match="needs data.root"):
        run_evaluation(load_config(["data.name=kqapro"]))
    with pytest.raises(ValueError, match="no gold programs.*eval.per_category=null"):
        run_evaluation(load_config(["data.split=test"]))
    with pytest.raises(ValueError, match="unknown llm.backend 'gld'.*did you mean gold"):
        # Checked before retrieval, which would otherwise look for (or train) a structural retriever.
        run_evaluation(load_config(["llm.backend=gld", "eval.limit=1", f"output_dir={tmp_path}",
                                    f"structural.checkpoints_dir={tmp_path / 'none'}"]))
    assert not (tmp_path / "none").exists()


@pytest.fixture()
def scripted(fake_backend):
    """The fake backend (``llm.backend=fake``) answering ``script(question)`` for each mini-kqapro val question;
    ``fake_backend.qids`` lists what it was asked to generate."""
    from cbr2.data.benchmarks import Benchmark

    questions = {q.qid: q for q in Benchmark("mini-kqapro").questions("val")}

    def script(answer):
        fake_backend.reply = lambda prompt: answer(questions[prompt.qid])

    fake_backend.script = script
    return fake_backend


def test_garbage_is_a_counted_syntax_error_never_a_crash(tmp_path, scripted):
    scripted.script(lambda q: "I think the answer is yes.\u2028\n```python\nprint(42)\n```")
    metrics, _ = evaluate(tmp_path, "llm.backend=fake", "eval.limit=30")
    assert metrics["hits@1"] == 0.0 and metrics["ser"] == 1.0 and metrics["errors"]["syntax"] == 30
    assert evaluate(tmp_path, "llm.backend=fake", "eval.limit=30")[0]["n"] == 30  # U+2028 survives a resume


def test_a_corrupt_record_inside_the_file_is_reported_not_skipped(tmp_path, scripted):
    scripted.script(lambda q: "r1: Find[X] → QueryName[]")
    _, out = evaluate(tmp_path, "llm.backend=fake", "eval.limit=5")
    lines = (out / "predictions.jsonl").read_text().split("\n")
    lines[2] = lines[2][:10]
    (out / "predictions.jsonl").write_text("\n".join(lines))
    with pytest.raises(ValueError, match=r"predictions\.jsonl:3: corrupt"):
        evaluate(tmp_path, "llm.backend=fake", "eval.limit=5")


def test_unknown_names_are_execution_errors_even_on_no_questions(tmp_path, scripted):
    # The reference engine answers a Verify on an unknown entity with "no"; that must not score.
    scripted.script(lambda q: "r1: Find[No Such Entity] → QueryAttr[height] → VerifyNum[1 centimetre | >]")
    metrics, _ = evaluate(tmp_path, "llm.backend=fake")
    verify = metrics["per_category"]["Verify"]
    assert verify["hits@1"] == 0.0 and verify["ser"] == 0.0
    assert metrics["errors"]["execution"] == metrics["n"]


def test_repair_is_recorded_and_ser_counts_before_and_after(tmp_path, scripted):
    from cbr2.kopl.text import to_dag_text

    scripted.script(lambda q: to_dag_text(q.program).replace("→", "->") + "\nQuestion: next one")
    metrics, out = evaluate(tmp_path, "llm.backend=fake", "eval.limit=20")
    assert metrics["hits@1"] == 1.0 and metrics["ser"] == 0.0 and metrics["ser_before_repair"] == 1.0
    first = json.loads((out / "predictions.jsonl").read_text().splitlines()[0])
    assert {"normalise_arrows", "drop_trailing_text"} <= set(first["repairs"])


def test_an_interrupted_run_resumes_without_regenerating(tmp_path, scripted):
    from cbr2.kopl.text import to_dag_text

    scripted.script(lambda q: to_dag_text(q.program))
    full, out = evaluate(tmp_path, "llm.backend=fake", "eval.limit=40")
    pred = out / "predictions.jsonl"
    lines = pred.read_text().splitlines(keepends=True)
    pred.write_text("".join(lines[:25]) + lines[25][:17])  # killed mid-write
    scripted.prompts.clear()
    resumed, _ = evaluate(tmp_path, "llm.backend=fake", "eval.limit=40")
    assert len(scripted.qids) == 15
    timing = ("provenance", "generation")  # wall-clock measurements differ between runs
    assert {k: v for k, v in resumed.items() if k not in timing} == {k: v for k, v in full.items() if k not in timing}
    assert pred.read_text().count("\n") == 40 and pred.read_text().endswith("}\n")
    pred.write_text(pred.read_text()[:-1])  # killed between a record and its newline
    scripted.prompts.clear()
    assert evaluate(tmp_path, "llm.backend=fake", "eval.limit=40")[0]["n"] == 40 and not scripted.qids
    assert pred.read_text().count("\n") == 40
    with pytest.raises(ValueError, match="different configuration"):
        evaluate(tmp_path, "llm.backend=fake", "eval.limit=40", "prompt.format=chain")


def test_offline_wandb_gets_the_run(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    metrics, out = evaluate(tmp_path, "eval.limit=6", "wandb.mode=offline")
    runs = list((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and metrics["n"] == 6
    assert list(runs[0].glob("*.wandb")), "no W&B run file written"
    (preds,) = (runs[0] / "files" / "media" / "table").glob("predictions_*.table.json")
    table = json.loads(preds.read_text())
    assert len(table["data"]) == 6 and "generated" in table["columns"]
    assert all(row[table["columns"].index("correct")] is True for row in table["data"])
    (per_cat,) = (runs[0] / "files" / "media" / "table").glob("per_category_*.table.json")
    assert json.loads(per_cat.read_text())["columns"][:2] == ["category", "hits@1"]


def _needs_packaged(name: str) -> None:
    """Skip unless llama-cpp-python and the packages of the packaged model ``name`` are installed."""
    pytest.importorskip("llama_cpp", reason="llm.backend=llamacpp needs llama-cpp-python")
    from cbr2.llm.packaged import chunk_paths, packaged

    try:
        chunk_paths(packaged(name))
    except OSError as err:
        pytest.skip(str(err))


@pytest.mark.slow
def test_the_cpu_llm_run_resumes_from_its_predictions_cache(tmp_path, monkeypatch):
    _needs_packaged("smollm2-135m")
    from cbr2.llm.llamacpp import LlamaCppBackend

    first, out = evaluate(tmp_path, "llm.backend=llamacpp", "llm.model=smollm2-135m", "eval.limit=2")
    records = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(r["prompt_tokens"] > 1000 and r["completion_tokens"] for r in records)

    def no_generation(self, prompts, on_result=None):
        assert not prompts, "a cached prediction was generated again"
        return []

    monkeypatch.setattr(LlamaCppBackend, "generate", no_generation)
    again, _ = evaluate(tmp_path, "llm.backend=llamacpp", "llm.model=smollm2-135m", "eval.limit=2")
    assert again["hits@1"] == first["hits@1"] and again["errors"] == first["errors"]


@pytest.mark.slow
@pytest.mark.parametrize("model", ["smollm2-135m", "qwen2.5-coder-0.5b"])
def test_a_constrained_cpu_llm_run_writes_only_well_typed_programs(tmp_path, model):
    """generation.constrained with a real CPU LLM: every output is accepted by the run's
    grammar, parses and type-checks, so SER is 0 (the model is free to be wrong)."""
    pytest.importorskip("xgrammar")
    _needs_packaged(model)
    from cbr2.config import load_config
    from cbr2.data.benchmarks import Benchmark
    from cbr2.generation.grammar import build_grammar
    from cbr2.kopl.checker import check_text

    metrics, out = evaluate(tmp_path, "llm.backend=llamacpp", f"llm.model={model}", "eval.limit=2",
                            "generation.constrained=true")
    records = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    constrained = load_config(["generation.constrained=true"])
    grammar = build_grammar(constrained.generation, constrained.prompt.format, Benchmark("mini-kqapro"))
    assert len(records) == 2
    for r in records:
        assert grammar.accepts(r["generated"]), r["generated"]
        assert check_text(r["generated"].strip(), "dag").ok and not r["syntax_error_before_repair"]
    assert metrics["ser"] == 0.0 and metrics["ser_before_repair"] == 0.0


@pytest.mark.slow
def test_the_default_qwen_model_answers_with_its_cases(tmp_path):
    """The CPU default (Qwen2.5-Coder-0.5B, DAG prompt with its cases, grounded decoding) on the first
    9 questions of the balanced sample, one per category: it must get some right and write
    parseable programs for most. (A model that fails every question would prove nothing.)"""
    _needs_packaged("qwen2.5-coder-0.5b")
    cfg = load_config([f"output_dir={tmp_path / 'run'}", "wandb.mode=disabled", "eval.per_category=1",
                       "structural.checkpoints_dir=" + str(tmp_path / "ckpt"), "retrieval.cases=semantic"])
    metrics = run_evaluation(cfg)
    assert metrics["n"] == 9
    assert metrics["hits@1"] >= 2 / 9 and metrics["ser"] <= 4 / 9, metrics


def test_a_record_whose_prompt_changed_is_generated_again(tmp_path, scripted):
    from cbr2.kopl.text import to_dag_text

    scripted.script(lambda q: to_dag_text(q.program))
    _, out = evaluate(tmp_path, "llm.backend=fake", "eval.limit=5")
    pred = out / "predictions.jsonl"
    lines = pred.read_text().splitlines()
    stale = json.loads(lines[3])
    stale["prompt_hash"] = "0" * 64  # e.g. written before a prompt change (PROMPT_VERSION bump)
    lines[3] = json.dumps(stale)
    pred.write_text("\n".join(lines) + "\n")
    scripted.prompts.clear()
    metrics, _ = evaluate(tmp_path, "llm.backend=fake", "eval.limit=5")
    assert scripted.qids == [stale["id"]] and metrics["n"] == 5 and metrics["hits@1"] == 1.0
    assert len(pred.read_text().splitlines()) == 6  # appended; the newest record of a question wins


def test_a_setting_the_backend_cannot_decode_stops_the_run_before_retrieval(tmp_path, monkeypatch, fake_backend):
    """Backends declare the decoding features they honour; a run that asks for one its backend
    lacks stops at start in one line naming those that have it (nothing retrieved, nothing built)."""
    from cbr2.run import runner

    def no_retrieval(*args, **kwargs):
        raise AssertionError("retrieval started")

    monkeypatch.setattr(runner, "Retriever", no_retrieval)
    monkeypatch.setattr(type(fake_backend), "capabilities", frozenset({"constrained"}))
    base = [f"output_dir={tmp_path / 'run'}", "llm.backend=fake", "eval.limit=2", "wandb.mode=disabled"]
    with pytest.raises(ConfigError) as err:
        run_evaluation(load_config([*base]))  # the defaults: constrained, grounded, linking on
    assert str(err.value) == ("generation.grounded=true: llm.backend=fake cannot decode it; use "
                              "llm.backend=vllm or openai or llamacpp, or set generation.grounded=false")
    assert fake_backend.builds == 0
    # Grounded decoding is asked only where it acts: without linking no prompt carries candidates.
    metrics = run_evaluation(load_config([*base, *NO_RETRIEVAL, "retrieval.link=false"]))
    assert metrics["n"] == 2 and fake_backend.grammar is not None


def test_the_backend_gets_the_grammar_as_data_and_each_grounded_prompt_its_own_text(tmp_path, fake_backend):
    """Under the defaults (constrained, grounded, linking) the run hands the backend the grammar as a
    record, each grounded prompt with its own grammar text, and the cache root; the records' prompt
    hashes are those of the prompts as built, whatever text rides along."""
    from cbr2.data.benchmarks import Benchmark
    from cbr2.generation.grammar import build_grammar
    from cbr2.generation.prompt import prompt_hash

    cfg = load_config([f"output_dir={tmp_path / 'run'}", "llm.backend=fake", "eval.limit=6", "wandb.mode=disabled",
                       "retrieval.cases=random", f"cache_dir={tmp_path / 'cache'}"])  # links without an encoder
    run_evaluation(cfg)
    grammar = build_grammar(cfg.generation, cfg.prompt.format, Benchmark("mini-kqapro"))
    assert fake_backend.grammar == grammar.record()
    grounded = [p for p in fake_backend.prompts if p.grounding]
    assert grounded and all(p.grammar == grammar.grounded_ebnf(dict(p.grounding)) for p in grounded)
    assert all(p.grammar is None for p in fake_backend.prompts if not p.grounding)
    hashes = {r["id"]: r["prompt_hash"] for r in map(json.loads, (tmp_path / "run" / "predictions.jsonl").open())}
    assert all(hashes[p.qid] == prompt_hash(replace(p, grammar=None)) for p in fake_backend.prompts)
    assert (tmp_path / "cache" / "kb").is_dir()  # the KB store under the configured cache root


def test_records_of_older_runs_with_fields_no_longer_written_are_read_as_they_are(tmp_path, fake_backend):
    """A record may carry a field that no run writes any more (``candidates``, of the retired
    execution-guided choice): a rerun reuses it from the cache, and the metrics, report and browser
    are written from it as from any other."""
    metrics, out = evaluate(tmp_path, "llm.backend=fake", "eval.limit=2")
    pred = out / "predictions.jsonl"
    records = [json.loads(line) for line in pred.read_text().splitlines()]
    assert records and not any("candidates" in r for r in records)
    pred.write_text("".join(json.dumps({**r, "candidates": {"tried": 2, "kept": 1}}) + "\n" for r in records))
    fake_backend.prompts.clear()
    again, _ = evaluate(tmp_path, "llm.backend=fake", "eval.limit=2")
    assert fake_backend.prompts == [] and again["n"] == metrics["n"] and again["hits@1"] == metrics["hits@1"]
    assert all(json.loads(line)["candidates"] for line in pred.read_text().splitlines())
    assert (out / "browser.html").is_file() and (out / "report.md").is_file()