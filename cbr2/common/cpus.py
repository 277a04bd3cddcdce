"""How many threads a CPU-bound step runs: the CPUs this process may use that other jobs leave idle."""

from __future__ import annotations

import os


def idle_threads() -> int:
    """The CPUs this process may run on, less those other jobs keep busy (the 1-minute load
    average less this process's own one), at least one.

    Threads of llama.cpp and of torch's CPU kernels wait for each other at every step; on a core
    another job also runs, a thread waits for a partner the scheduler has set aside. On the 2-core
    machine at a load of 12, one llama.cpp thread answered three questions in 23.5, 21.2 s where
    two took 60.5, 53.2 s (the same texts); at a load of 12-15, training the structural retriever
    took 6.8-8.9 s per step on one torch thread and 40 s on two. On an idle machine every CPU is
    used, as before.
    """
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        busy = max(0.0, os.getloadavg()[0] - 1.0)  # this process has been busy before asking
    except OSError:  # not every platform has one
        busy = 0.0
    return max(1, min(cpus, int(cpus - busy + 0.5)))
