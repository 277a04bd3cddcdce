"""Train the structural retriever and export it under ``checkpoints/``.

    python train.py                                      # embedded default (mini-kqapro), CPU-sized
    python train.py data.name=kqapro data.root=/data/KQAPro trainer.devices=4 trainer.strategy=ddp
    python train.py --config sweep.yaml wandb.mode=online

Overrides are OmegaConf ``key=value`` pairs over ``configs/train.yaml``; ``--config FILE`` merges
a YAML file on top of it first. Rerunning the same command resumes the same run.
"""

import argparse
import logging
import sys

from cbr2.config import CONFIG_DIR, ConfigError, TrainConfig, load_config
from cbr2.structural.train import MONITOR, train


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. trainer.max_epochs=5")
    parser.add_argument("--config", action="append", default=[], metavar="FILE",
                        help="extra YAML merged over configs/train.yaml (repeatable)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        cfg = load_config(args.overrides, files=[CONFIG_DIR / "train.yaml", *args.config], schema=TrainConfig)
        result = train(cfg)
    except (ConfigError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if result["checkpoint"]:  # DDP: only global rank zero exports and reports
        best, untrained = result["best"].get(MONITOR, float("nan")), result["baseline"].get(MONITOR, float("nan"))
        print(f"best {MONITOR} {best:.4f} (untrained {untrained:.4f}) -> {result['checkpoint']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
