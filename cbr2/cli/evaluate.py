"""Evaluate CBR² on a benchmark.

    cbr2 evaluate                                   # embedded default: mini-kqapro, CPU LLM
    cbr2 evaluate --ablation w/o_knowledge          # one of the paper's Table 5 settings
    cbr2 evaluate --show-prompt 0                   # print question 0's prompt, no LLM
    cbr2 evaluate data.name=mini-metaqa eval.per_category=20
    cbr2 evaluate data.name=kqapro data.root=/data/KQAPro llm.backend=vllm eval.per_category=100
    cbr2 evaluate --retrieval-only                  # retrieval metrics only, no LLM

The configuration is ``configs/evaluate.yaml``, each ``--config FILE``, the ``--ablation``'s Table 5
setting, then OmegaConf ``key=value`` overrides (docs/usage.md, "Ablations").
"""

import argparse
import sys

from cbr2.common.console import setup_logging
from cbr2.common.devices import check_devices
from cbr2.common.errors import UserError
from cbr2.config import ABLATIONS, Config
from cbr2.config.cli import add_config_arguments, config_from_args
from cbr2.llm.openai_compat import LLMRequestError
from cbr2.report.run_report import summary_line
from cbr2.run.runner import device_settings, run_evaluation, show_prompt


def main(argv: list[str] | None = None) -> int:
    """``cbr2 evaluate`` and ``python evaluate.py``: the exit status (0 done, 2 a user error, 3 the LLM server failed)."""
    parser = argparse.ArgumentParser(prog="cbr2 evaluate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser)
    parser.add_argument("--ablation", metavar="NAME", help=f"a Table 5 setting: {', '.join(ABLATIONS)}")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--retrieval-only", action="store_true", help="retrieve and score retrieval, no LLM")
    mode.add_argument("--show-prompt", type=int, metavar="N",
                      help="print the exact prompt of question N (0-based) of the selection to stdout; no LLM")
    args = parser.parse_intermixed_args(argv)  # options may come between overrides
    # Logs go to stderr, so --show-prompt's stdout is the prompt and nothing else.
    setup_logging()
    try:
        cfg = config_from_args(args, Config)
        # A GPU asked for and absent fails here, in one line, before the data is read.
        check_devices(**device_settings(cfg, llm=args.show_prompt is None and not args.retrieval_only,
                                        retrieval_only=args.retrieval_only))
        if args.show_prompt is not None:
            sys.stdout.write(show_prompt(cfg, args.show_prompt))
            return 0
        metrics = run_evaluation(cfg, retrieval_only=args.retrieval_only, ablation=args.ablation,
                                 config_files=args.config)
    except LLMRequestError as err:
        # The server is gone or refuses (after the client's retries); every answer that came is saved.
        print(f"error: the LLM server failed: {err}\nEvery answer received so far is in the run folder; run the same "
              "command again to resume (it generates only the questions still missing).", file=sys.stderr)
        return 3
    except UserError as err:  # the user's to fix: one line; anything else is a bug and shows its traceback
        print(f"error: {err}", file=sys.stderr)
        return 2
    where = metrics["provenance"]["output_dir"]
    if args.retrieval_only:
        cases = metrics["retrieval"]["cases"]
        hits = "  ".join(f"{view} {m['sketch_hit@5']:.4f}" for view, m in cases.items())
        recall = metrics["retrieval"].get("knowledge", {}).get("recall")
        linking = metrics["retrieval"].get("linking", {})
        linked = "".join(f"  linking {group} P {m['precision']:.4f} R {m['recall']:.4f}" for group, m in linking.items())
        print(f"sketch-hit@5 {hits}  knowledge recall {recall if recall is None else f'{recall:.4f}'}{linked}  "
              f"n={metrics['n']}  -> {where}")
    else:
        print(summary_line(metrics, where))
    return 0
