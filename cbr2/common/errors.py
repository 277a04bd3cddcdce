"""Errors that are the user's to fix, apart from bugs.

Every entry point (``evaluate.py``, ``train.py``, ``python -m cbr2.cluster.sweep`` ...) prints a
``UserError`` as one line, ``error: <message>``, and exits with status 2; any other exception is
a fault of the project or of a library and shows its traceback. So the message of a
``UserError`` says what to change, and nothing that is a bug is raised as one.

The project's kinds derive from it: ``ConfigError`` and ``SetupError`` below, ``DataError`` (a
data file, ``cbr2.data.reading``) and ``ReportError`` (runs that cannot be compared,
``cbr2.report.compare``).
"""

from __future__ import annotations


class UserError(ValueError):
    """Something the user can fix: a setting, an input file or folder, the installation.

    A ``ValueError``, as every one of these was before it had a type of its own.
    """


class ConfigError(UserError):
    """A configuration file, override or value that does not fit.

    Public as ``cbr2.config.ConfigError``.
    """


class SetupError(UserError, OSError):
    """What this machine lacks: a package, a model's files, a command (``sbatch``).

    An ``OSError`` as well, as these were before.
    """
