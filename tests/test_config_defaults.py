"""One source of defaults and choices: the schema (``cbr2.config``) and the YAML files that document
it (``configs/evaluate.yaml``, ``configs/train.yaml``) say the same; each choice field's set is the
set of the code that implements it; the ablation table and its delta files match.

``configs/paper.yaml`` is exempt from the equality: it is an overlay (the paper's setting on top of
the defaults), so it differs from them on purpose; it only has to load.
"""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from cbr2._config_load import choices, leaves
from cbr2.config import (
    ABLATION_TABLE,
    ABLATIONS,
    CONFIG_DIR,
    CaseMode,
    Config,
    ExecutorEngine,
    IndexKind,
    ProgramFormat,
    StructuralLabel,
    TrainConfig,
    WandbMode,
    ablation,
    load_config,
    setting_of,
)

SURFACES = [(Config, "evaluate.yaml"), (TrainConfig, "train.yaml")]
_KEY = re.compile(r"^(?P<indent> *)(?P<key>[\w.-]+):(?P<rest>.*)$")


def commented_keys(path: Path) -> dict[str, str]:
    """``{"a.b": comment}`` of every key line of a block-style YAML file (comment "" when none)."""
    out: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        m = _KEY.match(line)
        if not m or line.lstrip().startswith("#"):
            continue
        indent = len(m["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key = ".".join([k for _, k in stack] + [m["key"]])
        value, _, comment = m["rest"].partition("#")
        if not value.strip():  # a section: its keys follow, indented
            stack.append((indent, m["key"]))
        out[key] = comment.strip()
    return out


@pytest.mark.parametrize("schema, name", SURFACES)
def test_the_yaml_defaults_are_the_schema_defaults(schema, name):
    declared = leaves(OmegaConf.to_container(OmegaConf.structured(schema)))
    documented = leaves(OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / name)))
    assert sorted(set(declared) - set(documented)) == [], f"keys of the schema that {name} does not show"
    assert sorted(set(documented) - set(declared)) == [], f"keys of {name} the schema does not declare"
    differ = {k: (declared[k], documented[k]) for k in declared
              if declared[k] != documented[k] or type(declared[k]) is not type(documented[k])}
    assert differ == {}, f"(schema, {name}) disagree"


def test_the_paper_overlay_loads_and_sets_only_schema_keys():
    cfg = load_config([], files=[CONFIG_DIR / "evaluate.yaml", CONFIG_DIR / "paper.yaml"])
    overlay = leaves(OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "paper.yaml")))
    assert overlay and all(OmegaConf.select(cfg, k) == v for k, v in overlay.items())


def test_each_choice_type_is_the_set_of_the_code_that_reads_it():
    from cbr2.evaluation.tracking import WANDB_MODES
    from cbr2.kopl.executor import ENGINES
    from cbr2.kopl.text import FORMATS
    from cbr2.retrieval.index import INDEX_KINDS
    from cbr2.retrieval.retriever import CASE_MODES
    from cbr2.structural.labels import LABELS

    pairs = [(ProgramFormat, FORMATS), (CaseMode, CASE_MODES), (IndexKind, INDEX_KINDS), (ExecutorEngine, ENGINES),
             (StructuralLabel, LABELS), (WandbMode, WANDB_MODES)]
    for literal, table in pairs:
        assert typing.get_args(literal) == tuple(table), (literal, table)


@pytest.mark.parametrize("schema, name", SURFACES)
def test_a_yaml_comment_that_lists_a_keys_values_lists_exactly_the_valid_ones(schema, name):
    comments = commented_keys(CONFIG_DIR / name)
    valid = choices(schema)
    checked = []
    for key, allowed in valid.items():
        comment = comments[key]
        if "|" not in comment:
            # llm.dtype's comment says what `auto` means instead of listing the four values.
            assert key == "llm.dtype", f"{name}: the comment of {key} does not list its values {allowed}"
            continue
        listed = {re.sub(r"\(.*?\)", "", part).split()[0].rstrip(":,") for part in comment.split("|")}
        assert listed == set(allowed), f"{name}: {key} lists {sorted(listed)}, the valid values are {allowed}"
        checked.append(key)
    assert {"wandb.mode", "data.name"} <= set(checked)


def test_the_ablation_table_matches_its_files_and_settings():
    files = {p.name for p in (CONFIG_DIR / "ablations").glob("*.yaml")}
    assert sorted(a.file.name for a in ABLATION_TABLE) == sorted(files)
    assert len(set(ABLATIONS)) == len(ABLATIONS) == len(ABLATION_TABLE)
    assert [a.group for a in ABLATION_TABLE[:1]] == [""] and all(a.group and a.label for a in ABLATION_TABLE[1:])
    for a in ABLATION_TABLE:
        assert ablation(a.slug) is a
        assert setting_of(load_config([], files=[CONFIG_DIR / "evaluate.yaml", a.file])) == a.name
