"""``python -m cbr2.cli``: the ``cbr2`` command without its console script."""

import sys

from cbr2.cli import main

if __name__ == "__main__":
    sys.exit(main())
