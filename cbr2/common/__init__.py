"""The core layer: what every other package of ``cbr2`` may use, and which uses none of them.

Errors the user can fix (``errors``); the records the stages pass on, a prompt, a completion, a
prediction (``records``); files: the cache root, publishing a folder whole, hashing
(``files``); build-once and one-writer locks (``locks``); console output and progress
(``console``); the devices and the Slurm allocation a process has (``devices``, ``slurm``); the
W&B mode a run uses (``tracking``). ``tests/test_layout.py`` keeps packages depending downward
only (``LAYERS``), this one lowest.
"""
