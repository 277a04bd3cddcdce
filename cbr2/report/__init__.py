"""What a reader sees of one run or several, made from its records and metrics alone.

``run_report`` (``report.md``), ``browser`` (``browser.html`` of a run, ``compare.html`` of several;
its script and styles are the package data in ``browser_assets/``), ``compare`` (runs → the
paper's Table 5, the model ladder, charts; ``cbr2 compare``), ``figures`` (the tables' Markdown and
the charts) and ``tracking`` (an evaluation's W&B run). A report imports ``cbr2.evaluation`` and
never the run loop (``cbr2.run`` sits above it and calls the reports when a run finishes), so any
finished folder can be reported again without a model (``tests/test_layout.py``: ``LAYERS``).
"""
