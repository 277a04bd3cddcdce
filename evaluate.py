"""Evaluate CBR² on a benchmark.

    python evaluate.py                                   # embedded default (mini-kqapro)
    python evaluate.py data.name=mini-metaqa eval.limit=100
    python evaluate.py data.name=kqapro data.root=/data/KQAPro llm.backend=gold

Overrides are OmegaConf ``key=value`` pairs over ``configs/evaluate.yaml``; see README.
"""

import argparse
import logging
import sys

from cbr2.config import CONFIG_DIR, ConfigError, load_config
from cbr2.evaluation.runner import run_evaluation


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. data.name=mini-metaqa")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        cfg = load_config(args.overrides, files=[CONFIG_DIR / "evaluate.yaml"])
        metrics = run_evaluation(cfg)
    except (ConfigError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    where = metrics["provenance"]["output_dir"]
    print(f"Hits@1 {metrics['hits@1']:.4f}  SER {metrics['ser']:.4f}  n={metrics['n']}  -> {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
