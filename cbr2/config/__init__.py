"""Configuration: the schema, its composition from ``configs/*.yaml`` and overrides, and the
paper's ablation settings (Table 5).

* ``cbr2.config.schema``: every key with its type, default, range (``bounded``,
  ``cbr2.config.fields``) and choices, declared once;
* ``cbr2.config.files``: where the YAML files are (the checkout's ``configs/``, or the copy an
  installed package carries) and reading one;
* ``cbr2.config.load``: ``compose``, the one layering (the schema's defaults, the entry point's
  file, ``--config`` files, the ablation's setting, then ``key=value`` overrides), the checks the
  types cannot make, and the wording of every error (``ConfigError``, naming key and file);
* ``cbr2.config.ablations``: the paper's Table 5 settings, their files, and putting a
  configuration in one;
* ``cbr2.config.cli``: the arguments ``train.py`` and ``evaluate.py`` share;
* ``cbr2.config.reference``: ``python -m cbr2.config.reference > docs/configuration.md``.

This module re-exports what the rest of the code uses.
"""

from __future__ import annotations

from cbr2.common.errors import ConfigError
from cbr2.config.ablations import (
    ABLATION_TABLE,
    ABLATIONS,
    Ablation,
    ablation,
    ablation_slug,
    canonical_ablation,
    setting_of,
)
from cbr2.config.fields import bounded
from cbr2.config.files import CONFIG_DIR, REPO_ROOT
from cbr2.config.load import compose, load_config
from cbr2.config.schema import (
    Config,
    DataConfig,
    EvalConfig,
    GenerationConfig,
    LLMConfig,
    PromptConfig,
    RetrievalConfig,
    StructuralConfig,
    StructuralTrainConfig,
    TrainConfig,
    TrainDataConfig,
    WandbConfig,
)

__all__ = [
    "ABLATIONS", "ABLATION_TABLE", "CONFIG_DIR", "REPO_ROOT", "Ablation", "Config", "ConfigError", "DataConfig",
    "EvalConfig", "GenerationConfig", "LLMConfig", "PromptConfig", "RetrievalConfig", "StructuralConfig",
    "StructuralTrainConfig", "TrainConfig", "TrainDataConfig", "WandbConfig", "ablation",
    "ablation_slug", "bounded", "canonical_ablation", "compose", "load_config", "setting_of",
]
