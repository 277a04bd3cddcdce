"""Configurations: the schema's defaults (``cbr2.config_schema``), ``configs/*.yaml`` on top, then
``key=value`` overrides (``compose``, the one layering); the paper's Table 5 settings (ablations).

The schema is the one source of every key, default, range and choice: a key it does not declare
fails with a message that lists the valid keys; a value of the wrong type or outside a
``Literal`` field's set fails naming the key; a number outside its field's ``bounded`` range fails
naming the key and the range. ``cbr2._config_load`` reads the layers, checks what a type cannot
say (registry names, ``data.split``, the declared ranges) and words the errors. The YAML files
hold only what differs from the schema's defaults.
"""

from __future__ import annotations

import argparse
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from cbr2._config_load import ConfigError, leaves, merge_layers, read_yaml, validate
from cbr2.common.console import did_you_mean
from cbr2.config_schema import Config, TrainConfig

__all__ = ["Config", "ConfigError", "TrainConfig", "validate"]  # defined in the schema and the loader, public here

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = REPO_ROOT / "configs"


@dataclass(frozen=True)
class Ablation:
    """One setting of the paper's Table 5: its name, delta file and place in the table."""

    name: str
    """As the paper and ``--ablation`` spell it (``w/o_act``)."""
    group: str
    """Table 5's category group ("" for the full method)."""
    label: str
    """Table 5's row label."""

    @property
    def slug(self) -> str:
        """The name as file and folder names spell it (``wo_act``)."""
        return ablation_slug(self.name)

    @property
    def file(self) -> Path:
        """Its delta file over the defaults, ``configs/ablations/{slug}.yaml``."""
        return CONFIG_DIR / "ablations" / f"{self.slug}.yaml"


ABLATION_TABLE = (
    Ablation("full", "", "Full CBR²"),
    Ablation("chain", "Target Program Format", "Chain"),
    Ablation("w/o_reasoning_case", "Case Recall", "-w/o reasoning case"),
    Ablation("w/o_semantic_case", "Case Recall", "-w/o semantic case"),
    Ablation("random_case", "Case Recall", "random case"),
    Ablation("w/o_act", "Knowledge Recall", "-w/o act knowledge"),
    Ablation("w/o_ont", "Knowledge Recall", "-w/o ont knowledge"),
    Ablation("w/o_knowledge", "Knowledge Recall", "-w/o knowledge"),
)
"""The paper's Table 5 settings, in its order (``python -m cbr2.evaluation.compare`` lays out its
table by it; ``--ablation`` and the sweep take the names)."""

ABLATIONS = tuple(a.name for a in ABLATION_TABLE)
"""The names of ``ABLATION_TABLE``, in its order."""


def canonical_ablation(name: str | None) -> str | None:
    """An ablation name as ``ABLATIONS`` spells it: ``wo_act`` (its file and folder name) is ``w/o_act``."""
    if isinstance(name, str) and name.startswith("wo_"):
        return "w/o_" + name[3:]
    return name


def ablation_slug(name: str) -> str:
    """An ablation name as file and folder names spell it: ``w/o_act`` → ``wo_act``."""
    return name.replace("w/o_", "wo_")


def ablation(name: str) -> Ablation:
    """The Table 5 setting of a name (``w/o_act`` or its file spelling ``wo_act``).

    Raises:
        ConfigError: For an unknown name, with the closest valid one.
    """
    canonical = canonical_ablation(name)
    for a in ABLATION_TABLE:
        if a.name == canonical:
            return a
    hint = did_you_mean(canonical, ABLATIONS, n=1, cutoff=0.75)
    raise ConfigError(f"unknown ablation {name!r}{hint}; valid: {', '.join(ABLATIONS)}")


def ablation_file(name: str) -> Path:
    """The delta file of an ablation (``w/o_act`` or ``wo_act`` → ``configs/ablations/wo_act.yaml``).

    Raises:
        ConfigError: For an unknown name, with the closest valid one.
    """
    return ablation(name).file


def setting_of(cfg: DictConfig) -> str | None:
    """The Table 5 setting a configuration is in, from its values, or None for none of them.

    The keys the ablation files set (``prompt.format``, ``retrieval.cases``, ``retrieval.k_facts``,
    ``retrieval.k_ontology``) decide: a setting is its file's values on those keys, with the
    full method's everywhere else (the default of a choice, any number above 0 for a ``k``). So
    a run without ``--ablation`` on the defaults is ``full``, and ``retrieval.k_facts=0`` given
    as an override is ``w/o_act``, as ``--ablation w/o_act`` is.
    """
    deltas = {a.name: leaves(OmegaConf.to_container(read_yaml(a.file))) for a in ABLATION_TABLE}
    keys = sorted(set().union(*deltas.values()))
    defaults = OmegaConf.structured(Config)

    def full_like(key: str, value: Any) -> bool:
        default = OmegaConf.select(defaults, key)
        if isinstance(default, int) and not isinstance(default, bool):
            return isinstance(value, int) and value > 0
        return value == default

    values = {k: OmegaConf.select(cfg, k) for k in keys}
    for name, delta in deltas.items():
        if all(values[k] == delta[k] if k in delta else full_like(k, values[k]) for k in keys):
            return name
    return None


def load_config(overrides: list[str] | None = None, files: list[str | Path] = (), schema: type = Config) -> DictConfig:
    """Build the configuration.

    Args:
        overrides: OmegaConf dotlist (``["data.name=mini-metaqa", "eval.limit=10"]``).
        files: YAML files merged in order on top of the defaults.
        schema: The dataclass describing valid keys.

    Raises:
        ConfigError: Naming the unknown key (with the list of valid ones), the file (and line,
            for a file that is not a YAML mapping), or the value that does not fit its type or
            its allowed values (its ``Literal`` type, ``validate``), every bad value at once.
    """
    return merge_layers(OmegaConf.structured(schema), files, overrides or [])


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments every entry point shares: ``key=value`` overrides and ``--config FILE``."""
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. data.name=mini-metaqa")
    parser.add_argument("--config", action="append", default=[], metavar="FILE",
                        help="extra YAML merged over the entry point's defaults (repeatable)")


def compose(schema: type = Config, *, ablation: str | None = None, files: Iterable[str | Path] = (),
            overrides: Iterable[str] = ()) -> DictConfig:
    """The configuration of a run, layered the one way every entry point, sweep task and on-demand
    training does: the schema's defaults, its entry point's file (``configs/evaluate.yaml`` or
    ``configs/train.yaml``), the ablation's delta file, ``files``, then ``key=value`` overrides.

    Raises:
        ConfigError: As ``load_config``, or for an unknown ablation.
    """
    delta = [ablation_file(ablation)] if ablation else []
    defaults = CONFIG_DIR / ("train.yaml" if schema is TrainConfig else "evaluate.yaml")
    return load_config(list(overrides), files=[defaults, *delta, *files], schema=schema)


def config_from_args(args: argparse.Namespace, schema: type) -> DictConfig:
    """The configuration of an entry point's arguments (``--ablation`` where it has it, ``--config``
    files, overrides), layered by ``compose``.

    Raises:
        ConfigError: As ``compose``.
    """
    return compose(schema, ablation=getattr(args, "ablation", None), files=args.config, overrides=args.overrides)


def git_hash() -> str | None:
    """The repository's commit (with ``-dirty`` when uncommitted changes exist), or None."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("-dirty" if dirty else "")
