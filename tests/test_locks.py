"""Concurrent jobs build a shared cache entry once: the first builds, the others wait and load it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

BUILDER = textwrap.dedent("""
    import sys, time
    import numpy as np
    from cbr2.retrieval.cache import EmbeddingStore

    root, calls = sys.argv[1], sys.argv[2]

    def embed(texts):
        with open(calls, "a") as handle:  # one line per real computation
            handle.write("embed\\n")
        time.sleep(3.0)  # long enough for the other process to arrive while this one builds
        return np.eye(len(texts), 4, dtype=np.float32)

    emb, index = EmbeddingStore(root).get("facts", ["a", "b", "c"], "enc", "fp", embed)
    print(emb.sum(), index.ntotal)
""")


def test_two_processes_on_a_cold_cache_encode_once(tmp_path):
    calls = tmp_path / "calls.txt"
    procs = [subprocess.Popen([sys.executable, "-c", BUILDER, str(tmp_path / "cache"), str(calls)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outputs]
    assert calls.read_text().splitlines() == ["embed"]
    assert [out.split() for out, _ in outputs] == [["3.0", "3"], ["3.0", "3"]]
