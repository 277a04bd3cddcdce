"""The runs of a sweep: the ablations crossed with ``--grid`` axes, or varied one factor at a time."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import Any

import yaml
from omegaconf import OmegaConf

from cbr2.config import ConfigError, ablation_slug


@dataclass
class Run:
    """One evaluation of the grid."""

    name: str
    """Folder name under ``SWEEP/runs/`` (the ablation, then each grid value)."""
    ablation: str | None
    overrides: list[str] = field(default_factory=list)
    """The grid's ``key=value`` pairs of this run."""



def split_values(text: str) -> list[str]:
    """``a,b,[c,d]`` → ``["a", "b", "[c,d]"]``: commas inside brackets or quotes stay."""
    values, depth, quote, current = [], 0, None, ""
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            values.append(current)
            current = ""
            continue
        current += ch
    values.append(current)
    return values


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=+-]+", "-", text).strip("-")


def expand_grid(ablations: list[str | None], grid: list[str]) -> list[Run]:
    """Every combination of the ablations and the ``--grid KEY=V1,V2`` axes, in order.

    Raises:
        ConfigError: On an axis that is not ``key=values`` or a key given twice.
    """
    axes: list[tuple[str, list[str]]] = []
    for item in grid:
        key, sep, values = item.partition("=")
        if not sep or not key or not values:
            raise ConfigError(f"--grid {item!r} is not KEY=V1,V2,... (e.g. llm.seed=0,1,2)")
        if key in {k for k, _ in axes}:
            raise ConfigError(f"--grid {key} is given twice; list all its values in one --grid")
        axes.append((key, split_values(values)))
    runs, seen = [], set()
    for ablation in ablations:
        for combo in itertools.product(*[[(k, v) for v in values] for k, values in axes]):
            parts = [ablation_slug(ablation) if ablation else "run"] + [_slug(f"{k}={v}") for k, v in combo]
            name = "__".join(parts)
            if name in seen:
                raise ConfigError(f"two runs of the grid would share the folder {name}; make the values distinct")
            seen.add(name)
            runs.append(Run(name=name, ablation=ablation, overrides=[f"{k}={v}" for k, v in combo]))
    return runs


def expand_vary(ablations: list[str | None], vary: list[str], base: Any) -> list[Run]:
    """One factor at a time: per ablation, its run as configured, then one run per ``--vary`` value.

    ``--vary KEY=V1,V2`` changes one key; ``--vary K1,K2=V1,V2`` sets several keys to the same
    value in each run (``retrieval.k_semantic,retrieval.k_structural=2,5``). A value equal to the
    base configuration's is left out: that run is the base run.

    Args:
        ablations: As for ``expand_grid``.
        vary: The ``--vary`` axes.
        base: The shared configuration, to read each key's base value.

    Raises:
        ConfigError: On an axis that is not ``keys=values`` or an unknown key.
    """
    axes: list[tuple[list[str], list[str]]] = []
    for item in vary:
        keys, sep, values = item.partition("=")
        if not sep or not keys or not values:
            raise ConfigError(f"--vary {item!r} is not KEY=V1,V2,... or K1,K2=V1,V2 (e.g. prompt.case_triples=0,1)")
        names = [k.strip() for k in keys.split(",")]
        for key in names:
            if OmegaConf.select(base, key, default="\x00missing") == "\x00missing":
                raise ConfigError(f"--vary {item!r}: unknown key {key!r}")
        axes.append((names, split_values(values)))
    runs, seen = [], set()
    for ablation in ablations:
        prefix = ablation_slug(ablation) if ablation else "run"
        runs.append(Run(name=prefix, ablation=ablation))
        for keys, values in axes:
            for value in values:
                if all(OmegaConf.select(base, k) == yaml.safe_load(value) for k in keys):
                    continue
                name = f"{prefix}__{_slug(','.join(keys) + '=' + value)}"
                if name not in seen:
                    seen.add(name)
                    runs.append(Run(name=name, ablation=ablation, overrides=[f"{k}={value}" for k in keys]))
    return runs
