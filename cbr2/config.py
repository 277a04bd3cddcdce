"""Typed configuration: defaults here, ``configs/*.yaml`` on top, then ``key=value`` overrides.

The dataclasses are the schema: a key that is not declared here fails with a message that
lists the valid keys, and a value of the wrong type fails naming the key.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = REPO_ROOT / "configs"


@dataclass
class DataConfig:
    """Which benchmark to read."""

    name: str = "mini-kqapro"
    """``mini-kqapro``, ``mini-metaqa``, ``kqapro`` or ``metaqa``."""
    root: str | None = None
    """Folder in the official layout; the embedded copy for ``mini-*`` when unset."""
    split: str | None = None
    """Split to evaluate; the family's default (KQA Pro ``val``, MetaQA ``test``) when unset."""


@dataclass
class LLMConfig:
    """Which program generator to use."""

    backend: str = "gold"
    """``gold`` writes each question's gold program as text (checks the whole path after generation)."""


@dataclass
class PromptConfig:
    """How programs are written as text."""

    format: str = "dag"
    """``dag`` (the paper's structure-aware form) or ``chain`` (one step per line)."""


@dataclass
class EvalConfig:
    """Evaluation loop settings."""

    limit: int | None = None
    """Evaluate only the first N questions of the split."""
    timeout_s: float = 10.0
    """Per-program execution time limit in seconds."""


@dataclass
class Config:
    """Everything ``evaluate.py`` reads."""

    data: DataConfig = field(default_factory=DataConfig)
    llm: LLMConfig = field(default_factory=LLMConfig)
    prompt: PromptConfig = field(default_factory=PromptConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    output_dir: str | None = None
    """Where results go; ``outputs/{data.name}/{split}/{llm.backend}`` when unset."""


class ConfigError(ValueError):
    """A configuration file or override that does not fit the schema."""


def _valid_keys(node: Any, prefix: str = "") -> list[str]:
    keys = []
    for k, v in node.items():
        keys += _valid_keys(v, f"{prefix}{k}.") if isinstance(v, DictConfig) else [f"{prefix}{k}"]
    return keys


def load_config(overrides: list[str] | None = None, files: list[str | Path] = (), schema: type = Config) -> DictConfig:
    """Build the configuration.

    Args:
        overrides: OmegaConf dotlist (``["data.name=mini-metaqa", "eval.limit=10"]``).
        files: YAML files merged in order on top of the defaults.
        schema: The dataclass describing valid keys.

    Raises:
        ConfigError: Naming the unknown key (with the list of valid ones), the file, or the
            value that does not fit its type.
    """
    cfg = OmegaConf.structured(schema)
    for path in files:
        try:
            cfg = OmegaConf.merge(cfg, OmegaConf.load(path))
        except OmegaConfBaseException as err:
            raise ConfigError(f"{path}: {_describe(err, cfg)}") from err
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not key=value (e.g. data.name=mini-metaqa)")
        try:
            cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist([item]))
        except OmegaConfBaseException as err:
            raise ConfigError(f"override {item!r}: {_describe(err, cfg)}") from err
    return cfg


def _describe(err: OmegaConfBaseException, cfg: DictConfig) -> str:
    if isinstance(err, ConfigKeyError):
        return f"unknown key {err.full_key!r}; valid keys: {', '.join(_valid_keys(cfg))}"
    return f"{getattr(err, 'full_key', '') or ''}: {err.msg if hasattr(err, 'msg') else err}".strip(": ")


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
