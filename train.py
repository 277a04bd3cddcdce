"""``python train.py``: the same command as ``cbr2 train`` (``cbr2/cli/train.py``), kept as the design card's
entry point. ``python train.py --help`` lists its arguments."""

import sys

from cbr2.cli.train import main

if __name__ == "__main__":
    sys.exit(main())
