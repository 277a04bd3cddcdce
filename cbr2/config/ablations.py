"""The paper's Table 5 settings (ablations): their names, their files
(``configs/ablations/{slug}.yaml``), applying one to a configuration, and which setting a
configuration is in.

A setting is defined on four keys: the program form (``prompt.format``), the case views
(``retrieval.cases``) and whether the question's ontology and fact triples are recalled
(``retrieval.k_ontology``, ``retrieval.k_facts`` above 0). ``full.yaml`` gives all four for the
full method; every other setting is ``full.yaml`` with its own delta on top.

``--ablation NAME`` is applied after the ``--config`` files, as a setting and not as one more
layer: the four keys are set to the setting's values, except that a ``k`` the setting recalls
keeps the base's amount when the base recalls any (``paper.yaml``'s 10, a user's 4) and takes
``full.yaml``'s otherwise (the CPU default recalls none). So ``--ablation w/o_act`` means the
paper's row, ontology triples without facts, whatever the defaults or the ``--config`` files hold,
and the base's other values (its model, encoder, k_s and k_r ...) stand. A ``key=value`` override
comes last and must not take the run out of the setting (``check_setting``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from cbr2.common.console import did_you_mean
from cbr2.common.errors import ConfigError
from cbr2.config.files import CONFIG_DIR, leaves, read_yaml

FULL_FILE = CONFIG_DIR / "ablations" / "full.yaml"
"""The full method's setting, on every key that defines a setting."""

VIEW_AMOUNTS = {"semantic": "retrieval.k_semantic", "structural": "retrieval.k_structural"}
"""The number of cases each view contributes: a setting that uses a view needs it above 0."""

CASE_VIEWS = {"dual": ("semantic", "structural"), "semantic": ("semantic",), "structural": ("structural",),
              "random": ()}
"""The views each ``retrieval.cases`` mode of a Table 5 setting draws from (random draws as many
cases as the dual view gives at most: k_s + k_r)."""


def _is_amount(value: Any) -> bool:
    """Whether a setting's value is an amount (a ``k``: only 0 or above 0 defines the setting)."""
    return isinstance(value, int) and not isinstance(value, bool)


@functools.cache
def _file_values(path: Path) -> dict[str, Any]:
    """The leaves of a setting's file, read once per process: every run asks which setting it is
    in (``setting_of``: each of the eight, two files each), and the files ship with the code."""
    return leaves(OmegaConf.to_container(read_yaml(path)))


@dataclass(frozen=True)
class Ablation:
    """One setting of the paper's Table 5: its name, file and place in the table."""

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
        """Its file, ``configs/ablations/{slug}.yaml`` (a delta over ``full.yaml``'s, for the others)."""
        return CONFIG_DIR / "ablations" / f"{self.slug}.yaml"

    @property
    def values(self) -> dict[str, Any]:
        """The setting on the keys that define one (``{"prompt.format": "dag", ...}``): ``full.yaml``,
        then this setting's own file.

        Raises:
            ConfigError: Naming a file that cannot be read.
        """
        values = _file_values(FULL_FILE)
        if self.file != FULL_FILE:
            values = {**values, **_file_values(self.file)}
        return dict(values)

    def apply(self, cfg: DictConfig) -> DictConfig:
        """``cfg`` put in this setting: a copy with the defining keys set, each ``k`` the setting
        recalls keeping ``cfg``'s amount when that is above 0."""
        out = cfg.copy()
        for key, want in self.values.items():
            have = OmegaConf.select(out, key)
            if _is_amount(want) and want > 0 and _is_amount(have) and have > 0:
                continue  # the base's amount: the setting only says that this kind is recalled
            OmegaConf.update(out, key, want, merge=False)
        return out

    def departures(self, cfg: DictConfig) -> list[tuple[str, Any, str]]:
        """Where ``cfg`` is not in this setting: ``(key, its value, what the setting needs)`` each."""
        found = []
        for key, want in self.values.items():
            have = OmegaConf.select(cfg, key)
            if _is_amount(want):
                if not _is_amount(have) or (have > 0) != (want > 0):
                    found.append((key, have, "0" if want == 0 else "above 0"))
            elif have != want:
                found.append((key, have, repr(want)))
        views = CASE_VIEWS.get(OmegaConf.select(cfg, "retrieval.cases"), ())
        for view in views:
            amount = VIEW_AMOUNTS[view]
            if not OmegaConf.select(cfg, amount):
                found.append((amount, OmegaConf.select(cfg, amount), f"above 0 (the {view} view gives cases)"))
        if OmegaConf.select(cfg, "retrieval.cases") == "random" and \
                not sum(OmegaConf.select(cfg, k) or 0 for k in VIEW_AMOUNTS.values()):
            found.append(("retrieval.k_semantic", 0, "above 0 with retrieval.k_structural (random cases: k_s + k_r)"))
        return found


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
"""The paper's Table 5 settings, in its order (``python -m cbr2.report.compare`` lays out its
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


def setting_of(cfg: DictConfig) -> str | None:
    """The Table 5 setting a configuration is in, from its values, or None for none of them.

    The keys the ablation files set decide (a ``k`` only as 0 or above 0), and a setting's case
    views must each give cases. So ``retrieval.k_facts=3`` is still ``full``,
    ``retrieval.k_ontology=10`` given as an override on the CPU default is ``w/o_act``, as
    ``--ablation w/o_act`` is, and a run on the CPU default is ``w/o_knowledge``.
    """
    return next((a.name for a in ABLATION_TABLE if not a.departures(cfg)), None)
