"""Executor overhead against the official engine, measured side by side in one run.

    python benchmarks/executor.py                      # mini-kqapro
    python benchmarks/executor.py --data mini-metaqa --repeat 5
    python benchmarks/executor.py --data kqapro --root /data/KQAPro

Times, on every gold program of the train and evaluation splits: the engine's own ``forward``
(post-order driver, no checks) and ``Executor.run`` (grounding, explicit dependencies, time
limit, formatting). Prints seconds per program and their ratio; a ratio near 1 means the
checks cost little next to the KB work. Also prints engine construction time.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import time

from cbr2.data.benchmarks import Benchmark
from cbr2.kopl.executor import Executor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="mini-kqapro")
    parser.add_argument("--root", default=None)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    bench = Benchmark(args.data, args.root)
    programs = [q.program for s in (bench.family.train_split, bench.family.eval_split)
                for q in bench.questions(s) if q.program is not None]
    t0 = time.perf_counter()
    executor = Executor(bench.kb, timeout_s=None)  # no alarm: measure the checks, not signal setup
    build_s = time.perf_counter() - t0
    engine = executor.engine
    plain = [([s.function for s in p.steps], [list(s.inputs) for s in p.steps]) for p in programs]

    def official() -> None:
        with contextlib.redirect_stdout(io.StringIO()):
            for funcs, inputs in plain:
                engine.forward(funcs, inputs)

    def ours() -> None:
        for p in programs:
            executor.run(p)

    best = {}
    for name, fn in (("engine.forward", official), ("Executor.run", ours)):
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        best[name] = min(times) / len(programs)
    print(f"{bench.name}: {len(programs)} gold programs, {len(bench.kb.entities)} entities; "
          f"engine built in {build_s:.2f} s")
    for name, sec in best.items():
        print(f"  {name:15s} {1e6 * sec:9.1f} µs/program (best of {args.repeat})")
    print(f"  ratio Executor.run / engine.forward = {best['Executor.run'] / best['engine.forward']:.2f}")


if __name__ == "__main__":
    main()
