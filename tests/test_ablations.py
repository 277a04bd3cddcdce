"""``--ablation NAME`` is setting NAME of Table 5 under every base: each configuration file shipped in
``configs/`` and a user's own file, composed with each of the 8 settings, is in that setting, keeps
the base's other values, and its prompts hold exactly what Table 5 defines (which knowledge, which
case views, which program form); an override that leaves the setting is an error naming both; a
sweep of every setting over the paper's configuration runs 8 distinct settings.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from cbr2.common.errors import ConfigError
from cbr2.config import ABLATION_TABLE, ABLATIONS, CONFIG_DIR, Config, ablation, compose, setting_of
from cbr2.config.files import leaves

USER_FILE = """\
# A user's own base: its own amounts and views, which each setting must override where it defines them.
llm:
  model: smollm2-135m
retrieval:
  k_ontology: 4
  k_facts: 0
  k_semantic: 2
  k_structural: 4
  cases: semantic
prompt:
  format: chain
  case_triples: 1
"""

SHIPPED = sorted(p for p in CONFIG_DIR.glob("*.yaml") if p.name not in ("evaluate.yaml", "train.yaml"))
"""Every base configuration shipped in ``configs/`` (the entry points' own files are the base of all)."""

SETTING_KEYS = set(ABLATION_TABLE[0].values)
"""The keys a Table 5 setting is defined on (``full.yaml``'s)."""

TABLE5 = {
    # setting: (program form, case views, ontology triples, fact triples)
    "full": ("dag", {"semantic", "structural"}, True, True),
    "chain": ("chain", {"semantic", "structural"}, True, True),
    "w/o_reasoning_case": ("dag", {"semantic"}, True, True),
    "w/o_semantic_case": ("dag", {"structural"}, True, True),
    "random_case": ("dag", {"random"}, True, True),
    "w/o_act": ("dag", {"semantic", "structural"}, True, False),
    "w/o_ont": ("dag", {"semantic", "structural"}, False, True),
    "w/o_knowledge": ("dag", {"semantic", "structural"}, False, False),
}
"""The paper's Table 5, written out independently of the ablation files."""


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> dict[str, list[Path]]:
    """No file, each shipped file, and a user's file: the ``--config`` lists a run may have."""
    user = tmp_path_factory.mktemp("user") / "mine.yaml"
    user.write_text(USER_FILE, encoding="utf-8")
    return {"defaults": [], **{p.name: [p] for p in SHIPPED}, "user": [user]}


def test_the_table_is_written_out_for_every_setting():
    assert set(TABLE5) == set(ABLATIONS) and len(SHIPPED) >= 2


@pytest.mark.parametrize("name", ABLATIONS)
def test_every_base_composed_with_a_setting_is_in_it_and_keeps_its_other_values(bases, name):
    form, views, ontology, facts = TABLE5[name]
    for base, files in bases.items():
        cfg = compose(ablation=name, files=files)
        plain = compose(files=files)
        assert setting_of(cfg) == name, (base, name)
        assert cfg.prompt.format == form
        assert {"dual": {"semantic", "structural"}}.get(cfg.retrieval.cases, {cfg.retrieval.cases}) == views
        assert (cfg.retrieval.k_ontology > 0, cfg.retrieval.k_facts > 0) == (ontology, facts)
        # An amount the setting recalls is the base's own where the base recalls any (paper.yaml's 10,
        # the user's 4), else full.yaml's.
        for key, recalled in (("k_ontology", ontology), ("k_facts", facts)):
            have = plain.retrieval[key]
            if recalled:
                assert cfg.retrieval[key] == (have if have > 0 else ablation("full").values[f"retrieval.{key}"])
        # Every other value of the base stands: model, encoder, k_s, k_r, case triples ...
        other = {k: v for k, v in leaves(OmegaConf.to_container(plain)).items() if k not in SETTING_KEYS}
        assert {k: OmegaConf.select(cfg, k) for k in other} == other, (base, name)


def test_the_paper_setting_keeps_its_own_values_under_every_ablation():
    for name in ABLATIONS:
        cfg = compose(ablation=name, files=[CONFIG_DIR / "paper.yaml"])
        assert (cfg.retrieval.k_semantic, cfg.retrieval.k_structural) == (5, 5)
        assert (cfg.retrieval.encoder, cfg.llm.model, cfg.llm.backend) == ("BAAI/bge-m3", "Qwen/Qwen3-8B", "vllm")


@pytest.mark.parametrize("name, override, key", [
    ("w/o_ont", "retrieval.k_ontology=5", "retrieval.k_ontology"),
    ("w/o_act", "retrieval.k_facts=10", "retrieval.k_facts"),
    ("full", "retrieval.k_facts=0", "retrieval.k_facts"),
    ("full", "prompt.format=chain", "prompt.format"),
    ("chain", "retrieval.cases=semantic", "retrieval.cases"),
    ("w/o_semantic_case", "retrieval.k_structural=0", "retrieval.k_structural"),
])
def test_an_override_that_contradicts_the_setting_is_an_error_naming_both(name, override, key):
    with pytest.raises(ConfigError) as err:
        compose(ablation=name, files=[CONFIG_DIR / "paper.yaml"], overrides=[override])
    message = str(err.value)
    assert f"override {override!r}" in message and f"--ablation {name}" in message and key in message


def test_an_override_inside_the_setting_is_taken():
    cfg = compose(ablation="full", files=[CONFIG_DIR / "paper.yaml"], overrides=["retrieval.k_facts=3"])
    assert setting_of(cfg) == "full" and cfg.retrieval.k_facts == 3
    cfg = compose(ablation="w/o_act", overrides=["retrieval.k_ontology=4"])
    assert setting_of(cfg) == "w/o_act" and cfg.retrieval.k_ontology == 4


def test_a_base_file_whose_view_gives_no_cases_is_named(tmp_path):
    path = tmp_path / "no_structural.yaml"
    path.write_text("retrieval:\n  k_structural: 0\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"{path} contradicts --ablation full: .*retrieval.k_structural above 0"):
        compose(ablation="full", files=[path])
    assert setting_of(compose(ablation="w/o_reasoning_case", files=[path])) == "w/o_reasoning_case"


def test_the_paper_sweep_of_every_setting_runs_eight_distinct_settings(tmp_path):
    from cbr2.cluster.sweep import Sweep, main

    code = main(["submit", "--dry-run", "--ablations", "all", "--config", str(CONFIG_DIR / "paper.yaml"),
                 "--name", "paper", "--dir", str(tmp_path), "data.name=mini-kqapro"])
    assert code == 0
    sweep = Sweep.load(tmp_path / "paper")
    settings = [setting_of(sweep.config(run, 0)) for run in sweep.runs]
    assert settings == list(ABLATIONS)


def test_a_sweep_whose_runs_compose_alike_is_refused(tmp_path, capsys):
    from cbr2.cluster.sweep import main

    code = main(["submit", "--dry-run", "--ablations", "w/o_knowledge", "--grid", "eval.limit=3,03",
                 "--name", "twice", "--dir", str(tmp_path)])
    assert code == 2 and not (tmp_path / "twice").exists()
    assert "compose to the same configuration" in capsys.readouterr().err


def test_the_run_folder_records_the_base_files_and_the_ablation(tmp_path, bases):
    from cbr2.run.runner import run_evaluation

    user = bases["user"]
    cfg = compose(ablation="w/o_act", files=user, overrides=["llm.backend=gold", "wandb.mode=disabled", "eval.limit=2",
                                                             "structural.checkpoint=sentence-transformers/all-MiniLM-L6-v2",
                                                             f"output_dir={tmp_path / 'run'}"])
    metrics = run_evaluation(cfg, ablation="w/o_act", config_files=user)
    prov = json.loads((tmp_path / "run" / "metrics.json").read_text())["provenance"]
    assert prov == metrics["provenance"]
    assert (prov["ablation"], prov["setting"], prov["config_files"]) == ("w/o_act", "w/o_act", [str(user[0].resolve())])


# ------------------------------------------------------------------ the prompts, as Table 5 defines them


def _blocks(user: str) -> list[str]:
    """The question blocks of a prompt's user part: each case's, then the target's."""
    return ["Question:" + b for b in user.split("Question:")[1:]]


@pytest.mark.slow
@pytest.mark.parametrize("base", ["paper.yaml", "user"])
def test_the_prompts_of_each_setting_hold_what_table5_defines(bases, base):
    """Real retrieval (the packaged MiniLM for both views, in place of bge-m3 and a trained
    retriever) for one mini-kqapro question per setting."""
    from cbr2.data.benchmarks import Benchmark
    from cbr2.retrieval.cases import Query
    from cbr2.retrieval.retriever import Retriever
    from cbr2.run.runner import build_prompts, prepare, select_questions

    minilm = "sentence-transformers/all-MiniLM-L6-v2"
    files = bases[base]
    texts = {}
    for name in ABLATIONS:
        form, views, ontology, facts = TABLE5[name]
        cfg = compose(Config, ablation=name, files=files,
                      overrides=["data.name=mini-kqapro", "llm.backend=gold", f"retrieval.encoder={minilm}",
                                 f"structural.checkpoint={minilm}", "retrieval.device=cpu", "eval.limit=1"])
        bench = Benchmark(cfg.data.name)
        (question,) = select_questions(bench, cfg.data.split, cfg.eval)
        cfg = prepare(cfg, bench)
        (item,) = Retriever(bench, cfg.retrieval, cfg.structural.checkpoint).retrieve([Query(question.qid,
                                                                                              question.question)])
        (prompt,) = build_prompts(cfg.prompt, cfg.generation, [question], {question.qid: item})
        blocks = _blocks(prompt.user)
        assert len(blocks) == len(item.cases) + 1 and item.cases
        assert {v for case in item.cases for v in case.views} == views, name
        target = blocks[-1]
        assert ("\nOntology:\n" in target, "\nFacts:\n" in target) == (ontology, facts), name
        for block in blocks[:-1]:  # each case with its own triples: of the same kinds, never of another
            assert "\nFacts:\n" not in block or facts
            assert "\nOntology:\n" not in block or ontology
        case_programs = [b.split("Program:\n", 1)[1] for b in blocks[:-1]]
        assert all(p.startswith("r1: ") for p in case_programs) == (form == "dag"), name
        assert ("Program form (a flat chain" in prompt.system) == (form == "chain")
        texts[name] = (prompt.system, prompt.user, tuple(case.views for case in item.cases))
    # 8 settings, 8 different inputs. The two case views share one encoder here, so they may find the
    # same cases: the views that found them then tell the settings apart.
    assert len(set(texts.values())) == len(ABLATIONS)
