"""The project's engine and the official one, measured side by side in one run.

    python benchmarks/executor.py                      # mini-kqapro
    python benchmarks/executor.py --data mini-metaqa --repeat 5
    python benchmarks/executor.py --data kqapro --root /data/KQAPro

Times, on every gold program of the train and evaluation splits: the official engine's own
``forward`` (post-order driver, no checks), and ``Executor.run`` (grounding, explicit
dependencies, time limit, formatting) on the official engine (``eval.executor=kopl``) and on
the project's (``cbr2``, the default). Prints seconds per program, their ratios to ``forward``,
and each engine's construction time.
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
    build_s, executors = {}, {}
    for name in ("kopl", "cbr2"):
        t0 = time.perf_counter()
        executors[name] = Executor(bench.kb, timeout_s=None, engine=name)  # no alarm: measure the work
        build_s[name] = time.perf_counter() - t0
    engine = executors["kopl"].engine
    plain = [([s.function for s in p.steps], [list(s.inputs) for s in p.steps]) for p in programs]

    def official() -> None:
        with contextlib.redirect_stdout(io.StringIO()):
            for funcs, inputs in plain:
                engine.forward(funcs, inputs)

    def run_on(name: str):
        def run() -> None:
            for p in programs:
                executors[name].run(p)
        return run

    best = {}
    for name, fn in (("engine.forward", official), ("run (kopl)", run_on("kopl")), ("run (cbr2)", run_on("cbr2"))):
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        best[name] = min(times) / len(programs)
    print(f"{bench.name}: {len(programs)} gold programs, {len(bench.kb.entities)} entities; engines built in "
          + ", ".join(f"{n} {s:.3f} s" for n, s in build_s.items()))
    for name, sec in best.items():
        ratio = sec / best["engine.forward"]
        print(f"  {name:15s} {1e6 * sec:9.1f} µs/program (best of {args.repeat}); x{ratio:.2f} of engine.forward")


if __name__ == "__main__":
    main()
