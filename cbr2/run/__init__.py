"""One evaluation run: the loop, its output folder, and mending a folder.

``runner`` (questions → retrieval → prompts → generation → scoring; its stages ``prepare``,
``build_prompts`` and ``Answerer`` are the service's too), ``run_folder`` (the folder's name, its
configuration check, provenance, the predictions cache, and ``finish_run``, which writes
``metrics.json`` and calls the reports of ``cbr2.report``) and ``repair`` (a folder two runs wrote
at once; ``cbr2 repair``). Above ``cbr2.report`` and below ``cbr2.cluster`` and ``cbr2.service``
(``tests/test_layout.py``: ``LAYERS``).
"""
