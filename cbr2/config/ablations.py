"""The paper's Table 5 settings (ablations): their names, their delta files
(``configs/ablations/{slug}.yaml``), and which setting a configuration is in.

Every setting is the full method (``full.yaml``: the question's knowledge as the paper recalls it)
with its own delta on top, whatever the defaults are: the CPU default recalls no knowledge
(``retrieval.k_ontology`` / ``k_facts`` 0), so ``--ablation w/o_act`` still means the paper's row,
ontology triples without facts, and not the default less what it does not have.
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
        """Its delta file, ``configs/ablations/{slug}.yaml`` (over ``full.yaml``'s, for the others)."""
        return CONFIG_DIR / "ablations" / f"{self.slug}.yaml"

    @property
    def files(self) -> list[Path]:
        """What ``--ablation`` merges over the defaults, in order: ``full.yaml``, then its own file."""
        full = CONFIG_DIR / "ablations" / "full.yaml"
        return [full] if self.file == full else [full, self.file]


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


def ablation_files(name: str) -> list[Path]:
    """What ``--ablation NAME`` merges over the defaults: ``full.yaml``, then the setting's own file.

    Raises:
        ConfigError: For an unknown name, with the closest valid one.
    """
    return ablation(name).files


def setting_of(cfg: DictConfig) -> str | None:
    """The Table 5 setting a configuration is in, from its values, or None for none of them.

    The keys the ablation files set (``prompt.format``, ``retrieval.cases``, ``retrieval.k_facts``,
    ``retrieval.k_ontology``) decide: a setting is its files' values on those keys (a ``k`` only
    as 0 or above 0), with the defaults' elsewhere. So ``retrieval.k_facts=3`` is still ``full``,
    ``retrieval.k_ontology=10`` given as an override on the CPU default is ``w/o_act``, as
    ``--ablation w/o_act`` is, and a run on the CPU default is ``w/o_knowledge``.
    """
    deltas = {a.name: {k: v for f in a.files for k, v in leaves(OmegaConf.to_container(read_yaml(f))).items()}
              for a in ABLATION_TABLE}
    keys = sorted(set().union(*deltas.values()))
    defaults = OmegaConf.structured(Config)

    def same(value: Any, want: Any) -> bool:
        if isinstance(want, int) and not isinstance(want, bool):
            return isinstance(value, int) and (value > 0) == (want > 0)
        return value == want

    values = {k: OmegaConf.select(cfg, k) for k in keys}
    for name, delta in deltas.items():
        if all(same(values[k], delta[k] if k in delta else OmegaConf.select(defaults, k)) for k in keys):
            return name
    return None
