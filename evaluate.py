"""``python evaluate.py``: the same command as ``cbr2 evaluate`` (``cbr2/cli/evaluate.py``), kept as the design card's
entry point. ``python evaluate.py --help`` lists its arguments."""

import sys

from cbr2.cli.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
