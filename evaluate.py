"""Evaluate CBR² on a benchmark.

    python evaluate.py                                   # embedded default (mini-kqapro)
    python evaluate.py data.name=mini-metaqa eval.limit=100
    python evaluate.py data.name=kqapro data.root=/data/KQAPro llm.backend=gold
    python evaluate.py --retrieval-only                  # retrieval metrics only, no LLM

Overrides are OmegaConf ``key=value`` pairs over ``configs/evaluate.yaml``; see README.
"""

import argparse
import logging
import sys

from cbr2.config import Config, ConfigError, add_config_arguments, config_from_args
from cbr2.evaluation.runner import run_evaluation


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser)
    parser.add_argument("--retrieval-only", action="store_true", help="retrieve and score retrieval, no LLM")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        cfg = config_from_args(args, "evaluate.yaml", Config)
        metrics = run_evaluation(cfg, retrieval_only=args.retrieval_only)
    except (ConfigError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    where = metrics["provenance"]["output_dir"]
    if args.retrieval_only:
        cases = metrics["retrieval"]["cases"]
        hits = "  ".join(f"{view} {m['sketch_hit@5']:.4f}" for view, m in cases.items())
        recall = metrics["retrieval"].get("knowledge", {}).get("recall")
        print(f"sketch-hit@5 {hits}  knowledge recall {recall if recall is None else f'{recall:.4f}'}  "
              f"n={metrics['n']}  -> {where}")
    else:
        print(f"Hits@1 {metrics['hits@1']:.4f}  SER {metrics['ser']:.4f}  n={metrics['n']}  -> {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
