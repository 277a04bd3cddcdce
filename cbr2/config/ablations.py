"""The paper's Table 5 settings (ablations): their names, their delta files over the defaults
(``configs/ablations/{slug}.yaml``), and which setting a configuration is in.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from cbr2.common.console import did_you_mean
from cbr2.common.errors import ConfigError
from cbr2.config.files import CONFIG_DIR, leaves, read_yaml
from cbr2.config.schema import Config


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
