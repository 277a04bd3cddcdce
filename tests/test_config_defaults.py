"""One source of defaults, ranges and choices: the schema (``cbr2.config.schema``). The YAML files hold
only what differs from it; each numeric field's range is declared on the field and its default
is inside it; each choice field's set is the set of the code that implements it; the ablation
table and its delta files match.
"""

from __future__ import annotations

import typing
from dataclasses import fields

import pytest
from omegaconf import OmegaConf

from cbr2.config import ABLATION_TABLE, ABLATIONS, CONFIG_DIR, ablation, load_config, setting_of
from cbr2.config.fields import ranges
from cbr2.config.files import leaves
from cbr2.config.schema import (
    AnswerType,
    CaseMode,
    Config,
    EncoderBackend,
    ExecutorEngine,
    IndexKind,
    KnowledgeStyle,
    ProgramFormat,
    StructuralLabel,
    TrainConfig,
)

SURFACES = [(Config, "evaluate.yaml"), (TrainConfig, "train.yaml")]
OVERLAYS = [(Config, "paper.yaml"), (Config, "quality.yaml"), *((Config, f"ablations/{a.file.name}") for a in ABLATION_TABLE), *SURFACES]


@pytest.mark.parametrize("schema, name", [o for o in OVERLAYS if o[1] != "ablations/full.yaml"])
def test_a_yaml_file_sets_only_keys_of_the_schema_and_no_default_again(schema, name):
    base = OmegaConf.structured(schema)
    if name.startswith("ablations/"):
        base = OmegaConf.merge(base, OmegaConf.load(CONFIG_DIR / "ablations" / "full.yaml"))  # what it is a delta of
    declared = leaves(OmegaConf.to_container(base))
    written = leaves(OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / name)))
    assert sorted(set(written) - set(declared)) == [], f"keys of {name} the schema does not declare"
    again = sorted(k for k, v in written.items() if v == declared[k] and type(v) is type(declared[k]))
    assert again == [], f"{name} repeats the value it overlays of these keys"


@pytest.mark.parametrize("schema, name", SURFACES)
def test_an_entry_points_file_sets_no_value_so_the_schema_holds_its_defaults(schema, name):
    # A value here would be a second default: docs/configuration.md (written from the schema) would
    # then show one that no run gets. Overlays (paper.yaml, ablations/) differ on purpose.
    assert leaves(OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / name))) == {}, name


def test_a_key_of_both_entry_points_has_one_default():
    evaluate = leaves(OmegaConf.to_container(OmegaConf.structured(Config)))
    train = leaves(OmegaConf.to_container(OmegaConf.structured(TrainConfig)))
    shared = sorted(set(evaluate) & set(train))
    assert {"data.name", "structural.checkpoints_dir", "wandb.mode"} <= set(shared)
    assert {k: (evaluate[k], train[k]) for k in shared if evaluate[k] != train[k]} == {}


@pytest.mark.parametrize("schema", [Config, TrainConfig])
def test_every_numeric_field_but_a_seed_has_a_range_and_its_default_is_in_it(schema):
    bounds = ranges(schema)
    defaults = leaves(OmegaConf.to_container(OmegaConf.structured(schema)))

    def numeric(hint) -> bool:
        return bool({int, float} & {hint, *typing.get_args(hint)})

    def numeric_keys(node: type, prefix: str = "") -> list[str]:
        hints = typing.get_type_hints(node)
        out = []
        for f in fields(node):
            if hasattr(hints[f.name], "__dataclass_fields__"):
                out += numeric_keys(hints[f.name], f"{prefix}{f.name}.")
            elif numeric(hints[f.name]) and "seed" not in f.name:
                out.append(f"{prefix}{f.name}")
        return out

    assert sorted(numeric_keys(schema)) == sorted(bounds)
    outside = {k: str(r) for k, r in bounds.items() if defaults[k] is not None and not r.accepts(defaults[k])}
    assert outside == {}


@pytest.mark.parametrize("name", ["paper.yaml", "quality.yaml"])
def test_a_preset_loads_and_each_of_its_keys_takes_effect(name):
    cfg = load_config([], files=[CONFIG_DIR / "evaluate.yaml", CONFIG_DIR / name])
    overlay = leaves(OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / name)))
    assert overlay and all(OmegaConf.select(cfg, k) == v for k, v in overlay.items())


def test_each_choice_type_is_the_set_of_the_code_that_reads_it():
    from cbr2.generation.grounded import ANSWER_SOURCES
    from cbr2.generation.prompt import KNOWLEDGE_STYLES
    from cbr2.kopl.executor import ENGINES
    from cbr2.kopl.text import FORMATS
    from cbr2.retrieval.encoders import BACKENDS
    from cbr2.retrieval.index import INDEX_KINDS
    from cbr2.retrieval.retriever import CASE_MODES
    from cbr2.structural.labels import LABELS

    pairs = [(ProgramFormat, FORMATS), (CaseMode, CASE_MODES), (IndexKind, INDEX_KINDS), (ExecutorEngine, ENGINES),
             (StructuralLabel, LABELS), (EncoderBackend, BACKENDS), (KnowledgeStyle, KNOWLEDGE_STYLES),
             (AnswerType, ANSWER_SOURCES)]
    for literal, table in pairs:
        assert typing.get_args(literal) == tuple(table), (literal, table)


def test_the_ablation_table_matches_its_files_and_settings():
    files = {p.name for p in (CONFIG_DIR / "ablations").glob("*.yaml")}
    assert sorted(a.file.name for a in ABLATION_TABLE) == sorted(files)
    assert len(set(ABLATIONS)) == len(ABLATIONS) == len(ABLATION_TABLE)
    assert [a.group for a in ABLATION_TABLE[:1]] == [""] and all(a.group and a.label for a in ABLATION_TABLE[1:])
    # full.yaml defines the full setting on every key that defines a setting (whatever the schema's
    # defaults are), so each setting's values are complete: a setting is never "the defaults, less".
    full = leaves(OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "ablations" / "full.yaml")))
    assert sorted(full) == ["prompt.format", "retrieval.cases", "retrieval.k_facts", "retrieval.k_ontology"]
    for a in ABLATION_TABLE:
        assert ablation(a.slug) is a
        assert set(a.values) == set(full)
        assert setting_of(load_config([], files=[CONFIG_DIR / "evaluate.yaml", ABLATION_TABLE[0].file, a.file])) == a.name


def test_the_configuration_page_is_the_one_the_schema_writes():
    from pathlib import Path

    from cbr2.config.reference import reference

    page = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
    assert page.read_text(encoding="utf-8") == reference(), "regenerate: python -m cbr2.config.reference > " + str(page)


def test_the_quality_preset_names_a_packaged_model():
    from cbr2.llm.packaged import DEFAULT_MODEL, packaged

    cfg = load_config([], files=[CONFIG_DIR / "evaluate.yaml", CONFIG_DIR / "quality.yaml"])
    assert packaged(cfg.llm.model).name == cfg.llm.model != DEFAULT_MODEL  # installable by name, and not the default
