"""What a user reads: config errors in the project's words and runs labelled by what they ran."""

from __future__ import annotations

import pytest

from cbr2.config import CONFIG_DIR, ConfigError, ablation_file, load_config, setting_of

DEFAULTS = [CONFIG_DIR / "evaluate.yaml"]


@pytest.mark.parametrize("override, message", [
    ("eval.per_categry=3", "unknown key 'eval.per_categry' (did you mean eval.per_category"),
    ("retrieval.k_fact=3", "unknown key 'retrieval.k_fact' (did you mean retrieval.k_facts"),
    ("eval.zzz=1", "unknown key 'eval.zzz'; the keys of eval are eval.limit, "),
    ("zzz.k=1", "unknown key 'zzz'; keys start with one of data, eval, generation"),
    ("eval.per_category=three", "eval.per_category takes null or an integer, not 'three'"),
    ("generation.constrained=maybe", "generation.constrained takes true or false, not 'maybe'"),
    ("eval.timeout_s=abc", "eval.timeout_s takes a number, not 'abc'"),
    ("eval=3", "that is a group of keys, not a value"),
    ("eval.executor=kop", "unknown eval.executor 'kop' (did you mean kopl?); expected one of cbr2, kopl"),
    ("wandb.mode=onlin", "unknown wandb.mode 'onlin' (did you mean online"),
])
def test_config_errors_suggest_the_fix_in_the_projects_words(override, message):
    with pytest.raises(ConfigError) as err:
        load_config([override], DEFAULTS)
    text = str(err.value)
    assert message in text, text
    assert "reference_type" not in text and "object_type" not in text  # no OmegaConf internals
    assert len(text) < 400  # a suggestion, not all 56 keys


@pytest.mark.parametrize("overrides, files, setting", [
    ([], [], "full"),
    ([], ["full"], "full"),
    (["llm.model=smollm2-135m", "retrieval.k_facts=3"], [], "full"),  # other knobs: still the full method
    (["retrieval.k_facts=0"], [], "w/o_act"),  # an override is the same setting as the file
    ([], ["w/o_act"], "w/o_act"),
    ([], ["wo_knowledge"], "w/o_knowledge"),  # the file spelling is accepted too
    ([], ["chain"], "chain"),
    ([], ["random_case"], "random_case"),
    (["prompt.format=chain", "retrieval.k_facts=0"], [], None),  # two changes: no Table 5 row
])
def test_a_run_is_labelled_by_the_setting_its_configuration_is_in(overrides, files, setting):
    cfg = load_config(overrides, DEFAULTS + [ablation_file(f) for f in files])
    assert setting_of(cfg) == setting


def test_the_paper_config_is_the_full_method_too():
    assert setting_of(load_config([], DEFAULTS + [CONFIG_DIR / "paper.yaml"])) == "full"


def test_report_labels_a_default_run_full(tmp_path):
    import json

    from cbr2.report import load_run, table_data

    run = tmp_path / "llamacpp"
    run.mkdir()
    metrics = {"hits@1": 0.5, "ser": 0.0, "n": 2, "per_category": {"Count": {"hits@1": 0.5, "n": 2}},
               "provenance": {"ablation": None, "setting": "full", "config": {"data": {"name": "mini-kqapro"}}}}
    (run / "metrics.json").write_text(json.dumps(metrics))
    assert [r["setting"] for r in table_data([load_run(run)])["rows"]] == ["Full CBR²"]
