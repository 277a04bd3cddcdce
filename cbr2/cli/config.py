"""``cbr2 config``: the configuration a command line composes, before anything runs.

    cbr2 config --config configs/paper.yaml --ablation w/o_ont        # what that evaluation would run
    cbr2 config --train trainer.devices=4                              # train.py's
    cbr2 config --reference > docs/configuration.md                    # every key, its default and meaning

It composes exactly as ``evaluate.py`` (or ``train.py``) does (``cbr2.config.compose``) and prints
the result as YAML, then the Table 5 setting it is in; a bad key or value fails the same way, in one
line.
"""

from __future__ import annotations

import argparse
import sys

from omegaconf import OmegaConf

from cbr2.common.errors import UserError
from cbr2.config import ABLATIONS, Config, TrainConfig, compose, setting_of
from cbr2.config.cli import add_config_arguments


def main(argv: list[str] | None = None) -> int:
    """Print the composed configuration (or the reference page); 2 on a bad one."""
    parser = argparse.ArgumentParser(prog="cbr2 config", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser)
    parser.add_argument("--ablation", metavar="NAME", help=f"a Table 5 setting: {', '.join(ABLATIONS)}")
    parser.add_argument("--train", action="store_true", help="train.py's configuration instead of evaluate.py's")
    parser.add_argument("--reference", action="store_true", help="print docs/configuration.md (every key)")
    args = parser.parse_intermixed_args(argv)
    if args.reference:
        from cbr2.config.reference import reference

        sys.stdout.write(reference())
        return 0
    try:
        if args.train:
            if args.ablation:
                raise UserError("--ablation is evaluate.py's; train.py has no Table 5 setting")
            cfg = compose(TrainConfig, files=args.config, overrides=args.overrides)
        else:
            cfg = compose(Config, ablation=args.ablation, files=args.config, overrides=args.overrides)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    sys.stdout.write(OmegaConf.to_yaml(cfg))
    if not args.train:
        print(f"# Table 5 setting: {setting_of(cfg) or 'none of them'}")
    return 0
