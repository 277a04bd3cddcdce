"""Judging answers, and what runs and reports both read: the layer below ``cbr2.report`` and ``cbr2.run``.

``scoring`` (generated text → scored prediction, the one path for every generator), ``metrics``
(every metric of the answers), ``errors`` (the error analysis), ``records`` (``predictions.jsonl``
and ``retrieval.jsonl``: one writer, one reader), ``trace`` (one question's trace) and
``selection`` (which questions a run judges, its shards). Nothing here writes a report or runs a
model: a report reads these records and metrics, a run writes them (``tests/test_layout.py``:
``LAYERS``).
"""
