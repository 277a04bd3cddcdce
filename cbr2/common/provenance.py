"""The code a run used, recorded with its results (``config.yaml`` of a run folder, a sweep's
manifest, the structural retriever's export)."""

from __future__ import annotations

import subprocess
from pathlib import Path

# The checkout this package was imported from; an installed copy is in no repository, and then
# git fails and the hash is None rather than some unrelated repository's commit.
PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def git_hash() -> str | None:
    """The repository's commit (with ``-dirty`` when uncommitted changes exist), or None."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PACKAGE_ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=PACKAGE_ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("-dirty" if dirty else "")
