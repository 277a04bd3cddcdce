"""Concurrent jobs build a shared cache entry once: the first builds, the others wait and load it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

BUILDER = textwrap.dedent("""
    import json, os, sys, time
    import numpy as np
    from cbr2.retrieval.cache import EmbeddingStore

    root, log, ready = sys.argv[1], sys.argv[2], sys.argv[3]

    def note(event):
        with open(log, "a") as handle:
            handle.write(json.dumps([os.getpid(), event, time.time()]) + "\\n")

    def embed(texts):
        note("embed start")
        time.sleep(3.0)  # the other process asks for the entry while this one builds it
        note("embed end")
        return np.eye(len(texts), 4, dtype=np.float32)

    # Both processes ask at the same moment, whatever their start-up took.
    open(os.path.join(ready, str(os.getpid())), "w").close()
    while len(os.listdir(ready)) < 2:
        time.sleep(0.01)
    note("ask")
    emb, index = EmbeddingStore(root).get("facts", ["a", "b", "c"], "enc", "fp", embed)
    note("got")
    print(emb.sum(), index.ntotal)
""")


def test_two_processes_on_a_cold_cache_encode_once(tmp_path):
    log, ready = tmp_path / "events.jsonl", tmp_path / "ready"
    ready.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", BUILDER, str(tmp_path / "cache"), str(log), str(ready)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outputs]
    assert [out.split() for out, _ in outputs] == [["3.0", "3"], ["3.0", "3"]]
    events: dict[int, dict[str, float]] = {}
    for line in log.read_text().splitlines():
        pid, event, at = json.loads(line)
        events.setdefault(pid, {})[event] = at
    builders = [pid for pid, seen in events.items() if "embed start" in seen]
    assert len(builders) == 1 and len(events) == 2  # one encoded, the other did not
    built = events[builders[0]]
    (waiter,) = [seen for pid, seen in events.items() if pid != builders[0]]
    # They overlapped: the other asked while the entry was being built, and got it only after.
    assert waiter["ask"] < built["embed end"] <= waiter["got"]
