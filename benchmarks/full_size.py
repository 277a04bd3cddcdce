"""KQA Pro at full size through the real entry points: every stage's time and peak memory.

    python benchmarks/full_size.py                          # 94,376 training, 11,797 validation questions
    python benchmarks/full_size.py --scale 0.01 --out outputs/full-size-small   # the same path, small

On the synthetic KQA Pro of ``cbr2.data.builders.synthetic_kqapro`` (``write_benchmark``: KB,
``train.json`` and ``val.json`` in KQA Pro's category mix, both times ``--scale``), each stage
runs as the command a researcher types, in a child process of its own, whose wall time and
peak resident memory (``os.wait4``'s ``ru_maxrss``: that child and what it waited for) form one
row:

``generate``        the KB and both splits (reused while ``generate.json`` matches)
``check answers``   a seeded sample of both splits rerun on the official engine
``train start-up``  ``train.py`` for ``--train-steps`` steps; the log's start-up line (labels,
                    pairs, the untrained baseline's validation, before the first step) is a row
``evaluate cold``   ``evaluate.py`` on the whole validation set with the gold backend and full
                    retrieval (both case views over the training pool, knowledge over every
                    fact) in an empty cache: every encoding built
``evaluate warm``   the same in a new run folder, the cache filled
``report``          ``report.md`` of the warm run again, from its ``metrics.json``
``browser``         ``browser.html`` of the warm run (its size is in the row); with headless
                    Chromium on PATH, the time until its first page is in the DOM
``8 shards``        the run as 8 Slurm-style shards, one after another (warm)
``merge 8 shards``  ``python -m cbr2.cluster.merge`` of them
``sweep tasks``     a local sweep of two Table-5 settings (``--settings``)
``finalize``        that sweep's finalize (merge, the Table-5 comparison with its bootstrap)

Prints the table and writes ``OUT/results.json`` and ``OUT/report.md``; each child's log is in
``OUT/logs/``. Timings depend on what else runs: every row has the 1-minute load average.
``--resume`` keeps the rows of ``OUT/results.json`` that ended well and runs only the stages after
them, on the caches, checkpoints and runs those stages left (a long run stopped between stages
goes on where it stopped, without building its cold cache again).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
STARTUP = re.compile(r"start-up: ([0-9.]+) s, the untrained baseline's validation ([0-9.]+) s")


class Bench:
    """Runs the stages' commands and collects their rows."""

    def __init__(self, out: Path, env: dict[str, str], resume: bool = False):
        self.out, self.env, self.rows = out, env, []
        (out / "logs").mkdir(parents=True, exist_ok=True)
        results = out / "results.json"
        # Only the leading rows that ended well: a stage after a failed one ran on what it left.
        self.done: dict[str, dict[str, Any]] = {}
        if resume and results.is_file():
            for row in json.loads(results.read_text(encoding="utf-8")):
                if row.get("rc"):
                    break
                self.done[row["stage"]] = row

    def finished(self, *stages: str) -> bool:
        """Whether every one of ``stages`` has a row kept by ``--resume``."""
        return all(s in self.done for s in stages)

    def run(self, stage: str, cmd: list[str], **extra: Any) -> dict[str, Any]:
        """Run ``cmd``; its row (``stage, seconds, peak_rss_gb, rc, load_1m``, ``extra``). A row
        kept by ``--resume`` is taken as it is, without running ``cmd``."""
        if stage in self.done:
            row = self.done[stage]
            self.rows.append(row)
            print(f"  {stage}: {row['seconds']:.1f} s, peak {row['peak_rss_gb']:.2f} GB (kept from {self.out})",
                  flush=True)
            return row
        log = self.out / "logs" / (re.sub(r"[^a-z0-9]+", "-", stage.lower()).strip("-") + ".log")
        start = time.perf_counter()
        with log.open("w", encoding="utf-8") as handle:
            child = subprocess.Popen(cmd, cwd=ROOT, env=self.env, stdout=handle, stderr=subprocess.STDOUT)
            _, status, usage = os.wait4(child.pid, 0)
        row = {"stage": stage, "seconds": time.perf_counter() - start, "peak_rss_gb": usage.ru_maxrss / 2**20,
               "rc": os.waitstatus_to_exitcode(status), "load_1m": os.getloadavg()[0], "log": str(log), **extra}
        self.rows.append(row)
        print(f"  {stage}: {row['seconds']:.1f} s, peak {row['peak_rss_gb']:.2f} GB"
              + (f" [exit {row['rc']}: see {log}]" if row["rc"] else ""), flush=True)
        (self.out / "results.json").write_text(json.dumps(self.rows, indent=1), encoding="utf-8")
        if row["rc"]:
            raise SystemExit(f"{stage} failed (exit {row['rc']}); its log: {log}\n{log.read_text()[-3000:]}")
        return row


def _python(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", code, *args]


def generate(bench: Bench, data: Path, scale: float, seed: int) -> dict[str, Any]:
    """The benchmark folder at ``scale`` (reused while its ``generate.json`` matches)."""
    from cbr2.data.builders.synthetic_kqapro import VERSION

    key = {"generator_version": VERSION, "scale": scale, "seed": seed}
    meta = data / "generate.json"
    if meta.is_file() and json.loads(meta.read_text())["key"] == key:
        if "generate" in bench.done:  # a resumed run keeps the row of the generation it reuses
            bench.run("generate", [])
        else:
            print(f"  generate: reusing {data}", flush=True)
        return json.loads(meta.read_text())["stats"]
    code = ("import json, sys; from cbr2.data.builders.synthetic_kqapro import write_benchmark; "
            "print('STATS', json.dumps(write_benchmark(sys.argv[1], float(sys.argv[2]), int(sys.argv[3]))))")
    row = bench.run("generate", _python(code, str(data), str(scale), str(seed)))
    stats = json.loads(Path(row["log"]).read_text().split("STATS ", 1)[1].splitlines()[0])
    row.update(train=stats["train"], val=stats["val"], sketches=stats["sketches"], kb_mb=round(stats["kb_mb"], 1))
    meta.write_text(json.dumps({"key": key, "stats": stats}, indent=1), encoding="utf-8")
    return stats


def first_page_s(page: Path, profile: Path) -> dict[str, float] | None:
    """Headless Chromium's wall time to a screenshot of the page (taken once it has loaded and
    its script has built the first page of rows), and to one of a blank page: the difference is
    the page's own cost. ``--dump-dom`` is not used: serialising the embedded data back out
    costs more than loading it."""
    browser = next((p for name in CHROMIUM_NAMES if (p := shutil.which(name))), None)
    if browser is None:
        return None

    def shot(url: str) -> float:
        start = time.perf_counter()
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                        f"--user-data-dir={profile}", f"--screenshot={profile}.png", "--window-size=1280,900", url],
                       capture_output=True, text=True, timeout=300, check=True)
        return time.perf_counter() - start

    blank = shot("about:blank")
    return {"chromium_s": shot(page.resolve().as_uri()), "blank_s": blank}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="KB and question counts times this")
    parser.add_argument("--out", type=Path, default=Path("outputs/full-size"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-steps", type=int, default=4, help="optimiser steps of the train.py stage")
    parser.add_argument("--settings", default="full,chain", help="the two Table-5 settings of the sweep")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--sample", type=int, default=200, help="questions rerun on the official engine")
    parser.add_argument("--index", default="ivf", choices=("flat", "hnsw", "ivf"),
                        help="retrieval.index of the evaluate stages (default: %(default)s; exact flat search of "
                             "650k facts costs ~0.4 s per question on 2 cores, docs/results/scale.md)")
    parser.add_argument("--resume", action="store_true",
                        help="keep OUT/results.json's rows that ended well and run only the stages after them")
    parser.add_argument("--skip-cold", action="store_true",
                        help="keep OUT/cache as it is and skip the cold evaluate: the warm stages reuse the encodings "
                             "a cold run left (its 80 minutes of encoding need not be repeated to time the rest)")
    args = parser.parse_args(argv)

    out = args.out.resolve()
    data, cache = out / "data", out / "cache"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "CBR2_CACHE_DIR": str(cache)}
    bench = Bench(out, env, args.resume)
    print(f"full-size benchmark at scale {args.scale} in {out}", flush=True)
    stats = generate(bench, data, args.scale, args.seed)

    check = ("import json, sys; from cbr2.data.builders import synthetic_kqapro as s; "
             "kb = json.load(open(sys.argv[1] + '/kb.json')); "
             "items = json.load(open(sys.argv[1] + '/train.json')) + json.load(open(sys.argv[1] + '/val.json')); "
             "wrong = s.check_answers(kb, items, 'kopl', int(sys.argv[2])); print('WRONG', len(wrong)); "
             "sys.exit(1 if wrong else 0)")
    bench.run("check answers (kopl, sample)", _python(check, str(data), str(args.sample)), sample=args.sample)

    checkpoints = out / "checkpoints"
    if not args.skip_cold and not bench.finished("train start-up", "evaluate cold"):
        # The cold run must find only what training left in the cache: both run again.
        bench.done.pop("train start-up", None)
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(checkpoints, ignore_errors=True)
    common = ["data.name=kqapro", f"data.root={data}", "wandb.mode=disabled"]
    train = bench.run("train start-up", [sys.executable, "train.py", *common, f"trainer.max_steps={args.train_steps}",
                                         f"structural.checkpoints_dir={checkpoints}", f"output_dir={out / 'train'}"])
    found = STARTUP.search(Path(train["log"]).read_text())
    if found:
        train.update(startup_s=float(found.group(1)), baseline_validation_s=float(found.group(2)))

    evaluate = [sys.executable, "evaluate.py", *common, "data.split=val", "eval.per_category=null", "llm.backend=gold",
                f"structural.checkpoints_dir={checkpoints}", f"retrieval.index={args.index}"]
    runs = out / "runs"
    if args.skip_cold:
        # The cache may hold the encodings but not yet this index kind: built here, so that the
        # warm row times a warm run.
        bench.run(f"{args.index} indexes over the cached encodings", [*evaluate, "eval.limit=1",
                                                                      f"output_dir={runs / 'indexes'}"])
    else:
        if not bench.finished("evaluate cold"):
            shutil.rmtree(runs, ignore_errors=True)
        bench.run("evaluate cold", [*evaluate, f"output_dir={runs / 'cold'}"], questions=stats["val"])
    warm = runs / "warm"
    if not bench.finished("evaluate warm"):
        shutil.rmtree(warm, ignore_errors=True)  # its predictions would make a rerun a cache read
    bench.run("evaluate warm", [*evaluate, f"output_dir={warm}"], questions=stats["val"])
    report = ("import json, sys; from pathlib import Path; from cbr2.report.run_report import write_report; "
              "run = Path(sys.argv[1]); write_report(run / 'report.md', json.loads((run / 'metrics.json').read_text()))")
    bench.run("report", _python(report, str(warm)))
    row = bench.run("browser", [sys.executable, "-m", "cbr2.report.browser", str(warm)])
    page = warm / "browser.html"
    row["browser_mb"] = page.stat().st_size / 1e6
    timing = first_page_s(page, out / "chromium-profile")
    if timing:
        row.update(timing)
        print(f"  browser.html {row['browser_mb']:.1f} MB; headless Chromium: {timing['chromium_s']:.2f} s to the "
              f"first page ({timing['blank_s']:.2f} s for a blank page)", flush=True)

    sharded = runs / "sharded"
    shard_stages = [f"shard {i} of {args.shards}" for i in range(args.shards)]
    if not bench.finished(*shard_stages):
        # All again: a shard would resume from its predictions, and the merge needs every folder.
        for stage in shard_stages:
            bench.done.pop(stage, None)
        shutil.rmtree(sharded, ignore_errors=True)
    shard_rows = [bench.run(shard_stages[i], [*evaluate, f"output_dir={sharded}",
                                                             f"eval.num_shards={args.shards}", f"eval.shard={i}"])
                  for i in range(args.shards)]
    bench.rows.append({"stage": f"{args.shards} shards (sum)", "seconds": sum(r["seconds"] for r in shard_rows),
                       "peak_rss_gb": max(r["peak_rss_gb"] for r in shard_rows), "rc": 0,
                       "load_1m": os.getloadavg()[0]})
    shards = [str(sharded / f"shard-{i}-of-{args.shards}") for i in range(args.shards)]
    bench.run(f"merge {args.shards} shards", [sys.executable, "-m", "cbr2.cluster.merge", *shards,
                                              "--out", str(sharded)])

    sweeps = out / "sweeps"
    if not bench.finished("sweep tasks (2 settings)"):
        shutil.rmtree(sweeps, ignore_errors=True)
    bench.run("sweep tasks (2 settings)", [sys.executable, "-m", "cbr2.cluster.sweep", "submit", "--local",
                                           "--name", "table5", "--dir", str(sweeps), "--ablations", args.settings,
                                           *common, "data.split=val", "eval.per_category=null", "llm.backend=gold",
                                           f"structural.checkpoints_dir={checkpoints}", f"retrieval.index={args.index}"])
    bench.run("finalize", [sys.executable, "-m", "cbr2.cluster.sweep", "finalize", str(sweeps / "table5")])

    table = render(bench.rows, args.scale, stats)
    (out / "report.md").write_text(table, encoding="utf-8")
    print("\n" + table)
    return 0


def render(rows: list[dict[str, Any]], scale: float, stats: dict[str, Any]) -> str:
    """The stage table (Markdown), the largest peak last."""
    title = (f"Full-size benchmark, scale {scale}: {stats['train']} training and {stats['val']} validation "
             f"questions ({stats['sketches']['train']} distinct training sketches), KB {stats['kb_mb']:.0f} MB")
    lines = [title, "", "| stage | seconds | peak RSS (GB) | load (1 min) | note |", "|---|---:|---:|---:|---|"]
    for r in rows:
        note = []
        if "startup_s" in r:
            note.append(f"start-up before the first step {r['startup_s']:.1f} s "
                        f"(baseline validation {r['baseline_validation_s']:.1f} s)")
        if "browser_mb" in r:
            note.append(f"browser.html {r['browser_mb']:.1f} MB")
        if "chromium_s" in r:
            note.append(f"Chromium first page {r['chromium_s']:.2f} s (blank page {r['blank_s']:.2f} s)")
        if "questions" in r:
            note.append(f"{r['questions']} questions")
        lines.append(f"| {r['stage']} | {r['seconds']:.1f} | {r['peak_rss_gb']:.2f} | {r['load_1m']:.1f} | "
                     f"{'; '.join(note)} |")
    top = max(rows, key=lambda r: r["peak_rss_gb"])
    lines += ["", f"Largest peak: {top['peak_rss_gb']:.2f} GB ({top['stage']})."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
