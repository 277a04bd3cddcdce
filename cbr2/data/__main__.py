"""Dataset commands.

    python -m cbr2.data fetch kqapro|metaqa DIR [--source NAME] [--url URL]
    python -m cbr2.data check DIR [--kind kqapro|metaqa]

``fetch`` downloads a dataset from its public sources (``cbr2.data.fetch.SOURCES``), resuming a
broken download, verifies it and lays it out as ``data.root`` expects, then checks the folder.
``check`` lists every problem of a folder with its file and item, then the questions per split
and category and the KB's size. Exit status: 0 when the folder is clean, 1 when it has
problems, 2 when the command cannot run (no network, no such folder: one line saying why).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from cbr2.common.console import setup_logging
from cbr2.common.errors import UserError
from cbr2.data.check import KINDS, check_folder, render


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``fetch`` or ``check``; the exit status as the module docstring says."""
    from cbr2.data.fetch import SOURCES

    parser = argparse.ArgumentParser(prog="python -m cbr2.data", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    fetch = commands.add_parser("fetch", help="download, verify and lay out a dataset, then check it")
    fetch.add_argument("dataset", choices=KINDS)
    fetch.add_argument("dir", metavar="DIR", help="the folder to fill (data.root)")
    fetch.add_argument("--source", help="one source only: " + "; ".join(
        f"{d}: {', '.join(s.name for s in SOURCES[d])}" for d in KINDS) + " (default: each in turn)")
    fetch.add_argument("--url", help="instead of the source's URL (a mirror): a zip's URL for KQA Pro's release, "
                                     "else the base URL of the files in the folder's layout")
    check = commands.add_parser("check", help="list every problem of a dataset folder, then count what it holds")
    check.add_argument("dir", metavar="DIR")
    check.add_argument("--kind", choices=KINDS, help="default: told from the files the folder holds")
    args = parser.parse_args(argv)
    setup_logging()
    try:
        if args.command == "fetch":
            from cbr2.data.fetch import fetch as fetch_dataset

            source = fetch_dataset(args.dataset, args.dir, args.source, args.url)
            print(f"fetched {args.dataset} from {source.name} ({args.url or source.url}) into {args.dir}; verified: "
                  f"{source.verified}")
            report = check_folder(args.dir, args.dataset)
        else:
            report = check_folder(args.dir, args.kind)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    sys.stdout.write(render(report))
    return 0 if report.clean else 1


if __name__ == "__main__":
    sys.exit(main())
