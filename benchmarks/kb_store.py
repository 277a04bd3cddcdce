"""The KB store against parsing kb.json, at KQA Pro's size, each measurement in a fresh process.

    python benchmarks/kb_store.py                        # full size (17,000 entities, kb.json ~80 MB)
    python benchmarks/kb_store.py --scale 0.125 --skip-reference
    python benchmarks/kb_store.py --workdir /tmp/kb-store-bench --programs 200

The KB and the programs come from ``cbr2.data.builders.synthetic_kqapro`` (``build_kb(scale,
seed)``, questions with ``engine="cbr2"``: only their gold programs are used), written once
into ``--workdir`` and reused while the generator version, scale and seed match. Every row is
its own child process (``ru_maxrss`` is that process's peak RSS; seconds count from the start
of the child's work, imports included):

``reference``    ``json.load`` of kb.json + ``KoPLEngine`` (the official engine) + its first answer
``parsed``       ``load_kqapro_kb`` + ``Executor`` (the cbr2 engine built from the KB) + first
                 answer, then every program: the path before the store
``cold``         ``load_kb`` with an empty store (parse, validate, index, write the entry)
``warm``         ``load_kb`` from the entry + ``Executor`` + first answer, then every program
``warm-kopl``    ``load_kb`` from the entry + ``Executor(engine="kopl")`` + every program

The table gives each row's seconds and peak RSS, the ratios the goals name (warm first answer
against the reference, at least 10x; warm peak RSS at most 0.7 GB; warm load at most 2 s;
per-program time no slower than the engines'), measured side by side in this one run. The
mean includes the cyclic collector's passes over what each process holds (the parsed KB's
millions of objects make them expensive; the store freezes its indexes, see
``cbr2.data.kb_store.FREEZE_FACTS``); the median is the programs' own work.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

KINDS = ("reference", "parsed", "cold", "warm", "warm-kopl")


def _rss_gb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # kB on Linux


# --------------------------------------------------------------------------- data

def prepare(workdir: Path, scale: float, seed: int, per_category: int) -> None:
    """Write ``kb.json`` and ``val.json`` into ``workdir`` unless ones of this generator, scale and seed are there."""
    from cbr2.data.builders import synthetic_kqapro as syn

    key = {"generator_version": syn.VERSION, "scale": scale, "seed": seed, "per_category": per_category}
    marker = workdir / "generate.json"
    if marker.is_file() and json.loads(marker.read_text()) == key and (workdir / "val.json").is_file():
        return
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"generating the synthetic KB (scale {scale}, seed {seed}) into {workdir} ...", flush=True)
    kb = syn.build_kb(scale, seed)
    tmp = workdir / ".kb.json.tmp"
    with tmp.open("w", encoding="utf-8") as handle:
        json.dump(kb, handle, ensure_ascii=False, separators=(",", ":"))
    tmp.replace(workdir / "kb.json")
    questions = syn.build_questions(kb, seed, per_category, engine="cbr2")
    (workdir / "val.json").write_text(json.dumps(questions, ensure_ascii=False), encoding="utf-8")
    marker.write_text(json.dumps(key))


# --------------------------------------------------------------------------- workers (child processes)

def _programs(workdir: Path, n: int) -> list:
    from cbr2.data.questions import load_kqapro_questions

    return [q.program for q in load_kqapro_questions(workdir / "val.json", "val")][:n]


def _run_all(executor, programs: list) -> dict[str, float]:
    times = []
    for program in programs:
        start = time.perf_counter()
        try:
            executor.run(program)
        except Exception:  # noqa: BLE001, S110 - an error is an answer too; only the time matters here
            pass
        times.append(time.perf_counter() - start)
    times_ms = sorted(t * 1e3 for t in times)
    return {"n": len(times), "mean_ms": sum(times_ms) / len(times_ms), "median_ms": times_ms[len(times_ms) // 2],
            "p95_ms": times_ms[int(0.95 * (len(times_ms) - 1))], "max_ms": times_ms[-1], "total_s": sum(times)}


def worker(kind: str, workdir: Path, cache: Path, n: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    os.environ["CBR2_CACHE_DIR"] = str(cache)
    kb_path = workdir / "kb.json"
    row: dict[str, Any] = {"kind": kind}
    if kind == "reference":
        import contextlib
        import io

        from kopl.kopl import KoPLEngine

        programs = _programs(workdir, 1)
        start = time.perf_counter()
        with kb_path.open("rb") as handle:
            raw = json.load(handle)
        row["json_load_s"] = time.perf_counter() - start
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            engine = KoPLEngine(raw)
        row["engine_s"] = time.perf_counter() - start
        steps = programs[0].steps
        with contextlib.redirect_stdout(io.StringIO()):
            row["answer"] = engine.forward([s.function for s in steps], [list(s.inputs) for s in steps], ignore_error=True)
        row["first_answer_s"] = time.perf_counter() - t0
    elif kind == "cold":
        from cbr2.data.kb_store import StoredKB, load_kb

        start = time.perf_counter()
        kb = load_kb(kb_path)
        row["build_s"] = time.perf_counter() - start
        row["stored"] = isinstance(kb, StoredKB)
        row["store_mb"] = kb.store.meta["store_bytes"] / 1e6 if row["stored"] else None
        row["kb_json_mb"] = kb_path.stat().st_size / 1e6
    else:
        from cbr2.kopl.executor import Executor

        programs = _programs(workdir, n)
        start = time.perf_counter()
        if kind == "parsed":
            from cbr2.data.kb_loaders import load_kqapro_kb

            kb = load_kqapro_kb(kb_path)
        else:
            from cbr2.data.kb_store import StoredKB, load_kb

            kb = load_kb(kb_path)
            assert isinstance(kb, StoredKB), "the store entry was not used"
        row["load_s"] = time.perf_counter() - start
        start = time.perf_counter()
        executor = Executor(kb, engine="kopl" if kind == "warm-kopl" else "cbr2")
        row["engine_s"] = time.perf_counter() - start
        try:
            row["answer"] = executor.run(programs[0])
        except Exception as err:  # noqa: BLE001
            row["answer"] = str(err)
        row["first_answer_s"] = time.perf_counter() - t0
        row["programs"] = _run_all(executor, programs)
    row["peak_rss_gb"] = _rss_gb()
    row["total_s"] = time.perf_counter() - t0
    return row


def run_child(kind: str, workdir: Path, cache: Path, n: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", kind, "--workdir", str(workdir), "--cache", str(cache),
           "--programs", str(n)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    print(f"  {kind} ...", end="", flush=True)
    start = time.perf_counter()
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        print(" failed")
        raise RuntimeError(f"{kind} failed:\n{proc.stderr[-3000:]}")
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f" {time.perf_counter() - start:.1f} s", flush=True)
    return row


# --------------------------------------------------------------------------- report

def report(rows: dict[str, dict[str, Any]]) -> str:
    ref, warm = rows.get("reference"), rows["warm"]
    lines = ["| measurement | seconds | peak RSS (GB) | detail |", "|---|---:|---:|---|"]

    def add(name: str, seconds: float | None, rss: float | None, detail: str = "") -> None:
        s = "n/a" if seconds is None else f"{seconds:.2f}"
        r = "n/a" if rss is None else f"{rss:.2f}"
        lines.append(f"| {name} | {s} | {r} | {detail} |")

    if ref:
        add("reference: json.load + KoPLEngine + first answer", ref["first_answer_s"], ref["peak_rss_gb"],
            f"json.load {ref['json_load_s']:.2f} s, KoPLEngine {ref['engine_s']:.2f} s")
    par = rows["parsed"]
    add("before the store: load_kqapro_kb + cbr2 Engine + first answer", par["first_answer_s"], par["peak_rss_gb"],
        f"load {par['load_s']:.2f} s, engine {par['engine_s']:.2f} s")
    cold = rows["cold"]
    add("cold store build (load_kb, empty cache)", cold["build_s"], cold["peak_rss_gb"],
        f"kb.json {cold['kb_json_mb']:.0f} MB -> store.bin {cold['store_mb']:.0f} MB")
    add("warm: load_kb (hash, verify, header)", warm["load_s"], None, "")
    add("warm: + Executor(cbr2) ready", warm["load_s"] + warm["engine_s"], None, f"engine {warm['engine_s']:.2f} s")
    add("warm: first answer (from process start, imports included)", warm["first_answer_s"], warm["peak_rss_gb"],
        "")
    kopl = rows["warm-kopl"]
    add("warm + Executor(kopl) (to_kopl_dict from the store)", kopl["load_s"] + kopl["engine_s"], kopl["peak_rss_gb"],
        f"KoPLEngine {kopl['engine_s']:.2f} s")
    lines += ["", "| per program (Executor.run) | n | mean ms | median ms | p95 ms | max ms | total s |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for name, key in (("cbr2 engine, warm store", "warm"), ("cbr2 engine, parsed KB", "parsed"),
                      ("kopl engine (reference)", "warm-kopl")):
        p = rows[key]["programs"]
        lines.append(f"| {name} | {p['n']} | {p['mean_ms']:.3f} | {p['median_ms']:.3f} | {p['p95_ms']:.3f} "
                     f"| {p['max_ms']:.1f} | {p['total_s']:.2f} |")
    lines += ["", "| goal | measured | met |", "|---|---|---|"]

    def goal(text: str, measured: str, ok: bool) -> None:
        lines.append(f"| {text} | {measured} | {'yes' if ok else 'NO'} |")

    if ref:
        ratio = ref["first_answer_s"] / warm["first_answer_s"]
        goal("first answer, warm store, >= 10x faster than json.load + KoPLEngine", f"{ratio:.0f}x", ratio >= 10)
    goal("warm store load <= 2 s", f"{warm['load_s']:.2f} s", warm["load_s"] <= 2)
    goal("peak RSS of the warm run <= 0.7 GB", f"{warm['peak_rss_gb']:.2f} GB", warm["peak_rss_gb"] <= 0.7)
    for stat in ("mean_ms", "median_ms"):
        w, k, p = (rows[x]["programs"][stat] for x in ("warm", "warm-kopl", "parsed"))
        what = stat.split("_")[0]
        goal(f"per program ({what}) no slower than the kopl engine", f"{w / k:.2f}x its time", w <= k)
        goal(f"per program ({what}) no slower than the cbr2 engine built from the parsed KB", f"{w / p:.2f}x its time",
             w <= 1.05 * p)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--per-category", type=int, default=40, help="questions per category (9 categories)")
    parser.add_argument("--programs", type=int, default=360, help="programs timed per engine")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/cbr2-kb-store-bench"))
    parser.add_argument("--cache", type=Path, default=None, help="store cache (default: WORKDIR/cache, emptied first)")
    parser.add_argument("--skip-reference", action="store_true", help="skip json.load + KoPLEngine (45-170 s)")
    parser.add_argument("--worker", choices=KINDS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.workdir, args.cache, args.programs), default=str))
        return

    import shutil

    prepare(args.workdir, args.scale, args.seed, args.per_category)
    cache = args.cache or args.workdir / "cache"
    shutil.rmtree(cache / "kb", ignore_errors=True)
    print(f"kb.json: {(args.workdir / 'kb.json').stat().st_size / 1e6:.0f} MB; store cache {cache}", flush=True)
    rows = {}
    for kind in ("cold", "warm", "warm-kopl", "parsed", *(() if args.skip_reference else ("reference",))):
        rows[kind] = run_child(kind, args.workdir, cache, args.programs)
    text = report(rows)
    print()
    print(text)
    (args.workdir / "kb_store.md").write_text(text + "\n")
    (args.workdir / "kb_store.json").write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()
