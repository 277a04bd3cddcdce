"""Train the structural retriever and export it under ``checkpoints/``.

    cbr2 train                                      # embedded default (mini-kqapro), CPU-sized
    cbr2 train data.name=kqapro data.root=/data/KQAPro trainer.devices=4 trainer.strategy=ddp
    cbr2 train --config sweep.yaml wandb.mode=online

Overrides are OmegaConf ``key=value`` pairs over ``configs/train.yaml``; ``--config FILE`` merges
a YAML file on top of it first. Rerunning the same command resumes the same run.
"""

import argparse
import sys

from cbr2.common.console import setup_logging
from cbr2.common.devices import check_devices
from cbr2.common.errors import UserError
from cbr2.config import TrainConfig
from cbr2.config.cli import add_config_arguments, config_from_args


def main(argv: list[str] | None = None) -> int:
    """``cbr2 train`` and ``python train.py``: the exit status (0 done, 2 a user error)."""
    parser = argparse.ArgumentParser(prog="cbr2 train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser)
    args = parser.parse_intermixed_args(argv)  # options may come between overrides
    setup_logging()
    # Lightning and torch load when training starts: `cbr2 train --help` and `import train` need neither.
    from cbr2.structural.train import MONITOR, train

    try:
        cfg = config_from_args(args, TrainConfig)
        # A GPU asked for and absent fails here, in one line, before the data is read.
        check_devices(accelerator=str(cfg.trainer.get("accelerator", "auto")))
        result = train(cfg)
    except UserError as err:  # the user's to fix: one line; anything else is a bug and shows its traceback
        print(f"error: {err}", file=sys.stderr)
        return 2
    if result["checkpoint"]:  # DDP: only global rank zero exports and reports
        best, untrained = result["best"].get(MONITOR, float("nan")), result["baseline"].get(MONITOR, float("nan"))
        print(f"best {MONITOR} {best:.4f} (untrained {untrained:.4f}) -> {result['checkpoint']}")
    return 0
