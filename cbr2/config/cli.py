"""The command line every entry point shares (``train.py``, ``evaluate.py``): ``key=value``
overrides and ``--config FILE``, composed into a configuration by ``cbr2.config.compose``."""

from __future__ import annotations

import argparse

from omegaconf import DictConfig

from cbr2.config.load import compose


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments every entry point shares: ``key=value`` overrides and ``--config FILE``."""
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. data.name=mini-metaqa")
    parser.add_argument("--config", action="append", default=[], metavar="FILE",
                        help="extra YAML merged over the entry point's defaults (repeatable)")


def config_from_args(args: argparse.Namespace, schema: type) -> DictConfig:
    """The configuration of an entry point's arguments (``--ablation`` where it has it, ``--config``
    files, overrides), layered by ``compose``.

    Raises:
        ConfigError: As ``compose``.
    """
    return compose(schema, ablation=getattr(args, "ablation", None), files=args.config, overrides=args.overrides)
