"""Dataset commands.

    python -m cbr2.data fetch kqapro|metaqa DIR [--source NAME] [--url URL]
    python -m cbr2.data check DIR [--kind kqapro|metaqa]
    python -m cbr2.data check --kb FILE [--cases FILE]

``fetch`` downloads a dataset from its public sources (``cbr2.data.fetch.SOURCES``), resuming a
broken download, verifies it and lays it out as ``data.root`` expects, then checks the folder.
``check`` lists every problem of a folder with its file and item, then the questions per split
and category and the KB's size; with ``--kb`` (and ``--cases``), every problem of a KB and cases
of your own with its file and line, then the KB's vocabulary and each case's computed answer.
Exit status: 0 when the files are clean, 1 when they have problems, 2 when the command cannot
run (no network, no such folder or file: one line saying why).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from cbr2.common.console import setup_logging
from cbr2.common.errors import UserError
from cbr2.data.check import KINDS, check_custom, check_folder, render, render_custom


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
    check = commands.add_parser("check", help="list every problem of a dataset folder (or of a KB and cases of "
                                              "your own), then count what it holds")
    check.add_argument("dir", metavar="DIR", nargs="?", help="a dataset folder (data.root)")
    check.add_argument("--kind", choices=KINDS, help="default: told from the files the folder holds")
    check.add_argument("--kb", metavar="FILE", help="instead of DIR: a KB of your own (data.kb: triples or KoPL JSON)")
    check.add_argument("--cases", metavar="FILE", help="with --kb: its cases file (data.cases, YAML)")
    args = parser.parse_args(argv)
    if args.command == "check":
        if (args.dir is None) == (args.kb is None):
            parser.error("check takes a folder DIR, or --kb FILE (with --cases FILE), not both")
        if args.kb is None and args.cases is not None:
            parser.error("--cases FILE needs --kb FILE: the cases are checked against their KB")
        if args.kb is not None and args.kind is not None:
            parser.error("--kind is the kind of a folder DIR; a KB of your own is told by its file")
    setup_logging()
    try:
        if args.command == "fetch":
            from cbr2.data.fetch import fetch as fetch_dataset

            source = fetch_dataset(args.dataset, args.dir, args.source, args.url)
            print(f"fetched {args.dataset} from {source.name} ({args.url or source.url}) into {args.dir}; verified: "
                  f"{source.verified}")
            report = check_folder(args.dir, args.dataset)
        elif args.kb is not None:
            custom = check_custom(args.kb, args.cases)
            sys.stdout.write(render_custom(custom))
            return 0 if custom.clean else 1
        else:
            report = check_folder(args.dir, args.kind)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    sys.stdout.write(render(report))
    return 0 if report.clean else 1


if __name__ == "__main__":
    sys.exit(main())
