"""A gold run without retrieval against the official engine's load of the same KB, at KQA Pro's size.

    python benchmarks/startup.py --data /work/startup                    # full size: kb.json ~80 MB
    python benchmarks/startup.py --data /tmp/startup-small --scale 0.01  # the same path in seconds

What a run pays before and besides its own work (imports, the device check, the KB) is what
separates it from the official engine, which must parse ``kb.json`` and build its indexes before
it answers anything. On the synthetic KQA Pro of ``cbr2.data.builders.synthetic_kqapro``
(``write_benchmark``: ``kb.json``, 30 validation questions and the fewest training questions; built
once into ``--data`` and reused while its ``generate.json`` matches), two commands run side by
side in this one invocation, each in a child process whose wall time and peak resident memory
(``os.wait4``'s ``ru_maxrss``: that child and what it waited for) are one measurement:

``gold``      ``evaluate.py llm.backend=gold retrieval.cases=none retrieval.k_ontology=0
              retrieval.k_facts=0`` on the 30 questions, W&B off (its offline run is a component of
              its own), into a new run folder each time. A first run fills the KB store (in
              ``DATA/cache``, ``$CBR2_CACHE_DIR``); the next ``--repeats`` are timed (warm) and their
              median is the figure.
``official``  ``json.load`` of the same ``kb.json`` and ``KoPLEngine`` over it (the official
              engine's load, 22-24 s at full size on the 2-core development VM), ``--official-repeats`` times, median.

Prints one JSON object (every measurement, MB being MiB of ``ru_maxrss``; the medians; the ratio
official/gold; the 1-minute load average before and after; the heavy packages the gold run
imported, from one more warm run that reports its ``sys.modules`` at exit), also written to
``DATA/startup.json``, and one line. The goals: the gold run under 500 MB and at least 25x the
official engine's load. Each child's output is in ``DATA/logs/``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

QUESTIONS = 30
"""Validation questions of the benchmark, all of them evaluated."""
TRAIN_QUESTIONS = 36
"""The fewest training questions ``write_benchmark`` writes (4 per category); a gold run without
retrieval reads them only for ``generation.narrow``'s hop count."""
GOLD = ["llm.backend=gold", "retrieval.cases=none", "retrieval.k_ontology=0", "retrieval.k_facts=0",
        "wandb.mode=disabled", "data.name=kqapro", "data.split=val", "eval.per_category=null"]
"""The gold run's overrides (data.root, eval.limit and output_dir are added)."""
HEAVY = ("torch", "faiss", "transformers", "sentence_transformers", "lightning", "llama_cpp", "vllm", "xgrammar",
         "onnxruntime", "wandb", "matplotlib", "scipy")
"""Top-level names of the packages a gold run without retrieval has no use for."""
GOALS = {"gold_peak_mb": 500, "ratio": 25}
"""The goals: the gold run's peak RSS (MB) below, the official engine's load over the gold run's time at least."""

OFFICIAL = r"""
import contextlib, io, json, sys
from kopl.kopl import KoPLEngine
with open(sys.argv[1], "rb") as handle:
    kb = json.load(handle)
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    KoPLEngine(kb)  # it prints its progress
"""
"""The official engine's load, as a user of the official code runs it."""

MODULES = r"""
import json, runpy, sys
out, heavy = sys.argv[1], set(json.loads(sys.argv[2]))
sys.argv = ["evaluate.py", *sys.argv[3:]]
try:
    runpy.run_path("evaluate.py", run_name="__main__")
finally:
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(sorted({name.partition(".")[0] for name in sys.modules} & heavy), handle)
"""
"""``evaluate.py`` as it runs from the command line, then the heavy packages it imported."""


def prepare(data: Path, scale: float, seed: int) -> dict[str, Any]:
    """The benchmark folder at ``scale``: written unless its ``generate.json`` matches."""
    from cbr2.data.builders.synthetic_kqapro import VERSION

    key = {"generator_version": VERSION, "scale": scale, "seed": seed, "train": TRAIN_QUESTIONS, "val": QUESTIONS}
    meta = data / "generate.json"
    if meta.is_file() and json.loads(meta.read_text(encoding="utf-8"))["key"] == key:
        print(f"reusing the benchmark in {data}", file=sys.stderr, flush=True)
        return json.loads(meta.read_text(encoding="utf-8"))["stats"]
    print(f"writing the synthetic KQA Pro at scale {scale} into {data} ...", file=sys.stderr, flush=True)
    shutil.rmtree(data / "cache", ignore_errors=True)  # a KB store of another KB would only take room
    # In a child: a parent that once held the KB would pass its peak to every later child, since
    # Linux carries a process's peak RSS across fork and exec into ``ru_maxrss``.
    code = ("import json, sys; from pathlib import Path; "
            "from cbr2.data.builders.synthetic_kqapro import write_benchmark; "
            "print(json.dumps(write_benchmark(Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), "
            "n_train=int(sys.argv[4]), n_val=int(sys.argv[5]))))")
    done = subprocess.run([sys.executable, "-c", code, str(data), str(scale), str(seed), str(TRAIN_QUESTIONS),
                           str(QUESTIONS)], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          check=True, capture_output=True, text=True)
    stats = json.loads(done.stdout.strip().splitlines()[-1])
    meta.write_text(json.dumps({"key": key, "stats": stats}, indent=1), encoding="utf-8")
    return stats


def measure(cmd: list[str], env: dict[str, str], log: Path) -> dict[str, Any]:
    """Run ``cmd`` as a child: its wall seconds and peak RSS (MB); its output goes to ``log``."""
    start = time.perf_counter()
    with log.open("w", encoding="utf-8") as handle:
        child = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    if code:
        raise SystemExit(f"exit {code}: {' '.join(cmd)}\n{log.read_text(encoding='utf-8')[-3000:]}")
    return {"seconds": round(seconds, 3), "peak_rss_mb": round(usage.ru_maxrss / 1024, 1)}


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The medians of measurements, with each one."""
    return {"seconds": statistics.median(r["seconds"] for r in rows),
            "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in rows), "runs": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True,
                        help="folder of the benchmark, its KB store and the runs (built once, then reused)")
    parser.add_argument("--scale", type=float, default=1.0, help="the KB's size times this (default: full size)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=5, help="timed warm gold runs (default: %(default)s)")
    parser.add_argument("--official-repeats", type=int, default=1,
                        help="timed official loads (default: %(default)s; 22-24 s each at full size on 2 cores)")
    args = parser.parse_args(argv)

    data = args.data.resolve()
    stats = prepare(data, args.scale, args.seed)
    logs, runs = data / "logs", data / "runs"
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "CBR2_CACHE_DIR": str(data / "cache")}
    overrides = [*GOLD, f"data.root={data}", f"eval.limit={QUESTIONS}"]

    def gold_run(name: str, cmd: list[str]) -> list[str]:
        folder = runs / name
        shutil.rmtree(folder, ignore_errors=True)  # its predictions would make the run a cache read
        return [*cmd, *overrides, f"output_dir={folder}"]

    evaluate = [sys.executable, "evaluate.py"]
    load_before = os.getloadavg()[0]
    print("gold: the first run fills the KB store ...", file=sys.stderr, flush=True)
    first = measure(gold_run("first", evaluate), env, logs / "gold-first.log")
    gold = []
    for i in range(args.repeats):
        gold.append(measure(gold_run(f"warm-{i}", evaluate), env, logs / f"gold-warm-{i}.log"))
        print(f"gold warm {i + 1}/{args.repeats}: {gold[-1]['seconds']:.2f} s, {gold[-1]['peak_rss_mb']:.0f} MB",
              file=sys.stderr, flush=True)
    official = []
    for i in range(args.official_repeats):
        official.append(measure([sys.executable, "-c", OFFICIAL, str(data / "kb.json")], env,
                                logs / f"official-{i}.log"))
        print(f"official load {i + 1}/{args.official_repeats}: {official[-1]['seconds']:.1f} s, "
              f"{official[-1]['peak_rss_mb']:.0f} MB", file=sys.stderr, flush=True)
    load_after = os.getloadavg()[0]
    modules_file = data / "gold-modules.json"
    measure(gold_run("modules", [sys.executable, "-c", MODULES, str(modules_file), json.dumps(HEAVY)]), env,
            logs / "gold-modules.log")

    a, b = summary(gold), summary(official)
    ratio = b["seconds"] / a["seconds"]
    result = {
        "scale": args.scale, "kb_mb": round(stats["kb_mb"], 1), "questions": stats["val"],
        "gold_warm": a, "gold_first": first, "official_load": b, "ratio_official_over_gold": round(ratio, 1),
        "heavy_modules_imported_by_gold": json.loads(modules_file.read_text(encoding="utf-8")),
        "load_1m": {"before": round(load_before, 2), "after": round(load_after, 2)},
        "goals": {"gold_peak_rss_mb_below": GOALS["gold_peak_mb"], "ratio_at_least": GOALS["ratio"],
                  "met": a["peak_rss_mb"] < GOALS["gold_peak_mb"] and ratio >= GOALS["ratio"]},
    }
    (data / "startup.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=1))
    heavy = ", ".join(result["heavy_modules_imported_by_gold"]) or "none"
    print(f"scale {args.scale}: warm gold run {a['seconds']:.2f} s, {a['peak_rss_mb']:.0f} MB (median of "
          f"{len(gold)}); official load {b['seconds']:.1f} s, {b['peak_rss_mb']:.0f} MB: {ratio:.1f}x; "
          f"heavy modules imported: {heavy}; load {load_before:.2f} -> {load_after:.2f}; goals (< "
          f"{GOALS['gold_peak_mb']} MB, >= {GOALS['ratio']}x) {'met' if result['goals']['met'] else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
