"""The code a run used, recorded with its configuration (``config.yaml`` of a run folder, the
structural retriever's export).

Here until the project has a home for provenance outside the configuration package.
"""

from __future__ import annotations

import subprocess

from cbr2.config.files import REPO_ROOT


def git_hash() -> str | None:
    """The repository's commit (with ``-dirty`` when uncommitted changes exist), or None."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("-dirty" if dirty else "")
