"""Where the YAML configuration files are, and reading one.

``configs/`` at the top of the checkout is where users edit them (the design card's layout). The
package carries the same folder as ``cbr2/config/configs``: in a checkout a symbolic link to
``../../configs``, which a wheel or a non-editable install turns into a copy of its files
(``pyproject.toml``'s package data). So ``CONFIG_DIR`` is the checkout's ``configs/`` when
``cbr2`` is imported from a checkout (editable install, or run from it), else the installed
copy: one path, no search, and never a ``configs/`` of whatever folder a run starts in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from cbr2.common.errors import ConfigError

PACKAGE_CONFIGS = Path(__file__).resolve().parent / "configs"
"""The configuration files as the package carries them (a link to the checkout's ``configs/``
in a checkout, a copy in an installed package)."""

CONFIG_DIR = PACKAGE_CONFIGS.resolve()
"""The folder of ``evaluate.yaml``, ``train.yaml``, ``paper.yaml`` and ``ablations/``; in a
checkout, its ``configs/`` (the link resolved, so messages name the file users edit)."""

REPO_ROOT = Path(__file__).resolve().parents[2]
"""The checkout ``cbr2`` is imported from (its ``Makefile``, ``slurm/``; in an installed package
the folder that holds ``cbr2``, where neither exists)."""


def read_yaml(path: str | Path) -> DictConfig:
    """A config file as a mapping; a file that is not one is a one-line error naming it.

    Raises:
        ConfigError: Naming the file (and the line of a YAML syntax error) when it cannot be
            read, is not YAML, or holds something other than a mapping of config keys.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot read this config file ({err})") from None
    try:
        # Parsed once here for the checks (PyYAML reports the line); OmegaConf parses it again
        # with its own loader, as before, for the values.
        data = yaml.safe_load(text)
        if data is None:  # empty, or only comments
            return OmegaConf.create({})
        if not isinstance(data, dict):
            raise ConfigError(f"{path}:1: holds a YAML {type(data).__name__}, not a mapping of config keys "
                              "(e.g. `eval:` and below it `  limit: 10`)")
        return OmegaConf.load(path)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        what = " ".join(str(x) for x in (getattr(err, "context", None), getattr(err, "problem", None)) if x)
        raise ConfigError(f"{where}: not valid YAML ({what or type(err).__name__})") from None


def leaves(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a.b": value}`` of every leaf of a nested dict (not a dict: none)."""
    if not isinstance(tree, dict):
        return {}
    out: dict[str, Any] = {}
    for k, v in tree.items():
        out.update(leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out
