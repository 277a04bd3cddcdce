"""Compare two run folders on everything except timings and where/how they ran.

Used by the sharding tests (a merged run must equal the unsharded one) and runnable by hand:
``python tests/run_equivalence.py RUN_A RUN_B`` prints the differences and exits 1 if any.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

TIMING_KEYS = {"latency_s", "seconds_per_question"}
"""Wall-clock measurements: two runs of the same config never agree on them."""
WHERE_KEYS = {"output_dir"}
"""Config keys that say where a run wrote, not what it computed."""


def _drop(node: Any, keys: set[str]) -> Any:
    if isinstance(node, dict):
        return {k: _drop(v, keys) for k, v in node.items() if k not in keys}
    if isinstance(node, list):
        return [_drop(v, keys) for v in node]
    return node


def comparable(run: str | Path) -> dict[str, Any]:
    """A run folder's results with timings, provenance and its own location taken out."""
    run = Path(run)
    metrics = json.loads((run / "metrics.json").read_text(encoding="utf-8"))
    metrics.pop("provenance", None)
    report = (run / "report.md").read_text(encoding="utf-8").split("\n## Provenance")[0]
    report = re.sub(r"\d+\.\d+ (m?s) per question", r"<timing> \1 per question", report)
    out = {
        "metrics.json": _drop(metrics, TIMING_KEYS),
        "report.md": report,
        "config.yaml": _drop(yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8")), WHERE_KEYS),
    }
    for name in ("predictions.jsonl", "retrieval.jsonl"):
        path = run / name
        if path.is_file():
            out[name] = [_drop(json.loads(line), TIMING_KEYS) for line in path.read_text(encoding="utf-8").splitlines()]
    return out


def differences(a: str | Path, b: str | Path) -> list[str]:
    """File names (and the first differing line or key) where two runs differ."""
    left, right = comparable(a), comparable(b)
    diffs = []
    for name in sorted(left.keys() | right.keys()):
        if left.get(name) != right.get(name):
            diffs.append(name)
    return diffs


if __name__ == "__main__":
    found = differences(sys.argv[1], sys.argv[2])
    print("identical apart from timings and provenance" if not found else f"differ in: {', '.join(found)}")
    sys.exit(1 if found else 0)
